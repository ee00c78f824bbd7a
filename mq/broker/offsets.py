"""Committed offsets, stored as records of the compacted ``__consumer_offsets`` topic.

Record formats are Kafka's (strings are int16 length + UTF-8, integers big-endian)::

    key   (version 1)  int16 1 | group string | topic string | int32 partition
    value (version 3)  int16 3 | int64 offset | int32 leader epoch | metadata string |
                       int64 commit timestamp
    a null value (tombstone) deletes the committed offset

    key   (version 3)  int16 3 | group string          Kafka's ConsumerGroupMetadataKey
    value (version 0)  int16 0 | int32 group epoch | uvarint 0 (no tagged fields: the value is
                       a flexible version)          present while the group exists
    key   (version 6)  int16 6 | group string          Kafka's
                       ConsumerGroupTargetAssignmentMetadataKey
    value (version 0)  int16 0 | int32 assignment epoch | uvarint 0
                                                    present while the group has members

The group record (3) says the group exists, as in Kafka: it is written when the group first
has members and tombstoned only when the group is deleted (DeleteGroups, expired offsets).
The target-assignment record (6) says the group had live members: after a crash the broker
cannot know who was consuming what, so for such groups it withholds unreported partitions for
a grace period while members rejoin (``apis/groups.py``). It is tombstoned when the last
member goes. So Kafka's own group coordinator, loading these records, sees an empty group with
its offsets where mq has one, and deletes a group only as Kafka does: the target assignment's
tombstone, then the group's, in one batch (Kafka refuses to load a log that deletes a group
whose target assignment was not deleted first). A data dir written before this layout (the
group record then meant "has members") loses that crash grace once, for the groups live at the
time.

The partition of a group is Kafka's ``abs(java_string_hash(group)) % partitions``. The broker
keeps every committed offset in a dict and rebuilds it by replaying the topic at start, so a
commit survives kill -9 once its record is in the log (acked after an fsync, like
``acks="all"``). The cleaner compacts the topic: the latest record per key wins.

Offsets committed inside a transaction (``TxnOffsetCommit``) are written as a transactional
batch of the producer (its id and epoch, no sequence) and held apart, per partition and
producer, until the transaction's COMMIT marker lands on that partition (they join the cache)
or its ABORT marker (they are dropped); replay at start follows the same rule, and what is
still pending then stays pending until the coordinator ends the transaction.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Iterable, Iterator
from typing import Final

from mq.broker.internal_topics import OFFSETS_TOPIC
from mq.errors import CorruptRecordError, InvalidRequestError
from mq.log.builder import build_batch
from mq.log.layout import CONTROL_COMMIT
from mq.log.log import PartitionLog

__all__ = ["OFFSETS_TOPIC", "CommittedOffset", "OffsetStore", "encode_key", "decode_key",
           "encode_assignment_key", "encode_group_key", "encode_group_value", "decode_group_key",
           "encode_value", "decode_value", "partition_for_group", "java_string_hash"]

_KEY_VERSION: Final = 1
_GROUP_KEY_VERSION: Final = 3
_ASSIGNMENT_KEY_VERSION: Final = 6
_VALUE_VERSION: Final = 3
_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")
_VALUE_HEAD: Final = struct.Struct(">hqi")       # version, offset, leader epoch
_I64: Final = struct.Struct(">q")


@dataclasses.dataclass(frozen=True, slots=True)
class CommittedOffset:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp_ms: int = -1


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (UTF-16 code units, int32 overflow)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def partition_for_group(group: str, partitions: int) -> int:
    """Kafka's coordinator partition: ``abs(hashCode) % partitions`` (Utils.abs: MIN -> 0)."""
    h = java_string_hash(group)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > 0x7FFF:
        raise InvalidRequestError(f"string of {len(data)} bytes is too long for an int16 "
                                  "length")
    return _I16.pack(len(data)) + data


def _read_string(buf: bytes, pos: int) -> tuple[str, int]:
    (n,) = _I16.unpack_from(buf, pos)
    pos += 2
    if n < 0 or pos + n > len(buf):
        raise ValueError(f"bad string length {n}")
    return buf[pos:pos + n].decode("utf-8"), pos + n


def encode_key(group: str, topic: str, partition: int) -> bytes:
    return _I16.pack(_KEY_VERSION) + _string(group) + _string(topic) + _I32.pack(partition)


def decode_key(data: bytes) -> tuple[str, str, int] | None:
    """``(group, topic, partition)`` for an offset-commit key; None for other key versions
    (Kafka's group-metadata records, version 2). Raises ``ValueError`` if malformed."""
    (version,) = _I16.unpack_from(data, 0)
    if version not in (0, 1):
        return None
    group, pos = _read_string(data, 2)
    topic, pos = _read_string(data, pos)
    (partition,) = _I32.unpack_from(data, pos)
    if pos + 4 != len(data):
        raise ValueError("trailing bytes after the offset key")
    return group, topic, partition


def encode_group_key(group: str) -> bytes:
    return _I16.pack(_GROUP_KEY_VERSION) + _string(group)


def encode_assignment_key(group: str) -> bytes:
    return _I16.pack(_ASSIGNMENT_KEY_VERSION) + _string(group)


def encode_group_value(epoch: int) -> bytes:
    # Kafka's ConsumerGroupMetadataValue and ConsumerGroupTargetAssignmentMetadataValue are
    # flexible from version 0: without the tagged-field count its coordinator (and
    # DumpLogSegments --offsets-decoder) cannot read them. Both are an epoch.
    return _I16.pack(0) + _I32.pack(epoch) + b"\x00"


encode_assignment_value = encode_group_value


def decode_group_record_key(data: bytes) -> tuple[int, str] | None:
    """(key version, group) of a group (3) or target-assignment (6) record key; None for
    other versions."""
    (version,) = _I16.unpack_from(data, 0)
    if version not in (_GROUP_KEY_VERSION, _ASSIGNMENT_KEY_VERSION):
        return None
    group, pos = _read_string(data, 2)
    if pos != len(data):
        raise ValueError("trailing bytes after the group key")
    return version, group


def decode_group_key(data: bytes) -> str | None:
    """The group of a group record key (version 3); None for other versions."""
    decoded = decode_group_record_key(data)
    return decoded[1] if decoded is not None and decoded[0] == _GROUP_KEY_VERSION else None


def encode_value(value: CommittedOffset) -> bytes:
    return (_VALUE_HEAD.pack(_VALUE_VERSION, value.offset, value.leader_epoch)
            + _string(value.metadata) + _I64.pack(value.commit_timestamp_ms))


def decode_value(data: bytes) -> CommittedOffset:
    """Versions 1 and 3 (1 has no leader epoch but an extra expire timestamp)."""
    (version,) = _I16.unpack_from(data, 0)
    if version == 3:
        _, offset, epoch = _VALUE_HEAD.unpack_from(data, 0)
        metadata, pos = _read_string(data, _VALUE_HEAD.size)
        (ts,) = _I64.unpack_from(data, pos)
        return CommittedOffset(offset, epoch, metadata, ts)
    if version in (0, 1):
        (offset,) = _I64.unpack_from(data, 2)
        metadata, pos = _read_string(data, 10)
        (ts,) = _I64.unpack_from(data, pos)
        return CommittedOffset(offset, -1, metadata, ts)
    raise ValueError(f"unknown offset value version {version}")


class OffsetStore:
    """The broker's cache of committed offsets over the ``__consumer_offsets`` logs."""

    def __init__(self, logs: list[PartitionLog]) -> None:
        self.logs = logs
        self.offsets: dict[str, dict[tuple[str, int], CommittedOffset]] = {}
        self.known_groups: set[str] = set()       # groups with a group record (3)
        self.live_groups: set[str] = set()        # ... and a target assignment (6): members
        # (offsets partition, producer id) -> group -> offsets of its open transaction, not
        # yet applied (the latest commit of a partition wins, as it will in ``offsets``)
        self.pending: dict[tuple[int, int],
                           dict[str, dict[tuple[str, int], CommittedOffset]]] = {}
        for plog in logs:
            self._replay(plog)

    def _replay(self, plog: PartitionLog) -> None:
        for batch in plog.batches():
            if batch.is_control:
                marker = batch.end_txn_marker() if batch.producer_id >= 0 else None
                if marker is not None:
                    self.end_transaction(plog.partition, batch.producer_id,
                                         marker[0] == CONTROL_COMMIT)
                continue
            held = (self.pending.setdefault((plog.partition, batch.producer_id), {})
                    if batch.is_transactional and batch.producer_id >= 0 else None)
            for rec in batch.records():
                if rec.key is None:
                    continue
                try:
                    key = decode_key(bytes(rec.key))
                    if held is not None:            # a TxnOffsetCommit: waits for its marker
                        if key is not None and rec.value is not None:
                            group, topic, partition = key
                            held.setdefault(group, {})[(topic, partition)] = \
                                decode_value(bytes(rec.value))
                        continue
                    if key is None:
                        self._replay_group_record(bytes(rec.key), rec.value is not None)
                        continue
                    group, topic, partition = key
                    if rec.value is None:
                        self._forget(group, (topic, partition))
                    else:
                        self.offsets.setdefault(group, {})[(topic, partition)] = \
                            decode_value(bytes(rec.value))
                except (ValueError, struct.error, UnicodeDecodeError) as err:
                    raise CorruptRecordError(plog.dir, rec.offset,
                                             f"bad __consumer_offsets record: {err}") from err

    def _replay_group_record(self, key: bytes, present: bool) -> None:
        decoded = decode_group_record_key(key)
        if decoded is None:
            return
        version, group = decoded
        held = self.known_groups if version == _GROUP_KEY_VERSION else self.live_groups
        if present:
            held.add(group)
        else:
            held.discard(group)
            if version == _GROUP_KEY_VERSION:
                self.live_groups.discard(group)

    def mark_group(self, group: str, live: bool, epoch: int, now_ms: int
                   ) -> PartitionLog | None:
        """Record that ``group`` has members (``live``) or no longer has; returns the log
        written to, or None when nothing changed. Not flushed by itself: the record only
        matters after a broker crash, which leaves the page cache intact."""
        if (group in self.live_groups) == live:
            return None
        records = [(now_ms, encode_assignment_key(group),
                    encode_assignment_value(epoch) if live else None)]
        if live and group not in self.known_groups:
            records.insert(0, (now_ms, encode_group_key(group), encode_group_value(epoch)))
        plog = self._append(group, records)
        if live:
            self.known_groups.add(group)
            self.live_groups.add(group)
        else:
            self.live_groups.discard(group)
        return plog

    def _forget(self, group: str, tp: tuple[str, int]) -> None:
        group_offsets = self.offsets.get(group)
        if group_offsets is not None:
            group_offsets.pop(tp, None)
            if not group_offsets:
                del self.offsets[group]

    def log_for(self, group: str) -> PartitionLog:
        return self.logs[partition_for_group(group, len(self.logs))]

    def _append(self, group: str, records: list[tuple], **batch) -> PartitionLog:
        """Append ``(timestamp_ms, key, value)`` records as one batch to the group's log
        (``batch``: ``build_batch`` options, a transactional producer's id and epoch)."""
        plog = self.log_for(group)
        plog.append(build_batch(records, **batch), from_client=False)
        return plog

    def commit(self, group: str, offsets: Iterable[tuple[str, int, CommittedOffset]],
               now_ms: int, producer_id: int = -1, producer_epoch: int = -1) -> PartitionLog:
        """Append one batch with every offset of the commit (atomic: one batch), update the
        cache, and return the log the caller must flush before acknowledging. With a
        ``producer_id`` the batch is that producer's, transactional: its offsets wait for the
        transaction's marker (``end_transaction``)."""
        items = list(offsets)
        records = [(now_ms, encode_key(group, topic, partition), encode_value(value))
                   for topic, partition, value in items]
        if producer_id < 0:
            plog = self._append(group, records)
            target = self.offsets
        else:
            plog = self._append(group, records, producer_id=producer_id,
                                producer_epoch=producer_epoch, is_transactional=True)
            target = self.pending.setdefault((plog.partition, producer_id), {})
        group_offsets = target.setdefault(group, {})
        for topic, partition, value in items:
            group_offsets[(topic, partition)] = value
        return plog

    def end_transaction(self, partition: int, producer_id: int, commit: bool) -> None:
        """A COMMIT/ABORT marker of ``producer_id`` landed on offsets partition
        ``partition``: apply (commit) or drop (abort) its pending offsets."""
        held = self.pending.pop((partition, producer_id), {})
        if commit:
            for group, group_offsets in held.items():
                self.offsets.setdefault(group, {}).update(group_offsets)

    def delete(self, group: str, partitions: Iterable[tuple[str, int]] | None = None,
               now_ms: int = 0) -> PartitionLog | None:
        """Tombstone the group's offsets (``partitions``' only, if given); without
        ``partitions`` the group goes too: its target assignment's tombstone, then its
        record's, after the offsets' in the same batch (Kafka's order)."""
        current = self.offsets.get(group, {})
        doomed = list(current) if partitions is None else [tp for tp in partitions
                                                           if tp in current]
        records = [(now_ms, encode_key(group, topic, partition), None)
                   for topic, partition in doomed]
        whole = partitions is None and group in self.known_groups
        if whole:
            records += [(now_ms, encode_assignment_key(group), None),
                        (now_ms, encode_group_key(group), None)]
        if not records:
            return None
        plog = self._append(group, records)
        for tp in doomed:
            self._forget(group, tp)
        if whole:
            self.known_groups.discard(group)
            self.live_groups.discard(group)
        return plog

    def pending_partitions(self, group: str) -> set[tuple[str, int]]:
        """The partitions of ``group`` with offsets held by a transaction not yet ended. One
        dict lookup per open transaction that committed offsets: few, and OffsetFetch is not
        a hot path, so no per-group index is kept beside ``pending``."""
        return {tp for held in self.pending.values() for tp in held.get(group, ())}

    def committed(self, group: str, topic: str, partition: int) -> CommittedOffset | None:
        return self.offsets.get(group, {}).get((topic, partition))

    def groups(self) -> Iterator[str]:
        return iter(sorted(self.offsets))

    def expired(self, now_ms: int, retention_ms: int, is_empty) -> list[str]:
        """Groups whose offsets expire: ``is_empty(group)`` (no live members) and the newest
        commit older than ``retention_ms`` (Kafka's offsets.retention.minutes rule for
        groups), or no commit at all; the caller deletes them with ``delete``."""
        out = []
        for group in sorted(set(self.offsets) | self.known_groups):
            offsets = self.offsets.get(group, {})
            newest = max((o.commit_timestamp_ms for o in offsets.values()), default=-1)
            if is_empty(group) and now_ms - newest > retention_ms:
                out.append(group)
        return out
