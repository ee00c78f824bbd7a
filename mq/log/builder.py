"""Building RecordBatch v2 batches (``mq.log.layout``): the records section a record at a
time, then the header and CRC around it.

Pure. ``RecordEncoder`` encodes records as they are appended, so a batch's size is known
exactly at every step (an upper bound once compressed); ``BatchBuilder`` seals them into a
batch. The records go into the C accumulator when the extension is built (``mq.log.native``),
whose encoding ``RecordEncoder`` is the byte-for-byte reference of; the producer's accumulator
(``mq.client.accumulator``) adds per-record futures to the same encoding. Every batch built
here passes ``RecordBatch.validate()``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, Final

from mq.log import native
from mq.log.compression import CODEC_NAMES, NONE, compress
from mq.log.layout import (
    ATTRIBUTES_OFFSET,
    CONTROL_KEY,
    CONTROL_MASK,
    CREATE_TIME,
    CRC_OFFSET,
    DELETE_HORIZON_MASK,
    END_TXN_VALUE,
    HEADER,
    LOG_APPEND_TIME,
    LOG_OVERHEAD,
    MAGIC,
    NO_PRODUCER_ID,
    NO_TIMESTAMP,
    RECORD_BATCH_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    crc32c,
    field,
)
from mq.log.varints import CACHED, NULL_VARINT, VARINTS, ZERO_VARINT, encode_varint, \
    encode_varint_uncached

__all__ = ["RecordEncoder", "BatchBuilder", "build_batch", "control_batch", "new_records"]

# Module globals, so the per-record loop below looks each up once.
_ENC: Final = VARINTS
_SMALL: Final = CACHED
_encode_varint_slow: Final = encode_varint_uncached
_NULL: Final = NULL_VARINT
_ZERO: Final = ZERO_VARINT
_ATTR0: Final = b"\x00"
_HEADER_ROOM: Final = bytearray(RECORD_BATCH_OVERHEAD)
_CRC: Final = field("crc")


def _encode_headers(headers) -> bytes:
    parts = [encode_varint(len(headers))]
    for hkey, hval in headers:
        kb = hkey.encode("utf-8") if isinstance(hkey, str) else bytes(hkey)
        parts.append(encode_varint(len(kb)))
        parts.append(kb)
        if hval is None:
            parts.append(_NULL)
        else:
            parts.append(encode_varint(len(hval)))
            parts.append(bytes(hval))
    return b"".join(parts)


class RecordEncoder:
    """The records section of one batch being built: encoded records and the counters its
    header needs. The pure-Python reference of ``_crecords.RecordAccumulator``'s encoding
    (``append``, ``records``, ``buffer``), which encodes into one growing buffer and mirrors
    this byte for byte (tests/unit/log/test_crecords.py).
    """

    __slots__ = ("_parts", "count", "size", "base_timestamp", "max_timestamp",
                 "last_offset_delta", "_horizon")

    def __init__(self, delete_horizon_ms: int = NO_TIMESTAMP) -> None:
        self._parts: list[bytes] = []
        self.count = 0
        self.size = RECORD_BATCH_OVERHEAD
        self.base_timestamp: int | None = None
        self.max_timestamp = NO_TIMESTAMP
        self.last_offset_delta = -1
        self._horizon = delete_horizon_ms

    def records(self) -> bytes:
        return b"".join(self._parts)

    def buffer(self) -> bytearray:
        """The batch so far: ``RECORD_BATCH_OVERHEAD`` zero bytes, room for its header, then
        the records. (The C twin hands out its own buffer when nothing else holds it, so
        ``BatchBuilder.build`` writes the header in place instead of copying the records.)"""
        return bytearray().join((_HEADER_ROOM, *self._parts))

    def checkpoint(self) -> tuple:
        """What ``rollback`` needs to take back every record appended after this call."""
        return (len(self._parts), self.size, self.count, self.base_timestamp,
                self.max_timestamp, self.last_offset_delta)

    def rollback(self, mark: tuple) -> None:
        """Take back the records appended since ``checkpoint()`` returned ``mark``."""
        del self._parts[mark[0]:]
        (_, self.size, self.count, self.base_timestamp, self.max_timestamp,
         self.last_offset_delta) = mark

    def append(self, timestamp_ms: int | None, key, value, headers: Sequence = (),
               offset_delta: int | None = None) -> int:
        """Encode one record (``None`` timestamp: now) at ``offset_delta`` (default: the next);
        returns its offset delta. Raises ``ValueError`` for a delta that does not follow the
        last one, ``TypeError``/``ValueError`` for a key, value or header of the wrong kind,
        and leaves the records as they were then."""
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        base_ts = self.base_timestamp
        if base_ts is None:
            # With a delete horizon (set by the cleaner), baseTimestamp holds the horizon and
            # record deltas are taken from it, so record timestamps stay exact.
            base_ts = timestamp_ms if self._horizon < 0 else self._horizon
        if offset_delta is None:
            offset_delta = self.last_offset_delta + 1
        elif offset_delta <= self.last_offset_delta:
            raise ValueError(f"offset delta {offset_delta} does not follow "
                             f"{self.last_offset_delta}")
        ts_delta = timestamp_ms - base_ts
        ts = _ENC[ts_delta + _SMALL] if -_SMALL <= ts_delta < _SMALL \
            else _encode_varint_slow(ts_delta)
        od = _ENC[offset_delta + _SMALL] if offset_delta < _SMALL \
            else _encode_varint_slow(offset_delta)
        if key is None:
            kl = _NULL
            klen = 0
        else:
            if type(key) is not bytes:
                key = bytes(key)                # a copy now: the caller may reuse its buffer
            klen = len(key)
            kl = _ENC[klen + _SMALL] if klen < _SMALL else _encode_varint_slow(klen)
        if value is None:
            vl = _NULL
            vlen = 0
        else:
            if type(value) is not bytes:
                value = bytes(value)
            vlen = len(value)
            vl = _ENC[vlen + _SMALL] if vlen < _SMALL else _encode_varint_slow(vlen)
        hb = _encode_headers(headers) if headers else _ZERO
        body_len = 1 + len(ts) + len(od) + len(kl) + klen + len(vl) + vlen + len(hb)
        ln = _ENC[body_len + _SMALL] if body_len < _SMALL else _encode_varint_slow(body_len)
        parts = self._parts
        parts.append(ln)
        parts.append(_ATTR0)
        parts.append(ts)
        parts.append(od)
        parts.append(kl)
        if key is not None:
            parts.append(key)
        parts.append(vl)
        if value is not None:
            parts.append(value)
        parts.append(hb)
        self.base_timestamp = base_ts
        self.last_offset_delta = offset_delta
        if timestamp_ms > self.max_timestamp:
            self.max_timestamp = timestamp_ms
        self.count += 1
        self.size += len(ln) + body_len
        return offset_delta


def new_records(delete_horizon_ms: int = NO_TIMESTAMP) -> Any:
    """An empty records section: the C accumulator when built, else a ``RecordEncoder``."""
    if native.RecordAccumulator is not None:
        return native.RecordAccumulator(delete_horizon_ms)
    return RecordEncoder(delete_horizon_ms)


class BatchBuilder:
    """Accumulates records and builds one RecordBatch v2 (baseOffset 0 unless given).

    ``append`` encodes the record at once, so ``size_in_bytes`` is exact for uncompressed
    batches and an upper bound for compressed ones — what a producer's ``batch_size`` needs.
    Timestamps are milliseconds; ``None`` means now (CreateTime). The records live in
    ``records``, an empty accumulator (default ``new_records(delete_horizon_ms)``; the
    producer's, with futures, from ``mq.client.accumulator``) made with the same
    ``delete_horizon_ms``; ``append`` is its bound method, so a record costs one call.
    """

    __slots__ = ("_acc", "append", "compression", "timestamp_type", "producer_id",
                 "producer_epoch", "base_sequence", "is_transactional", "is_control",
                 "partition_leader_epoch", "base_offset", "_delete_horizon_ms")

    def __init__(self, *, compression: int = NONE, timestamp_type: int = CREATE_TIME,
                 producer_id: int = NO_PRODUCER_ID, producer_epoch: int = -1,
                 base_sequence: int = -1, is_transactional: bool = False,
                 is_control: bool = False, partition_leader_epoch: int = -1,
                 base_offset: int = 0, delete_horizon_ms: int = NO_TIMESTAMP,
                 records: Any = None) -> None:
        if compression not in CODEC_NAMES:
            raise ValueError(f"invalid compression codec {compression}")
        self.compression = compression
        self.timestamp_type = timestamp_type
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.base_sequence = base_sequence
        self.is_transactional = is_transactional
        self.is_control = is_control
        self.partition_leader_epoch = partition_leader_epoch
        self.base_offset = base_offset
        self._delete_horizon_ms = delete_horizon_ms
        acc = self._acc = new_records(delete_horizon_ms) if records is None else records
        self.append = acc.append

    def __len__(self) -> int:
        return self._acc.count

    @property
    def size_in_bytes(self) -> int:
        return self._acc.size

    @property
    def accumulator(self) -> Any:
        """The records so far (``RecordEncoder``, the producer's ``RecordAccumulator`` or
        their C twin): ``size``, ``count``, ``append``..."""
        return self._acc

    def attributes(self) -> int:
        attrs = self.compression
        if self.timestamp_type == LOG_APPEND_TIME:
            attrs |= TIMESTAMP_TYPE_MASK
        if self.is_transactional:
            attrs |= TRANSACTIONAL_MASK
        if self.is_control:
            attrs |= CONTROL_MASK
        if self._delete_horizon_ms >= 0:
            attrs |= DELETE_HORIZON_MASK
        return attrs

    def build(self) -> bytearray:
        """The finished batch (header, records, CRC) as a ``bytearray``. Uncompressed, it is
        the accumulator's buffer with the header written in place (no copy of the records)
        when nothing else holds that buffer; building again rewrites its header. Raises
        ``UnsupportedCodecError`` for a codec this process lacks."""
        acc = self._acc
        if self.compression == NONE:
            out = acc.buffer()
        else:
            records = compress(self.compression, acc.records())
            out = bytearray(RECORD_BATCH_OVERHEAD + len(records))
            out[RECORD_BATCH_OVERHEAD:] = records
        base_ts = NO_TIMESTAMP if acc.base_timestamp is None else acc.base_timestamp
        if self._delete_horizon_ms >= 0:   # an empty batch must still carry its horizon
            base_ts = self._delete_horizon_ms
        HEADER.pack_into(out, 0, self.base_offset, len(out) - LOG_OVERHEAD,
                         self.partition_leader_epoch, MAGIC, 0, self.attributes(),
                         max(acc.last_offset_delta, 0), base_ts, acc.max_timestamp,
                         self.producer_id, self.producer_epoch, self.base_sequence, acc.count)
        with memoryview(out) as view:
            _CRC.pack_into(out, CRC_OFFSET, crc32c(view[ATTRIBUTES_OFFSET:]))
        return out


def control_batch(control_type: int, *, producer_id: int, producer_epoch: int,
                  coordinator_epoch: int = 0, timestamp_ms: int | None = None,
                  base_offset: int = 0, partition_leader_epoch: int = -1) -> bytearray:
    """A transaction marker: control + transactional batch with one record (78 bytes)."""
    builder = BatchBuilder(producer_id=producer_id, producer_epoch=producer_epoch,
                           is_transactional=True, is_control=True, base_offset=base_offset,
                           partition_leader_epoch=partition_leader_epoch)
    builder.append(timestamp_ms, CONTROL_KEY.pack(0, control_type),
                   END_TXN_VALUE.pack(0, coordinator_epoch))
    return builder.build()


def build_batch(records: Iterable[tuple], **kwargs) -> bytearray:
    """Convenience: ``records`` of ``(timestamp_ms, key, value[, headers])``."""
    builder = BatchBuilder(**kwargs)
    for rec in records:
        builder.append(*rec)
    return builder.build()
