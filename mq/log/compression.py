"""The compression codecs of a RecordBatch v2's records section (attributes bits 0-2).

Pure. gzip is always there; snappy (``cramjam``), lz4 (``lz4``) and zstd (``zstandard``) are
optional packages, looked up once at import: ``available_codecs()`` says which this process
has, and compressing or decompressing with a missing one raises ``UnsupportedCodecError``
naming the package to install. The streams are Kafka's: gzip, LZ4 frames of 64 KiB independent
blocks, zstd frames, and snappy in xerial framing (raw snappy is read too).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from typing import Final

from mq.errors import UnsupportedCodecError

__all__ = ["NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD", "CODEC_NAMES", "codec_from_name",
           "available_codecs", "compress", "decompress"]

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
CODEC_NAMES: Final = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}


def codec_from_name(name: str | None) -> int:
    """``"lz4"`` -> 3. ``None`` and ``"none"`` -> 0. Raises ``ValueError`` for unknown names."""
    if name is None:
        return NONE
    for code, codec_name in CODEC_NAMES.items():
        if codec_name == name.lower():
            return code
    raise ValueError(f"unknown compression type {name!r}; expected one of "
                     f"{', '.join(CODEC_NAMES.values())}")


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


def compress(codec: int, data: bytes) -> bytes:
    """``data`` as ``codec``'s stream. Raises ``UnsupportedCodecError`` for a codec this
    process lacks or that does not exist."""
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


def decompress(codec: int, data: memoryview) -> bytes:
    """The bytes of ``codec``'s stream ``data``. Raises ``UnsupportedCodecError`` as
    ``compress`` does, and whatever the codec's library raises for a broken stream
    (``ValueError`` for a truncated gzip, zstd or xerial one)."""
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
