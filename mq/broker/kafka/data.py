"""Kafka's data apis on mq's logs: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch.

**Produce** hands each partition's records to the native Produce (``apis/produce.py``): the
same validation, stamping (12 bytes patched, never re-encoded), idempotence and transaction
checks, free-space guard and group commit as mq's own producers. acks=-1 is answered after the
fsync that covers the batch, acks=1 once it is in the page cache (it survives a crash of any
process, the broker's included), acks=0 never (a failure closes the connection, as Kafka
does).

**Fetch** reads straight from the segment files: for each partition, whole batches from the
one holding the fetch offset (the client skips the records before it), up to the partition's
and the request's byte limits, at least one batch for the first partition with data (KIP-74),
sent with ``sendfile`` from a descriptor of the segment's own (``FileRegion``). The upper
bound is the high watermark, or the last stable offset for ``read_committed`` — which also
gets the aborted transactions of the range from ``.txnindex``. With less than MinBytes
found, the request parks until a partition it reads moves or MaxWaitMs passes, woken by the
same publication that wakes mq's own consumers. Fetch sessions (KIP-227) are declined: every
response says session 0, so clients send full requests.

**ACLs** (``acls.py``), as Kafka's ``KafkaApis``: Produce needs Write on each topic (and on
the transactional id of a transactional batch), Fetch Read, ListOffsets and
OffsetForLeaderEpoch Describe; a partition denied answers TOPIC_AUTHORIZATION_FAILED in its
row and the others are served. A Produce auto-creates only the topics the principal may
Create (on the Cluster or the topic).

**Leader epochs**: one broker, so the leader is always node ``node_id`` and a partition's
epoch is the broker start that wrote it last (``leader-epoch-checkpoint``). A fetch or
ListOffsets naming a newer epoch than the current one gets UNKNOWN_LEADER_EPOCH, an older
one FENCED_LEADER_EPOCH (the client refreshes its metadata), -1 skips the check.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

from mq import errors
from mq.broker.acls import OPEN, AclOperation, Authorizer, ResourceType
from mq.broker.kafka.conn import KafkaConn
from mq.broker.kafka.exchange import Call, CloseConnection, Park, call_each
from mq.broker.partitions import Partition, PartitionTable
from mq.log.log import PartitionLog
from mq.protocol.kafka.codec import FileRegion
from mq.protocol.messages import Api, Response

__all__ = ["DataApis", "epoch_end_offset"]


_LATEST, _EARLIEST, _MAX_TIMESTAMP, _EARLIEST_LOCAL = -1, -2, -3, -4
_READ_COMMITTED = 1


def epoch_end_offset(entries: list[tuple[int, int]], epoch: int, log_end_offset: int
                     ) -> tuple[int, int]:
    """Kafka's OffsetForLeaderEpoch over ``[(epoch, start offset)]``: (the largest epoch at
    most ``epoch``, the offset where it ended — the next epoch's start, or the log end for
    the latest). (-1, -1) when ``epoch`` is older than every known one."""
    found = -1
    for i, (e, _) in enumerate(entries):
        if e > epoch:
            if found < 0:
                return -1, -1
            return entries[found][0], entries[i][1]
        found = i
    if found < 0:
        return -1, -1
    return entries[found][0], log_end_offset


class DataApis:
    """The data-path handlers of the Kafka listener."""

    def __init__(self, table: PartitionTable, *, leader_epoch: int, node_id: int,
                 auto_create: Callable[[str], Call] | None = None,
                 authz: Authorizer = OPEN) -> None:
        """``auto_create``: the native CreateTopics that creates an unknown topic a Produce
        names (``AdminApis.create_call``; None: auto-creation is off)."""
        self._authz = authz
        self._table = table
        self._epoch = leader_epoch
        self._node_id = node_id
        self._auto_create = auto_create

    def handlers(self) -> Mapping[int, object]:
        return {0: self.produce, 1: self.fetch, 2: self.list_offsets,
                23: self.offset_for_leader_epoch}

    # --- Produce ------------------------------------------------------------------------------
    def produce(self, conn: KafkaConn, version: int, body: dict):
        acks = body["acks"]
        denied = self._produce_denied(conn, body)
        unknown = sorted({t["name"] for t in body["topic_data"]
                          if t["name"] not in denied and self._table.get(t["name"], 0) is None
                          and self._authz.may_create_topic(conn, t["name"])})
        if unknown and self._auto_create is not None:
            yield from call_each({name: self._auto_create(name) for name in unknown})
        where = [(t["name"], p["index"]) for t in body["topic_data"]
                 for p in t["partition_data"]]
        made = yield from call_each({
            i: Call(Api.PRODUCE, {"topic": t["name"], "partition": p["index"], "acks": acks,
                                  "batch": p["records"] if p["records"] is not None
                                  else b""}, one_way=acks == 0)
            for i, (t, p) in enumerate((t, p) for t in body["topic_data"]
                                       for p in t["partition_data"])
            if t["name"] not in denied})
        replies = [Response.refused(denied[topic], "not authorized") if topic in denied
                   else made[i] for i, (topic, _) in enumerate(where)]
        if acks == 0:
            failed = [r for r in replies if r is not None and r.error_code != errors.NONE]
            if failed:       # no response can carry it: Kafka closes the connection
                return CloseConnection(f"a Produce with acks=0 failed: {failed[0].error_message}")
            return None
        by_topic: dict[str, list[dict]] = {}
        for (topic, partition), reply in zip(where, replies, strict=True):
            code, message = reply.error_code, reply.error_message
            if code == errors.NONE:
                row = {"index": partition, "error_code": errors.NONE,
                       "base_offset": reply["first_offset"],
                       "log_append_time_ms": reply["log_append_time"],
                       "log_start_offset": reply["log_start_offset"]}
            else:
                row = {"index": partition, "error_code": code, "base_offset": -1,
                       "log_append_time_ms": -1, "log_start_offset": -1,
                       "error_message": message}
            by_topic.setdefault(topic, []).append(row)
        return {"responses": [{"name": topic, "partition_responses": rows}
                              for topic, rows in by_topic.items()], "throttle_time_ms": 0}

    def _produce_denied(self, conn: KafkaConn, body: dict) -> dict[str, int]:
        """The topics of a Produce this connection may not write to, with the error code:
        every one when its transactional id is not its to write (Kafka fails the whole
        request so), else those without Write."""
        tid = body.get("transactional_id")
        if tid is not None and not self._authz.allows(conn, AclOperation.WRITE,
                                                      ResourceType.TRANSACTIONAL_ID, tid):
            return dict.fromkeys((t["name"] for t in body["topic_data"]),
                                 errors.TransactionalIdAuthorizationFailedError.code)
        return {t["name"]: errors.TopicAuthorizationFailedError.code for t in body["topic_data"]
                if not self._authz.allows(conn, AclOperation.WRITE, ResourceType.TOPIC,
                                          t["name"])}

    # --- Fetch --------------------------------------------------------------------------------
    def fetch(self, conn: KafkaConn, version: int, body: dict):
        deadline = time.monotonic() + max(0, body["max_wait_ms"]) / 1e3
        committed = body["isolation_level"] == _READ_COMMITTED
        denied = {t["topic"] for t in body["topics"]
                  if not self._authz.allows(conn, AclOperation.READ, ResourceType.TOPIC,
                                            t["topic"])}
        while True:
            responses, found, bytes_found = self._read(body, committed, denied)
            if found or bytes_found >= body["min_bytes"] or time.monotonic() >= deadline:
                return {"throttle_time_ms": 0, "error_code": errors.NONE, "session_id": 0,
                        "responses": responses}
            _close_regions(responses)
            keys = [(t["topic"], p["partition"]) for t in body["topics"]
                    for p in t["partitions"]]
            yield Park(deadline, keys)

    def _read(self, body: dict, committed: bool, denied: set[str]
              ) -> tuple[list[dict], bool, int]:
        """One pass over the requested partitions (those of ``denied`` topics answer
        TOPIC_AUTHORIZATION_FAILED): the response's topics, whether an error must be returned
        at once, and the bytes found."""
        budget = body["max_bytes"] if body["max_bytes"] > 0 else 0x7FFFFFFF
        total = 0
        urgent = False
        responses = []
        for t in body["topics"]:
            rows = []
            for p in t["partitions"]:
                if t["topic"] in denied:
                    rows.append(_fetch_error(p["partition"],
                                             errors.TopicAuthorizationFailedError.code))
                    urgent = True
                    continue
                row, size = self._read_partition(t["topic"], p, committed,
                                                 min_one=total == 0,
                                                 max_bytes=min(p["partition_max_bytes"],
                                                               max(budget - total, 0)))
                total += size
                urgent = urgent or row["error_code"] != errors.NONE
                rows.append(row)
            responses.append({"topic": t["topic"], "partitions": rows})
        return responses, urgent, total

    def _read_partition(self, topic: str, p: dict, committed: bool, *, min_one: bool,
                        max_bytes: int) -> tuple[dict, int]:
        index = p["partition"]
        part = self._table.get(topic, index)
        if part is None:
            return _fetch_error(index, errors.UnknownTopicOrPartitionError.code), 0
        plog = part.log
        epoch_error = self._check_epoch(p["current_leader_epoch"])
        if epoch_error:
            return _fetch_error(index, epoch_error), 0
        upper = plog.last_stable_offset if committed else plog.high_watermark
        row = {"partition_index": index, "error_code": errors.NONE,
               "high_watermark": plog.high_watermark,
               "last_stable_offset": plog.last_stable_offset,
               "log_start_offset": plog.log_start_offset,
               "aborted_transactions": [] if committed else None,
               "preferred_read_replica": -1, "records": b""}
        offset = p["fetch_offset"]
        if offset < plog.log_start_offset or offset > plog.high_watermark:
            return _fetch_error(index, errors.BrokerOffsetOutOfRangeError.code, plog), 0
        if plog.offline:
            return _fetch_error(index, errors.KafkaStorageError.code, plog), 0
        if max_bytes <= 0 and not min_one:
            return row, 0
        try:
            found = plog.locate(offset, max_bytes, max_offset=upper, min_one_batch=min_one)
        except errors.OffsetOutOfRangeError:
            return _fetch_error(index, errors.BrokerOffsetOutOfRangeError.code, plog), 0
        if found is None:
            return row, 0
        seg, position, length = found
        row["records"] = FileRegion(seg.dup_fd(), position, length)
        if committed:
            row["aborted_transactions"] = [
                {"producer_id": t.producer_id, "first_offset": t.first_offset}
                for t in plog.aborted_transactions(offset, upper)]
        return row, length

    def _check_epoch(self, epoch: int) -> int:
        if epoch < 0 or epoch == self._epoch:
            return errors.NONE
        if epoch > self._epoch:
            return errors.UnknownLeaderEpochError.code
        return errors.FencedLeaderEpochError.code

    # --- ListOffsets --------------------------------------------------------------------------
    def list_offsets(self, conn: KafkaConn, version: int, body: dict) -> dict:
        committed = body["isolation_level"] == _READ_COMMITTED
        topics = []
        for t in body["topics"]:
            rows = []
            allowed = self._authz.allows(conn, AclOperation.DESCRIBE, ResourceType.TOPIC,
                                         t["name"])
            for p in t["partitions"]:
                rows.append(self._list_offset(t["name"], p, committed) if allowed else
                            {"partition_index": p["partition_index"], "timestamp": -1,
                             "error_code": errors.TopicAuthorizationFailedError.code, "offset": -1,
                             "leader_epoch": -1})
            topics.append({"name": t["name"], "partitions": rows})
        return {"throttle_time_ms": 0, "topics": topics}

    def _list_offset(self, topic: str, p: dict, committed: bool) -> dict:
        index = p["partition_index"]
        row = {"partition_index": index, "error_code": errors.NONE, "timestamp": -1, "offset": -1,
               "leader_epoch": -1}
        part = self._table.get(topic, index)
        if part is None:
            return {**row, "error_code": errors.UnknownTopicOrPartitionError.code}
        epoch_error = self._check_epoch(p["current_leader_epoch"])
        if epoch_error:
            return {**row, "error_code": epoch_error}
        plog = part.log
        ts = p["timestamp"]
        if ts == _LATEST:
            offset = plog.last_stable_offset if committed else plog.high_watermark
            return {**row, "offset": offset, "leader_epoch": self._epoch_at(plog, offset)}
        if ts in (_EARLIEST, _EARLIEST_LOCAL):
            return {**row, "offset": plog.log_start_offset,
                    "leader_epoch": self._epoch_at(plog, plog.log_start_offset)}
        if ts < 0 and ts != _MAX_TIMESTAMP:
            return {**row, "error_code": errors.InvalidRequestError.code}
        found = plog.offset_for_timestamp(ts)
        if found is None or (committed and found[0] >= plog.last_stable_offset):
            return row
        return {**row, "offset": found[0], "timestamp": found[1],
                "leader_epoch": self._epoch_at(plog, found[0])}

    @staticmethod
    def _epoch_at(plog: PartitionLog, offset: int) -> int:
        epoch = -1
        for e, start in plog.leader_epochs.entries:
            if start > offset:
                break
            epoch = e
        return epoch

    # --- OffsetForLeaderEpoch -----------------------------------------------------------------
    def offset_for_leader_epoch(self, conn: KafkaConn, version: int, body: dict) -> dict:
        topics = []
        for t in body["topics"]:
            rows = []
            for p in t["partitions"]:
                part: Partition | None = self._table.get(t["topic"], p["partition"])
                row = {"partition": p["partition"], "error_code": errors.NONE, "leader_epoch": -1,
                       "end_offset": -1}
                if not self._authz.allows(conn, AclOperation.DESCRIBE, ResourceType.TOPIC,
                                          t["topic"]):
                    row["error_code"] = errors.TopicAuthorizationFailedError.code
                elif part is None:
                    row["error_code"] = errors.UnknownTopicOrPartitionError.code
                elif epoch_error := self._check_epoch(p["current_leader_epoch"]):
                    row["error_code"] = epoch_error
                else:
                    epoch, end = epoch_end_offset(part.log.leader_epochs.entries,
                                                  p["leader_epoch"], part.log.log_end_offset)
                    row.update(leader_epoch=epoch, end_offset=end)
                rows.append(row)
            topics.append({"topic": t["topic"], "partitions": rows})
        return {"throttle_time_ms": 0, "topics": topics}


def _fetch_error(index: int, code: int, plog: PartitionLog | None = None) -> dict:
    return {"partition_index": index, "error_code": code,
            "high_watermark": plog.high_watermark if plog else -1,
            "last_stable_offset": plog.last_stable_offset if plog else -1,
            "log_start_offset": plog.log_start_offset if plog else -1,
            "aborted_transactions": None, "preferred_read_replica": -1, "records": b""}


def _close_regions(responses: list[dict]) -> None:
    """Close the descriptors of a pass whose answer is not sent (the fetch parks)."""
    for t in responses:
        for row in t["partitions"]:
            if isinstance(row["records"], FileRegion):
                os.close(row["records"].fd)
