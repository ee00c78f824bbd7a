"""A partition's producers as Kafka's ``TransactionsCommand describe-producers`` shows them, and
the same rows from mq's producer snapshot, so that the judge's tests compare the producer state
that mq and Kafka hand each other (id, epoch, coordinator epoch, last sequence and timestamp,
open transaction; Kafka's column names, values as text)."""

from __future__ import annotations

from javakafka import TRANSACTIONS, KafkaTarget, table

from mq.log.producer_state import read_snapshot


def kafka_producers(target: KafkaTarget, topic: str, partition: int = 0
                    ) -> list[dict[str, str]]:
    """The rows of describe-producers for ``topic``-``partition``, by producer id."""
    rows = table(target.tool(TRANSACTIONS, "describe-producers", "--topic", topic,
                             "--partition", str(partition)).stdout)
    return sorted(({k: v for k, v in row.items() if k} for row in rows),
                  key=lambda row: int(row["ProducerId"]))


def mq_producers(directory: str, log_end_offset: int) -> list[dict[str, str]]:
    """The producers of mq's snapshot at the log end offset, as describe-producers shows
    them."""
    return sorted(({"ProducerId": str(e.producer_id), "ProducerEpoch": str(e.epoch),
                    "LatestCoordinatorEpoch": str(e.coordinator_epoch),
                    "LastSequence": str(e.last_seq), "LastTimestamp": str(e.last_timestamp),
                    "CurrentTransactionStartOffset": (str(e.current_txn_first_offset)
                                                      if e.current_txn_first_offset >= 0
                                                      else "None")}
                   for e in read_snapshot(directory, log_end_offset)),
                  key=lambda row: int(row["ProducerId"]))
