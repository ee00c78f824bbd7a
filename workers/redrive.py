"""``mq workers redrive DLQ --to TOPIC``: dead letters back to a topic, each once.

Every record of the dead-letter topic from the redrive cursor up to the topic's end as it is
when the redrive starts goes to ``to`` (default: the topic it came from, its ``mq.dlq.topic``
header) with its key, value and own headers; the ``mq.dlq.*`` headers go. The cursor is the
committed offset of the group ``mq-workers-redrive.<DLQ>`` (or ``group_id=``), and the records
sent plus the cursor's move commit in one transaction: a redrive killed half-way and run again
sends nothing twice, and one run after another sends only what was dead-lettered since.
Dead letters are read ``read_committed``: those of an aborted transaction of an exactly-once
pool were never dead letters.
"""

from __future__ import annotations

import time

__all__ = ["redrive"]

_BATCH = 500
_TIMEOUT_S = 30.0


def redrive(dead_letter_topic: str, to: str | None = None, group_id: str | None = None,
            socket: str | None = None, max_messages: int | None = None,
            dry_run: bool = False, bootstrap_servers: str | None = None,
            kafka_config: dict | None = None) -> list[dict]:
    """Send the dead letters past the cursor to ``to``; returns one dict per record
    (``offset``, ``partition``, ``to``, ``error``, ``attempts``). ``dry_run``: send and
    commit nothing. ``socket``: the local broker's; ``bootstrap_servers`` and
    ``kafka_config``: a Kafka cluster's, as ``mq.Consumer`` takes them. Raises ``mq.errors.UnknownTopicOrPartitionError`` (the dead-letter
    topic, or a target), ``ValueError`` for a dead letter without ``mq.dlq.topic`` when
    ``to`` is not given, ``mq.BrokerUnavailableError``."""
    import mq
    from mq import Consumer
    from mq.errors import UnknownTopicOrPartitionError
    from workers.failures import original_headers

    group = group_id or f"mq-workers-redrive.{dead_letter_topic}"
    moved: list[dict] = []
    broker = {"socket": socket, "bootstrap_servers": bootstrap_servers,
              "kafka_config": kafka_config}
    with Consumer(group_id=group, isolation_level="read_committed", enable_auto_commit=False,
                  value_bytes=True, **broker) as consumer:
        parts = consumer.partitions_for_topic(dead_letter_topic)
        if parts is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {dead_letter_topic!r}")
        tps = [mq.TopicPartition(dead_letter_topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        for tp in tps:
            committed = consumer.committed(tp)
            if committed is None:
                consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, committed)
        ends = consumer.end_offsets(tps)
        producer = None if dry_run else mq.Producer(transactional_id=group, **broker)
        try:
            if producer is not None:
                producer.init_transactions()
            deadline = time.monotonic() + _TIMEOUT_S
            while any(consumer.position(tp) < ends[tp] for tp in tps):
                if max_messages is not None and len(moved) >= max_messages:
                    break
                left = _BATCH if max_messages is None else min(_BATCH,
                                                               max_messages - len(moved))
                batch = consumer.poll(timeout_ms=100, max_records=left)
                if not batch:
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"no progress reading {dead_letter_topic} for "
                                           f"{_TIMEOUT_S:g} s")
                    continue
                deadline = time.monotonic() + _TIMEOUT_S
                if producer is not None:
                    producer.begin_transaction()
                positions = {}
                for tp, records in batch.items():
                    for r in records:
                        if r.offset >= ends[tp]:
                            break
                        headers = {k: bytes(v) for k, v in r.headers}
                        target = to or headers.get("mq.dlq.topic", b"").decode()
                        if not target:
                            raise ValueError(f"{tp.topic}-{tp.partition}@{r.offset} has no "
                                             f"mq.dlq.topic header: name a topic with --to")
                        if producer is not None:
                            producer.send(target, value=r.value, key=r.key,
                                          headers=original_headers(r.headers))
                        moved.append({"partition": r.partition, "offset": r.offset,
                                      "to": target,
                                      "error": headers.get("mq.dlq.error", b"").decode(),
                                      "attempts": headers.get("mq.dlq.attempts", b"").decode()})
                        positions[tp] = r.offset + 1
                if producer is not None:
                    if positions:
                        producer.send_offsets_to_transaction(positions, group)
                    producer.commit_transaction()
        finally:
            if producer is not None:
                producer.close(timeout=10)
    return moved
