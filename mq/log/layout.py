"""RecordBatch v2's wire layout — Kafka's on-disk and on-wire record format (magic 2) — as
named constants, and the two in-place header rewrites of the broker's append path.

Pure: no files, no sockets. ``HEADER_FIELDS`` is the one declaration of the batch header:
``HEADER`` (the whole 61-byte struct), every ``*_OFFSET`` and ``field()`` are derived from it,
so no other module spells a header offset or a field's format again.

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

Record layout (varints are protobuf zig-zag, ``mq.log.varints``; a varint is at most 5 bytes,
a varlong 10)::

    length varint | attributes int8 | timestampDelta varlong | offsetDelta varint |
    keyLength varint (-1 = null) | key | valueLength varint (-1 = null, a tombstone) | value |
    headerCount varint | (headerKeyLength varint >= 0 | utf-8 key | headerValueLength | value)*

Control batches (transaction markers) hold exactly one record whose key is int16 version +
int16 type (0 ABORT, 1 COMMIT) and whose value is int16 version + int32 coordinatorEpoch.
"""

from __future__ import annotations

import struct
from itertools import accumulate
from typing import Final

import crc32c as _crc32c_mod

__all__ = [
    "HEADER_FIELDS", "HEADER", "FRAME", "field",
    "BASE_OFFSET_OFFSET", "LENGTH_OFFSET", "PARTITION_LEADER_EPOCH_OFFSET", "MAGIC_OFFSET",
    "CRC_OFFSET", "ATTRIBUTES_OFFSET", "LAST_OFFSET_DELTA_OFFSET", "BASE_TIMESTAMP_OFFSET",
    "MAX_TIMESTAMP_OFFSET", "PRODUCER_ID_OFFSET", "PRODUCER_EPOCH_OFFSET",
    "BASE_SEQUENCE_OFFSET", "RECORDS_COUNT_OFFSET",
    "RECORD_BATCH_OVERHEAD", "LOG_OVERHEAD", "HEADER_SIZE_UP_TO_MAGIC", "MIN_BATCH_LENGTH",
    "MAGIC", "MAX_RECORD_OVERHEAD",
    "CODEC_MASK", "TIMESTAMP_TYPE_MASK", "TRANSACTIONAL_MASK", "CONTROL_MASK",
    "DELETE_HORIZON_MASK",
    "CREATE_TIME", "LOG_APPEND_TIME", "NO_TIMESTAMP", "NO_PRODUCER_ID",
    "CONTROL_ABORT", "CONTROL_COMMIT", "CONTROL_KEY", "END_TXN_VALUE",
    "crc32c", "stamp_batch", "set_log_append_time",
]

crc32c = _crc32c_mod.crc32c

# --- the header: one declaration -------------------------------------------------------------

HEADER_FIELDS: Final = (
    ("baseOffset", "q"), ("batchLength", "i"), ("partitionLeaderEpoch", "i"), ("magic", "b"),
    ("crc", "I"), ("attributes", "h"), ("lastOffsetDelta", "i"), ("baseTimestamp", "q"),
    ("maxTimestamp", "q"), ("producerId", "q"), ("producerEpoch", "h"), ("baseSequence", "i"),
    ("recordsCount", "i"),
)
HEADER: Final = struct.Struct(">" + "".join(code for _, code in HEADER_FIELDS))
_OFFSETS: Final = dict(zip((name for name, _ in HEADER_FIELDS),
                           accumulate((struct.calcsize(">" + code) for _, code in HEADER_FIELDS),
                                      initial=0), strict=False))


def field(name: str) -> struct.Struct:
    """The struct of one header field (``field("producerId")`` is ``>q``); read it at its
    ``*_OFFSET``. Raises ``KeyError`` for a name ``HEADER_FIELDS`` does not declare."""
    return struct.Struct(">" + dict(HEADER_FIELDS)[name])


# Kafka's DefaultRecordBatch names.
BASE_OFFSET_OFFSET: Final = _OFFSETS["baseOffset"]                        # 0
LENGTH_OFFSET: Final = _OFFSETS["batchLength"]                            # 8
PARTITION_LEADER_EPOCH_OFFSET: Final = _OFFSETS["partitionLeaderEpoch"]   # 12
MAGIC_OFFSET: Final = _OFFSETS["magic"]                                   # 16
CRC_OFFSET: Final = _OFFSETS["crc"]                                       # 17
ATTRIBUTES_OFFSET: Final = _OFFSETS["attributes"]                         # 21: CRC covers [21, end)
LAST_OFFSET_DELTA_OFFSET: Final = _OFFSETS["lastOffsetDelta"]             # 23
BASE_TIMESTAMP_OFFSET: Final = _OFFSETS["baseTimestamp"]                  # 27
MAX_TIMESTAMP_OFFSET: Final = _OFFSETS["maxTimestamp"]                    # 35
PRODUCER_ID_OFFSET: Final = _OFFSETS["producerId"]                        # 43
PRODUCER_EPOCH_OFFSET: Final = _OFFSETS["producerEpoch"]                  # 51
BASE_SEQUENCE_OFFSET: Final = _OFFSETS["baseSequence"]                    # 53
RECORDS_COUNT_OFFSET: Final = _OFFSETS["recordsCount"]                    # 57

RECORD_BATCH_OVERHEAD: Final = HEADER.size                                 # 61
LOG_OVERHEAD: Final = PARTITION_LEADER_EPOCH_OFFSET                        # 12: offset + length
# The frame: what tells a batch's size and format (baseOffset .. magic, 17 bytes).
FRAME: Final = struct.Struct(HEADER.format[:5])
HEADER_SIZE_UP_TO_MAGIC: Final = FRAME.size                                # 17
MIN_BATCH_LENGTH: Final = RECORD_BATCH_OVERHEAD - LOG_OVERHEAD             # 49
MAGIC: Final = 2
# Kafka's DefaultRecord.MAX_RECORD_OVERHEAD: what a record's framing adds to its key, value and
# headers at most, their lengths aside — length varint 5, attributes 1, timestampDelta
# varlong 10, offsetDelta varint 5.
MAX_RECORD_OVERHEAD: Final = 21

assert (RECORD_BATCH_OVERHEAD, CRC_OFFSET, ATTRIBUTES_OFFSET, PRODUCER_ID_OFFSET,
        RECORDS_COUNT_OFFSET) == (61, 17, 21, 43, 57)

# --- attributes -------------------------------------------------------------------------------

CODEC_MASK: Final = 0x07
TIMESTAMP_TYPE_MASK: Final = 0x08
TRANSACTIONAL_MASK: Final = 0x10
CONTROL_MASK: Final = 0x20
DELETE_HORIZON_MASK: Final = 0x40

CREATE_TIME, LOG_APPEND_TIME = 0, 1
NO_TIMESTAMP: Final = -1
NO_PRODUCER_ID: Final = -1

# --- control records --------------------------------------------------------------------------

CONTROL_ABORT, CONTROL_COMMIT = 0, 1
CONTROL_KEY: Final = struct.Struct(">hh")         # version, control type
END_TXN_VALUE: Final = struct.Struct(">hi")       # version, coordinator epoch

# --- in-place rewrites (broker append path) --------------------------------------------------

_BASE_OFFSET: Final = field("baseOffset")
_LENGTH: Final = field("batchLength")
_EPOCH: Final = field("partitionLeaderEpoch")
_CRC: Final = field("crc")
_ATTRS: Final = field("attributes")
_MAX_TS: Final = field("maxTimestamp")


def stamp_batch(buf: bytearray | memoryview, base_offset: int, leader_epoch: int,
                pos: int = 0) -> None:
    """Set baseOffset and partitionLeaderEpoch in place; neither is covered by the CRC."""
    _BASE_OFFSET.pack_into(buf, pos + BASE_OFFSET_OFFSET, base_offset)
    _EPOCH.pack_into(buf, pos + PARTITION_LEADER_EPOCH_OFFSET, leader_epoch)


def set_log_append_time(buf: bytearray | memoryview, now_ms: int, pos: int = 0) -> None:
    """Rewrite a batch for ``message.timestamp.type=LogAppendTime``: set the timestamp-type
    bit and maxTimestamp, then recompute the CRC (both fields are covered by it)."""
    (attrs,) = _ATTRS.unpack_from(buf, pos + ATTRIBUTES_OFFSET)
    _ATTRS.pack_into(buf, pos + ATTRIBUTES_OFFSET, attrs | TIMESTAMP_TYPE_MASK)
    _MAX_TS.pack_into(buf, pos + MAX_TIMESTAMP_OFFSET, now_ms)
    (length,) = _LENGTH.unpack_from(buf, pos + LENGTH_OFFSET)
    end = pos + LOG_OVERHEAD + length
    _CRC.pack_into(buf, pos + CRC_OFFSET, crc32c(memoryview(buf)[pos + ATTRIBUTES_OFFSET:end]))
