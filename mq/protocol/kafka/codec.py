"""Kafka's binary protocol, driven by the schema table: frames in, dicts out, and back.

Sans-I/O. ``decode_request`` takes one frame (the bytes after the 4-byte size) and returns the
request header and body as dicts keyed by Kafka's field names in snake case
(``partition_index``, ``max_wait_ms``); ``encode_response`` turns a body dict back into the
parts of one response frame. Every fact about a message — which fields a version has, which
are nullable or tagged, where flexible encoding starts — comes from ``schemas.py`` (generated
from Apache Kafka's JSON schemas); nothing here names an api but ApiVersions' header rule.

Encoding rules (Kafka's ``protocol.html``, KIP-482)::

    int8 int16 int32 int64 uint16 float64   big-endian; bool one byte
    string   int16 length (-1 null) + UTF-8     flexible: uvarint length+1 (0 null)
    bytes    int32 length (-1 null) + bytes     flexible: uvarint length+1 (0 null)
    records  as bytes (a RecordBatch sequence, kept as a memoryview of the frame)
    array    int32 count (-1 null) + items      flexible: uvarint count+1 (0 null)
    struct   its fields; flexible: then a tagged-field section, uvarint count of
             (uvarint tag, uvarint size, bytes), unknown tags skipped
    nullable struct (a ``{}`` field with nullable versions): int8 -1 null, 1 present

A records value in a response may be a ``FileRegion``: ``encode_response`` then returns the
frame as several parts, bytes around the region, so the listener can ``sendfile`` the region
straight from a segment file.

Decoding is total: any byte string either decodes or raises ``KafkaDecodeError`` (a
``RemoteProtocolError``: the peer broke the protocol); lengths and counts are checked against
the bytes left before anything is allocated, so what a frame claims allocates nothing. What
it holds does: a decoded dict per struct item, and an item takes 2 bytes at the least, so a
frame could decode into about 100 times its size in Python objects (1 MB of Metadata v1
topics with empty names: 96 MB). So one message holds at most ``MAX_ITEMS`` array items in
all (2**20, as many as a broker has partitions at most; about 200 MB decoded at worst) —
not 50 million in a 100 MiB frame.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from typing import Any, NamedTuple

from mq.errors import KafkaDecodeError
from mq.protocol.kafka.schemas import APIS, DATA

__all__ = ["FileRegion", "KafkaDecodeError", "RequestHeader", "decode_data", "decode_request",
           "decode_response", "encode_data", "encode_request", "encode_response",
           "header_versions", "schema_range"]

_OPEN_END = 0x7FFF
MAX_ITEMS = 1 << 20            # array items in one message, nested ones included


class FileRegion(NamedTuple):
    """``length`` bytes of the open file ``fd`` from ``offset``: a records value sent with
    ``sendfile`` instead of being copied into the frame. The owner closes ``fd``."""

    fd: int
    offset: int
    length: int


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_size: int            # bytes before the body


# --- decoding -------------------------------------------------------------------------------
_I8, _I16, _I32, _I64 = struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">i"), \
    struct.Struct(">q")
_U16, _F64 = struct.Struct(">H"), struct.Struct(">d")
_FIXED = {"int8": _I8, "int16": _I16, "int32": _I32, "int64": _I64, "uint16": _U16,
          "float64": _F64}


class _Reader:
    __slots__ = ("buf", "end", "items", "pos")

    def __init__(self, buf: memoryview, pos: int = 0, items: int = MAX_ITEMS) -> None:
        self.buf = buf
        self.pos = pos
        self.end = len(buf)
        self.items = items              # array items this message may still hold

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.end:
            raise KafkaDecodeError(f"{what}: needs {n} bytes at byte {self.pos}, "
                                   f"{self.end - self.pos} left")

    def fixed(self, st: struct.Struct, what: str):
        self.need(st.size, what)
        value = st.unpack_from(self.buf, self.pos)[0]
        self.pos += st.size
        return value

    def uvarint(self, what: str) -> int:
        value = shift = 0
        while True:
            self.need(1, what)
            b = self.buf[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise KafkaDecodeError(f"{what}: unsigned varint longer than 5 bytes")

    def take(self, n: int, what: str) -> memoryview:
        self.need(n, what)
        view = self.buf[self.pos:self.pos + n]
        self.pos += n
        return view


def _length(r: _Reader, compact: bool, wide: bool, what: str) -> int:
    """A length or count: -1 is null."""
    if compact:
        return r.uvarint(what) - 1
    return r.fixed(_I32 if wide else _I16, what)


def _read_string(r: _Reader, compact: bool, nullable: bool, what: str) -> str | None:
    n = _length(r, compact, False, what)
    if n < 0:
        if n == -1 and nullable:
            return None
        raise KafkaDecodeError(f"{what}: string length {n}")
    try:
        return str(r.take(n, what), "utf-8")
    except UnicodeDecodeError as err:
        raise KafkaDecodeError(f"{what}: not UTF-8") from err


def _read_bytes(r: _Reader, compact: bool, nullable: bool, what: str) -> memoryview | None:
    n = _length(r, compact, True, what)
    if n < 0:
        if n == -1 and nullable:
            return None
        raise KafkaDecodeError(f"{what}: bytes length {n}")
    return r.take(n, what)


def _fixed_reader(st: struct.Struct, what: str) -> Callable[[_Reader], Any]:
    unpack_from, size = st.unpack_from, st.size

    def read_fixed(r: _Reader) -> Any:
        pos = r.pos
        if pos + size > r.end:
            r.need(size, what)                      # raises, saying where
        r.pos = pos + size
        return unpack_from(r.buf, pos)[0]
    return read_fixed


def _scalar_reader(kind: str, compact: bool, nullable: bool, what: str
                   ) -> Callable[[_Reader], Any]:
    if kind in _FIXED:
        return _fixed_reader(_FIXED[kind], what)
    if kind == "bool":
        read_i8 = _fixed_reader(_I8, what)
        return lambda r: read_i8(r) != 0
    if kind == "uuid":
        return lambda r: bytes(r.take(16, what))
    if kind == "string":
        return lambda r: _read_string(r, compact, nullable, what)
    if kind == "string16":
        return lambda r: _read_string(r, False, nullable, what)
    if kind in ("bytes", "records"):
        return lambda r: _read_bytes(r, compact, nullable, what)
    raise AssertionError(kind)


def _in(versions: tuple[int, int] | None, version: int) -> bool:
    return versions is not None and versions[0] <= version <= versions[1]


def _field_reader(field: tuple, version: int, flexible: bool) -> Callable[[_Reader], Any]:
    name, kind, _, nullable_v, _, _, children = field
    nullable = _in(nullable_v, version)
    if kind == "{}":
        struct_reader = _struct_reader(children, version, flexible, name)
        if not nullable:
            return struct_reader

        def read_optional(r: _Reader):
            present = r.fixed(_I8, name)
            return None if present < 0 else struct_reader(r)
        return read_optional
    if kind.startswith("["):
        item = (_struct_reader(children, version, flexible, name) if kind == "[]"
                else _scalar_reader(kind[2:], flexible, False, name))

        def read_array(r: _Reader):
            n = _length(r, flexible, True, name)
            if n < 0:
                if n == -1 and nullable:
                    return None
                raise KafkaDecodeError(f"{name}: array count {n}")
            if n > r.end - r.pos:        # every item takes a byte at least
                raise KafkaDecodeError(f"{name}: {n} items in {r.end - r.pos} bytes")
            r.items -= n
            if r.items < 0:
                raise KafkaDecodeError(f"{name}: more than {MAX_ITEMS} array items in one "
                                       "message")
            return [item(r) for _ in range(n)]
        return read_array
    return _scalar_reader(kind, flexible, nullable, name)


def _defaults(fields: tuple, version: int) -> dict[str, Any]:
    return {f[0]: _default_value(f, version) for f in fields}


def _default_value(field: tuple, version: int) -> Any:
    kind, default = field[1], field[5]
    if kind == "{}" and default is None and not _in(field[3], version):
        return _defaults(field[6], version)
    if isinstance(default, list):
        return []
    return default


def _struct_reader(fields: tuple, version: int, flexible: bool, what: str
                   ) -> Callable[[_Reader], dict]:
    """A function reading one struct of ``fields`` at ``version`` into a dict; fields the
    version lacks get their defaults, tagged fields their defaults unless sent."""
    plain = []
    tagged: dict[int, tuple[str, Callable]] = {}
    absent = {}
    for f in fields:
        name, _, versions, _, tag, _, _ = f
        if tag is not None and flexible and _in(tag[1], version):
            tagged[tag[0]] = (name, _field_reader(f, version, flexible))
            absent[name] = _default_value(f, version)
        elif tag is None and _in(versions, version):
            plain.append((name, _field_reader(f, version, flexible)))
        else:
            absent[name] = _default_value(f, version)

    def read(r: _Reader) -> dict:
        out = dict(absent)
        for name, reader in plain:
            out[name] = reader(r)
        if flexible:
            if r.pos < r.end and r.buf[r.pos] == 0:     # no tagged fields: the usual case
                r.pos += 1
            else:
                _read_tags(r, tagged, out, what)
        return out
    return read


def _read_tags(r: _Reader, tagged: dict, out: dict, what: str) -> None:
    count = r.uvarint(f"{what} tagged fields")
    last = -1
    for _ in range(count):
        tag = r.uvarint(f"{what} tag")
        if tag <= last:
            raise KafkaDecodeError(f"{what}: tag {tag} after {last} (tags must ascend)")
        last = tag
        size = r.uvarint(f"{what} tag {tag} size")
        body = r.take(size, f"{what} tag {tag}")
        known = tagged.get(tag)
        if known is None:
            continue                    # a tag this version does not know: skipped
        sub = _Reader(body, items=r.items)
        out[known[0]] = known[1](sub)
        r.items = sub.items
        if sub.pos != sub.end:
            raise KafkaDecodeError(f"{what}: tag {tag} has {sub.end - sub.pos} bytes left over")


# --- encoding -------------------------------------------------------------------------------
class _Writer:
    __slots__ = ("buf", "parts")

    def __init__(self) -> None:
        self.buf = bytearray()
        self.parts: list[bytes | bytearray | FileRegion] = []

    def uvarint(self, value: int) -> None:
        while value > 0x7F:
            self.buf.append((value & 0x7F) | 0x80)
            value >>= 7
        self.buf.append(value)

    def length(self, n: int, compact: bool, wide: bool) -> None:
        if compact:
            self.uvarint(n + 1)
        else:
            self.buf += (_I32 if wide else _I16).pack(n)

    def region(self, region: FileRegion) -> None:
        self.parts.append(self.buf)
        self.parts.append(region)
        self.buf = bytearray()

    def finish(self) -> list:
        self.parts.append(self.buf)
        return [p for p in self.parts if not isinstance(p, bytearray) or p]


def _scalar_writer(kind: str, compact: bool, required: bool, name: str, version: int
                   ) -> Callable[[_Writer, Any], None]:
    """A function writing one ``kind`` value; ``required``: None raises ``ValueError``."""
    def missing() -> ValueError:
        return ValueError(f"{name} is not nullable in version {version}")
    if kind in _FIXED:
        pack = _FIXED[kind].pack

        def write_fixed(w: _Writer, value: Any) -> None:
            w.buf += pack(value)
        return write_fixed
    if kind == "bool":
        return lambda w, value: w.buf.append(1 if value else 0)
    if kind == "uuid":
        def write_uuid(w: _Writer, value: Any) -> None:
            raw = bytes(16) if value is None else (
                value.bytes if isinstance(value, uuid.UUID) else bytes(value))
            if len(raw) != 16:
                raise ValueError(f"{name}: a uuid is 16 bytes, got {len(raw)}")
            w.buf += raw
        return write_uuid
    if kind in ("string", "string16"):
        compact = compact and kind == "string"

        def write_string(w: _Writer, value: Any) -> None:
            if value is None:
                if required:
                    raise missing()
                w.length(-1, compact, False)
                return
            raw = value.encode()
            w.length(len(raw), compact, False)
            w.buf += raw
        return write_string
    if kind in ("bytes", "records"):
        def write_bytes(w: _Writer, value: Any) -> None:
            if value is None:
                if required:
                    raise missing()
                w.length(-1, compact, True)
            elif isinstance(value, FileRegion):
                w.length(value.length, compact, True)
                w.region(value)
            else:
                w.length(len(value), compact, True)
                w.buf += value
        return write_bytes
    raise AssertionError(kind)


def _field_writer(field: tuple, version: int, flexible: bool
                  ) -> Callable[[_Writer, Any], None]:
    name, kind, _, nullable_v, _, _, children = field
    nullable = _in(nullable_v, version)
    if kind == "{}":
        inner = _struct_writer(children, version, flexible)
        if not nullable:
            return lambda w, value: inner(w, value or {})

        def write_optional(w: _Writer, value: Any) -> None:
            if value is None:
                w.buf += b"\xff"
                return
            w.buf += b"\x01"
            inner(w, value or {})
        return write_optional
    if kind.startswith("["):
        item = (_struct_writer(children, version, flexible) if kind == "[]"
                else _scalar_writer(kind[2:], flexible, False, name, version))

        def write_array(w: _Writer, value: Any) -> None:
            if value is None:
                if not nullable:
                    raise ValueError(f"{name} is not nullable in version {version}")
                w.length(-1, flexible, True)
                return
            w.length(len(value), flexible, True)
            for x in value:
                item(w, x)
        return write_array
    return _scalar_writer(kind, flexible, not nullable, name, version)


def _struct_writer(fields: tuple, version: int, flexible: bool
                   ) -> Callable[[_Writer, dict], None]:
    """A function writing one struct of ``fields`` at ``version`` from a dict: a field the
    dict lacks is written as its default; a tagged field only when the dict has it with a
    value other than its default, in ascending tag order."""
    plain = []
    tagged = []
    for f in fields:
        name, _, versions, _, tag, _, _ = f
        if tag is not None:
            if flexible and _in(tag[1], version):
                tagged.append((tag[0], name, _default_value(f, version),
                               _field_writer(f, version, flexible)))
        elif _in(versions, version):
            plain.append((name, _default_value(f, version),
                          _field_writer(f, version, flexible)))
    tagged.sort(key=lambda t: t[0])

    def write(w: _Writer, values: dict) -> None:
        for name, default, field_writer in plain:
            field_writer(w, values[name] if name in values else default)
        if not flexible:
            return
        sent = [(tag, field_writer, values[name]) for tag, name, default, field_writer in tagged
                if name in values and values[name] != default]
        w.uvarint(len(sent))
        for tag, field_writer, value in sent:
            sub = _Writer()
            field_writer(sub, value)
            w.uvarint(tag)
            w.uvarint(len(sub.buf))
            w.buf += sub.buf
    return write


def _write_struct(w: _Writer, fields: tuple, values: dict, version: int, flexible: bool
                  ) -> None:
    key = (id(fields), version, flexible)
    writer = _WRITERS.get(key)
    if writer is None:
        writer = _WRITERS[key] = _struct_writer(fields, version, flexible)
    writer(w, values)


# Compiled writers by (the schema tuple's id, version, flexible): the schema tuples are the
# module-level constants of schemas.py, alive as long as this module.
_WRITERS: dict[tuple[int, int, bool], Callable[[_Writer, dict], None]] = {}


# --- messages -------------------------------------------------------------------------------
_READERS: dict[tuple[str, int, bool], Callable[[_Reader], dict]] = {}


def _message(api_key: int, response: bool) -> tuple:
    try:
        return APIS[api_key][1 if response else 0]
    except KeyError:
        raise KafkaDecodeError(f"api key {api_key} is not one this broker knows") from None


def schema_range(api_key: int) -> tuple[int, int]:
    """The versions of ``api_key`` Kafka's schemas define (KeyError: an api mq lacks)."""
    return APIS[api_key][0][1]


def _flexible(message: tuple, version: int) -> bool:
    return message[2] is not None and version >= message[2]


def header_versions(api_key: int, api_version: int) -> tuple[int, int]:
    """(request header version, response header version) for a request: 2 and 1 when the
    api version is flexible, else 1 and 0 — except ApiVersions, whose response header is
    always 0 so that a client can read it before it knows what the broker speaks."""
    flexible = _flexible(APIS[api_key][0], api_version)
    return (2 if flexible else 1), (1 if flexible and api_key != 18 else 0)


def _reader_for(message: tuple, version: int) -> Callable[[_Reader], dict]:
    key = (message[0], version, True)
    reader = _READERS.get(key)
    if reader is None:
        reader = _READERS[key] = _struct_reader(message[3], version,
                                                _flexible(message, version), message[0])
    return reader


_REQUEST_HEADER = DATA["RequestHeader"]
_RESPONSE_HEADER = DATA["ResponseHeader"]


def peek_header(frame: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """(api key, api version, correlation id) of a frame: the first 8 bytes, which every
    request header version shares. Raises ``KafkaDecodeError`` for a frame shorter."""
    if len(frame) < 8:
        raise KafkaDecodeError(f"a request of {len(frame)} bytes has no header")
    api_key, api_version = struct.unpack_from(">hh", frame, 0)
    return api_key, api_version, _I32.unpack_from(frame, 4)[0]


def decode_request(frame: bytes | bytearray | memoryview) -> tuple[RequestHeader, dict]:
    """The header and body of one request frame. The api version must be within Kafka's
    schemas for the api (the broker checks its own, narrower, ranges)."""
    view = memoryview(frame)
    api_key, api_version, correlation_id = peek_header(view)
    message = _message(api_key, False)
    lo, hi = message[1]
    if not lo <= api_version <= hi:
        raise KafkaDecodeError(f"{message[0]} version {api_version} is outside {lo}-{hi}")
    r = _Reader(view)
    header_version = 2 if _flexible(message, api_version) else 1
    head = _reader_for(_REQUEST_HEADER, header_version)(r)
    header = RequestHeader(api_key, api_version, correlation_id, head["client_id"], r.pos)
    # Bytes after the body are ignored, as Kafka's RequestContext.parseRequest ignores
    # them: librdkafka 2.16 sends Metadata v12 with three more (01 00 00).
    return header, _reader_for(message, api_version)(r)


def encode_response(api_key: int, api_version: int, correlation_id: int, body: dict
                    ) -> list[bytes | bytearray | FileRegion]:
    """The parts of one response frame, its 4-byte size first: bytes, with a ``FileRegion``
    wherever a records value is one. Raises ``ValueError`` for a body the schema cannot
    encode (a bug in the broker, never the peer's doing)."""
    message = _message(api_key, True)
    w = _Writer()
    w.buf += bytes(4)                              # the size, filled in below
    header_version = header_versions(api_key, api_version)[1]
    try:
        _write_struct(w, _RESPONSE_HEADER[3], {"correlation_id": correlation_id},
                      header_version, header_version >= 1)
        _write_struct(w, message[3], body, api_version, _flexible(message, api_version))
    except (struct.error, TypeError, AttributeError) as err:
        raise ValueError(f"{message[0]} v{api_version}: {err}") from err
    parts = w.finish()
    size = sum(p.length if isinstance(p, FileRegion) else len(p) for p in parts) - 4
    parts[0][0:4] = _I32.pack(size)
    return parts


def encode_request(api_key: int, api_version: int, correlation_id: int, body: dict,
                   client_id: str | None = "mq") -> bytes:
    """One request frame with its size: what a client sends (tests and the bench use it)."""
    message = _message(api_key, False)
    w = _Writer()
    header_version = 2 if _flexible(message, api_version) else 1
    _write_struct(w, _REQUEST_HEADER[3], {"request_api_key": api_key,
                                          "request_api_version": api_version,
                                          "correlation_id": correlation_id,
                                          "client_id": client_id},
                  header_version, header_version >= 2)
    _write_struct(w, message[3], body, api_version, _flexible(message, api_version))
    return _I32.pack(len(w.buf)) + bytes(w.buf)


def decode_response(api_key: int, api_version: int, frame: bytes | bytearray | memoryview
                    ) -> tuple[int, dict]:
    """(correlation id, body) of a response frame without its size (what a client reads)."""
    message = _message(api_key, True)
    r = _Reader(memoryview(frame))
    header_version = header_versions(api_key, api_version)[1]
    head = _reader_for(_RESPONSE_HEADER, header_version)(r)
    body = _reader_for(message, api_version)(r)
    if r.pos != r.end:
        raise KafkaDecodeError(f"{message[0]} v{api_version}: {r.end - r.pos} bytes after "
                               "the body")
    return head["correlation_id"], body


def decode_data(name: str, frame: bytes | bytearray | memoryview) -> tuple[int, dict]:
    """A versioned data message (the group protocol's ``ConsumerProtocolSubscription`` and
    ``ConsumerProtocolAssignment``): an int16 version, then the body. Bytes after the body
    are allowed: a newer version may add fields an older reader skips."""
    message = DATA[name]
    r = _Reader(memoryview(frame))
    version = r.fixed(_I16, f"{name} version")
    if version < message[1][0]:
        raise KafkaDecodeError(f"{name} version {version}")
    version = min(version, message[1][1])         # newer: read what this schema knows
    return version, _reader_for(message, version)(r)


def encode_data(name: str, version: int, body: dict) -> bytes:
    message = DATA[name]
    w = _Writer()
    w.buf += _I16.pack(version)
    _write_struct(w, message[3], body, version, _flexible(message, version))
    return bytes(w.buf)
