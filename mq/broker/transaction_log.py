"""Records of ``__transaction_state``, the compacted topic that holds the transaction
coordinator's state, in Kafka's formats (``TransactionLogKey`` v0, ``TransactionLogValue`` v0;
big-endian, strings int16 length + UTF-8, arrays int32 count)::

    key    int16 version 0 | transactionalId string
    value  int16 version 0 | producerId int64 | producerEpoch int16 |
           transactionTimeoutMs int32 | transactionStatus int8 |
           partitions [topic string, [partition int32]] |
           transactionLastUpdateTimestampMs int64 | transactionStartTimestampMs int64
    a null value (tombstone) removes the transactional id

Status ids are Kafka's: Empty 0, Ongoing 1, PrepareCommit 2, PrepareAbort 3, CompleteCommit 4,
CompleteAbort 5, Dead 6, PrepareEpochFence 7.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from collections.abc import Iterable
from typing import Final

from mq.broker.internal_topics import TRANSACTION_STATE_TOPIC
from mq.errors import InvalidRequestError

__all__ = ["TRANSACTION_STATE_TOPIC", "TxnMetadata", "TxnState", "decode_key", "decode_value",
           "encode_key", "encode_value"]

_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")
_VALUE_HEAD: Final = struct.Struct(">hqhib")        # version, pid, epoch, timeout, status
_TIMES: Final = struct.Struct(">qq")


class TxnState(enum.IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        return "".join(part.capitalize() for part in self.name.split("_"))


@dataclasses.dataclass(frozen=True, slots=True)
class TxnMetadata:
    """One transactional id's state (a value of ``__transaction_state``)."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[tuple[str, int]] = frozenset()
    last_update_ms: int = -1
    start_ms: int = -1


def _string(text: str) -> bytes:
    data = text.encode("utf-8")
    if len(data) > 0x7FFF:
        raise InvalidRequestError(f"string of {len(data)} bytes is too long for an int16 "
                                  "length")
    return _I16.pack(len(data)) + data


def _read_string(buf, pos: int) -> tuple[str, int]:
    (n,) = _I16.unpack_from(buf, pos)
    pos += 2
    if n < 0 or pos + n > len(buf):
        raise ValueError(f"bad string length {n}")
    return bytes(buf[pos:pos + n]).decode("utf-8"), pos + n


def encode_key(transactional_id: str) -> bytes:
    return _I16.pack(0) + _string(transactional_id)


def decode_key(data) -> str:
    """Raises ``ValueError`` for another version or a malformed key."""
    (version,) = _I16.unpack_from(data, 0)
    if version != 0:
        raise ValueError(f"transaction log key version {version}")
    tid, pos = _read_string(data, 2)
    if pos != len(data):
        raise ValueError("trailing bytes after the transaction log key")
    return tid


def _by_topic(partitions: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for topic, partition in sorted(partitions):
        out.setdefault(topic, []).append(partition)
    return out


def encode_value(meta: TxnMetadata) -> bytes:
    out = bytearray(_VALUE_HEAD.pack(0, meta.producer_id, meta.producer_epoch, meta.timeout_ms,
                                     int(meta.state)))
    topics = _by_topic(meta.partitions)
    out += _I32.pack(len(topics))
    for topic, parts in topics.items():
        out += _string(topic) + _I32.pack(len(parts))
        out += b"".join(_I32.pack(p) for p in parts)
    out += _TIMES.pack(meta.last_update_ms, meta.start_ms)
    return bytes(out)


def decode_value(transactional_id: str, data) -> TxnMetadata:
    """Raises ``ValueError`` (or ``struct.error``) for a malformed value."""
    version, pid, epoch, timeout, status = _VALUE_HEAD.unpack_from(data, 0)
    if version not in (0, 1):
        raise ValueError(f"transaction log value version {version}")
    pos = _VALUE_HEAD.size
    (count,) = _I32.unpack_from(data, pos)
    pos += 4
    partitions = set()
    for _ in range(max(count, 0)):
        topic, pos = _read_string(data, pos)
        (n,) = _I32.unpack_from(data, pos)
        pos += 4
        for _ in range(n):
            partitions.add((topic, _I32.unpack_from(data, pos)[0]))
            pos += 4
    last_update, start = _TIMES.unpack_from(data, pos)
    return TxnMetadata(transactional_id, pid, epoch, timeout, TxnState(status),
                       frozenset(partitions), last_update, start)
