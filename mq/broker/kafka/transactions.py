"""Kafka's transaction apis on mq's transaction coordinator: AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn, TxnOffsetCommit, DescribeProducers, DescribeTransactions,
ListTransactions.

Every transition goes through the native apis (``apis/transactions.py``, and ``apis/groups.py``
for TxnOffsetCommit), so a Kafka client's transaction is the same ``__transaction_state``
record, the same markers and the same offsets as an ``mq.Producer``'s, and an EndTxn is
answered once its markers are durable. This module only translates, the way Kafka's
``KafkaApis`` does:

- per-partition answers: AddPartitionsToTxn names the partitions that do not exist
  (UNKNOWN_TOPIC_OR_PARTITION) and marks the others OPERATION_NOT_ATTEMPTED, as Kafka does,
  rather than failing the request on the first;
- error codes an older version does not know: PRODUCER_FENCED (KIP-588) is
  INVALID_PRODUCER_EPOCH below the version that introduced it (``fenced_error``);
  TRANSACTIONAL_ID_NOT_FOUND is INVALID_PRODUCER_ID_MAPPING outside the Describe apis (Kafka's
  coordinator answers an unknown id that way);
- CONCURRENT_TRANSACTIONS stays as it is: every client retries it.

DescribeProducers reads each partition's producer table (``log.producer_state``) directly, as
Fetch reads the segments: it changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from mq.broker.apis.groups import wall_ms
from mq.broker.kafka.conn import KafkaConn
from mq.broker.kafka.exchange import Call, Calls
from mq.broker.partitions import PartitionTable
from mq.protocol.messages import Api

__all__ = ["TransactionWireApis", "fenced_error"]

NONE: Final = 0
UNKNOWN_TOPIC_OR_PARTITION: Final = 3
INVALID_PRODUCER_EPOCH: Final = 47
INVALID_PRODUCER_ID_MAPPING: Final = 49
OPERATION_NOT_ATTEMPTED: Final = 55
PRODUCER_FENCED: Final = 90
TRANSACTIONAL_ID_NOT_FOUND: Final = 105

# The first version of each api whose clients know PRODUCER_FENCED (KIP-588); below it
# Kafka answers INVALID_PRODUCER_EPOCH, which older clients treat as fenced too.
_FENCED_SINCE: Final = {22: 4, 24: 2, 25: 2, 26: 2, 28: 3}

# Kafka's transaction states, as ListTransactions filters name them.
_STATES: Final = frozenset({"Empty", "Ongoing", "PrepareCommit", "PrepareAbort",
                            "CompleteCommit", "CompleteAbort", "Dead", "PrepareEpochFence"})


def fenced_error(api_key: int, version: int, code: int) -> int:
    """``code`` as ``version`` of ``api_key`` may carry it (see the module doc)."""
    if code == PRODUCER_FENCED and version < _FENCED_SINCE.get(api_key, 0):
        return INVALID_PRODUCER_EPOCH
    return code


def _coordinator_error(api_key: int, version: int, code: int) -> int:
    if code == TRANSACTIONAL_ID_NOT_FOUND:
        return INVALID_PRODUCER_ID_MAPPING
    return fenced_error(api_key, version, code)


class TransactionWireApis:
    """The transaction handlers of the Kafka listener."""

    def __init__(self, table: PartitionTable) -> None:
        self._table = table

    def handlers(self) -> Mapping[int, object]:
        return {24: self.add_partitions_to_txn, 25: self.add_offsets_to_txn,
                26: self.end_txn, 28: self.txn_offset_commit, 61: self.describe_producers,
                65: self.describe_transactions, 66: self.list_transactions}

    # --- AddPartitionsToTxn (v0-3) ------------------------------------------------------------
    def add_partitions_to_txn(self, conn: KafkaConn, version: int, body: dict):
        wanted = [(t["name"], p) for t in body["v3_and_below_topics"] for p in t["partitions"]]
        unknown = {tp for tp in wanted if self._table.get(*tp) is None}
        if unknown:
            codes = {tp: UNKNOWN_TOPIC_OR_PARTITION if tp in unknown
                     else OPERATION_NOT_ATTEMPTED for tp in wanted}
        else:
            (reply,) = yield Calls([Call(Api.ADD_PARTITIONS_TO_TXN, {
                "transactional_id": body["v3_and_below_transactional_id"],
                "producer_id": body["v3_and_below_producer_id"],
                "producer_epoch": body["v3_and_below_producer_epoch"],
                "partitions": [list(tp) for tp in wanted]})])
            code = _coordinator_error(24, version, reply[2])
            codes = dict.fromkeys(wanted, code)
        by_topic: dict[str, list[dict]] = {}
        for (topic, partition), code in codes.items():
            by_topic.setdefault(topic, []).append({"partition_index": partition,
                                                   "partition_error_code": code})
        return {"throttle_time_ms": 0, "results_by_topic_v3_and_below": [
            {"name": topic, "results_by_partition": rows} for topic, rows in by_topic.items()]}

    # --- AddOffsetsToTxn, EndTxn --------------------------------------------------------------
    def add_offsets_to_txn(self, conn: KafkaConn, version: int, body: dict):
        (reply,) = yield Calls([Call(Api.ADD_OFFSETS_TO_TXN, {
            "transactional_id": body["transactional_id"], "producer_id": body["producer_id"],
            "producer_epoch": body["producer_epoch"], "group": body["group_id"]})])
        return {"throttle_time_ms": 0, "error_code": _coordinator_error(25, version, reply[2])}

    def end_txn(self, conn: KafkaConn, version: int, body: dict):
        (reply,) = yield Calls([Call(Api.END_TXN, {
            "transactional_id": body["transactional_id"], "producer_id": body["producer_id"],
            "producer_epoch": body["producer_epoch"], "commit": int(body["committed"])})])
        return {"throttle_time_ms": 0, "error_code": _coordinator_error(26, version, reply[2]),
                "producer_id": -1, "producer_epoch": -1}

    # --- TxnOffsetCommit ----------------------------------------------------------------------
    def txn_offset_commit(self, conn: KafkaConn, version: int, body: dict):
        offsets = [[t["name"], p["partition_index"], p["committed_offset"],
                    p["committed_leader_epoch"], p["committed_metadata"] or ""]
                   for t in body["topics"] for p in t["partitions"]]
        (reply,) = yield Calls([Call(Api.TXN_OFFSET_COMMIT, {
            "transactional_id": body["transactional_id"], "group": body["group_id"],
            "producer_id": body["producer_id"], "producer_epoch": body["producer_epoch"],
            "member_id": body["member_id"], "member_epoch": body["generation_id"],
            "offsets": offsets})])
        code = fenced_error(28, version, reply[2])
        return {"throttle_time_ms": 0, "topics": [
            {"name": t["name"], "partitions": [
                {"partition_index": p["partition_index"], "error_code": code}
                for p in t["partitions"]]} for t in body["topics"]]}

    # --- DescribeProducers --------------------------------------------------------------------
    def describe_producers(self, conn: KafkaConn, version: int, body: dict) -> dict:
        topics = []
        for t in body["topics"]:
            rows = []
            for index in t["partition_indexes"]:
                part = self._table.get(t["name"], index)
                if part is None:
                    rows.append({"partition_index": index,
                                 "error_code": UNKNOWN_TOPIC_OR_PARTITION,
                                 "error_message": None, "active_producers": []})
                    continue
                rows.append({"partition_index": index, "error_code": NONE,
                             "error_message": None, "active_producers": [
                                 {"producer_id": e.producer_id, "producer_epoch": e.epoch,
                                  "last_sequence": e.last_seq,
                                  "last_timestamp": e.last_timestamp,
                                  "coordinator_epoch": e.coordinator_epoch,
                                  "current_txn_start_offset": e.current_txn_first_offset}
                                 for e in part.log.producers.producers.values()]})
            topics.append({"name": t["name"], "partitions": rows})
        return {"throttle_time_ms": 0, "topics": topics}

    # --- DescribeTransactions, ListTransactions -----------------------------------------------
    def describe_transactions(self, conn: KafkaConn, version: int, body: dict):
        ids = body["transactional_ids"]
        # One native call per id: an unknown id is its own row's error, not the request's.
        replies = yield Calls([Call(Api.DESCRIBE_TRANSACTIONS, {"transactional_ids": [tid]})
                               for tid in ids])
        states = []
        for tid, reply in zip(ids, replies, strict=True):
            if reply[2] != NONE:
                states.append({"error_code": reply[2], "transactional_id": tid,
                               "transaction_state": "", "transaction_timeout_ms": 0,
                               "transaction_start_time_ms": -1, "producer_id": -1,
                               "producer_epoch": -1, "topics": []})
                continue
            (row,) = reply[4]
            by_topic: dict[str, list[int]] = {}
            for topic, partition in row["partitions"]:
                by_topic.setdefault(topic, []).append(partition)
            states.append({"error_code": NONE, "transactional_id": tid,
                           "transaction_state": row["state"],
                           "transaction_timeout_ms": row["timeout_ms"],
                           "transaction_start_time_ms": row["start_ms"],
                           "producer_id": row["producer_id"],
                           "producer_epoch": row["producer_epoch"],
                           "topics": [{"topic": topic, "partitions": parts}
                                      for topic, parts in by_topic.items()]})
        return {"throttle_time_ms": 0, "transaction_states": states}

    def list_transactions(self, conn: KafkaConn, version: int, body: dict):
        (reply,) = yield Calls([Call(Api.DESCRIBE_TRANSACTIONS, {"transactional_ids": None})])
        if reply[2] != NONE:
            return {"throttle_time_ms": 0, "error_code": reply[2],
                    "unknown_state_filters": [], "transaction_states": []}
        states = set(body["state_filters"])
        pids = set(body["producer_id_filters"])
        duration = body["duration_filter"]
        now = wall_ms()
        rows = [{"transactional_id": r["transactional_id"], "producer_id": r["producer_id"],
                 "transaction_state": r["state"]} for r in reply[4]
                if (not states or r["state"] in states)
                and (not pids or r["producer_id"] in pids)
                # "running longer than": a transaction that is open, since its start
                and (duration < 0 or (r["start_ms"] >= 0 and now - r["start_ms"] >= duration))]
        return {"throttle_time_ms": 0, "error_code": NONE,
                "unknown_state_filters": sorted(states - _STATES), "transaction_states": rows}
