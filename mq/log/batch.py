"""RecordBatch: a lazy, zero-copy view over one RecordBatch v2 (``mq.log.layout``), its
records, and the scan that cuts a buffer of batches into such views.

Pure: no files, no sockets. A ``RecordBatch`` is a view over a ``memoryview`` of one batch, and
the keys and values of its records are slices of that view (or of the decompressed bytes, for
compressed batches): nothing is copied on the read path. Building a view checks the framing
(magic, a sane length); ``validate()`` checks the CRC and the header. Any malformed input
raises ``CorruptRecordError`` — never ``IndexError``, ``struct.error`` or ``ValueError``.
Records decode in C when the extension is built (``mq.log.native``); ``_records_py`` is the
reference it mirrors.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from mq.errors import CorruptRecordError, UnsupportedCodecError
from mq.log import native
from mq.log.compression import CODEC_NAMES, NONE, ZSTD, decompress
from mq.log.layout import (
    ATTRIBUTES_OFFSET,
    CODEC_MASK,
    CONTROL_ABORT,
    CONTROL_COMMIT,
    CONTROL_KEY,
    CONTROL_MASK,
    CREATE_TIME,
    DELETE_HORIZON_MASK,
    END_TXN_VALUE,
    FRAME,
    HEADER,
    HEADER_SIZE_UP_TO_MAGIC,
    LOG_APPEND_TIME,
    LOG_OVERHEAD,
    MAGIC,
    MIN_BATCH_LENGTH,
    NO_TIMESTAMP,
    RECORD_BATCH_OVERHEAD,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_MASK,
    crc32c,
)
from mq.log.varints import decode_varint

__all__ = ["BatchRecord", "RecordBatch", "iter_batches"]

_INT32_MAX: Final = (1 << 31) - 1


class BatchRecord:
    """One decoded record. ``key``/``value`` are memoryviews into the batch (or ``None``)."""

    __slots__ = ("offset", "timestamp", "key", "value", "headers")

    def __init__(self, offset: int, timestamp: int, key, value, headers) -> None:
        self.offset = offset
        self.timestamp = timestamp
        self.key = key
        self.value = value
        self.headers = headers

    def __repr__(self) -> str:
        return (f"BatchRecord(offset={self.offset}, timestamp={self.timestamp}, "
                f"key={_b(self.key)!r}, value={_b(self.value)!r}, "
                f"headers={[(k, _b(v)) for k, v in self.headers]!r})")

    def __eq__(self, other) -> bool:
        if not isinstance(other, BatchRecord):
            return NotImplemented
        return (self.offset, self.timestamp, _b(self.key), _b(self.value),
                [(k, _b(v)) for k, v in self.headers]) == (
            other.offset, other.timestamp, _b(other.key), _b(other.value),
            [(k, _b(v)) for k, v in other.headers])

    __hash__ = None  # type: ignore[assignment]


def _b(x):
    return None if x is None else bytes(x)


class RecordBatch:
    """A view over one RecordBatch v2.

    ``buffer`` must start at the batch and hold at least the whole batch; ``position`` and
    ``path`` only serve error messages (and ``mq dump-log``). Building the view checks the
    framing (magic and a sane length); ``validate()`` checks the CRC and the header fields.
    """

    __slots__ = ("buffer", "position", "path", "base_offset", "batch_length",
                 "partition_leader_epoch", "magic", "crc", "attributes", "last_offset_delta",
                 "base_timestamp", "max_timestamp", "producer_id", "producer_epoch",
                 "base_sequence", "records_count")

    def __init__(self, buffer, position: int = 0, path=None, header=None) -> None:
        """``header``: read the header fields from this copy of the batch's first
        ``RECORD_BATCH_OVERHEAD`` bytes, not from ``buffer`` (memory another process may
        write: ``PartitionLog.append(shared_head=)``)."""
        mv = buffer if isinstance(buffer, memoryview) else memoryview(buffer)
        if mv.format != "B" or mv.ndim != 1:
            mv = mv.cast("B")
        self.position = position
        self.path = path
        if len(mv) < RECORD_BATCH_OVERHEAD:
            raise CorruptRecordError(path, position, f"batch of {len(mv)} bytes is shorter "
                                     f"than the {RECORD_BATCH_OVERHEAD}-byte header")
        (self.base_offset, self.batch_length, self.partition_leader_epoch, self.magic, self.crc,
         self.attributes, self.last_offset_delta, self.base_timestamp, self.max_timestamp,
         self.producer_id, self.producer_epoch, self.base_sequence,
         self.records_count) = HEADER.unpack_from(mv if header is None else header)
        if self.magic != MAGIC:
            raise CorruptRecordError(path, position, f"unsupported magic {self.magic} "
                                     "(only RecordBatch v2 is supported)")
        if self.batch_length < MIN_BATCH_LENGTH:
            raise CorruptRecordError(path, position, f"batch length {self.batch_length} is "
                                     f"below the minimum {MIN_BATCH_LENGTH}")
        size = LOG_OVERHEAD + self.batch_length
        if len(mv) < size:
            raise CorruptRecordError(path, position, f"batch of {size} bytes is truncated to "
                                     f"{len(mv)} bytes")
        self.buffer = mv[:size]

    # derived header fields
    @property
    def size(self) -> int:
        """Bytes the batch occupies on disk (``batchLength + 12``)."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> int:
        return self.attributes & CODEC_MASK

    @property
    def compression_name(self) -> str:
        return CODEC_NAMES.get(self.compression, f"unknown({self.compression})")

    @property
    def timestamp_type(self) -> int:
        return LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_MASK else CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_MASK)

    @property
    def delete_horizon_ms(self) -> int:
        return self.base_timestamp if self.attributes & DELETE_HORIZON_MASK else NO_TIMESTAMP

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return -1
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF \
            if self.base_sequence + self.last_offset_delta > _INT32_MAX \
            else self.base_sequence + self.last_offset_delta

    def compute_crc(self) -> int:
        return crc32c(self.buffer[ATTRIBUTES_OFFSET:])

    @property
    def is_valid(self) -> bool:
        try:
            self.validate()
        except CorruptRecordError:
            return False
        return True

    def validate(self) -> None:
        """Check what Kafka's ``ensureValid`` checks, plus header sanity; raise if broken.

        Raises ``CorruptRecordError`` for a CRC mismatch, an invalid codec, a negative record
        count or unused attribute bits.
        """
        actual = self.compute_crc()
        if actual != self.crc:
            self._fail(f"CRC mismatch: stored {self.crc:#010x}, computed {actual:#010x}")
        self.validate_header()

    def validate_header(self) -> None:
        """``validate`` but the CRC (checked elsewhere: on the bytes a shared batch left in
        the file, ``LogSegment.append``)."""
        if self.compression > ZSTD:
            self._fail(f"invalid compression codec {self.compression}")
        if self.records_count < 0:
            self._fail(f"negative record count {self.records_count}")
        if self.last_offset_delta < 0:
            self._fail(f"negative last offset delta {self.last_offset_delta}")
        if self.attributes & ~0x7F:
            self._fail(f"unused attribute bits set in {self.attributes:#06x}")

    def _fail(self, reason: str, cause: BaseException | None = None):
        raise CorruptRecordError(self.path, self.position, reason) from cause

    def records_payload(self) -> memoryview:
        """The records section, decompressed if needed."""
        body = self.buffer[RECORD_BATCH_OVERHEAD:]
        codec = self.attributes & CODEC_MASK
        if codec == NONE:
            return body
        try:
            return memoryview(decompress(codec, body))
        except UnsupportedCodecError as err:
            raise UnsupportedCodecError(self.path, self.position, err.reason) from err
        except Exception as err:   # zlib.error, lz4/zstd/cramjam errors: each library its own
            self._fail(f"cannot decompress {CODEC_NAMES.get(codec, codec)} records: {err}", err)

    def counted_payload(self) -> tuple[int, memoryview]:
        """The record count and the records section, checked against each other (what every
        decoder starts from: ``records()``, ``mq.log.columns``). Raises ``CorruptRecordError``."""
        count = self.records_count
        if count < 0:
            self._fail(f"negative record count {count}")
        buf = self.records_payload()
        end = len(buf)
        if count > end:   # each record takes at least 7 bytes; cheap guard against huge counts
            self._fail(f"record count {count} exceeds the {end} bytes of records")
        return count, buf

    def __iter__(self) -> Iterator[BatchRecord]:
        return iter(self.records())

    def records(self) -> list[BatchRecord]:
        """Decode every record. Raises ``CorruptRecordError`` on any structural problem."""
        count, buf = self.counted_payload()
        decode = native.decode_records
        if decode is not None:                     # the C codec, when built
            try:
                return decode(buf, self.base_offset, self.base_timestamp,
                              self.attributes & TIMESTAMP_TYPE_MASK, self.max_timestamp, count)
            except ValueError as err:
                raise CorruptRecordError(self.path, self.position, str(err)) from err
        return self._records_py(buf, count)

    def _records_py(self, buf: memoryview, count: int) -> list[BatchRecord]:
        """The pure-Python decoder of the records section: the reference ``_crecords`` mirrors."""
        end = len(buf)
        base_offset = self.base_offset
        base_ts = self.base_timestamp
        log_append = self.attributes & TIMESTAMP_TYPE_MASK
        max_ts = self.max_timestamp
        out: list[BatchRecord] = []
        append = out.append
        pos = 0
        try:
            for _ in range(count):
                # length (varint)
                b = buf[pos]
                if b < 0x80:
                    length = (b >> 1) ^ -(b & 1)
                    pos += 1
                else:
                    length, pos = decode_varint(buf, pos, 5)
                rec_end = pos + length
                if length < 6 or rec_end > end:
                    raise ValueError(f"record length {length} does not fit the batch")
                pos += 1                                  # attributes (unused)
                b = buf[pos]
                if b < 0x80:
                    ts_delta = (b >> 1) ^ -(b & 1)
                    pos += 1
                else:
                    ts_delta, pos = decode_varint(buf, pos, 10)
                b = buf[pos]
                if b < 0x80:
                    off_delta = (b >> 1) ^ -(b & 1)
                    pos += 1
                else:
                    off_delta, pos = decode_varint(buf, pos, 5)
                b = buf[pos]
                if b < 0x80:
                    klen = (b >> 1) ^ -(b & 1)
                    pos += 1
                else:
                    klen, pos = decode_varint(buf, pos, 5)
                if klen < 0:
                    if klen != -1:
                        raise ValueError(f"invalid key length {klen}")
                    key = None
                else:
                    key = buf[pos:pos + klen]
                    pos += klen
                b = buf[pos]
                if b < 0x80:
                    vlen = (b >> 1) ^ -(b & 1)
                    pos += 1
                else:
                    vlen, pos = decode_varint(buf, pos, 5)
                if vlen < 0:
                    if vlen != -1:
                        raise ValueError(f"invalid value length {vlen}")
                    value = None
                else:
                    value = buf[pos:pos + vlen]
                    pos += vlen
                b = buf[pos]
                pos += 1
                if b == 0:
                    headers = []
                else:
                    headers, pos = self._headers(buf, pos - 1, rec_end)
                if pos != rec_end:
                    raise ValueError(f"record consumed {length - rec_end + pos} bytes but "
                                     f"declared {length}")
                append(BatchRecord(base_offset + off_delta,
                                   max_ts if log_append else base_ts + ts_delta,
                                   key, value, headers))
        except CorruptRecordError:
            raise
        except (IndexError, ValueError) as err:
            self._fail(f"malformed record {len(out)} of {count} at records byte {pos}: "
                       f"{err or 'premature end of records'}", err)
        if pos != end:
            self._fail(f"{end - pos} bytes left after {count} records "
                       "(incorrect declared batch size)")
        return out

    @staticmethod
    def _headers(buf, pos: int, rec_end: int) -> tuple[list, int]:
        count, pos = decode_varint(buf, pos, 5)
        if count < 0 or count > rec_end - pos:
            raise ValueError(f"invalid header count {count}")
        headers = []
        for _ in range(count):
            hklen, pos = decode_varint(buf, pos, 5)
            if hklen < 0 or pos + hklen > rec_end:
                raise ValueError(f"invalid header key length {hklen}")
            hkey = str(buf[pos:pos + hklen], "utf-8")
            pos += hklen
            hvlen, pos = decode_varint(buf, pos, 5)
            if hvlen < -1 or pos + hvlen > rec_end:
                raise ValueError(f"invalid header value length {hvlen}")
            if hvlen == -1:
                hval = None
            else:
                hval = buf[pos:pos + hvlen]
                pos += hvlen
            headers.append((hkey, hval))
        return headers, pos

    def end_txn_marker(self) -> tuple[int, int] | None:
        """For a COMMIT/ABORT marker batch, ``(control type, coordinator epoch)``; None for
        other control types. Raises ``CorruptRecordError`` if the record is malformed."""
        ctype = self.control_type()
        if ctype not in (CONTROL_ABORT, CONTROL_COMMIT):
            return None
        value = self.records()[0].value
        if value is None or len(value) < END_TXN_VALUE.size:
            self._fail("end-transaction marker value must hold 6 bytes")
        return ctype, END_TXN_VALUE.unpack_from(value)[1]

    def control_type(self) -> int:
        """For a control batch, the control record type (``CONTROL_ABORT``, ``CONTROL_COMMIT``,
        or another of Kafka's types). Raises ``CorruptRecordError`` if the key is malformed."""
        if not self.is_control:
            self._fail("not a control batch")
        records = self.records()
        if len(records) != 1 or records[0].key is None or len(records[0].key) < 4:
            self._fail("control batch must hold one record with a 4-byte key")
        version, ctype = CONTROL_KEY.unpack_from(records[0].key)
        if version < 0:
            self._fail(f"negative control record version {version}")
        return ctype

    def __repr__(self) -> str:
        return (f"RecordBatch(base_offset={self.base_offset}, last_offset={self.last_offset}, "
                f"count={self.records_count}, size={self.size}, "
                f"codec={self.compression_name}, position={self.position})")


def iter_batches(buffer, start: int = 0, end: int | None = None, path=None,
                 ) -> Iterator[RecordBatch]:
    """Yield each complete batch in ``buffer[start:end]``, in order, without validating CRCs.

    Stops quietly at a torn tail — fewer than 17 bytes left, or a batch that runs past ``end``
    (Kafka's ``FileLogInputStream``). Raises ``CorruptRecordError`` for framing that cannot be
    a batch (batch length below 49, magic other than 2), which is what a zero-filled or
    overwritten tail looks like.
    """
    mv = buffer if isinstance(buffer, memoryview) else memoryview(buffer)
    if end is None:
        end = len(mv)
    pos = start
    unpack = FRAME.unpack_from
    while end - pos >= HEADER_SIZE_UP_TO_MAGIC:
        _, length, _, magic = unpack(mv, pos)
        if length < MIN_BATCH_LENGTH:
            raise CorruptRecordError(path, pos, f"batch length {length} is below the minimum "
                                     f"{MIN_BATCH_LENGTH}")
        if magic != MAGIC:
            raise CorruptRecordError(path, pos, f"unsupported magic {magic}")
        size = LOG_OVERHEAD + length
        if pos + size > end:
            return
        yield RecordBatch(mv[pos:pos + size], pos, path)
        pos += size


