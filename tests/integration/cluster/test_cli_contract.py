"""The ``mq`` command line on a Kafka cluster (issue 24): ``--bootstrap-server``,
``$MQ_BOOTSTRAP_SERVERS`` and ``--command-config`` on the client commands, run as real
processes against both of this directory's backends (mq's own Kafka listener and the shared
three-node Apache Kafka cluster) alike: topics, produce and consume (keys, headers), offsets,
groups (describe, reset, a member's final commit), ``top --once``, the errors a cluster gives
(transactions are mq's own), a bad ``--command-config`` and a cluster that is not there (one
``mq: error:`` line each).

The cluster is shared by the run, so every test names its topics and groups uniquely; another
test may have a node down meanwhile, so nothing here expects every replica in sync.
"""

from __future__ import annotations

import json
import signal
import socket
import uuid

import pytest
from cli_run import ENV, Lines, assert_one_error, json_lines, mq_process, mq_run, ok

from mq.cli.common import plural
from mq.testing import wait_for


@pytest.fixture
def bootstrap(backend) -> str:
    """HOST:PORT[,...] of mq's Kafka listener, or of the Kafka cluster."""
    return backend.bootstrap


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def on(bootstrap: str, *args, **kwargs):
    """``mq ARGS --bootstrap-server BOOTSTRAP``."""
    return mq_run(*args, "--bootstrap-server", bootstrap, **kwargs)


def create(bootstrap: str, partitions: int = 3) -> str:
    topic = unique("t")
    out = ok(on(bootstrap, "topics", "create", topic, "--partitions", partitions)).out
    assert out == f"Created topic {topic} with {partitions} partitions.\n"
    return topic


def produce(bootstrap: str, topic: str, lines: list[str], *flags) -> None:
    result = ok(on(bootstrap, "produce", topic, *flags,
                   stdin="".join(line + "\n" for line in lines).encode()))
    assert result.err == f"produced {plural(len(lines), 'record')} to {topic}\n"


# --- topics -----------------------------------------------------------------------------------

def test_topics_create_list_describe_alter_delete(bootstrap):
    topic = unique("t")
    ok(on(bootstrap, "topics", "create", topic, "--partitions", 2, "--config",
          "retention.ms=3600000"))
    assert topic in ok(mq_run("topics", "--bootstrap-server", bootstrap, "list")).out.split()

    text = ok(on(bootstrap, "topics", "describe", topic)).out.splitlines()
    assert text[0].startswith(f"Topic: {topic}\tTopicId: ")
    assert "\tPartitionCount: 2\tReplicationFactor: " in text[0]
    for p in (0, 1):
        fields = dict(f.split(": ", 1) for f in text[1 + p].strip("\t").split("\t"))
        assert fields["Partition"] == str(p)
        assert (fields["StartOffset"], fields["EndOffset"]) == ("0", "0")
        replicas = fields["Replicas"].split(",")
        assert fields["Leader"] in fields["Isr"].split(",")
        assert set(fields["Isr"].split(",")) <= set(replicas)
    assert "\t* retention.ms=3600000" in text

    [info] = json_lines(ok(on(bootstrap, "topics", "describe", topic, "--json")))
    assert info["topic"] == topic and info["overrides"] == {"retention.ms": "3600000"}
    for p, part in enumerate(info["partitions"]):
        assert set(part) == {"partition", "startOffset", "endOffset", "leader", "replicas",
                             "isr"}
        assert part["partition"] == p and part["leader"] in part["replicas"]

    ok(on(bootstrap, "topics", "alter", topic, "--config", "retention.ms=60000",
          "--partitions", 3))
    [info] = json_lines(ok(on(bootstrap, "topics", "describe", topic, "--json")))
    assert len(info["partitions"]) == 3 and info["overrides"]["retention.ms"] == "60000"

    assert_one_error(on(bootstrap, "topics", "create", topic), "already exists", code=1)
    assert ok(on(bootstrap, "topics", "delete", topic)).out == f"Deleted topic {topic}.\n"
    wait_for(lambda: topic not in ok(on(bootstrap, "topics", "list")).out.split(),
             timeout=60, message="the deleted topic to leave the list")
    assert_one_error(on(bootstrap, "topics", "describe", unique("none")), code=1)


# --- produce, consume, offsets ----------------------------------------------------------------

def test_produce_then_consume_keys_and_headers(bootstrap):
    topic = create(bootstrap)
    lines = [f"key-{i}:value {i}" for i in range(12)]
    produce(bootstrap, topic, lines, "--key-separator", ":", "--header", "source=cli",
            "--header", "run=1")

    result = ok(on(bootstrap, "consume", topic, "--from-beginning", "--max-messages", 12,
                   "--format", "json"))
    assert result.err == f"consumed 12 records from {topic}\n"
    records = json_lines(result)
    assert sorted((r["key"], r["value"]) for r in records) == sorted(
        tuple(line.split(":", 1)) for line in lines)
    assert all(r["headers"] == [{"key": "source", "value": "cli"}, {"key": "run", "value": "1"}]
               and r["topic"] == topic and r["timestampType"] == "CreateTime" for r in records)
    # A key always goes to the same partition, in order there.
    by_key = {r["key"]: (r["partition"], r["offset"]) for r in records}
    assert len({p for p, _ in by_key.values()}) > 1
    for p in range(3):
        offsets = sorted(o for q, o in by_key.values() if q == p)
        assert offsets == list(range(len(offsets)))

    first = min(records, key=lambda r: (r["partition"], r["offset"]))
    text = ok(on(bootstrap, "consume", topic, "--partition", first["partition"], "--offset", 0,
                 "--max-messages", 1, "--print-key", "--print-headers", "--print-offset"))
    assert text.out == f"Offset:0\tsource:cli,run:1\t{first['key']}\t{first['value']}\n"

    # Nothing new arrives: the default start is each partition's end.
    idle = ok(on(bootstrap, "consume", topic, "--timeout-ms", 500))
    assert idle.out == "" and idle.err == f"consumed 0 records from {topic}\n"


def test_offsets(bootstrap):
    topic = create(bootstrap)
    produce(bootstrap, topic, [f"k{i}:v" for i in range(20)], "--key-separator", ":")
    latest = ok(on(bootstrap, "offsets", topic)).out.splitlines()
    assert [line.rsplit(":", 1)[0] for line in latest] == [f"{topic}:{p}" for p in range(3)]
    assert sum(int(line.rsplit(":", 1)[1]) for line in latest) == 20
    assert ok(on(bootstrap, "offsets", topic, "--time", "earliest")).out == "".join(
        f"{topic}:{p}:0\n" for p in range(3))
    assert ok(on(bootstrap, "offsets", topic, "--time", "2000-01-01", "--partition", 1)).out \
        == f"{topic}:1:0\n"
    assert ok(on(bootstrap, "offsets", topic, "--time", "2999-01-01", "--partition", 2)).out \
        == f"{topic}:2:-1\n"
    assert_one_error(on(bootstrap, "offsets", topic, "--partition", 7), "no partition 7",
                     code=1)


# --- groups -----------------------------------------------------------------------------------

def describe(bootstrap: str, group: str) -> list[dict]:
    return json_lines(ok(on(bootstrap, "groups", "describe", group, "--json")))


def test_groups_list_describe_reset_delete(bootstrap):
    topic, group = create(bootstrap), unique("g")
    produce(bootstrap, topic, [f"k{i}:v{i}" for i in range(9)], "--key-separator", ":")
    ok(on(bootstrap, "consume", topic, "--group", group, "--from-beginning", "--max-messages",
          9))
    assert {"group": group, "state": "Empty", "members": 0} in json_lines(
        ok(on(bootstrap, "groups", "list", "--json")))
    rows = describe(bootstrap, group)
    assert [(r["topic"], r["partition"], r["lag"]) for r in rows] == [
        (topic, p, 0) for p in range(3)]
    assert sum(r["committedOffset"] for r in rows) == 9
    assert set(rows[0]) == {"group", "topic", "partition", "committedOffset", "endOffset", "lag",
                            "memberId", "host", "clientId"}
    text = ok(on(bootstrap, "groups", "describe", group)).out.splitlines()
    assert text[0] == f"Consumer group {group!r} has no active members."
    assert text[2].split() == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET",
                               "LOG-END-OFFSET", "LAG", "MEMBER-ID", "HOST", "CLIENT-ID"]

    plan = ok(on(bootstrap, "groups", "reset-offsets", group, "--topic", f"{topic}:0,1",
                 "--to-earliest", "--dry-run"))
    assert plan.out.splitlines()[0].split() == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET",
                                                "NEW-OFFSET"]
    assert [line.split()[-1] for line in plan.out.splitlines()[1:]] == ["0", "0"]
    assert describe(bootstrap, group) == rows                     # a dry run changes nothing
    ok(on(bootstrap, "groups", "reset-offsets", group, "--topic", topic, "--to-earliest",
          "--execute"))
    assert [r["lag"] for r in describe(bootstrap, group)] == [r["committedOffset"] for r in rows]
    again = ok(on(bootstrap, "consume", topic, "--group", group, "--max-messages", 9))
    assert sorted(again.out.split()) == sorted(f"v{i}" for i in range(9))

    ok(on(bootstrap, "groups", "delete", group))
    assert_one_error(on(bootstrap, "groups", "describe", group), "does not exist", code=1)


def test_a_live_member_is_named_by_client_and_host(bootstrap):
    topic, group = create(bootstrap, partitions=2), unique("g")
    with mq_process("consume", topic, "--group", group, "--bootstrap-server", bootstrap) as proc:
        def assigned() -> bool:
            result = on(bootstrap, "groups", "describe", group)
            return result.code == 0 and "1 member" in result.out.splitlines()[0] \
                and f"{topic}(0,1)" in result.out
        wait_for(assigned, timeout=60, message="the consumer to join and get both partitions")
        text = ok(on(bootstrap, "groups", "describe", group)).out.splitlines()
        header = next(i for i, line in enumerate(text) if line.startswith("MEMBER-ID "))
        assert text[header].split() == ["MEMBER-ID", "INSTANCE-ID", "HOST", "CLIENT-ID",
                                        "#PARTITIONS", "ASSIGNMENT"]
        member_id, instance, host, client_id, count, assignment = text[header + 1].split()
        assert (instance, count, assignment) == ("-", "2", f"{topic}(0,1)")
        assert [(r["memberId"], r["host"], r["clientId"]) for r in describe(bootstrap, group)] \
            == [(member_id, host, client_id)] * 2
        assert_one_error(on(bootstrap, "groups", "reset-offsets", group, "--topic", topic,
                            "--to-earliest", "--execute"), "1 live member", code=1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_a_member_commits_where_it_stopped_in_every_partition(bootstrap):
    """What a group member printed is committed, and a partition it printed nothing from is
    committed where it started: the next run reads every record exactly once, also those
    that arrived in a partition while the first run was there but stopped before them."""
    topic, group = create(bootstrap), unique("g")
    # Every partition starts at a committed 0, so no record can be missed: with no committed
    # offset a partition would start at its end as librdkafka resolves it, which on a loaded
    # box may come after the records below.
    ok(on(bootstrap, "groups", "reset-offsets", group, "--topic", topic, "--to-earliest",
          "--execute"))
    with mq_process("consume", topic, "--group", group, "--max-messages", 2,
                    "--bootstrap-server", bootstrap) as proc:
        lines = Lines(proc.stdout)
        produce(bootstrap, topic, ["warm-up"], "--partition", "0")
        assert lines.next(timeout=60) == b"warm-up\n"       # it has every partition now
        produce(bootstrap, topic, [f"k{i}:v{i}" for i in range(30)], "--key-separator", ":")
        assert proc.wait(timeout=60) == 0                   # after one more record
        first = lines.next(timeout=5).decode().split()
    second = ok(on(bootstrap, "consume", topic, "--group", group, "--timeout-ms", 3000)).out
    assert sorted(first + second.split()) == sorted(f"v{i}" for i in range(30))


# --- where: the environment, --socket, --command-config ---------------------------------------

def test_the_environment_names_the_cluster_and_the_flags_win(bootstrap, tmp_path):
    env = {**ENV, "MQ_BOOTSTRAP_SERVERS": bootstrap}
    topic = unique("t")
    ok(mq_run("topics", "create", topic, env=env))
    assert topic in ok(mq_run("topics", "list", env=env)).out.split()
    # --socket means the local broker, whatever the environment says.
    assert_one_error(mq_run("topics", "list", "--socket", tmp_path / "none.sock", env=env),
                     "no broker at", code=1)
    # --bootstrap-server wins over the environment.
    env["MQ_BOOTSTRAP_SERVERS"] = f"127.0.0.1:{closed_port()}"
    assert topic in ok(mq_run("topics", "list", "--bootstrap-server", bootstrap,
                              env=env)).out.split()
    assert_one_error(mq_run("topics", "list", "--socket", tmp_path / "s.sock",
                            "--bootstrap-server", bootstrap), "not both", code=2)


def test_command_config(bootstrap, tmp_path):
    props = tmp_path / "client.properties"
    props.write_text("# a comment\nclient.id = mq-cli-test\nsocket.keepalive.enable=true\n")
    topic = create(bootstrap)
    assert topic in ok(on(bootstrap, "topics", "list", "--command-config", props)).out.split()
    produce(bootstrap, topic, ["a", "b"], "--command-config", str(props))

    props.write_text("client.id=x\nthis line has no separator\n")
    assert_one_error(on(bootstrap, "topics", "list", "--command-config", props),
                     "client.properties:2: not a key=value line", code=2)
    props.write_text("no.such.property=1\n")
    assert_one_error(on(bootstrap, "consume", topic, "--command-config", props),
                     'No such configuration property: "no.such.property"', code=2)
    assert_one_error(on(bootstrap, "topics", "list", "--command-config",
                        tmp_path / "missing.properties"), "No such file or directory", code=1)
    assert_one_error(mq_run("topics", "list", "--command-config", props),
                     "--command-config is for a Kafka cluster", code=2)


# --- what a cluster does not do, and what it shows instead ------------------------------------

def test_transactions_are_one_line_errors(bootstrap):
    for args in (("transactions", "list"), ("transactions", "describe", "tx-1"),
                 ("transactions", "list", "--json")):
        assert_one_error(on(bootstrap, *args), "not available on a Kafka cluster", code=1)


def test_top_once(bootstrap):
    topic, group = create(bootstrap), unique("g")
    produce(bootstrap, topic, [f"k{i}:v" for i in range(6)], "--key-separator", ":")
    ok(on(bootstrap, "consume", topic, "--group", group, "--from-beginning",
          "--max-messages", 4))
    snap = json.loads(ok(on(bootstrap, "top", "--once", "--json", "--interval", 0.2)).out)
    assert snap["cluster"]["brokers"] and snap["cluster"]["controller"] is not None
    [row] = [t for t in snap["topics"] if t["topic"] == topic]
    assert (row["partitions"], row["records"]) == (3, 6)
    assert row["inRecordsPerSecond"] is not None
    [g] = [g for g in snap["groups"] if g["group"] == group]
    assert (g["lag"], g["topics"], g["lagSeconds"]) == (2, [topic], None)
    text = ok(on(bootstrap, "top", "--once", "--interval", 0)).out.splitlines()
    assert text[0].startswith("cluster ") and "under-replicated" in text[0]
    assert text[1].startswith("brokers ")
    assert text[3].split() == ["TOPIC", "PARTS", "RF", "URP", "OFFLINE", "RECORDS", "IN-REC/S",
                               "OUT-REC/S"]


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_cluster_there_is_one_line_in_bounded_time(tmp_path):
    """librdkafka retries until the request timeout (30 s, or socket.timeout.ms from
    --command-config) runs out; then one line."""
    config = tmp_path / "client.properties"
    config.write_text("socket.timeout.ms=3000\n")
    result = mq_run("topics", "list", "--bootstrap-server", f"127.0.0.1:{closed_port()}",
                    "--command-config", str(config), timeout=120)
    assert_one_error(result, code=1)
