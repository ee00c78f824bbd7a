"""RecordBatch v2 — Kafka's on-disk and on-wire record format (magic 2), encoded and decoded.

Pure: no files, no sockets. Decoding is lazy and zero-copy: a ``RecordBatch`` is a view over a
``memoryview`` of one batch, and the keys and values of its records are slices of that view
(or of the decompressed bytes, for compressed batches). Any malformed input raises
``CorruptRecordError`` — never ``IndexError``, ``struct.error`` or ``ValueError``.

Batch layout (all integers big-endian; 61-byte header, ``RECORD_BATCH_OVERHEAD``)::

    off size field
      0   8  baseOffset            stamped by the broker on append
      8   4  batchLength           bytes after this field (batch size - 12), >= 49
     12   4  partitionLeaderEpoch  stamped by the broker; NOT covered by the CRC
     16   1  magic                 2
     17   4  crc                   CRC-32C (Castagnoli) of bytes [21, end)
     21   2  attributes            bits 0-2 codec, 3 LogAppendTime, 4 transactional,
                                   5 control, 6 hasDeleteHorizonMs
     23   4  lastOffsetDelta
     27   8  baseTimestamp         (delete horizon when bit 6 is set)
     35   8  maxTimestamp
     43   8  producerId            -1 if not idempotent
     51   2  producerEpoch
     53   4  baseSequence
     57   4  recordsCount
     61   .  records               one compressed stream of them when a codec is set

Record layout (varints are protobuf zig-zag; a varint is at most 5 bytes, a varlong 10)::

    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint |
    keyLength varint (-1 = null) | key | valueLength varint (-1 = null, a tombstone) | value |
    headerCount varint | (headerKeyLength varint >= 0 | utf-8 key | headerValueLength | value)*

Control batches (transaction markers) hold exactly one record whose key is int16 version +
int16 type (0 ABORT, 1 COMMIT) and whose value is int16 version + int32 coordinatorEpoch.
"""

from __future__ import annotations

import array
import gzip
import importlib
import os
import struct
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final

import crc32c as _crc32c_mod

from mq.errors import CorruptRecordError, UnsupportedCodecError

__all__ = [
    "RECORD_BATCH_OVERHEAD", "LOG_OVERHEAD", "HEADER_SIZE_UP_TO_MAGIC", "MAGIC",
    "NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD", "CODEC_NAMES", "codec_from_name",
    "CREATE_TIME", "LOG_APPEND_TIME", "NO_TIMESTAMP", "NO_PRODUCER_ID",
    "CONTROL_ABORT", "CONTROL_COMMIT", "CONTROL_KEY", "END_TXN_VALUE",
    "BatchRecord", "RecordBatch", "BatchBuilder", "RecordAccumulator", "RecordFuture",
    "FutureBase", "iter_batches", "control_batch",
    "stamp_batch", "set_log_append_time", "crc32c", "available_codecs",
    "encode_varint", "decode_varint",
]

crc32c = _crc32c_mod.crc32c

# --- constants --------------------------------------------------------------------------------

HEADER: Final = struct.Struct(">qiibIhiqqqhii")
RECORD_BATCH_OVERHEAD: Final = HEADER.size            # 61
LOG_OVERHEAD: Final = 12                               # baseOffset + batchLength
HEADER_SIZE_UP_TO_MAGIC: Final = 17
MIN_BATCH_LENGTH: Final = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD   # 49
MAGIC: Final = 2
CRC_OFFSET: Final = 17
ATTRIBUTES_OFFSET: Final = 21                          # CRC covers [21, end)
_FRAME: Final = struct.Struct(">qiib")                 # baseOffset, batchLength, epoch, magic
_OFFSET_AND_LENGTH: Final = struct.Struct(">qi")
_EPOCH: Final = struct.Struct(">i")
_CRC: Final = struct.Struct(">I")
_MAX_TS: Final = struct.Struct(">q")
_ATTRS: Final = struct.Struct(">h")

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES: Final = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}
_CODEC_MASK: Final = 0x07
_TIMESTAMP_TYPE_MASK: Final = 0x08
_TRANSACTIONAL_MASK: Final = 0x10
_CONTROL_MASK: Final = 0x20
_DELETE_HORIZON_MASK: Final = 0x40

CREATE_TIME, LOG_APPEND_TIME = 0, 1
NO_TIMESTAMP: Final = -1
NO_PRODUCER_ID: Final = -1
CONTROL_ABORT, CONTROL_COMMIT = 0, 1
CONTROL_KEY: Final = struct.Struct(">hh")         # version, control type
END_TXN_VALUE: Final = struct.Struct(">hi")       # version, coordinator epoch

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


def codec_from_name(name: str | None) -> int:
    """``"lz4"`` -> 3. ``None`` and ``"none"`` -> 0. Raises ``ValueError`` for unknown names."""
    if name is None:
        return NONE
    for code, codec_name in CODEC_NAMES.items():
        if codec_name == name.lower():
            return code
    raise ValueError(f"unknown compression type {name!r}; expected one of "
                     f"{', '.join(CODEC_NAMES.values())}")


# --- varints ----------------------------------------------------------------------------------

def _encode_varint_slow(value: int) -> bytes:
    v = (value << 1) ^ (value >> 63)        # zig-zag, 64-bit
    v &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


# Zig-zag varints of small integers, precomputed: encoding a 100-byte record then costs list
# lookups instead of bit twiddling (the per-record hot spot of a pure-Python producer).
_SMALL: Final = 1 << 13
_VARINT_CACHE: Final = [_encode_varint_slow(i) for i in range(-_SMALL, _SMALL)]


def encode_varint(value: int) -> bytes:
    """Zig-zag varint (varlong for values beyond int32) of ``value``."""
    if -_SMALL <= value < _SMALL:
        return _VARINT_CACHE[value + _SMALL]
    return _encode_varint_slow(value)


def decode_varint(buf, pos: int, limit: int = 10) -> tuple[int, int]:
    """Decode a zig-zag varint at ``buf[pos]``; returns ``(value, next_pos)``.

    Raises ``IndexError`` at the end of the buffer and ``ValueError`` when the varint runs past
    ``limit`` bytes (5 for varint, 10 for varlong); callers turn both into CorruptRecordError.
    """
    b = buf[pos]
    pos += 1
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos
    result = b & 0x7F
    shift = 7
    for _ in range(limit - 1):
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
    raise ValueError(f"varint longer than {limit} bytes")


# --- compression ------------------------------------------------------------------------------

def _optional(module: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        return None


_lz4_frame = _optional("lz4.frame")
_zstd = _optional("zstandard")
_cramjam = _optional("cramjam")

# xerial snappy framing (what Kafka's Java client writes): 8-byte magic, version 1, compat 1,
# then [int32 compressed length, raw snappy block]*.
_XERIAL_HEADER: Final = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK: Final = 32 * 1024
_BE_INT32: Final = struct.Struct(">i")


def available_codecs() -> dict[str, bool]:
    """Which codecs this process can read and write: ``{"gzip": True, "zstd": False, ...}``."""
    return {"none": True, "gzip": True, "snappy": _cramjam is not None,
            "lz4": _lz4_frame is not None, "zstd": _zstd is not None}


def _missing(codec: int) -> UnsupportedCodecError:
    package = {SNAPPY: "cramjam", LZ4: "lz4", ZSTD: "zstandard"}.get(codec)
    name = CODEC_NAMES.get(codec, f"codec {codec}")
    hint = f"; install the '{package}' package (pip install 'mq[codecs]')" if package else ""
    return UnsupportedCodecError(None, 0, f"{name} compression is not available{hint}")


def _compress(codec: int, data: bytes) -> bytes:
    if codec == GZIP:
        return gzip.compress(data, compresslevel=6, mtime=0)
    if codec == LZ4:
        if _lz4_frame is None:
            raise _missing(codec)
        # Kafka's KafkaLZ4BlockOutputStream: standard frame, 64 KiB independent blocks.
        return _lz4_frame.compress(data, block_size=_lz4_frame.BLOCKSIZE_MAX64KB,
                                   block_linked=False, content_checksum=False)
    if codec == ZSTD:
        if _zstd is None:
            raise _missing(codec)
        return _zstd.ZstdCompressor(level=3).compress(data)
    if codec == SNAPPY:
        if _cramjam is None:
            raise _missing(codec)
        parts = [_XERIAL_HEADER]
        view = memoryview(data)
        for start in range(0, len(data), _XERIAL_BLOCK):
            block = bytes(_cramjam.snappy.compress_raw(view[start:start + _XERIAL_BLOCK]))
            parts.append(_BE_INT32.pack(len(block)))
            parts.append(block)
        return b"".join(parts)
    raise UnsupportedCodecError(None, 0, f"invalid compression codec {codec}")


def _decompress(codec: int, data: memoryview) -> bytes:
    if codec == GZIP:
        d = zlib.decompressobj(wbits=47)          # 32 + 15: gzip or zlib header, auto-detected
        out = d.decompress(data)
        if not d.eof:
            raise ValueError("truncated gzip stream")
        return out
    if codec == LZ4:
        if _lz4_frame is None:
            raise _missing(codec)
        return _lz4_frame.decompress(data)
    if codec == ZSTD:
        if _zstd is None:
            raise _missing(codec)
        d = _zstd.ZstdDecompressor().decompressobj()
        out = d.decompress(data)
        if not d.eof:
            raise ValueError("truncated zstd stream")
        return out
    if codec == SNAPPY:
        if _cramjam is None:
            raise _missing(codec)
        if bytes(data[:8]) != _XERIAL_HEADER[:8]:
            return bytes(_cramjam.snappy.decompress_raw(data))
        parts, pos = [], 16
        while pos < len(data):
            (n,) = _BE_INT32.unpack_from(data, pos)
            pos += 4
            if n < 0 or pos + n > len(data):
                raise ValueError("truncated xerial snappy block")
            parts.append(bytes(_cramjam.snappy.decompress_raw(data[pos:pos + n])))
            pos += n
        return b"".join(parts)
    raise UnsupportedCodecError(None, 0, f"invalid compression codec {codec}")


# --- optional C codec (begin) ----------------------------------------------------------------
# mq/log/_crecords.c, built by setup.py when a C compiler is available, decodes the records
# section ~7-10x and accumulates records (BatchBuilder.append, the producer's add) several times
# faster; RecordBatch._records_py and RecordAccumulator stay the reference it mirrors byte for
# byte. Its records are ``_crecords.Record`` objects: same attributes, equal to an equal
# BatchRecord.
# MQ_PURE_PYTHON=1 (any value but "" or "0") forces the pure-Python paths.

_decode_records_c: Callable[..., list] | None = None
_decode_columns_c: Callable[..., int] | None = None
_crecords_mod: Any = None                       # for RecordAccumulator / RecordFuture
if os.environ.get("MQ_PURE_PYTHON", "") in ("", "0"):
    try:
        _crecords = importlib.import_module("mq.log._crecords")
        _decode_records_c = _crecords.decode_records
        # getattr: an extension built before decode_columns existed still serves the rest.
        _decode_columns_c = getattr(_crecords, "decode_columns", None)
        if hasattr(_crecords, "RecordAccumulator"):
            _crecords_mod = _crecords
    except ImportError:
        pass

# --- optional C codec (end) ------------------------------------------------------------------


# --- decoding ---------------------------------------------------------------------------------

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
        return self.attributes & _CODEC_MASK

    @property
    def compression_name(self) -> str:
        return CODEC_NAMES.get(self.compression, f"unknown({self.compression})")

    @property
    def timestamp_type(self) -> int:
        return LOG_APPEND_TIME if self.attributes & _TIMESTAMP_TYPE_MASK else CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_MASK)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & _DELETE_HORIZON_MASK)

    @property
    def delete_horizon_ms(self) -> int:
        return self.base_timestamp if self.attributes & _DELETE_HORIZON_MASK else NO_TIMESTAMP

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
        codec = self.attributes & _CODEC_MASK
        if codec == NONE:
            return body
        try:
            return memoryview(_decompress(codec, body))
        except UnsupportedCodecError as err:
            raise UnsupportedCodecError(self.path, self.position, err.reason) from err
        except Exception as err:   # zlib.error, lz4/zstd/cramjam errors: each library its own
            self._fail(f"cannot decompress {CODEC_NAMES.get(codec, codec)} records: {err}", err)

    def _counted_payload(self) -> tuple[int, memoryview]:
        """The record count and the records section, checked against each other (the decoders'
        common start). Raises ``CorruptRecordError``."""
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
        count, buf = self._counted_payload()
        if _decode_records_c is not None:          # optional C codec, see above
            try:
                return _decode_records_c(buf, self.base_offset, self.base_timestamp,
                                         self.attributes & _TIMESTAMP_TYPE_MASK,
                                         self.max_timestamp, count)
            except ValueError as err:
                raise CorruptRecordError(self.path, self.position, str(err)) from err
        return self._records_py(buf, count)

    def decode_columns(self, columns: list[bytearray], lo: int, hi: int) -> int:
        """Append the records whose offsets are in ``[lo, hi)`` to eight column bytearrays
        instead of building objects (``mq.spark`` builds Arrow columns of them): offsets
        (int64), timestamps (int64 ms), key ends (int32: the key data's length after each key),
        key data, key validity (a byte: 1, or 0 for null), then the same three for values,
        native byte order. Header values are validated but not kept. Returns how many records
        were appended. Raises ``CorruptRecordError`` as ``records()`` does (the columns are
        then left as they were)."""
        count, buf = self._counted_payload()
        if _decode_columns_c is not None:          # optional C codec, see above
            try:
                return _decode_columns_c(buf, self.base_offset, self.base_timestamp,
                                         self.attributes & _TIMESTAMP_TYPE_MASK,
                                         self.max_timestamp, count, lo, hi, columns)
            except (ValueError, OverflowError) as err:
                raise CorruptRecordError(self.path, self.position, str(err)) from err
        return _append_columns(columns, [r for r in self._records_py(buf, count)
                                         if lo <= r.offset < hi])

    def _records_py(self, buf: memoryview, count: int) -> list[BatchRecord]:
        """The pure-Python decoder of the records section: the reference ``_crecords`` mirrors."""
        end = len(buf)
        base_offset = self.base_offset
        base_ts = self.base_timestamp
        log_append = self.attributes & _TIMESTAMP_TYPE_MASK
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


def _append_columns(columns: list[bytearray], records: list[BatchRecord]) -> int:
    """The pure-Python ``decode_columns``: what the C codec appends, from decoded records."""
    try:
        out = [array.array("q", [r.offset for r in records]).tobytes(),
               array.array("q", [r.timestamp for r in records]).tobytes()]
    except OverflowError as err:
        raise CorruptRecordError(None, 0, "record offset or timestamp does not fit int64") \
            from err
    for field, column in (("key", 3), ("value", 6)):
        values = [getattr(r, field) for r in records]
        ends = array.array("q")
        size = len(columns[column])
        for v in values:
            size += 0 if v is None else len(v)
            ends.append(size)
        if size > _INT32_MAX:
            raise CorruptRecordError(None, 0, "a data column would pass 2**31 - 1 bytes")
        out += [array.array("i", ends).tobytes(), b"".join(v for v in values if v is not None),
                bytes(v is not None for v in values)]
    for column, data in zip(columns, out, strict=True):
        column += data
    return len(records)


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
    unpack = _FRAME.unpack_from
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


# --- in-place rewrites (broker append path) --------------------------------------------------

def stamp_batch(buf: bytearray | memoryview, base_offset: int, leader_epoch: int,
                pos: int = 0) -> None:
    """Set baseOffset and partitionLeaderEpoch in place; neither is covered by the CRC."""
    _OFFSET_AND_LENGTH.pack_into(buf, pos, base_offset, _OFFSET_AND_LENGTH.unpack_from(buf, pos)[1])
    _EPOCH.pack_into(buf, pos + 12, leader_epoch)


def set_log_append_time(buf: bytearray | memoryview, now_ms: int, pos: int = 0) -> None:
    """Rewrite a batch for ``message.timestamp.type=LogAppendTime``: set the timestamp-type
    bit and maxTimestamp, then recompute the CRC (both fields are covered by it)."""
    (attrs,) = _ATTRS.unpack_from(buf, pos + ATTRIBUTES_OFFSET)
    _ATTRS.pack_into(buf, pos + ATTRIBUTES_OFFSET, attrs | _TIMESTAMP_TYPE_MASK)
    _MAX_TS.pack_into(buf, pos + 35, now_ms)
    (length,) = _EPOCH.unpack_from(buf, pos + 8)
    end = pos + LOG_OVERHEAD + length
    _CRC.pack_into(buf, pos + CRC_OFFSET, crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET:end]))


# --- encoding ---------------------------------------------------------------------------------

_ENC: Final = _VARINT_CACHE
_NULL: Final = _VARINT_CACHE[-1 + _SMALL]          # b"\x01"
_ZERO: Final = _VARINT_CACHE[_SMALL]               # b"\x00"
_ATTR0: Final = b"\x00"
_HEADER_ROOM: Final = bytearray(RECORD_BATCH_OVERHEAD)


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


class RecordFuture:
    """Base of the producer's per-record future (``producer_batches.FutureRecordMetadata``):
    the batch, the record's offset delta and timestamp — a view into the batch's outcome,
    so a record needs no future object of its own beyond these three fields.
    ``_crecords.RecordFuture`` is the same in C, which ``RecordAccumulator.add`` fills
    without running Python code."""

    __slots__ = ("_batch", "_delta", "_ts")

    def __init__(self, batch: Any, delta: int, timestamp_ms: int) -> None:
        self._batch = batch
        self._delta = delta
        self._ts = timestamp_ms


class RecordAccumulator:
    """The records section of one batch being built: encoded records and the counters its
    header needs. The pure-Python reference of ``_crecords.RecordAccumulator``, which encodes
    into one growing buffer and mirrors it byte for byte (tests/unit/log/test_crecords.py).

    ``append`` is ``BatchBuilder.append``. ``add(timestamp_ms, key, value, headers)`` appends
    with the next offset delta and returns ``future_type(owner, delta, timestamp)`` — the
    producer's whole per-record step in one call.
    """

    __slots__ = ("_parts", "count", "size", "base_timestamp", "max_timestamp",
                 "last_offset_delta", "_horizon", "_future_type", "_owner")

    def __init__(self, delete_horizon_ms: int = NO_TIMESTAMP, future_type: type | None = None,
                 owner: Any = None, capacity: int = 0, buffer: bytearray | None = None) -> None:
        # capacity (a full batch's bytes, when known) and buffer (a finished batch's bytearray
        # to reuse) only serve the C twin, which builds the batch in place
        self._parts: list[bytes] = []
        self.count = 0
        self.size = RECORD_BATCH_OVERHEAD
        self.base_timestamp: int | None = None
        self.max_timestamp = NO_TIMESTAMP
        self.last_offset_delta = -1
        self._horizon = delete_horizon_ms
        self._future_type = future_type
        self._owner = owner

    def records(self) -> bytes:
        return b"".join(self._parts)

    def buffer(self) -> bytearray:
        """The batch so far: ``RECORD_BATCH_OVERHEAD`` zero bytes, room for its header, then
        the records. (The C twin hands out its own buffer when nothing else holds it, so
        ``BatchBuilder.build`` writes the header in place instead of copying the records.)"""
        return bytearray().join((_HEADER_ROOM, *self._parts))

    def add(self, timestamp_ms: int | None, key, value, headers: Sequence) -> Any:
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        return self._future(self.append(timestamp_ms, key, value, headers), timestamp_ms)

    def _future(self, delta: int, timestamp_ms: int) -> Any:
        if self._future_type is None:
            raise TypeError("add() needs an accumulator with a future_type")
        fut = object.__new__(self._future_type)
        RecordFuture.__init__(fut, self._owner, delta, timestamp_ms)
        return fut

    def extend(self, timestamp_ms: int | None, values: list, keys: list | None,
               headers: Sequence, start: int, limit: int, out: list) -> int:
        """``add`` for ``values[start:]`` (with ``keys[i]``, or None; one timestamp, None:
        now, and the same headers for all), each future appended to ``out``, while the batch
        stays within ``limit`` bytes (an empty batch takes its first record whatever its
        size); returns the index of the first record left out."""
        if timestamp_ms is None:
            timestamp_ms = int(time.time() * 1000)
        i = start
        while i < len(values):
            mark = (len(self._parts), self.size, self.count, self.base_timestamp,
                    self.max_timestamp, self.last_offset_delta)
            delta = self.append(timestamp_ms, None if keys is None else keys[i], values[i],
                                headers)
            if mark[2] and self.size > limit:          # does not fit: take it back out
                del self._parts[mark[0]:]
                (_, self.size, self.count, self.base_timestamp, self.max_timestamp,
                 self.last_offset_delta) = mark
                break
            out.append(self._future(delta, timestamp_ms))
            i += 1
        return i

    def append(self, timestamp_ms: int | None, key, value, headers: Sequence = (),
               offset_delta: int | None = None) -> int:
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


class BatchBuilder:
    """Accumulates records and builds one RecordBatch v2 (baseOffset 0 unless given).

    ``append`` encodes the record at once, so ``size_in_bytes`` is exact for uncompressed
    batches and an upper bound for compressed ones — what a producer's ``batch_size`` needs.
    Timestamps are milliseconds; ``None`` means now (CreateTime). The records live in a
    ``RecordAccumulator`` (C when built); ``append`` and ``add`` are its bound methods, so a
    record costs one call. ``future_type``/``owner``: see ``RecordAccumulator.add``;
    ``capacity``: the bytes of a full batch, if known (the C accumulator sizes its buffer);
    ``buffer``: a ``bytearray`` nothing else holds (a finished batch's), for the C accumulator
    to build this batch in.
    """

    __slots__ = ("_acc", "append", "add", "compression", "timestamp_type", "producer_id",
                 "producer_epoch", "base_sequence", "is_transactional", "is_control",
                 "partition_leader_epoch", "base_offset", "_delete_horizon_ms")

    def __init__(self, *, compression: int = NONE, timestamp_type: int = CREATE_TIME,
                 producer_id: int = NO_PRODUCER_ID, producer_epoch: int = -1,
                 base_sequence: int = -1, is_transactional: bool = False,
                 is_control: bool = False, partition_leader_epoch: int = -1,
                 base_offset: int = 0, delete_horizon_ms: int = NO_TIMESTAMP,
                 future_type: type | None = None, owner: Any = None,
                 capacity: int = 0, buffer: bytearray | None = None) -> None:
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
        acc = self._acc = _Accumulator(delete_horizon_ms, future_type, owner, capacity, buffer)
        self.append = acc.append
        self.add = acc.add

    def __len__(self) -> int:
        return self._acc.count

    @property
    def size_in_bytes(self) -> int:
        return self._acc.size

    @property
    def accumulator(self) -> Any:
        """The records so far (``RecordAccumulator`` or its C twin): ``size``, ``count``,
        ``add``, ``extend`` (C only)..."""
        return self._acc

    def attributes(self) -> int:
        attrs = self.compression
        if self.timestamp_type == LOG_APPEND_TIME:
            attrs |= _TIMESTAMP_TYPE_MASK
        if self.is_transactional:
            attrs |= _TRANSACTIONAL_MASK
        if self.is_control:
            attrs |= _CONTROL_MASK
        if self._delete_horizon_ms >= 0:
            attrs |= _DELETE_HORIZON_MASK
        return attrs

    def build(self) -> bytearray:
        """The finished batch (header, records, CRC) as a ``bytearray``. Uncompressed, it is
        the accumulator's buffer with the header written in place (no copy of the records)
        when nothing else holds that buffer; building again rewrites its header."""
        acc = self._acc
        if self.compression == NONE:
            out = acc.buffer()
        else:
            records = _compress(self.compression, acc.records())
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


# What BatchBuilder accumulates into, and the base its owners' futures must derive from:
# the C ones when built (see "optional C codec"), else the pure-Python references.
_Accumulator: Any = RecordAccumulator
FutureBase: Any = RecordFuture
if _crecords_mod is not None:
    _Accumulator, FutureBase = _crecords_mod.RecordAccumulator, _crecords_mod.RecordFuture


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


__all__.append("build_batch")
