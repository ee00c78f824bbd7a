"""``mq groups`` (list, describe, delete, reset-offsets) and ``mq consume --group`` run as real
processes (``python -m mq``) against a real broker subprocess (``mq.testing.broker``) on each
test's own data dir and socket.

Group members are in-process ``mq.Consumer``s (each has its own connection and heartbeat
thread, so the broker sees a live member) or ``mq consume --group`` processes. What the CLI
prints is compared with what the admin client reads; reset offsets are compared with offsets
computed here from the log (brute force over every record for --to-datetime). Every expected
error must be one ``mq: error:`` line on stderr with a non-zero exit and never a traceback.
Nothing sleeps to wait for a condition: ``mq.testing.wait_for`` and pipe reads with timeouts.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import signal
import time

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
    mq_process,
    mq_run,
    ok,
)

import mq.testing
from mq.cli.groups import clamp, parse_duration, parse_topic_spec
from mq.client.admin import Admin
from mq.client.consumer import Consumer
from mq.client.producer import Producer
from mq.client.types import TopicPartition as TP
from mq.errors import GroupIdNotFoundError

LIVE_ERROR = "has 1 live member(s); stop them first (consumers must leave the group)"


# --- helpers ----------------------------------------------------------------------------------

def now_ms() -> int:
    return time.time_ns() // 1_000_000


def table(text: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of a whitespace-aligned table (cells hold no spaces)."""
    lines = text.splitlines()
    return lines[0].split(), [line.split() for line in lines[1:]]


def produce(b, topic: str, values, partition: int = 0, timestamp_ms=None) -> None:
    """Send and wait for each ack; ``timestamp_ms``: one per value, or None."""
    with Producer(socket=b.socket, linger_ms=0) as producer:
        stamps = timestamp_ms or [None] * len(values)
        futures = [producer.send(topic, v, partition=partition, timestamp_ms=ts)
                   for v, ts in zip(values, stamps)]
        for f in futures:
            f.get(WAIT)


def offsets(b, group: str) -> dict[TP, int]:
    with Admin(b.socket) as admin:
        return admin.list_group_offsets(group)


@contextlib.contextmanager
def member(b, group: str, topic: str, partitions: int):
    """A live in-process member of ``group`` that owns all ``partitions`` of ``topic`` (as the
    broker sees it). Auto-commit is off: it changes no committed offset unless told to."""
    with Consumer(topic, group_id=group, socket=b.socket, enable_auto_commit=False) as consumer, \
            Admin(b.socket) as admin:
        def owns_all() -> bool:
            consumer.poll(timeout_ms=0)
            try:
                desc = admin.describe_group(group)
            except GroupIdNotFoundError:              # before the first heartbeat
                return False
            return desc["state"] == "Stable" and len(consumer.assignment()) == partitions and \
                sum(len(m["assignment"]) for m in desc["members"]) == partitions
        mq.testing.wait_for(owns_all, timeout=WAIT, message=f"a member of {group} owning "
                            f"{partitions} partitions")
        yield consumer


# --- pure parsers -----------------------------------------------------------------------------

@pytest.mark.parametrize("text,ms", [
    ("PT10M", 600_000), ("P1DT2H", 93_600_000), ("pt1.5s", 1_500), ("PT0,25S", 250),
    ("P2D", 172_800_000), ("PT1H30M", 5_400_000), ("30s", 30_000), ("10m", 600_000),
    ("2h", 7_200_000), ("1d", 86_400_000), ("500ms", 500), ("1h30m", 5_400_000)])
def test_parse_duration(text, ms):
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["", "P", "PT", "P1DT", "-PT5M", "PT-5M", "10", "10x", "m",
                                  "1.5h", "P1W", "P1M", "soon", "PT5M junk"])
def test_parse_duration_rejects(text):
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_parse_topic_spec_and_clamp():
    assert parse_topic_spec("orders") == ("orders", None)
    assert parse_topic_spec("orders:2,0,2") == ("orders", (0, 2))
    for bad in ("", ":0", "t:", "t:x", "t:1,,2", "t:-1", "t:0:1", "t: 1"):
        with pytest.raises(ValueError, match="invalid topic"):
            parse_topic_spec(bad)
    assert [clamp(x, 2, 10) for x in (0, 2, 5, 10, 11)] == [2, 2, 5, 10, 10]


# --- help -------------------------------------------------------------------------------------

@pytest.mark.parametrize("command", [("groups",), ("groups", "list"), ("groups", "describe"),
                                     ("groups", "delete"), ("groups", "reset-offsets")])
def test_help(command):
    assert_help(command)


def test_top_level_help_lists_groups():
    assert "groups" in ok(mq_run("--help")).out


# --- describe and list ------------------------------------------------------------------------

def test_describe_lag_text_and_json(broker):
    """7 + 5 records, 3 + 5 committed by a live member: lag 4 and 0; the lag of partition 0 in
    seconds is the age of record 3, produced with a timestamp a minute ago."""
    create_topic(broker, "o", 2)
    t0 = now_ms() - 60_000
    produce(broker, "o", [b"a%d" % i for i in range(7)], 0, [t0 + i for i in range(7)])
    produce(broker, "o", [b"b%d" % i for i in range(5)], 1)
    with member(broker, "billing", "o", 2) as consumer:
        consumer.commit({TP("o", 0): 3, TP("o", 1): 5})
        with Admin(broker.socket) as admin:
            member_id = admin.describe_group("billing")["members"][0]["member_id"]
        rows = json_lines(ok(mq_run("groups", "describe", "billing", "--json",
                                    "--socket", broker.socket)))
        assert [r.pop("lagSeconds") for r in rows][1] == 0.0
        assert rows == [
            {"group": "billing", "topic": "o", "partition": 0, "committedOffset": 3,
             "endOffset": 7, "lag": 4, "memberId": member_id, "pid": os.getpid()},
            {"group": "billing", "topic": "o", "partition": 1, "committedOffset": 5,
             "endOffset": 5, "lag": 0, "memberId": member_id, "pid": os.getpid()}]
        lag_s = json_lines(mq_run("groups", "describe", "billing", "--json", "--socket",
                                  broker.socket))[0]["lagSeconds"]
        assert 60 - 0.003 <= lag_s < 60 + 5 * WAIT

        text = ok(mq_run("groups", "describe", "billing", "--socket", broker.socket)).out
        status, partitions, members = text.split("\n\n")
        assert status == "Consumer group 'billing': Stable, 1 member, group epoch 1, " \
                         "assignor sticky."
        header, cells = table(partitions)
        assert header == ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET",
                          "LAG", "LAG-SECONDS", "MEMBER-ID", "PID"]
        assert [row[:6] + row[7:] for row in cells] == [
            ["billing", "o", "0", "3", "7", "4", member_id, str(os.getpid())],
            ["billing", "o", "1", "5", "5", "0", member_id, str(os.getpid())]]
        assert float(cells[0][6]) >= 60 - 0.003 and cells[1][6] == "0.0"
        header, cells = table(members)
        assert header == ["MEMBER-ID", "INSTANCE-ID", "PID", "EPOCH", "STATE", "#PARTITIONS",
                          "ASSIGNMENT"]
        assert cells == [[member_id, "-", str(os.getpid()), "1", "Stable", "2", "o(0,1)"]]
    # The member left: same offsets, nobody owns the partitions.
    rows = json_lines(ok(mq_run("groups", "describe", "billing", "--json",
                                "--socket", broker.socket)))
    assert [(r["committedOffset"], r["lag"], r["memberId"], r["pid"]) for r in rows] == \
        [(3, 4, None, None), (5, 0, None, None)]
    text = ok(mq_run("groups", "describe", "billing", "--socket", broker.socket)).out
    status, partitions = text.split("\n\n")
    assert status == "Consumer group 'billing' has no active members."
    assert [row[:6] + row[7:] for row in table(partitions)[1]] == [
        ["billing", "o", "0", "3", "7", "4", "-", "-"],
        ["billing", "o", "1", "5", "5", "0", "-", "-"]]


def test_describe_lists_assigned_partitions_without_offsets(broker):
    create_topic(broker, "fresh", 3)
    produce(broker, "fresh", [b"x", b"y"], 2)
    with member(broker, "new", "fresh", 3):
        rows = json_lines(ok(mq_run("groups", "describe", "new", "--json",
                                    "--socket", broker.socket)))
    assert [(r["partition"], r["committedOffset"], r["endOffset"], r["lag"], r["lagSeconds"],
             r["pid"]) for r in rows] == [(0, None, 0, None, None, os.getpid()),
                                          (1, None, 0, None, None, os.getpid()),
                                          (2, None, 2, None, None, os.getpid())]
    assert all(r["memberId"] for r in rows)


def test_list(broker):
    s = broker.socket
    assert ok(mq_run("groups", "list", "--socket", s)).out == ""
    assert ok(mq_run("groups", "list", "--json", "--socket", s)).out == ""
    create_topic(broker, "l", 2)
    with Admin(s) as admin:
        admin.alter_group_offsets("idle", {TP("l", 0): 0})
    with member(broker, "busy", "l", 2):
        header, rows = table(ok(mq_run("groups", "list", "--socket", s)).out)
        assert header == ["GROUP", "STATE", "MEMBERS"]
        assert rows == [["busy", "Stable", "1"], ["idle", "Empty", "0"]]
        assert json_lines(ok(mq_run("groups", "list", "--json", "--socket", s))) == [
            {"group": "busy", "state": "Stable", "members": 1},
            {"group": "idle", "state": "Empty", "members": 0}]
    # The member left, the group stays (Empty). 'groups --socket S list' works too.
    assert table(ok(mq_run("groups", "--socket", s, "list")).out)[1] == [
        ["busy", "Empty", "0"], ["idle", "Empty", "0"]]


# --- delete -----------------------------------------------------------------------------------

def test_delete_refused_with_live_members_then_deleted(broker):
    s = broker.socket
    create_topic(broker, "d", 2)
    with member(broker, "g", "d", 2) as consumer:
        consumer.commit({TP("d", 0): 0})
        assert_one_error(mq_run("groups", "delete", "g", "--socket", s),
                         f"group 'g' {LIVE_ERROR}", code=1)
        assert offsets(broker, "g") == {TP("d", 0): 0}
    assert ok(mq_run("groups", "delete", "g", "--socket", s)).out == \
        "Deleted consumer group 'g'.\n"
    assert offsets(broker, "g") == {}
    assert ok(mq_run("groups", "list", "--socket", s)).out == ""
    assert_one_error(mq_run("groups", "describe", "g", "--socket", s),
                     "group 'g' does not exist", code=1)
    assert_one_error(mq_run("groups", "delete", "g", "--socket", s),
                     "group 'g' does not exist", code=1)


# --- reset-offsets ----------------------------------------------------------------------------

BASELINE = {TP("r", 0): 5, TP("r", 1): 1}


@pytest.fixture(scope="module")
def resets(tmp_path_factory):
    """One broker per xdist worker; each case uses its own group. Topic r: partition 0 holds
    offsets [2, 10) (0 and 1 deleted), 2 h old up to offset 4 and 1 min old from 5; partition 1
    holds 4 records, 2 h old; partition 2 is empty. Topic q: 3 records, 2 h old."""
    with mq.testing.broker(tmp_path_factory.mktemp("resets") / "data") as b:
        create_topic(b, "r", 3, {"retention.ms": "-1"})
        create_topic(b, "q", 1, {"retention.ms": "-1"})
        now = now_ms()
        old, recent = now - 7_200_000, now - 60_000
        produce(b, "r", [b"%d" % i for i in range(10)], 0, [old] * 5 + [recent] * 5)
        produce(b, "r", [b"%d" % i for i in range(4)], 1, [old] * 4)
        produce(b, "q", [b"%d" % i for i in range(3)], 0, [old] * 3)
        with Admin(b.socket) as admin:
            admin.delete_records("r", 0, 2)
        yield b


RESETS = [  # scenario, --topic values, {(topic, partition): new offset}
    (["--to-earliest"], ["r"], {("r", 0): 2, ("r", 1): 0, ("r", 2): 0}),
    (["--to-latest"], ["r"], {("r", 0): 10, ("r", 1): 4, ("r", 2): 0}),
    (["--to-latest"], ["r:1", "q"], {("r", 1): 4, ("q", 0): 3}),
    (["--to-offset", "3"], ["r"], {("r", 0): 3, ("r", 1): 3, ("r", 2): 0}),
    (["--to-offset", "0"], ["r:0"], {("r", 0): 2}),
    (["--to-offset", "100"], ["r:0,1"], {("r", 0): 10, ("r", 1): 4}),
    (["--shift-by", "-4"], ["r:0,1"], {("r", 0): 2, ("r", 1): 0}),
    (["--shift-by=-1"], ["r:0"], {("r", 0): 4}),
    (["--shift-by", "2"], ["r:1", "r:0"], {("r", 0): 7, ("r", 1): 3}),
    (["--shift-by", "100"], ["r:0"], {("r", 0): 10}),
    (["--to-datetime", "2999-01-01T00:00:00Z"], ["r"], {("r", 0): 10, ("r", 1): 4, ("r", 2): 0}),
    (["--to-datetime", "2000-01-01"], ["r", "q"],
     {("r", 0): 2, ("r", 1): 0, ("r", 2): 0, ("q", 0): 0}),
    (["--by-duration", "PT30M"], ["r"], {("r", 0): 5, ("r", 1): 4, ("r", 2): 0}),
    (["--by-duration", "30m"], ["r:0"], {("r", 0): 5}),
    (["--by-duration", "P1DT2H"], ["r:0,1"], {("r", 0): 2, ("r", 1): 0}),
    (["--by-duration", "3h"], ["r:0"], {("r", 0): 2}),
    (["--by-duration", "10s"], ["r"], {("r", 0): 10, ("r", 1): 4, ("r", 2): 0}),
]


@pytest.mark.parametrize("case", range(len(RESETS)),
                         ids=[" ".join(s + t) for s, t, _ in RESETS])
def test_reset_offsets(resets, case):
    """Dry run: the plan, nothing changes. Execute: the same plan, applied to exactly the
    partitions named (the others keep their committed offsets)."""
    scenario, topics, new = RESETS[case]
    group = f"reset-{case}"
    with Admin(resets.socket) as admin:
        admin.alter_group_offsets(group, BASELINE)
    args = ["groups", "reset-offsets", group, *scenario, "--socket", resets.socket]
    for spec in topics:
        args += ["--topic", spec]
    plan = [[group, t, str(p), str(BASELINE.get(TP(t, p), "-")), str(offset)]
            for (t, p), offset in sorted(new.items())]
    dry = ok(mq_run(*args, "--dry-run"))
    assert table(dry.out) == (["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"],
                              plan)
    assert dry.err == "Dry run: nothing changed (run again with --execute to apply).\n"
    assert offsets(resets, group) == BASELINE
    done = ok(mq_run(*args, "--execute"))
    assert done.out == dry.out and done.err == ""
    assert offsets(resets, group) == {**BASELINE, **{TP(*tp): o for tp, o in new.items()}}


def test_reset_shift_by_needs_a_committed_offset(resets):
    with Admin(resets.socket) as admin:
        admin.alter_group_offsets("shift", BASELINE)
    assert_one_error(mq_run("groups", "reset-offsets", "shift", "--topic", "r", "--shift-by",
                            "1", "--execute", "--socket", resets.socket),
                     "cannot shift the offset of r-2: group 'shift' has no committed offset "
                     "for it", code=1)
    assert offsets(resets, "shift") == BASELINE


def test_reset_offsets_of_a_new_group_creates_it(resets):
    """As in Kafka: resetting a group that does not exist sets where it will start."""
    s = resets.socket
    ok(mq_run("groups", "reset-offsets", "pre", "--topic", "r:1", "--to-offset", "2",
              "--execute", "--socket", s))
    assert offsets(resets, "pre") == {TP("r", 1): 2}
    with Consumer("r", group_id="pre", socket=s, enable_auto_commit=False) as consumer:
        assert consumer.committed(TP("r", 1)) == 2


def test_reset_to_datetime_matches_brute_force(broker):
    """Partly out-of-order timestamps; for each time T every partition is reset to the first
    offset (in log order) whose timestamp is >= T, or to its end when there is none."""
    create_topic(broker, "ts", 2, {"retention.ms": "-1"})
    base = int(dt.datetime(2024, 5, 1, 12, 0, tzinfo=dt.UTC).timestamp() * 1000)
    steps = [0, 1000, 2000, 1500, 3000, 3000, 2500, 7000, 4000, 9000, 8000, 12000]
    for p in range(2):
        produce(broker, "ts", [b"%d" % i for i in range(len(steps))], p,
                [base + step + 10 * p for step in steps])
    records = []
    with Consumer("ts", socket=broker.socket) as consumer:
        consumer.seek_to_beginning()
        while len(records) < 2 * len(steps):
            for batch in consumer.poll(timeout_ms=WAIT * 1000).values():
                records += batch
    utc_minus_5 = {**ENV, "TZ": "XST+5"}          # POSIX TZ: local time is UTC-5
    queries = [
        ("2024-05-01T12:00:00Z", base, ENV),
        ("2024-05-01T12:00:01.500Z", base + 1500, ENV),
        ("2024-05-01T14:00:02.005+02:00", base + 2005, ENV),
        ("2024-05-01T07:00:02.500", base + 2500, utc_minus_5),   # naive: local time
        ("2024-05-01 07:00:08", base + 8000, utc_minus_5),
        ("2024-05-01T12:00:08.005Z", base + 8005, ENV),
        ("2024-05-01T12:00:12.010Z", base + 12010, ENV),
        ("2024-05-01T12:00:12.011Z", base + 12011, ENV),          # after every record
        ("2024-04-30", int(dt.datetime(2024, 4, 30).timestamp() * 1000), ENV),  # local
    ]
    for i, (text, ts_ms, env) in enumerate(queries):
        expected = {}
        for p in range(2):
            part = [r for r in records if r.partition == p]
            expected[TP("ts", p)] = next((r.offset for r in part if r.timestamp_ms >= ts_ms),
                                         len(part))
        group = f"dt-{i}"
        result = ok(mq_run("groups", "reset-offsets", group, "--topic", "ts", "--to-datetime",
                           text, "--execute", "--socket", broker.socket, env=env))
        assert table(result.out)[1] == [[group, "ts", str(tp.partition), "-", str(offset)]
                                        for tp, offset in expected.items()], text
        assert offsets(broker, group) == expected, text


def test_reset_refused_while_a_member_is_live(broker):
    s = broker.socket
    create_topic(broker, "busy", 2)
    produce(broker, "busy", [b"x"] * 4, 0)
    with member(broker, "g", "busy", 2) as consumer:
        consumer.commit({TP("busy", 0): 1})
        refused = mq_run("groups", "reset-offsets", "g", "--topic", "busy", "--to-latest",
                         "--execute", "--socket", s)
        assert_one_error(refused, f"group 'g' {LIVE_ERROR}", code=1)
        assert refused.out == ""
        assert offsets(broker, "g") == {TP("busy", 0): 1}
        # A dry run only reads: allowed, changes nothing.
        dry = ok(mq_run("groups", "reset-offsets", "g", "--topic", "busy", "--to-latest",
                        "--dry-run", "--socket", s))
        assert table(dry.out)[1] == [["g", "busy", "0", "1", "4"], ["g", "busy", "1", "-", "0"]]
        assert offsets(broker, "g") == {TP("busy", 0): 1}
    ok(mq_run("groups", "reset-offsets", "g", "--topic", "busy", "--to-latest", "--execute",
              "--socket", s))
    assert offsets(broker, "g") == {TP("busy", 0): 4, TP("busy", 1): 0}


# --- mq consume --group -----------------------------------------------------------------------

def consume_group(b, topic: str, group: str, *args) -> Result:
    return ok(mq_run("consume", topic, "--group", group, *args, "--socket", b.socket))


def test_consume_group_continues_where_it_stopped(broker):
    create_topic(broker, "c", 2)
    produce(broker, "c", [b"a%d" % i for i in range(6)], 0)
    produce(broker, "c", [b"b%d" % i for i in range(4)], 1)
    first = consume_group(broker, "c", "g", "--from-beginning", "--max-messages", "4")
    assert first.err == "consumed 4 records from c\n"
    second = consume_group(broker, "c", "g", "--max-messages", "6")
    printed = first.out.split() + second.out.split()
    assert sorted(printed) == sorted([f"a{i}" for i in range(6)] + [f"b{i}" for i in range(4)])
    assert offsets(broker, "g") == {TP("c", 0): 6, TP("c", 1): 4}
    # Nothing left: a run with a timeout prints nothing and commits the same offsets.
    third = consume_group(broker, "c", "g", "--timeout-ms", "300")
    assert third.out == "" and third.err == "consumed 0 records from c\n"
    produce(broker, "c", [b"a6", b"a7"], 0)
    produce(broker, "c", [b"b4"], 1)
    fourth = consume_group(broker, "c", "g", "--max-messages", "3", "--format", "json")
    assert sorted((o["partition"], o["offset"], o["value"]) for o in json_lines(fourth)) == \
        [(0, 6, "a6"), (0, 7, "a7"), (1, 4, "b4")]
    rows = json_lines(ok(mq_run("groups", "describe", "g", "--json", "--socket",
                                broker.socket)))
    assert [(r["partition"], r["committedOffset"], r["lag"]) for r in rows] == \
        [(0, 8, 0), (1, 5, 0)]


def test_consume_new_group_starts_at_the_end_and_commits_it(broker):
    """Without --from-beginning a new group starts at the end of each partition (Kafka's
    auto.offset.reset=latest) and commits that position, also for partitions it read
    nothing from: records produced after the run are the next run's. The first run is
    stopped once the broker sees it own both partitions."""
    create_topic(broker, "e", 2)
    produce(broker, "e", [b"old"] * 3, 0)
    with mq_process("consume", "e", "--group", "late", "--socket", broker.socket) as proc:
        with Admin(broker.socket) as admin:
            def owns_both() -> bool:
                try:
                    desc = admin.describe_group("late")
                except GroupIdNotFoundError:
                    return False
                return desc["state"] == "Stable" and \
                    [(m["pid"], len(m["assignment"])) for m in desc["members"]] == \
                    [(proc.pid, 2)]
            mq.testing.wait_for(owns_both, timeout=WAIT, message="mq consume owning e")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    assert out == b"" and err == b"consumed 0 records from e (interrupted)\n"
    assert offsets(broker, "late") == {TP("e", 0): 3, TP("e", 1): 0}
    produce(broker, "e", [b"new0"], 0)
    produce(broker, "e", [b"new1"], 1)
    second = consume_group(broker, "e", "late", "--max-messages", "2")
    assert sorted(second.out.split()) == ["new0", "new1"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_consume_group_stops_on_signal_and_commits_what_it_printed(broker, sig):
    create_topic(broker, "s")
    produce(broker, "s", [b"r%d" % i for i in range(10)], 0)
    with mq_process("consume", "s", "--group", "g", "--from-beginning",
                    "--socket", broker.socket) as proc:
        reader = Lines(proc.stdout)
        got = [reader.next(WAIT) for _ in range(10)]
        assert got == [b"r%d\n" % i for i in range(10)]
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=WAIT)
    assert proc.returncode == 0, err
    assert reader.buf + out == b"" and err == b"consumed 10 records from s (interrupted)\n"
    assert offsets(broker, "g") == {TP("s", 0): 10}
    produce(broker, "s", [b"r10"], 0)
    assert consume_group(broker, "s", "g", "--max-messages", "1").out == "r10\n"


# --- expected errors: one line, non-zero, no traceback ----------------------------------------

@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One broker per xdist worker for the error cases (they change nothing): topic t with 2
    partitions holding 3 records in partition 0; group g with offset 1 committed for t-0."""
    with mq.testing.broker(tmp_path_factory.mktemp("errors") / "data") as b:
        create_topic(b, "t", 2)
        produce(b, "t", [b"v0", b"v1", b"v2"], 0)
        with Admin(b.socket) as admin:
            admin.alter_group_offsets("g", {TP("t", 0): 1})
        yield b


RESET = ("groups", "reset-offsets", "g")
ERRORS = [
    # commands and arguments missing
    (("groups",), 2, "no groups command given"),
    (("groups", "bogus"), 2, "invalid choice: 'bogus'"),
    (("groups", "describe"), 2, "the following arguments are required: GROUP"),
    (("groups", "delete"), 2, "the following arguments are required: GROUP"),
    (("groups", "reset-offsets"), 2, "the following arguments are required: GROUP, --topic"),
    ((*RESET, "--to-earliest", "--execute"), 2, "the following arguments are required: --topic"),
    ((*RESET, "--topic", "t", "--execute"), 2,
     ("one of the arguments --to-earliest --to-latest --to-offset --shift-by --to-datetime "
      "--by-duration is required")),
    ((*RESET, "--topic", "t", "--to-earliest"), 2,
     "one of the arguments --dry-run --execute is required"),
    ((*RESET, "--topic", "t", "--to-offset"), 2, "argument --to-offset: expected one argument"),
    (("groups", "list", "--bogus"), 2, "unrecognized arguments: --bogus"),
    (("groups", "describe", "g", "h"), 2, "unrecognized arguments: h"),
    # two of a kind
    ((*RESET, "--topic", "t", "--to-earliest", "--to-latest", "--execute"), 2,
     "argument --to-latest: not allowed with argument --to-earliest"),
    ((*RESET, "--topic", "t", "--to-offset", "1", "--shift-by", "1", "--dry-run"), 2,
     "argument --shift-by: not allowed with argument --to-offset"),
    ((*RESET, "--topic", "t", "--to-earliest", "--dry-run", "--execute"), 2,
     "argument --execute: not allowed with argument --dry-run"),
    # unknown group, topic, partition
    (("groups", "describe", "nope"), 1, "group 'nope' does not exist"),
    (("groups", "delete", "nope"), 1, "group 'nope' does not exist"),
    ((*RESET, "--topic", "nope", "--to-earliest", "--execute"), 1, "unknown topic 'nope'"),
    ((*RESET, "--topic", "t", "--topic", "nope", "--to-earliest", "--dry-run"), 1,
     "unknown topic 'nope'"),
    ((*RESET, "--topic", "t:9", "--to-earliest", "--execute"), 1,
     "topic 't' has no partition 9 (it has 2)"),
    ((*RESET, "--topic", "t:0,2", "--to-latest", "--dry-run"), 1,
     "topic 't' has no partition 2 (it has 2)"),
    ((*RESET, "--topic", "t", "--shift-by", "1", "--execute"), 1,
     "cannot shift the offset of t-1: group 'g' has no committed offset for it"),
    # bad values
    ((*RESET, "--topic", "t:x", "--to-earliest", "--execute"), 2,
     "argument --topic: invalid topic 't:x'"),
    ((*RESET, "--topic", "t:", "--to-earliest", "--execute"), 2, "invalid topic 't:'"),
    ((*RESET, "--topic", ":0", "--to-earliest", "--execute"), 2, "invalid topic ':0'"),
    ((*RESET, "--topic", "t:0,,1", "--to-earliest", "--execute"), 2, "invalid topic 't:0,,1'"),
    ((*RESET, "--topic", "t", "--to-offset", "-1", "--execute"), 2,
     "argument --to-offset: must be 0 or more, got -1"),
    ((*RESET, "--topic", "t", "--to-offset", "ten", "--execute"), 2,
     "argument --to-offset: invalid integer 'ten'"),
    ((*RESET, "--topic", "t", "--shift-by", "1.5", "--execute"), 2,
     "argument --shift-by: invalid integer '1.5'"),
    ((*RESET, "--topic", "t", "--to-datetime", "xyz", "--execute"), 2,
     "argument --to-datetime: invalid datetime 'xyz': use ISO 8601 like 2024-05-01T12:00:00Z"),
    ((*RESET, "--topic", "t", "--to-datetime", "2024-13-01", "--execute"), 2,
     "invalid datetime '2024-13-01'"),
    ((*RESET, "--topic", "t", "--by-duration", "soon", "--execute"), 2,
     "argument --by-duration: invalid duration 'soon': use ISO 8601 like PT10M"),
    ((*RESET, "--topic", "t", "--by-duration", "PT", "--execute"), 2, "invalid duration 'PT'"),
    ((*RESET, "--topic", "t", "--by-duration", "10x", "--execute"), 2, "invalid duration '10x'"),
    # consume --group with options that do not apply to a group
    (("consume", "t", "--group", "g", "--partition", "0"), 2,
     "--group and --partition cannot be used together"),
    (("consume", "t", "--group", "g", "--partition", "0", "--offset", "1"), 2,
     "--group and --partition cannot be used together"),
    (("consume", "t", "--group", "g", "--offset", "1"), 2,
     "--group and --offset cannot be used together"),
    (("consume", "t", "--group", "g", "--from-datetime", "2024-05-01"), 2,
     "--group and --from-datetime cannot be used together"),
    (("consume", "nope", "--group", "g", "--timeout-ms", "10"), 1, "unknown topic 'nope'"),
]


@pytest.mark.parametrize("args,code,fragment", ERRORS, ids=[" ".join(e[0]) for e in ERRORS])
def test_expected_errors(shared, args, code, fragment):
    assert_one_error(mq_run(*args, "--socket", shared.socket), fragment, code=code)


def test_errors_change_nothing(shared):
    """After the error cases (on this worker's broker): group g is as the fixture made it."""
    with Admin(shared.socket) as admin:
        assert admin.list_groups() == [{"group": "g", "state": "Empty", "members": 0}]
        assert admin.list_group_offsets("g") == {TP("t", 0): 1}


NO_BROKER = [
    ("groups", "list"), ("groups", "describe", "g"), ("groups", "delete", "g"),
    ("groups", "reset-offsets", "g", "--topic", "t", "--to-earliest", "--dry-run"),
    ("groups", "reset-offsets", "g", "--topic", "t", "--to-latest", "--execute"),
    ("consume", "t", "--group", "g")]


@pytest.mark.parametrize("args", NO_BROKER, ids=" ".join)
def test_no_broker(tmp_path, args):
    path = tmp_path / "nothing.sock"
    line = assert_one_error(mq_run(*args, "--socket", path), code=1)
    assert line == (f"mq: error: no broker at {path} (No such file or directory); start one "
                    "with `mq broker` or pass --socket")
