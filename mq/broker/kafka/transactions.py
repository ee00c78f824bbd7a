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

**ACLs** (``acls.py``), as Kafka's: the transaction apis need Write on the transactional id
(else TRANSACTIONAL_ID_AUTHORIZATION_FAILED for the whole request), AddPartitionsToTxn Write on
each topic, AddOffsetsToTxn and TxnOffsetCommit Read on the group
(GROUP_AUTHORIZATION_FAILED), TxnOffsetCommit Read on each topic; DescribeProducers needs Read
on the topic, DescribeTransactions Describe on each id, and ListTransactions lists only the
ids the principal may Describe.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from mq import errors
from mq.broker.acls import OPEN, AclOperation, Authorizer, ResourceType
from mq.broker.apis.groups import wall_ms
from mq.broker.kafka.conn import KafkaConn
from mq.broker.kafka.exchange import Call, Calls, call_each
from mq.broker.partitions import PartitionTable
from mq.protocol.messages import Api, Response

__all__ = ["TransactionWireApis", "fenced_error"]

# The first version of each api whose clients know PRODUCER_FENCED (KIP-588); below it
# Kafka answers INVALID_PRODUCER_EPOCH, which older clients treat as fenced too.
_FENCED_SINCE: Final = {22: 4, 24: 2, 25: 2, 26: 2, 28: 3}

# Kafka's transaction states, as ListTransactions filters name them.
_STATES: Final = frozenset({"Empty", "Ongoing", "PrepareCommit", "PrepareAbort",
                            "CompleteCommit", "CompleteAbort", "Dead", "PrepareEpochFence"})


def fenced_error(api_key: int, version: int, code: int) -> int:
    """``code`` as ``version`` of ``api_key`` may carry it (see the module doc)."""
    if code == errors.ProducerFencedError.code and version < _FENCED_SINCE.get(api_key, 0):
        return errors.InvalidProducerEpochError.code
    return code


def _coordinator_error(api_key: int, version: int, code: int) -> int:
    if code == errors.TransactionalIdNotFoundError.code:
        return errors.InvalidProducerIdMappingError.code
    return fenced_error(api_key, version, code)


class TransactionWireApis:
    """The transaction handlers of the Kafka listener."""

    def __init__(self, table: PartitionTable, authz: Authorizer = OPEN) -> None:
        self._table = table
        self._authz = authz

    def _may(self, conn: KafkaConn, op: AclOperation, resource: ResourceType,
             name: str) -> bool:
        return self._authz.allows(conn, op, resource, name)

    def _txn_commit_denial(self, conn: KafkaConn, body: dict) -> int:
        """TxnOffsetCommit's authorization error, in Kafka's order of checks, else NONE."""
        if not self._may(conn, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID,
                         body["transactional_id"]):
            return errors.TransactionalIdAuthorizationFailedError.code
        if not self._may(conn, AclOperation.READ, ResourceType.GROUP, body["group_id"]):
            return errors.GroupAuthorizationFailedError.code
        if any(not self._may(conn, AclOperation.READ, ResourceType.TOPIC, t["name"])
               for t in body["topics"]):
            return errors.TopicAuthorizationFailedError.code
        return errors.NONE

    def handlers(self) -> Mapping[int, object]:
        return {24: self.add_partitions_to_txn, 25: self.add_offsets_to_txn,
                26: self.end_txn, 28: self.txn_offset_commit, 61: self.describe_producers,
                65: self.describe_transactions, 66: self.list_transactions}

    # --- AddPartitionsToTxn (v0-3) ------------------------------------------------------------
    def add_partitions_to_txn(self, conn: KafkaConn, version: int, body: dict):
        wanted = [(t["name"], p) for t in body["v3_and_below_topics"] for p in t["partitions"]]
        tid = body["v3_and_below_transactional_id"]
        denied = {tp for tp in wanted
                  if not self._may(conn, AclOperation.WRITE, ResourceType.TOPIC, tp[0])}
        unknown = {tp for tp in wanted if self._table.get(*tp) is None}
        if not self._may(conn, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, tid):
            codes = dict.fromkeys(wanted, errors.TransactionalIdAuthorizationFailedError.code)
        elif denied or unknown:
            codes = {tp: errors.TopicAuthorizationFailedError.code if tp in denied
                     else errors.UnknownTopicOrPartitionError.code if tp in unknown
                     else errors.OperationNotAttemptedError.code for tp in wanted}
        else:
            (reply,) = yield Calls([Call(Api.ADD_PARTITIONS_TO_TXN, {
                "transactional_id": tid,
                "producer_id": body["v3_and_below_producer_id"],
                "producer_epoch": body["v3_and_below_producer_epoch"],
                "partitions": [list(tp) for tp in wanted]})])
            code = _coordinator_error(24, version, reply.error_code)
            codes = dict.fromkeys(wanted, code)
        by_topic: dict[str, list[dict]] = {}
        for (topic, partition), code in codes.items():
            by_topic.setdefault(topic, []).append({"partition_index": partition,
                                                   "partition_error_code": code})
        return {"throttle_time_ms": 0, "results_by_topic_v3_and_below": [
            {"name": topic, "results_by_partition": rows} for topic, rows in by_topic.items()]}

    # --- AddOffsetsToTxn, EndTxn --------------------------------------------------------------
    def add_offsets_to_txn(self, conn: KafkaConn, version: int, body: dict):
        if not self._may(conn, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID,
                         body["transactional_id"]):
            return {"throttle_time_ms": 0,
                    "error_code": errors.TransactionalIdAuthorizationFailedError.code}
        if not self._may(conn, AclOperation.READ, ResourceType.GROUP, body["group_id"]):
            return {"throttle_time_ms": 0, "error_code": errors.GroupAuthorizationFailedError.code}
        (reply,) = yield Calls([Call(Api.ADD_OFFSETS_TO_TXN, {
            "transactional_id": body["transactional_id"], "producer_id": body["producer_id"],
            "producer_epoch": body["producer_epoch"], "group": body["group_id"]})])
        return {"throttle_time_ms": 0,
                "error_code": _coordinator_error(25, version, reply.error_code)}

    def end_txn(self, conn: KafkaConn, version: int, body: dict):
        if not self._may(conn, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID,
                         body["transactional_id"]):
            return {"throttle_time_ms": 0,
                    "error_code": errors.TransactionalIdAuthorizationFailedError.code,
                    "producer_id": -1, "producer_epoch": -1}
        (reply,) = yield Calls([Call(Api.END_TXN, {
            "transactional_id": body["transactional_id"], "producer_id": body["producer_id"],
            "producer_epoch": body["producer_epoch"], "commit": int(body["committed"])})])
        return {"throttle_time_ms": 0,
                "error_code": _coordinator_error(26, version, reply.error_code),
                "producer_id": -1, "producer_epoch": -1}

    # --- TxnOffsetCommit ----------------------------------------------------------------------
    def txn_offset_commit(self, conn: KafkaConn, version: int, body: dict):
        code = self._txn_commit_denial(conn, body)
        if code != errors.NONE:        # the whole commit or none of it: its offsets go together
            return _txn_commit_answer(body, code)
        offsets = [[t["name"], p["partition_index"], p["committed_offset"],
                    p["committed_leader_epoch"], p["committed_metadata"] or ""]
                   for t in body["topics"] for p in t["partitions"]]
        (reply,) = yield Calls([Call(Api.TXN_OFFSET_COMMIT, {
            "transactional_id": body["transactional_id"], "group": body["group_id"],
            "producer_id": body["producer_id"], "producer_epoch": body["producer_epoch"],
            "member_id": body["member_id"], "member_epoch": body["generation_id"],
            "offsets": offsets})])
        return _txn_commit_answer(body, fenced_error(28, version, reply.error_code))

    # --- DescribeProducers --------------------------------------------------------------------
    def describe_producers(self, conn: KafkaConn, version: int, body: dict) -> dict:
        topics = []
        for t in body["topics"]:
            rows = []
            readable = self._may(conn, AclOperation.READ, ResourceType.TOPIC, t["name"])
            for index in t["partition_indexes"]:
                part = self._table.get(t["name"], index)
                if part is None or not readable:
                    rows.append({"partition_index": index, "error_code":
                                 errors.UnknownTopicOrPartitionError.code if readable
                                 else errors.TopicAuthorizationFailedError.code,
                                 "error_message": None, "active_producers": []})
                    continue
                rows.append({"partition_index": index, "error_code": errors.NONE,
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
        allowed = [tid for tid in ids if self._may(conn, AclOperation.DESCRIBE,
                                                   ResourceType.TRANSACTIONAL_ID, tid)]
        # One native call per id: an unknown id is its own row's error, not the request's.
        replies = yield from call_each({
            tid: Call(Api.DESCRIBE_TRANSACTIONS, {"transactional_ids": [tid]})
            for tid in allowed})
        states = []
        for tid in ids:
            reply = replies.get(
                tid, Response.refused(errors.TransactionalIdAuthorizationFailedError.code, None))
            if reply.error_code != errors.NONE:
                states.append({"error_code": reply.error_code, "transactional_id": tid,
                               "transaction_state": "", "transaction_timeout_ms": 0,
                               "transaction_start_time_ms": -1, "producer_id": -1,
                               "producer_epoch": -1, "topics": []})
                continue
            (row,) = reply["rows"]
            by_topic: dict[str, list[int]] = {}
            for topic, partition in row["partitions"]:
                by_topic.setdefault(topic, []).append(partition)
            states.append({"error_code": errors.NONE, "transactional_id": tid,
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
        if reply.error_code != errors.NONE:
            return {"throttle_time_ms": 0, "error_code": reply.error_code,
                    "unknown_state_filters": [], "transaction_states": []}
        states = set(body["state_filters"])
        pids = set(body["producer_id_filters"])
        duration = body["duration_filter"]
        now = wall_ms()
        rows = [{"transactional_id": r["transactional_id"], "producer_id": r["producer_id"],
                 "transaction_state": r["state"]} for r in reply["rows"]
                if self._may(conn, AclOperation.DESCRIBE, ResourceType.TRANSACTIONAL_ID,
                             r["transactional_id"])
                and (not states or r["state"] in states)
                and (not pids or r["producer_id"] in pids)
                # "running longer than": a transaction that is open, since its start
                and (duration < 0 or (r["start_ms"] >= 0 and now - r["start_ms"] >= duration))]
        return {"throttle_time_ms": 0, "error_code": errors.NONE,
                "unknown_state_filters": sorted(states - _STATES), "transaction_states": rows}


def _txn_commit_answer(body: dict, code: int) -> dict:
    return {"throttle_time_ms": 0, "topics": [
        {"name": t["name"], "partitions": [
            {"partition_index": p["partition_index"], "error_code": code}
            for p in t["partitions"]]} for t in body["topics"]]}
