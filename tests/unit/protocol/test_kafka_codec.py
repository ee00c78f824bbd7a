"""The Kafka codec (mq/protocol/kafka/codec.py): byte layouts from Kafka's protocol guide and
KIP-482, the header rules, the KIP-511 answer, a cross-check against kafka-python's own
schema-generated classes, and ``schemas.py`` regenerated from the pinned jar."""

from __future__ import annotations

import hashlib
import os
import struct
import urllib.request
import warnings
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mq.broker.kafka.versions import SERVED
from mq.errors import UnsupportedVersionError
from mq.protocol.kafka import codec, generate
from mq.protocol.kafka.codec import FileRegion, KafkaDecodeError
from mq.protocol.kafka.schemas import APIS
from tests.property.kafka_bodies import body, default_of, expected, flexible, present
from tests.unit.broker.kafka.kafka_harness import ListenerPair

with warnings.catch_warnings():      # kafka-python 3.0 reads its schemas with a deprecated call
    warnings.simplefilter("ignore", DeprecationWarning)
    # each package defines (and so registers) its message classes
    import kafka.protocol.admin
    import kafka.protocol.consumer
    import kafka.protocol.producer  # noqa: F401
    from kafka.protocol import api_message
    from kafka.protocol.metadata import ApiVersionsResponse

METADATA, FETCH, API_VERSIONS, CG_HEARTBEAT = 3, 1, 18, 68


def _response(key: int, version: int, correlation_id: int, body_: dict) -> bytes:
    return b"".join(bytes(p) for p in codec.encode_response(key, version, correlation_id,
                                                            body_))


# --- round trips and layouts -----------------------------------------------------------------
def test_metadata_request_v12_round_trip_and_layout():
    topic_id = bytes(range(16))
    frame = codec.encode_request(METADATA, 12, 0x01020304, {
        "topics": [{"topic_id": topic_id, "name": "ab"}, {"topic_id": None, "name": None}],
        "allow_auto_topic_creation": True, "include_topic_authorized_operations": False},
        client_id="cl")
    assert frame == (
        struct.pack(">i", len(frame) - 4)
        + b"\x00\x03\x00\x0c\x01\x02\x03\x04"   # api key, version, correlation id
        + b"\x00\x02cl"                           # ClientId: int16 length even in header v2
        + b"\x00"                                 # header tags
        + b"\x03"                                 # topics: compact count 2 + 1
        + topic_id + b"\x03ab" + b"\x00"          # uuid, compact string, item tags
        + bytes(16) + b"\x00" + b"\x00"           # null uuid as zeros, null compact string
        + b"\x01\x00"                             # two bools
        + b"\x00")                                # body tags
    header, decoded = codec.decode_request(frame[4:])
    assert header.client_id == "cl" and header.header_size == 8 + 4 + 1
    assert decoded["topics"] == [{"topic_id": topic_id, "name": "ab"},
                                 {"topic_id": bytes(16), "name": None}]


def test_metadata_request_v1_uses_classic_lengths():
    frame = codec.encode_request(METADATA, 1, 1, {"topics": [{"name": "ab"}]}, client_id=None)
    assert frame[4:] == (b"\x00\x03\x00\x01\x00\x00\x00\x01" + b"\xff\xff"
                         + b"\x00\x00\x00\x01" + b"\x00\x02ab")
    assert codec.decode_request(frame[4:])[0].client_id is None


def test_null_compact_array_and_bytes():
    frame = codec.encode_request(METADATA, 12, 1, {"topics": None})
    body_at = codec.decode_request(frame[4:])[0].header_size
    assert frame[4 + body_at] == 0                      # compact null array: varint 0
    assert codec.decode_request(frame[4:])[1]["topics"] is None
    with pytest.raises(ValueError, match="not nullable"):
        codec.encode_request(METADATA, 0, 1, {"topics": None})


def test_fetch_response_records_as_a_file_region(tmp_path):
    region = FileRegion(fd=99, offset=4096, length=10)
    parts = codec.encode_response(FETCH, 12, 5, {"responses": [{"topic": "t", "partitions": [
        {"partition_index": 0, "high_watermark": 10, "records": region}]}]})
    assert parts[1] == region and len(parts) == 3
    size = struct.unpack_from(">i", parts[0])[0]
    assert size == len(parts[0]) - 4 + region.length + len(parts[2])
    assert parts[0][-1] == region.length + 1               # compact bytes length
    frame = bytes(parts[0]) + b"R" * 10 + bytes(parts[2])
    _, decoded = codec.decode_response(FETCH, 12, frame[4:])
    assert bytes(decoded["responses"][0]["partitions"][0]["records"]) == b"R" * 10


# --- tagged fields ---------------------------------------------------------------------------
def _api_versions_v3(tags: bytes) -> bytes:
    """An ApiVersions v3 request with the body's tag section replaced by ``tags``."""
    frame = codec.encode_request(API_VERSIONS, 3, 1, {"client_software_name": "x",
                                                      "client_software_version": "1"})[4:]
    assert frame[-1] == 0
    return frame[:-1] + tags


def test_unknown_tags_are_skipped():
    _, decoded = codec.decode_request(_api_versions_v3(b"\x02" + b"\x05\x02ab"
                                                       + b"\x09\x00"))
    assert decoded == {"client_software_name": "x", "client_software_version": "1"}


@pytest.mark.parametrize("tags", [b"\x02\x05\x00\x04\x00",       # descending
                                  b"\x02\x05\x00\x05\x00",       # repeated
                                  b"\x01\x05\x03ab",             # size past the end
                                  b"\x02\x05\x00"])              # one of two
def test_bad_tag_sections_are_refused(tags):
    with pytest.raises(KafkaDecodeError):
        codec.decode_request(_api_versions_v3(tags))


def test_known_tagged_field_round_trips_and_is_left_out_at_its_default():
    fields = APIS[FETCH][0][3]
    cluster = codec.encode_request(FETCH, 12, 1, {"cluster_id": "c1"})
    assert codec.decode_request(cluster[4:])[1]["cluster_id"] == "c1"
    plain = codec.encode_request(FETCH, 12, 1, {"cluster_id": None})
    assert len(cluster) == len(plain) + 1 + 1 + 1 + 2       # tag, size, compact "c1"
    assert codec.decode_request(plain[4:])[1]["cluster_id"] == default_of(fields[0], 12)


def test_a_tag_whose_value_leaves_bytes_over_is_refused():
    # Fetch v12's ClusterId is tag 0: give it 4 bytes holding a 2-byte string
    plain = codec.encode_request(FETCH, 12, 1, {})[4:]
    at = codec.decode_request(plain)[0].header_size + 4   # after the 4-byte replica id
    assert plain[at - 4:at] == b"\xff\xff\xff\xff"
    # the request's own tag section is its last byte: put tag 0 there
    frame = plain[:-1] + b"\x01\x00\x04\x02c\x00\x00"
    with pytest.raises(KafkaDecodeError, match="left over"):
        codec.decode_request(frame)


# --- nullable structs ------------------------------------------------------------------------
def test_nullable_struct_markers():
    null = _response(CG_HEARTBEAT, 0, 1, {"assignment": None})
    present_ = _response(CG_HEARTBEAT, 0, 1, {"assignment": {"topic_partitions": []}})
    # the body ends: ..., assignment marker (+ struct), body tags
    assert null[-2:] == b"\xff\x00"
    assert present_[-4:] == b"\x01\x01\x00\x00"     # marker 1, empty array, struct tags, tags
    assert codec.decode_response(CG_HEARTBEAT, 0, null[4:])[1]["assignment"] is None
    assert codec.decode_response(CG_HEARTBEAT, 0, present_[4:])[1]["assignment"] == \
        {"topic_partitions": []}


# --- headers ---------------------------------------------------------------------------------
def test_response_header_v1_carries_tags_but_api_versions_never():
    metadata = _response(METADATA, 12, 7, {})
    assert metadata[4:9] == b"\x00\x00\x00\x07\x00"         # correlation id, header tags
    api_versions = _response(API_VERSIONS, 3, 7, {"api_keys": []})
    assert api_versions[4:10] == b"\x00\x00\x00\x07\x00\x00"   # correlation id, error 0
    assert codec.header_versions(API_VERSIONS, 3) == (2, 0)
    assert codec.header_versions(METADATA, 12) == (2, 1)
    assert codec.header_versions(METADATA, 8) == (1, 0)


def test_request_header_v2_client_id_keeps_its_int16_length():
    frame = codec.encode_request(API_VERSIONS, 3, 1, {}, client_id="x" * 200)[4:]
    assert frame[8:10] == struct.pack(">h", 200)            # compact would be varint 201
    assert codec.decode_request(frame)[0].client_id == "x" * 200


def test_version_outside_the_schemas_is_refused():
    frame = bytearray(codec.encode_request(METADATA, 12, 1, {})[4:])
    frame[2:4] = struct.pack(">h", 99)
    with pytest.raises(KafkaDecodeError, match="outside"):
        codec.decode_request(frame)
    frame[0:2] = struct.pack(">h", 999)
    with pytest.raises(KafkaDecodeError, match="api key 999"):
        codec.decode_request(frame)


def test_bytes_after_the_body_are_ignored_as_kafka_does():
    frame = codec.encode_request(METADATA, 12, 1, {})[4:]
    assert codec.decode_request(frame + b"\x01\x00\x00") == codec.decode_request(frame)


# --- KIP-511: the listener answers an ApiVersions version it does not serve ------------------
def test_unsupported_api_versions_version_is_answered_in_v0():
    pair = ListenerPair()
    try:
        # v4 is in Kafka's schemas but not served; 77 is in nobody's: neither body is read
        for version, tail in ((4, b"\x00\x02cl\x00\x02x\x021\x00"), (77, b"\xde\xad")):
            frame = struct.pack(">hhi", API_VERSIONS, version, 41) + tail
            pair.send(struct.pack(">i", len(frame)) + frame)
            response = pair.response()
            assert response[:4] == struct.pack(">i", 41)
            _, decoded = codec.decode_response(API_VERSIONS, 0, response)
            assert decoded["error_code"] == UnsupportedVersionError.code == 35
            assert {"api_key": API_VERSIONS, "min_version": 0, "max_version": 3} in \
                decoded["api_keys"]
            # kafka-python reads it as a client does: an error means a v0 body
            kp = ApiVersionsResponse.decode(response, version=3, header=True)
            assert kp.error_code == 35 and kp.api_keys[0].api_key == API_VERSIONS
        assert not pair.closed
    finally:
        pair.close()


# --- kafka-python: an independent codec from the same schemas --------------------------------
def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


KAFKA_PYTHON = {(c.API_KEY, c.type == "response"): c
                for c in _subclasses(api_message.ApiMessage)
                if getattr(c, "_class_version", None) is None and c._json is not None}
# ConsumerGroupHeartbeat and ConsumerGroupDescribe: kafka-python 3.0 has no KIP-848 classes.
CROSS = [(key, version, response) for key, (lo, hi) in sorted(SERVED.items())
         if (key, False) in KAFKA_PYTHON for version in range(lo, hi + 1)
         for response in (False, True)]


# kafka-python renames Metadata's authorized-operations fields; it reads those (and
# DescribeGroups') as sets of bits
_KAFKA_PYTHON_NAMES = {"cluster_authorized_operations": "authorized_operations",
                       "topic_authorized_operations": "authorized_operations"}


def _bitfield(bits: set[int] | None) -> int:
    """kafka-python's set of bits as the int32 on the wire (None: INT32_MIN, 'not asked')."""
    if bits is None:
        return -(1 << 31)
    value = sum(1 << b for b in bits)
    return value - (1 << 32) if value >= 1 << 31 else value


def _kafka_python_value(obj, fields: tuple, version: int, flex: bool) -> dict:
    """kafka-python's decoded object as ``present`` gives mq's: the fields of ``version``
    by mq's names (both snake-case Kafka's), bytes as bytes, absent tagged fields left out."""
    out = {}
    for f in fields:
        name, kind, versions, _, tag, _, children = f
        value = getattr(obj, _KAFKA_PYTHON_NAMES.get(name, name))
        if tag is not None:
            if not (flex and tag[1][0] <= version <= tag[1][1]) or value is None or \
                    value == default_of(f, version):
                continue
        elif not versions[0] <= version <= versions[1]:
            continue
        if value is not None and kind == "{}":
            value = _kafka_python_value(value, children, version, flex)
        elif value is not None and kind == "[]":
            value = [_kafka_python_value(v, children, version, flex) for v in value]
        elif hasattr(value, "bytes") and kind == "uuid":
            value = value.bytes
        elif isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        elif kind == "int32" and (value is None or isinstance(value, set)):
            value = _bitfield(value)
        out[name] = value
    return out


@pytest.mark.parametrize(("key", "version", "response"), CROSS,
                         ids=[f"{APIS[k][r][0]}-v{v}" for k, v, r in CROSS])
@settings(max_examples=8)
@given(data=st.data())
def test_kafka_python_reads_what_mq_writes_and_writes_it_back_byte_for_byte(
        key, version, response, data):
    message = APIS[key][response]
    drawn = data.draw(body(message, version))
    if key == API_VERSIONS and response:
        drawn["error_code"] = 0        # any error: a client reads the body as v0 (KIP-511)
    if response:
        frame = _response(key, version, 5, drawn)
    else:
        frame = codec.encode_request(key, version, 5, drawn, client_id="mq")
    kp = KAFKA_PYTHON[(key, response)].decode(frame[4:], version=version, header=True)
    flex = flexible(message, version)
    assert _kafka_python_value(kp, message[3], version, flex) == \
        expected(drawn, message[3], version, flex)
    if response:
        kp.with_header(correlation_id=5)
    else:
        kp.with_header(correlation_id=5, client_id="mq")
    theirs = bytes(kp.encode(header=True, framed=True))
    assert theirs == frame
    if response:
        _, decoded = codec.decode_response(key, version, theirs[4:])
    else:
        decoded = codec.decode_request(theirs[4:])[1]
    assert present(decoded, message[3], version, flex) == \
        expected(drawn, message[3], version, flex)


# --- schemas.py from the pinned jar ----------------------------------------------------------
JAR = "kafka-clients-4.3.1.jar"
JAR_URL = f"https://repo1.maven.org/maven2/org/apache/kafka/kafka-clients/4.3.1/{JAR}"
JAR_SHA256 = "52501b7b47510c66f898871adaf6d2968ab7246561d44ced43643a8a587f0b36"


def _jar() -> Path:
    """The pinned jar, from ~/.cache/mq-tests (fetched from Maven Central the first time; no
    network then is a failure, not a skip: the check is part of the suite)."""
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mq-tests"
    path = cache / JAR
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        part = path.with_suffix(f".{os.getpid()}.part")
        with urllib.request.urlopen(JAR_URL, timeout=120) as src, open(part, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        os.replace(part, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert digest == JAR_SHA256, f"{path}: sha256 {digest}, expected {JAR_SHA256}"
    return path


def test_generate_reproduces_schemas_py_from_the_pinned_jar():
    ours = Path(codec.__file__).with_name("schemas.py").read_text()
    assert generate.generate(str(_jar()), "4.3.1") == ours
