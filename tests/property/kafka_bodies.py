"""Hypothesis strategies for Kafka message bodies, read off the codec's schema tuples.

``body(message, version)`` draws a dict that ``mq.protocol.kafka.codec`` can encode for that
message and version: every field the version has, each tagged field sometimes, nullable
values sometimes None. ``present(decoded, message, version)`` cuts a decoded dict down to the
fields the version carries, with records as bytes, so a round trip compares equal.

A schema field is ``(name, type, versions, nullable versions, tag, default, fields)``
(``mq/protocol/kafka/schemas.py``).
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

_INTS = {"int8": 8, "int16": 16, "int32": 32, "int64": 64}
_MAX_ITEMS = 3                  # arrays stay small: Fetch responses nest four deep


def _in(versions, version: int) -> bool:
    return versions is not None and versions[0] <= version <= versions[1]


def flexible(message: tuple, version: int) -> bool:
    return message[2] is not None and version >= message[2]


def _scalar(kind: str, nullable: bool) -> st.SearchStrategy:
    if kind in _INTS:
        bits = _INTS[kind]
        s = st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    elif kind == "uint16":
        s = st.integers(0, 0xFFFF)
    elif kind == "float64":
        s = st.floats(allow_nan=False)
    elif kind == "bool":
        s = st.booleans()
    elif kind == "uuid":
        s = st.binary(min_size=16, max_size=16)
    elif kind in ("string", "string16"):
        s = st.text(max_size=12)
    elif kind in ("bytes", "records"):
        s = st.binary(max_size=24)
    else:
        raise AssertionError(kind)
    return st.none() | s if nullable else s


def _field(f: tuple, version: int, flex: bool) -> st.SearchStrategy:
    _, kind, _, nullable_v, _, _, children = f
    nullable = _in(nullable_v, version)
    if kind == "{}":
        s = struct(children, version, flex)
    elif kind == "[]":
        s = st.lists(struct(children, version, flex), max_size=_MAX_ITEMS)
    elif kind.startswith("[]"):
        s = st.lists(_scalar(kind[2:], False), max_size=_MAX_ITEMS)
    else:
        return _scalar(kind, nullable)
    return st.none() | s if nullable else s


def struct(fields: tuple, version: int, flex: bool) -> st.SearchStrategy:
    """A dict of the fields ``version`` carries; a tagged field only sometimes."""
    required: dict[str, st.SearchStrategy] = {}
    optional: dict[str, st.SearchStrategy] = {}
    for f in fields:
        name, _, versions, _, tag, _, _ = f
        if tag is not None:
            if flex and _in(tag[1], version):
                optional[name] = _field(f, version, flex)
        elif _in(versions, version):
            required[name] = _field(f, version, flex)
    return st.fixed_dictionaries(required, optional=optional)


def body(message: tuple, version: int) -> st.SearchStrategy:
    return struct(message[3], version, flexible(message, version))


def present(value: Any, fields: tuple, version: int, flex: bool) -> Any:
    """``value`` (a decoded struct) with only the fields ``version`` carries, records and
    bytes as ``bytes``; a tagged field at its default counts as absent (it is not sent)."""
    out = {}
    for f in fields:
        name, kind, versions, _, tag, _, children = f
        if tag is not None:
            if not (flex and _in(tag[1], version)) or value[name] == default_of(f, version):
                continue
        elif not _in(versions, version):
            continue
        out[name] = _plain(value[name], kind, children, version, flex)
    return out


def default_of(f: tuple, version: int) -> Any:
    """A field's value when absent: a struct's is its fields' defaults (as in the codec)."""
    _, kind, _, nullable_v, _, default, children = f
    if kind == "{}" and default is None and not _in(nullable_v, version):
        return {c[0]: default_of(c, version) for c in children}
    return default


def _plain(value: Any, kind: str, children: tuple, version: int, flex: bool) -> Any:
    if value is None:
        return None
    if kind == "{}":
        return present(value, children, version, flex)
    if kind == "[]":
        return [present(item, children, version, flex) for item in value]
    if isinstance(value, memoryview):
        return bytes(value)
    return value


def expected(drawn: dict, fields: tuple, version: int, flex: bool) -> dict:
    """What a decoder gives back for ``drawn``, through ``present``: the same, less tagged
    fields drawn at their default (an encoder leaves those out)."""
    return present(_with_absent(drawn, fields, version), fields, version, flex)


def _with_absent(drawn: dict, fields: tuple, version: int) -> dict:
    out = dict(drawn)
    for f in fields:
        name, kind, _, _, _, _, children = f
        if name not in out:
            out[name] = default_of(f, version)
        elif kind == "{}" and out[name] is not None:
            out[name] = _with_absent(out[name], children, version)
        elif kind == "[]" and out[name] is not None:
            out[name] = [_with_absent(item, children, version) for item in out[name]]
    return out
