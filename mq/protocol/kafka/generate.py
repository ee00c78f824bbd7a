"""Development tool: turn Apache Kafka's JSON message schemas into ``schemas.py``.

Apache Kafka describes every request and response in JSON files (``common/message/*.json``
in the ``kafka-clients`` jar on Maven Central, and in the kafka-python sdist on PyPI). This
tool reads them once, at development time, and writes the facts the codec needs — field
names, types, versions, nullable versions, tags and defaults, with common structs resolved —
as plain Python tuples. The repository keeps this tool and its output, never Kafka's files::

    curl -sSfLO https://repo1.maven.org/maven2/org/apache/kafka/kafka-clients/4.3.1/kafka-clients-4.3.1.jar
    python3 -m mq.protocol.kafka.generate kafka-clients-4.3.1.jar > mq/protocol/kafka/schemas.py

Only the apis mq serves (``APIS``) and the data messages its group protocol reads are
written. The output is deterministic: the same jar gives the same file.
"""

from __future__ import annotations

import json
import pprint
import re
import sys
import zipfile

# The api keys whose request and response schemas are written (the broker picks the versions
# it advertises from Kafka's valid ranges; see mq/broker/kafka/versions.py).
APIS = (0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26,
        28, 29, 30, 31, 32, 33, 35, 36, 37, 42, 44, 47, 50, 51, 60, 61, 65, 66, 68, 69)
DATA = ("ConsumerProtocolSubscription", "ConsumerProtocolAssignment")
HEADERS = ("RequestHeader", "ResponseHeader")
OPEN_END = 0x7FFF          # "N+": up to any version


def _strip_comments(text: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))


def _versions(spec: str | None) -> tuple[int, int] | None:
    if spec is None or spec == "none":
        return None
    if spec.endswith("+"):
        return int(spec[:-1]), OPEN_END
    lo, _, hi = spec.partition("-")
    return int(lo), int(hi or lo)


def snake(name: str) -> str:
    """Kafka's field name as a Python identifier: ``ThrottleTimeMs`` -> ``throttle_time_ms``."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    return re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name).lower()


def _default(ftype: str, raw, nullable: bool):
    """The field's default as a Python value (a uuid's, and every null, is None)."""
    if raw == "null" or ftype in ("uuid", "{}"):
        return None
    if ftype.startswith("["):
        return []
    if ftype in ("int8", "int16", "int32", "int64", "uint16"):
        return int(raw, 0) if isinstance(raw, str) and raw else int(raw or 0)
    if ftype == "float64":
        return float(raw or 0)
    if ftype == "bool":
        return raw in (True, "true")
    if ftype in ("string", "string16"):
        return raw or ""
    return None if nullable else b""             # bytes, records


_SCALARS = {"int8", "int16", "int32", "int64", "uint16", "float64", "bool", "string", "bytes",
            "records", "uuid"}


def _fields(fields: list, common: dict) -> tuple:
    out = []
    for f in fields:
        ftype = f["type"]
        versions = _versions(f.get("versions"))
        nullable = _versions(f.get("nullableVersions"))
        tag = (f["tag"], _versions(f.get("taggedVersions"))) if "tag" in f else None
        elem = ftype[2:] if ftype.startswith("[]") else ftype
        children = ()
        if elem not in _SCALARS:
            children = _fields(f["fields"] if "fields" in f else common[elem], common)
            ftype = "[]" if ftype.startswith("[]") else "{}"
        elif f.get("flexibleVersions") == "none":
            ftype = "string16"                  # RequestHeader.ClientId: never compact
        out.append((snake(f["name"]), ftype, versions, nullable, tag,
                    _default(ftype, f.get("default"), nullable is not None), children))
    return tuple(out)


def _message(schema: dict) -> tuple:
    common = {s["name"]: s["fields"] for s in schema.get("commonStructs", ())}
    return (schema["name"], _versions(schema["validVersions"]),
            (_versions(schema.get("flexibleVersions")) or (None,))[0],
            _fields(schema["fields"], common))


def generate(jar: str, version: str) -> str:
    schemas = {}
    with zipfile.ZipFile(jar) as z:
        for name in z.namelist():
            if name.startswith("common/message/") and name.endswith(".json"):
                schemas[name.rsplit("/", 1)[1][:-5]] = json.loads(_strip_comments(
                    z.read(name).decode()))
    by_key: dict[int, dict[str, dict]] = {}
    for schema in schemas.values():
        if schema["type"] in ("request", "response"):
            by_key.setdefault(schema["apiKey"], {})[schema["type"]] = schema
    apis = {key: (_message(by_key[key]["request"]), _message(by_key[key]["response"]))
            for key in APIS}
    data = {name: _message(schemas[name]) for name in DATA + HEADERS}
    return (f'"""Apache Kafka {version}\'s message schemas for the apis mq serves, in mq\'s '
            'compact form.\n\nGenerated by ``python3 -m mq.protocol.kafka.generate '
            f'kafka-clients-{version}.jar``; do not edit.\nA message is ``(name, (min, max) '
            'valid versions, first flexible version or None, fields)``;\na field is ``(name, '
            'type, versions, nullable versions, (tag, tagged versions) or None,\ndefault, '
            'fields)`` with versions ``(lo, hi)`` (hi 32767: no end); type ``[]`` is an array '
            'of\nstructs, ``{}`` one struct, ``[]T`` an array of T, ``string16`` a string '
            'never compact.\n"""\n\n'
            f"KAFKA_VERSION = {version!r}\n\n"
            "# api key: (request, response)\n"
            f"APIS = {pprint.pformat(apis, width=100, compact=True)}\n\n"
            f"DATA = {pprint.pformat(data, width=100, compact=True)}\n")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python3 -m mq.protocol.kafka.generate kafka-clients-<version>.jar",
              file=sys.stderr)
        return 2
    match = re.search(r"kafka-clients-([\d.]+)\.jar$", argv[1])
    if match is None:
        print(f"{argv[1]}: not a kafka-clients-<version>.jar", file=sys.stderr)
        return 2
    sys.stdout.write(generate(argv[1], match.group(1)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
