"""The client commands end to end: ``mq broker``, ``topics``, ``produce``, ``consume``,
``offsets`` and ``demo`` run as real processes (``python -m mq``) against a real broker
subprocess (``mq.testing.broker``) on each test's own data dir and socket.

What the CLI prints is compared exactly with what the Python clients read or wrote. Every
expected error must be one ``mq: error:`` line on stderr with a non-zero exit and never a
traceback. Nothing sleeps to wait for a condition: waits are on sockets, pipes and processes,
each with a timeout.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import signal
import socket as socketlib
import subprocess
import sys
import time

import psutil
import pytest
from brokers import create_topic
from cli_run import (
    ENV,
    WAIT,
    Lines,
    Result,
    assert_help,
    assert_one_error,
    json_lines,
    json_value,
    mq_process,
    mq_run,
    ok,
)

import mq.testing
from mq.client.admin import Admin
from mq.client.consumer import Consumer
from mq.client.producer import Producer

# --- helpers ----------------------------------------------------------------------------------

def can_connect(path: str) -> bool:
    sock = socketlib.socket(socketlib.AF_UNIX, socketlib.SOCK_STREAM)
    try:
        sock.connect(path)
        return True
    except OSError:
        return False
    finally:
        sock.close()


def read_all(b, topic: str) -> list:
    """Every record of ``topic`` through the Python consumer: the ground truth."""
    with Admin(b.socket) as admin:
        ends = [end for _, end in admin.describe_topic(topic)["offsets"]]
    out = []
    with Consumer(topic, socket=b.socket, value_bytes=True) as consumer:
        consumer.seek_to_beginning()
        tps = sorted(consumer.assignment())
        while any(consumer.position(tp) < ends[tp.partition] for tp in tps):
            for records in consumer.poll(timeout_ms=WAIT * 1000).values():
                out.extend(records)
    return sorted(out, key=lambda r: (r.partition, r.offset))


def as_json(r) -> dict:
    """A consumer record as ``mq consume --format json`` prints it."""
    return {"topic": r.topic, "partition": r.partition, "offset": r.offset,
            "timestamp": r.timestamp_ms,
            "timestampType": "LogAppendTime" if r.timestamp_type else "CreateTime",
            "key": json_value(r.key), "value": json_value(r.value),
            "headers": [{"key": k, "value": json_value(v)} for k, v in r.headers]}


def by_position(objs: list[dict]) -> list[dict]:
    return sorted(objs, key=lambda o: (o["partition"], o["offset"]))


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One broker per xdist worker for the error cases (they change nothing): topic ``t``
    with 2 partitions holding 3 records."""
    with mq.testing.broker(tmp_path_factory.mktemp("errors") / "data") as b:
        create_topic(b, "t", 2)
        with Producer(socket=b.socket) as producer:
            for i in range(3):
                producer.send("t", b"v%d" % i, partition=0)
        yield b


# --- help -------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [
    ("broker",), ("demo",), ("topics",), ("topics", "create"), ("topics", "list"),
    ("topics", "describe"), ("topics", "alter"), ("topics", "delete"), ("produce",),
    ("consume",), ("offsets",)])
def test_help(command):
    assert_help(command, socket=command in (("produce",), ("consume",), ("offsets",),
                                            ("topics", "list")))


def test_top_level_help_lists_the_client_commands():
    result = ok(mq_run("--help"))
    for word in ("broker", "demo", "topics", "produce", "consume", "offsets", "$MQ_SOCKET"):
        assert word in result.out


# --- topics -----------------------------------------------------------------------------------

def test_topics_take_the_timestamp_window_configs(broker):
    """KIP-937's message.timestamp.after.max.ms and message.timestamp.before.max.ms, by
    Kafka's names, at create and alter; describe shows them with their defaults."""
    s = broker.socket
    ok(mq_run("topics", "create", "clicks", "--config",
              "message.timestamp.after.max.ms=60000", "--socket", s))
    ok(mq_run("topics", "alter", "clicks", "--config",
              "message.timestamp.before.max.ms=86400000", "--socket", s))
    ok(mq_run("topics", "create", "plain", "--socket", s))
    with Admin(s) as admin:
        clicks, plain = admin.describe_topic("clicks"), admin.describe_topic("plain")
    assert clicks["overrides"] == {"message.timestamp.after.max.ms": "60000",
                                   "message.timestamp.before.max.ms": "86400000"}
    assert (plain["config"]["message.timestamp.after.max.ms"],
            plain["config"]["message.timestamp.before.max.ms"]) == ("3600000",
                                                                    str((1 << 63) - 1))
    text = ok(mq_run("topics", "describe", "plain", "--socket", s)).out
    assert "message.timestamp.after.max.ms=3600000" in text


def test_topics_create_list_describe_alter_delete(broker):
    s = broker.socket
    result = ok(mq_run("topics", "create", "orders", "--partitions", "3", "--config",
                       "retention.ms=3600000", "--config", "segment.bytes=1048576",
                       "--socket", s))
    assert result.out == "Created topic orders with 3 partitions.\n" and result.err == ""
    assert ok(mq_run("topics", "create", "audit", "--socket", s)).out == \
        "Created topic audit with 1 partition.\n"
    assert ok(mq_run("topics", "list", "--socket", s)).out == "audit\norders\n"

    with Producer(socket=broker.socket) as producer:
        for i in range(5):
            producer.send("orders", b"x", partition=1)
    with Admin(broker.socket) as admin:
        admin.delete_records("orders", 1, 2)
        info = admin.describe_topic("orders")

    size = info["size_bytes"][1]
    assert info["size_bytes"] == [0, size, 0] and 0 < size < 1024 and info["offline"] == [None] * 3
    text = ok(mq_run("topics", "describe", "orders", "--socket", s)).out.splitlines()
    assert text[0] == f"Topic: orders\tTopicId: {info['id']}\tPartitionCount: 3\tSize: {size} B"
    assert text[1:4] == ["\tPartition: 0\tStartOffset: 0\tEndOffset: 0\tSize: 0 B",
                         f"\tPartition: 1\tStartOffset: 2\tEndOffset: 5\tSize: {size} B",
                         "\tPartition: 2\tStartOffset: 0\tEndOffset: 0\tSize: 0 B"]
    assert text[4].startswith("Configs (* = set on this topic")
    configs = {line[3:].partition("=")[0]: (line[1], line[3:].partition("=")[2])
               for line in text[5:]}
    assert configs == {key: ("*" if key in ("retention.ms", "segment.bytes") else " ", value)
                       for key, value in info["config"].items()}
    assert configs["retention.ms"] == ("*", "3600000")

    described = json_lines(ok(mq_run("topics", "describe", "orders", "--json", "--socket", s)))
    assert described == [{
        "topic": "orders", "topicId": info["id"],
        "partitions": [{"partition": 0, "startOffset": 0, "endOffset": 0, "sizeBytes": 0,
                        "offline": None},
                       {"partition": 1, "startOffset": 2, "endOffset": 5, "sizeBytes": size,
                        "offline": None},
                       {"partition": 2, "startOffset": 0, "endOffset": 0, "sizeBytes": 0,
                        "offline": None}],
        "configs": dict(sorted(info["config"].items())),
        "overrides": {"retention.ms": "3600000", "segment.bytes": "1048576"}}]

    result = ok(mq_run("topics", "alter", "orders", "--config", "retention.ms=60000",
                       "--config", "max.message.bytes=2000", "--socket", s))
    assert result.out == "Altered topic orders: retention.ms=60000, max.message.bytes=2000.\n"
    result = ok(mq_run("topics", "alter", "orders", "--partitions", "4", "--socket", s))
    assert result.out == "Altered topic orders: partitions=4.\n"
    with Admin(broker.socket) as admin:
        info = admin.describe_topic("orders")
    assert info["partitions"] == 4
    assert info["overrides"] == {"retention.ms": "60000", "segment.bytes": "1048576",
                                 "max.message.bytes": "2000"}
    assert info["config"]["max.message.bytes"] == "2000"

    assert ok(mq_run("topics", "delete", "orders", "--socket", s)).out == \
        "Deleted topic orders.\n"
    assert ok(mq_run("topics", "list", "--socket", s)).out == "audit\n"


def test_topics_list_empty_and_socket_from_environment(broker):
    assert ok(mq_run("topics", "list", "--socket", broker.socket)).out == ""
    create_topic(broker, "envtopic")
    result = ok(mq_run("topics", "list", env={**ENV, "MQ_SOCKET": broker.socket}))
    assert result.out == "envtopic\n"
    # The data dir's socket is the default when $MQ_SOCKET is unset.
    if broker.socket == os.path.join(broker.data_dir, "mq.sock"):
        result = ok(mq_run("topics", "list", env={**ENV, "MQ_DATA_DIR": broker.data_dir}))
        assert result.out == "envtopic\n"


# --- produce and consume ----------------------------------------------------------------------

LINES = [b"k1:hello", b"k2:world", b"k1:again", b"k3:with:colons", b"k4:", b"k5:caf\xc3\xa9",
         b"k6:\xff\xfe not utf-8", b"k2:last"]


def test_produce_with_keys_and_headers_then_consume_text_and_json(broker):
    s = broker.socket
    create_topic(broker, "t", 3)
    stdin = b"\n".join(LINES) + b"\r\n"           # CRLF on the last line is stripped too
    result = ok(mq_run("produce", "t", "--key-separator", ":", "--header", "source=cli",
                       "--header", "trace=42", "--socket", s, stdin=stdin))
    assert result.err == "produced 8 records to t\n" and result.out == ""

    records = read_all(broker, "t")
    assert sorted((r.key, r.value) for r in records) == \
        sorted(tuple(line.split(b":", 1)) for line in LINES)
    assert all(r.headers == [("source", b"cli"), ("trace", b"42")] for r in records)
    for p in range(3):                             # line order is kept within a partition
        keys = [r.key for r in records if r.partition == p]
        assert keys == [line.split(b":")[0] for line in LINES
                        if line.split(b":")[0] in keys]

    result = ok(mq_run("consume", "t", "--from-beginning", "--max-messages", "8", "--format",
                       "json", "--socket", s))
    assert result.err == "consumed 8 records from t\n"
    assert by_position(json_lines(result)) == [as_json(r) for r in records]
    odd = next(o for o in json_lines(result) if o["key"] == "k6")
    assert odd["value"] == {"base64": "//4gbm90IHV0Zi04"}

    result = ok(mq_run("consume", "t", "--from-beginning", "--max-messages", "8",
                       "--socket", s))
    assert sorted(result.raw.split(b"\n")[:-1]) == sorted(r.value for r in records)
    assert result.raw.endswith(b"\n")

    result = ok(mq_run("consume", "t", "--from-beginning", "--max-messages", "8",
                       "--print-timestamp", "--print-partition", "--print-offset",
                       "--print-headers", "--print-key", "--socket", s))
    expected = sorted(b"CreateTime:%d\tPartition:%d\tOffset:%d\tsource:cli,trace:42\t%s\t%s"
                      % (r.timestamp_ms, r.partition, r.offset, r.key, r.value)
                      for r in records)
    assert sorted(result.raw.split(b"\n")[:-1]) == expected


def test_consume_prints_null_key_value_and_header_values(broker):
    create_topic(broker, "n")
    with Producer(socket=broker.socket) as producer:
        producer.send("n", None, key=None, headers=[("h", None)])
        producer.send("n", b"v", key=b"k")
    result = ok(mq_run("consume", "n", "--from-beginning", "--max-messages", "2",
                       "--print-key", "--print-headers", "--socket", broker.socket))
    assert result.raw == b"h:null\tnull\tnull\nNO_HEADERS\tk\tv\n"
    result = ok(mq_run("consume", "n", "--from-beginning", "--max-messages", "2",
                       "--format", "json", "--socket", broker.socket))
    assert json_lines(result) == [as_json(r) for r in read_all(broker, "n")]
    assert json_lines(result)[0]["value"] is None


@pytest.mark.parametrize("acks", ["0", "1", "all", "-1"])
def test_produce_acks(broker, acks):
    create_topic(broker, "a", 2)
    lines = [b"line-%d" % i for i in range(500)] + [b""]     # an empty line: an empty value
    result = ok(mq_run("produce", "a", "--acks", acks, "--partition", "1",
                       "--socket", broker.socket, stdin=b"\n".join(lines) + b"\n"))
    assert result.err == "produced 501 records to a\n"
    records = read_all(broker, "a")
    assert [(r.partition, r.offset, r.key, r.value) for r in records] == \
        [(1, i, None, line) for i, line in enumerate(lines)]
    result = ok(mq_run("consume", "a", "--from-beginning", "--max-messages", "501",
                       "--socket", broker.socket))
    assert result.raw == b"".join(line + b"\n" for line in lines)


@pytest.mark.parametrize("codec", ["gzip", "lz4"])
def test_produce_compressed(broker, codec):
    create_topic(broker, "c")
    stdin = b"".join(b"compressible value %d\n" % (i % 3) for i in range(300))
    ok(mq_run("produce", "c", "--compression", codec, "--socket", broker.socket, stdin=stdin))
    assert b"".join(r.value + b"\n" for r in read_all(broker, "c")) == stdin
    seg = os.path.join(broker.data_dir, "c-0", "00000000000000000000.log")
    dump = ok(mq_run("dump-log", seg)).out
    assert f"compresscodec: {codec}" in dump


def test_produce_empty_stdin(broker):
    create_topic(broker, "e")
    result = ok(mq_run("produce", "e", "--socket", broker.socket, stdin=b""))
    assert result.err == "produced 0 records to e\n"


def test_consume_offset_with_partition(broker):
    create_topic(broker, "o", 2)
    with Producer(socket=broker.socket) as producer:
        for i in range(10):
            producer.send("o", b"p1-%d" % i, partition=1)
            producer.send("o", b"p0-%d" % i, partition=0)
    s = broker.socket
    result = ok(mq_run("consume", "o", "--partition", "1", "--offset", "4", "--max-messages",
                       "6", "--print-offset", "--socket", s))
    assert result.raw == b"".join(b"Offset:%d\tp1-%d\n" % (i, i) for i in range(4, 10))
    result = ok(mq_run("consume", "o", "--partition", "0", "--offset", "earliest",
                       "--max-messages", "3", "--socket", s))
    assert result.raw == b"p0-0\np0-1\np0-2\n"
    # At the end offset: nothing yet; --timeout-ms ends the wait with exit status 0.
    for offset in ("10", "latest"):
        result = ok(mq_run("consume", "o", "--partition", "0", "--offset", offset,
                           "--timeout-ms", "200", "--socket", s))
        assert result.raw == b"" and result.err == "consumed 0 records from o\n"
    # --partition alone: that partition from the end (nothing), or from the beginning.
    result = ok(mq_run("consume", "o", "--partition", "1", "--from-beginning",
                       "--max-messages", "10", "--socket", s))
    assert result.raw == b"".join(b"p1-%d\n" % i for i in range(10))
    assert_one_error(mq_run("consume", "o", "--partition", "1", "--offset", "11",
                            "--socket", s), "o-1: offset 11 is out of range [0, 10]", code=1)
    with Admin(s) as admin:
        admin.delete_records("o", 1, 3)
    assert_one_error(mq_run("consume", "o", "--partition", "1", "--offset", "2",
                            "--socket", s), "out of range [3, 10]", code=1)


def test_consume_default_starts_at_the_end_and_follows(broker):
    """Without a start flag only records produced after the start print. Readiness: a marker
    is produced until the consumer prints it (each attempt waits on its stdout, no sleep)."""
    create_topic(broker, "f", 2)
    with Producer(socket=broker.socket) as producer:
        for i in range(5):
            producer.send("f", b"old-%d" % i)
    with mq_process("consume", "f", "--partition", "0", "--socket", broker.socket) as proc:
        lines = []
        reader = Lines(proc.stdout)
        with Producer(socket=broker.socket) as producer:
            deadline = time.monotonic() + WAIT
            attempt = 0
            while not lines:
                assert time.monotonic() < deadline, "the consumer printed nothing"
                producer.send("f", b"marker-%d" % attempt, partition=0).get(WAIT)
                attempt += 1
                line = reader.next(0.5)
                if line is not None:
                    lines.append(line)
            for i in range(3):
                producer.send("f", b"new-%d" % i, partition=0).get(WAIT)
            want = [b"new-%d\n" % i for i in range(3)]
            while lines[-3:] != want:
                line = reader.next(WAIT)
                assert line is not None, lines
                lines.append(line)
        assert all(line.startswith(b"marker-") for line in lines[:-3])
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    assert err.decode() == f"consumed {len(lines)} records from f (interrupted)\n"
    assert out == b""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_consume_until_signal_exits_0(broker, sig):
    create_topic(broker, "g")
    with Producer(socket=broker.socket) as producer:
        for i in range(20):
            producer.send("g", b"r%d" % i)
    with mq_process("consume", "g", "--from-beginning", "--socket", broker.socket) as proc:
        got = [proc.stdout.readline() for _ in range(20)]       # blocks until printed
        assert got == [b"r%d\n" % i for i in range(20)]
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0
    assert out == b"" and err == b"consumed 20 records from g (interrupted)\n"


def test_consume_from_datetime_and_offsets_by_time_match_brute_force(broker):
    """Records with chosen, partly out-of-order timestamps; for each query time, every
    partition starts at the first offset (in log order) whose timestamp is >= the time."""
    create_topic(broker, "ts", 3, {"retention.ms": "-1"})
    base = int(dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC).timestamp() * 1000)
    steps = [0, 1000, 2000, 1500, 3000, 3000, 2500, 7000, 4000, 9000, 8000, 12000]
    with Producer(socket=broker.socket, linger_ms=0) as producer:
        futures = [producer.send("ts", b"%d-%d" % (p, i), partition=p,
                                 timestamp_ms=base + step + 10 * p)
                   for i, step in enumerate(steps) for p in range(3)]
        for f in futures:
            f.get(WAIT)
    records = read_all(broker, "ts")
    s = broker.socket

    def expected(ts_ms: int) -> tuple[list, list]:
        starts, rest = [], []
        for p in range(3):
            part = [r for r in records if r.partition == p]
            first = next((r.offset for r in part if r.timestamp_ms >= ts_ms), -1)
            starts.append(first)
            if first >= 0:
                rest.extend(r for r in part if r.offset >= first)
        return starts, rest

    local = dt.datetime.fromtimestamp((base + 2500) / 1000).replace(tzinfo=None)
    queries = {
        "2024-05-01T12:00:00Z": base,
        "2024-05-01T12:00:01.500Z": base + 1500,
        "2024-05-01T14:00:02.005+02:00": base + 2005,
        local.isoformat(timespec="milliseconds"): base + 2500,    # naive: local time
        "2024-05-01 12:00:08": base + 8000,
        "2024-05-01T12:00:12.020Z": base + 12020,
        "2024-05-01T12:00:12.021Z": base + 12021,                 # after every record
        "2024-04-30": int(dt.datetime(2024, 4, 30).timestamp() * 1000),   # local midnight
    }
    for text, ts_ms in queries.items():
        starts, rest = expected(ts_ms)
        result = ok(mq_run("consume", "ts", "--from-datetime", text, "--timeout-ms", "300",
                           "--format", "json", "--socket", s))
        assert by_position(json_lines(result)) == [as_json(r) for r in rest], text
        result = ok(mq_run("offsets", "ts", "--time", text, "--socket", s))
        assert result.out == "".join(f"ts:{p}:{starts[p]}\n" for p in range(3)), text
    # Epoch milliseconds work for --time too.
    starts, _ = expected(base + 3000)
    assert ok(mq_run("offsets", "ts", "--time", base + 3000, "--socket", s)).out == \
        "".join(f"ts:{p}:{starts[p]}\n" for p in range(3))


def test_offsets_earliest_latest(broker):
    create_topic(broker, "off", 3)
    with Producer(socket=broker.socket) as producer:
        for p, n in enumerate((4, 0, 7)):
            for i in range(n):
                producer.send("off", b"x", partition=p)
    with Admin(broker.socket) as admin:
        admin.delete_records("off", 2, 5)
    s = broker.socket
    latest = "off:0:4\noff:1:0\noff:2:7\n"
    assert ok(mq_run("offsets", "off", "--socket", s)).out == latest
    assert ok(mq_run("offsets", "off", "--time", "latest", "--socket", s)).out == latest
    assert ok(mq_run("offsets", "off", "--time", "-1", "--socket", s)).out == latest
    earliest = "off:0:0\noff:1:0\noff:2:5\n"
    assert ok(mq_run("offsets", "off", "--time", "earliest", "--socket", s)).out == earliest
    assert ok(mq_run("offsets", "off", "--time", "-2", "--socket", s)).out == earliest
    assert ok(mq_run("offsets", "off", "--partition", "2", "--socket", s)).out == "off:2:7\n"


def test_produce_too_large_line_stops_after_flushing_the_records_before_it(broker):
    create_topic(broker, "big", 1, {"max.message.bytes": "2000"})
    stdin = b"a\nb\n" + b"x" * 5000 + b"\nc\n"
    line = assert_one_error(mq_run("produce", "big", "--socket", broker.socket, stdin=stdin),
                            "line 3 is too large", "max.message.bytes 2000",
                            "produced the 2 records before it to big", code=1)
    assert "5000" in line
    assert [r.value for r in read_all(broker, "big")] == [b"a", b"b"]


def test_produce_line_without_separator_stops(broker):
    create_topic(broker, "sep")
    line = assert_one_error(mq_run("produce", "sep", "--key-separator", "=", "--socket",
                                   broker.socket, stdin=b"k=v\nno separator\nk=w\n"),
                            "line 2 has no key separator '='", code=1)
    assert "produced the 1 record before it" in line
    assert [(r.key, r.value) for r in read_all(broker, "sep")] == [(b"k", b"v")]


# --- expected errors: one line, non-zero, no traceback ----------------------------------------

NO_BROKER = [
    ("topics", "list"), ("topics", "create", "x"), ("topics", "describe", "x"),
    ("topics", "alter", "x", "--config", "retention.ms=1"), ("topics", "delete", "x"),
    ("produce", "x"), ("consume", "x"), ("offsets", "x")]


@pytest.mark.parametrize("args", NO_BROKER, ids=" ".join)
def test_no_broker(tmp_path, args):
    path = tmp_path / "nothing.sock"
    line = assert_one_error(mq_run(*args, "--socket", path, stdin=b"a\n"), code=1)
    assert line == (f"mq: error: no broker at {path} (No such file or directory); start one "
                    "with `mq broker` or pass --socket")


def test_no_broker_default_socket_from_data_dir(tmp_path):
    env = {**ENV, "MQ_DATA_DIR": str(tmp_path / "d")}
    assert_one_error(mq_run("topics", "list", env=env),
                     f"no broker at {tmp_path / 'd' / 'mq.sock'}", code=1)


ERRORS = [
    # unknown topic
    (("topics", "describe", "nope"), b"", 1, "unknown topic 'nope'"),
    (("topics", "alter", "nope", "--config", "retention.ms=1"), b"", 1, "unknown topic 'nope'"),
    (("topics", "alter", "nope", "--partitions", "3"), b"", 1, "unknown topic 'nope'"),
    (("topics", "delete", "nope"), b"", 1, "unknown topic 'nope'"),
    (("produce", "nope"), b"a\n", 1, "unknown topic 'nope'"),
    (("consume", "nope", "--timeout-ms", "10"), b"", 1, "unknown topic 'nope'"),
    (("offsets", "nope"), b"", 1, "unknown topic 'nope'"),
    # topic exists, bad names and configs
    (("topics", "create", "t"), b"", 1, "topic 't' already exists"),
    (("topics", "create", "bad name!"), b"", 1, "bad name!"),
    (("topics", "create", "__internal"), b"", 1, "reserved"),
    (("topics", "create", "x", "--config", "retention.ms"), b"", 2,
     "invalid --config 'retention.ms': expected key=value"),
    (("topics", "create", "x", "--config", "=1"), b"", 2, "invalid --config '=1'"),
    (("topics", "create", "x", "--config", "no.such.config=1"), b"", 1,
     "unknown config 'no.such.config'"),
    (("topics", "create", "x", "--config", "retention.ms=soon"), b"", 1,
     "retention.ms must be an integer"),
    (("topics", "create", "x", "--partitions", "0"), b"", 2, "--partitions"),
    (("topics", "create", "x", "--partitions", "many"), b"", 2, "invalid integer 'many'"),
    (("topics", "alter", "t", "--config", "oops"), b"", 2, "invalid --config 'oops'"),
    (("topics", "alter", "t", "--config", "segment.bytes=1"), b"", 1, "segment.bytes"),
    (("topics", "alter", "t"), b"", 2, "nothing to alter"),
    (("topics", "alter", "t", "--partitions", "2"), b"", 1,
     "--partitions 2: topic 't' has 2 partitions and partitions can only be added"),
    (("topics", "alter", "t", "--partitions", "1", "--config", "retention.ms=5"), b"", 1,
     "the new total must be 3 to 10000, got 1"),
    # partition out of range
    (("produce", "t", "--partition", "9"), b"a\n", 1, "topic 't' has no partition 9 (it has 2)"),
    (("consume", "t", "--partition", "9"), b"", 1, "topic 't' has no partition 9 (it has 2)"),
    (("offsets", "t", "--partition", "9"), b"", 1, "topic 't' has no partition 9 (it has 2)"),
    (("consume", "t", "--partition", "0", "--offset", "4"), b"", 1,
     "t-0: offset 4 is out of range [0, 3]"),
    # bad datetimes
    (("consume", "t", "--from-datetime", "xyz"), b"", 2,
     "invalid datetime 'xyz': use ISO 8601 like 2024-05-01T12:00:00Z"),
    (("consume", "t", "--from-datetime", "2024-13-01"), b"", 2, "invalid datetime '2024-13-01'"),
    (("offsets", "t", "--time", "xyz"), b"", 2,
     "invalid datetime 'xyz': use ISO 8601 like 2024-05-01T12:00:00Z"),
    (("offsets", "t", "--time", "yesterday"), b"", 2, "invalid datetime 'yesterday'"),
    # bad flags and combinations
    (("produce", "t", "--acks", "2"), b"", 2, "--acks"),
    (("produce", "t", "--compression", "brotli"), b"", 2, "--compression"),
    (("produce", "t", "--header", "novalue"), b"a\n", 2, "invalid --header 'novalue'"),
    (("produce", "t", "--key-separator", ""), b"a\n", 2, "--key-separator"),
    (("produce",), b"", 2, "TOPIC"),
    (("consume", "t", "--group", "g", "--partition", "0"), b"", 2,
     "--group and --partition cannot be used together"),
    (("consume", "t", "--offset", "3"), b"", 2, "--offset needs --partition"),
    (("consume", "t", "--partition", "0", "--offset", "-3"), b"", 2, "--offset"),
    (("consume", "t", "--from-beginning", "--offset", "1", "--partition", "0"), b"", 2,
     "not allowed with"),
    (("consume", "t", "--max-messages", "0"), b"", 2, "--max-messages"),
    (("consume", "t", "--format", "xml"), b"", 2, "--format"),
    (("offsets", "t", "--bogus"), b"", 2, "unrecognized arguments: --bogus"),
    (("topics", "list", "--bogus"), b"", 2, "unrecognized arguments: --bogus"),
    (("consume", "t", "--bogus"), b"", 2, "unrecognized arguments: --bogus"),
    (("produce", "t", "--bogus"), b"", 2, "unrecognized arguments: --bogus"),
    (("demo", "--partitions", "0"), b"", 2, "--partitions"),
    (("demo", "--records", "1"), b"", 2, "--records"),
    (("demo", "--bogus"), b"", 2, "unrecognized arguments: --bogus"),
    (("broker", "--bogus"), b"", 2, "unrecognized arguments: --bogus"),
]


@pytest.mark.parametrize("args,stdin,code,fragment", ERRORS,
                         ids=[" ".join(e[0]) for e in ERRORS])
def test_expected_errors(shared, args, stdin, code, fragment):
    assert_one_error(mq_run(*args, "--socket", shared.socket, stdin=stdin), fragment, code=code)


@pytest.mark.parametrize("args,fragment", [
    (("topics",), "no topics command given"), (("topics", "bogus"), "invalid choice"),
    (("topics", "list", "x"), "unrecognized arguments: x")])
def test_topics_usage_errors(args, fragment):
    assert_one_error(mq_run(*args), fragment, code=2)


def test_topics_socket_before_the_command(shared):
    assert ok(mq_run("topics", "--socket", shared.socket, "list")).out == "t\n"


def test_errors_change_nothing(shared):
    """After the error cases (on this worker's broker): topic t is as the fixture made it."""
    with Admin(shared.socket) as admin:
        assert admin.list_topics() == ["t"]
        info = admin.describe_topic("t")
    assert info["partitions"] == 2 and info["offsets"] == [(0, 3), (0, 0)]
    assert info["overrides"] == {}


# --- mq broker --------------------------------------------------------------------------------

@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_broker_command_serves_and_stops_cleanly(tmp_path, sig):
    sock = f"/tmp/mq-cli-{os.getpid()}-{sig.value}.sock"
    if len(str(tmp_path / "s.sock")) < 100:
        sock = str(tmp_path / "s.sock")
    with mq_process("broker", "--data-dir", tmp_path / "data", "--socket", sock) as proc:
        mq.testing.wait_for(lambda: can_connect(sock) or proc.poll() is not None, WAIT,
                            message="the broker's socket")
        assert proc.poll() is None, proc.communicate()
        ok(mq_run("topics", "create", "live", "--partitions", "2", "--socket", sock))
        ok(mq_run("produce", "live", "--socket", sock, stdin=b"one\ntwo\n"))
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    err = err.decode()
    assert "Traceback" not in err and "broker ready" in err and "stopped cleanly" in err
    assert not os.path.exists(sock)
    assert os.path.exists(tmp_path / "data" / ".kafka_cleanshutdown")
    # The data is there after a restart.
    with mq.testing.broker(tmp_path / "data") as b:
        assert ok(mq_run("offsets", "live", "--socket", b.socket)).out in (
            "live:0:2\nlive:1:0\n", "live:0:0\nlive:1:2\n", "live:0:1\nlive:1:1\n")


def test_broker_command_refuses_a_data_dir_in_use(broker, tmp_path):
    result = mq_run("broker", "--data-dir", broker.data_dir, "--socket", tmp_path / "b.sock")
    assert_one_error(result, f"{broker.data_dir} is in use by another process", code=1)
    assert broker.proc.poll() is None


def test_broker_command_bad_config_file(tmp_path):
    conf = tmp_path / "mq.toml"
    conf.write_text('bogus_key = 1\n')
    assert_one_error(mq_run("broker", "--data-dir", tmp_path / "d", "--config", conf),
                     "unknown broker config 'bogus_key'", code=2)
    assert_one_error(mq_run("broker", "--data-dir", tmp_path / "d", "--config",
                            tmp_path / "missing.toml"), "cannot read config file", code=2)


# --- mq demo ----------------------------------------------------------------------------------

def _demo_totals(result: Result, records: int) -> None:
    assert f"total: {records:,} records produced, {records:,} consumed (all of them)" \
        in result.out, result
    for role in ("producer 0 (acks=all)", "producer 1 (acks=1)", "consumer 0", "consumer 1",
                 "end to end", "records/s", "MB/s", "sample records:"):
        assert role in result.out, (role, result)


@pytest.mark.parametrize("how", ["--data-dir", "MQ_DATA_DIR"])
def test_demo_starts_and_stops_its_broker(tmp_path, how):
    data_dir = tmp_path / "d"
    if how == "--data-dir":
        result = ok(mq_run("demo", "--data-dir", data_dir, "--records", "2000"))
    else:
        result = ok(mq_run("demo", "--records", "2000", env={**ENV, "MQ_DATA_DIR": data_dir}))
    _demo_totals(result, 2000)
    assert "Broker stopped cleanly (exit 0)" in result.out
    assert result.out.count(": OK: ") == 4
    assert "Traceback" not in result.err
    assert os.path.exists(data_dir / ".kafka_cleanshutdown")
    assert not os.path.exists(data_dir / "mq.sock")


def test_demo_killed_leaves_no_worker_behind(broker):
    with mq_process("demo", "--socket", broker.socket, "--records", "100000000") as proc:
        demo = psutil.Process(proc.pid)
        mq.testing.wait_for(lambda: len(demo.children()) == 4, timeout=WAIT,
                            message="the demo's 4 workers")
        workers = demo.children()
        proc.kill()
        proc.wait()
        _, alive = psutil.wait_procs(workers, timeout=WAIT)
    assert alive == []


def test_demo_uses_a_running_broker_and_recreates_its_topic(broker):
    for _ in range(2):                     # the second run deletes and recreates 'demo'
        result = ok(mq_run("demo", "--socket", broker.socket, "--records", "3001",
                           "--partitions", "3"))
        _demo_totals(result, 3001)
        assert f"The broker at {broker.socket} keeps running" in result.out
        assert "using the broker already running" in result.err
    assert broker.proc.poll() is None
    with Admin(broker.socket) as admin:
        info = admin.describe_topic("demo")
    assert info["partitions"] == 3
    assert sum(end for _, end in info["offsets"]) == 3001
    assert info["overrides"] == {"segment.bytes": str(4 << 20)}


def test_demo_progress_never_shows_more_consumed_than_produced(broker):
    """The progress line compares like with like: records in the log (end offsets, read
    after) against distinct records consumed (read before). It used to set the producers'
    send counters, updated every 1024 records, against the consumers' live count."""
    often = ("import sys; import mq.cli.demo as demo; demo.PROGRESS_S = (0.001, 0.001); "
             "from mq.cli.main import main; sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", often, "demo", "--socket", broker.socket,
                           "--records", "200000"], capture_output=True, env=ENV,
                          timeout=300, check=False)
    result = ok(Result(proc))
    _demo_totals(result, 200000)
    shown = [(int(p.replace(",", "")), int(c.replace(",", ""))) for p, c in re.findall(
        r"mq demo: produced ([\d,]+) / 200,000, consumed ([\d,]+)", result.err)]
    assert len(shown) >= 2, result
    assert [(p, c) for p, c in shown if c > p] == []
    assert "re-delivered" not in result.err + result.out        # the group did not rebalance
