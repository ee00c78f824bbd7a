"""The pool's pure parts without processes (settings, handler references, retry delays,
dead-letter headers, the counter table), then the command line and ``workers.run`` from a
script: usage errors are one line, a script's own handler is found by the children, JSON logs
carry their fields, ``mq workers stats`` reads a running pool."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import textwrap

import pytest
from wk_pool import ENV, Pool, caught_up, mq_run, produce, read_events, run_pool_script

import mq
import mq.testing
import workers
from workers.config import HandlerRef, PoolConfig, load_handler
from workers.failures import backoff_s, dead_letter_headers, death_error, error_text
from workers.stats import KIND_DIED, KIND_TIMEOUT, StatsTable, find_stats, remove_stale


def config(**kw) -> PoolConfig:
    base = dict(handler=HandlerRef("wk_handlers", "handle"), topics=("jobs",), group_id="g",
                stats_path="/nowhere")
    return PoolConfig(**{**base, **kw})


def test_settings_are_checked_and_travel_as_json():
    c = config(processes=3, exactly_once=True, handler_timeout_s=None)
    assert PoolConfig.from_json(c.to_json()) == c
    assert c.transactional_id(2) == "g-worker-2"
    assert config(transactional_id_prefix="p").transactional_id(0) == "p-0"
    for bad in (dict(topics=()), dict(processes=0), dict(max_retries=-1),
                dict(dead_letter_topic="jobs"), dict(ordering="none"),
                dict(handler_timeout_s=0), dict(log_format="xml"), dict(topics=("a", "a"))):
        with pytest.raises(ValueError):
            config(**bad)


def test_handler_references():
    assert HandlerRef.parse("pkg.mod:Cls.method") == HandlerRef("pkg.mod", "Cls.method")
    for bad in ("nocolon", "mod:", ":fn", "bad-name:fn", "mod:fn()"):
        with pytest.raises(ValueError, match="MODULE:FUNCTION"):
            HandlerRef.parse(bad)
    with pytest.raises(ValueError, match="module-level function"):
        HandlerRef.of(lambda r: None)

    def nested(r):
        return None
    with pytest.raises(ValueError, match="module-level function"):
        HandlerRef.of(nested)
    assert HandlerRef.of(error_text) == HandlerRef("workers.failures", "error_text")
    assert load_handler(HandlerRef.of(error_text)) is error_text


def test_retry_delays_double_with_jitter_and_a_ceiling():
    rng = random.Random(7)
    for attempt in range(1, 12):
        ceiling = min(5000, 100 * 2 ** (attempt - 1)) / 1000
        for _ in range(50):
            assert ceiling / 2 <= backoff_s(attempt, 100, 5000, rng) <= ceiling


def test_dead_letter_headers_replace_an_earlier_dead_letters():
    old = [("trace", b"t1"), ("mq.dlq.attempts", b"9"), ("mq.dlq.error", b"old")]
    headers = dead_letter_headers(old, "jobs", 3, 42, "ValueError: bad", 4, "g", 1700)
    assert headers == [("trace", b"t1"), ("mq.dlq.topic", b"jobs"), ("mq.dlq.partition", b"3"),
                       ("mq.dlq.offset", b"42"), ("mq.dlq.error", b"ValueError: bad"),
                       ("mq.dlq.attempts", b"4"), ("mq.dlq.group", b"g"),
                       ("mq.dlq.timestamp", b"1700")]
    assert error_text(ValueError("a\n  b")) == "ValueError: a b"
    assert error_text(KeyError()) == "KeyError"
    assert death_error(KIND_DIED, -9, None).endswith("(killed by SIGKILL)")
    assert death_error(KIND_DIED, 3, None).endswith("(exit status 3)")
    assert "handler_timeout_s=2 s" in death_error(KIND_TIMEOUT, 0, 2.0)


def test_counter_table(tmp_path):
    path = str(tmp_path / "t.stats")
    table = StatsTable.create(path, "g", ["a", "b"], slots=2, inflight=3)
    reader = StatsTable.open(path)
    try:
        assert (reader.group_id, reader.topics, reader.slots, reader.inflight) == \
            ("g", ["a", "b"], 2, 3)
        table.add(1, 3, 5)                                  # handled
        e = table.inflight_entry(1, 2)
        table.words[e + 1], table.words[e + 2], table.words[e + 3] = 7, 99, 2
        table.words[e], table.words[e + 4] = 1, 12345
        assert reader.in_flight(1) == [(1, 7, 99, 2, 12345)]
        assert reader.counters(1)["handled"] == 5
        v = reader.hints_version()
        table.record_attempt(1, 7, 99, 2, KIND_DIED, -9)
        table.record_attempt(1, 7, 99, 1, KIND_TIMEOUT, 0)   # an older attempt: max stays
        assert reader.attempt_entries() == {(1, 7, 99): (2, KIND_TIMEOUT, 0)}
        table.set_hint(0, 0, 1, 5, 2, 111)
        table.set_hint(1, 0, 1, 5, 3, 222)
        assert reader.hints() == {(0, 1, 5): (3, 222)}
        table.clear_hint(1, 0, 1, 5)
        assert reader.hints() == {(0, 1, 5): (2, 111)}
        assert reader.hints_version() == v + 5
        snap = workers.read_stats(path)
        assert snap["slots"][1]["in_flight"][0]["topic"] == "b"
        assert snap["slots"][0]["state"] == "empty"
        for i in range(2000):                               # the ring wraps
            table.record_attempt(0, 0, i, 1, KIND_DIED, 1)
        assert len(reader.attempt_entries()) == 1024
    finally:
        reader.close()
        table.close()
    with pytest.raises(ValueError, match="not a worker pool stats table"):
        StatsTable.open(__file__)


def test_tables_of_killed_pools_are_found_and_removed(tmp_path):
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                            capture_output=True, check=True)
    stale = tmp_path / f"mq-workers-g-{int(exited.stdout)}.stats"
    live = tmp_path / f"mq-workers-g-{os.getpid()}.stats"
    other = tmp_path / f"mq-workers-h-{int(exited.stdout)}.stats"
    for path in (stale, live, other):
        path.write_bytes(b"")
    assert find_stats("g", str(tmp_path)) == [str(live)]
    assert remove_stale("g", str(tmp_path)) == [str(stale)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, other.name])


def test_cli_usage_errors_are_one_line(broker, tmp_path):
    r = mq_run("workers", "run", "no_such_module:handle", "--topic", "jobs", "--group", "g",
               "--socket", broker.socket, cwd=tmp_path)
    assert r.code == 2 and r.err.startswith("mq: error: cannot import handler "
                                            "no_such_module:handle: ModuleNotFoundError"), r
    assert r.err.count("\n") == 1
    r = mq_run("workers", "run", "wk_handlers:handle", "--topic", "nope", "--group", "g",
               "--socket", broker.socket, cwd=tmp_path)
    assert (r.code, r.err) == (1, "mq: error: unknown input topic 'nope' (create it: mq topics "
                                  "create nope --partitions N)\n"), r
    r = mq_run("workers", "run", "wk_handlers:handle", "--group", "g")
    assert r.code == 2 and "--topic" in r.err and r.err.count("\n") == 1, r
    r = mq_run("workers", "redrive", "nope", "--socket", broker.socket)
    assert (r.code, r.err) == (1, "mq: error: unknown topic 'nope'\n"), r


def test_json_logs_and_stats_of_a_running_pool(broker, tmp_path, pools):
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("jobs", 2)
    produce(broker.socket, "jobs", [b"poison" if i == 2 else b"v%d" % i for i in range(10)],
            partition=0)
    pool = Pool(tmp_path, broker.socket, processes=2,
                args=["--log-format", "json", "--max-retries", "0"])
    pools(pool)
    pool.wait_ready()
    pool.wait_for(lambda: caught_up(broker.socket, "g", "jobs"), "the group to catch up")
    lines = [json.loads(line) for line in pool.stderr().splitlines()]
    skipped = [e for e in lines if e["msg"].startswith("skipped after 1 failed attempts")]
    assert len(skipped) == 1
    assert {k: skipped[0][k] for k in ("level", "group", "topic", "partition", "offset")} == \
        {"level": "ERROR", "group": "g", "topic": "jobs", "partition": 0, "offset": 2}
    assert skipped[0]["slot"] in (0, 1) and skipped[0]["pid"] != pool.proc.pid
    ready = [e for e in lines if e["msg"].startswith("ready:")]
    assert ready and ready[0]["slot"] is None and ready[0]["pid"] == pool.proc.pid

    r = mq_run("workers", "stats", "--file", pool.stats_path, "--json")
    rows = [json.loads(line) for line in r.out.splitlines()]
    assert [row["slot"] for row in rows] == [0, 1]
    assert sum(row["handled"] for row in rows) == 9
    assert sum(row["skipped"] for row in rows) == 1
    assert all(row["state"] == "running" and row["group"] == "g" for row in rows)
    r = mq_run("workers", "stats", "--file", pool.stats_path)
    assert r.code == 0 and r.out.startswith("GROUP  SLOT  PID") and len(r.out.splitlines()) == 3
    assert pool.stop() == 0
    assert not (tmp_path / pool.stats_path.name).exists(), "the table outlived its pool"
    assert find_stats("g", str(tmp_path)) == []


def test_workers_run_from_a_script_with_its_own_handler(broker, tmp_path):
    """``workers.run(handle)`` where ``handle`` lives in the script itself: the children load
    the script as ``__mp_main__`` (its ``__main__`` block does not run again)."""
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("jobs", 2)
    produce(broker.socket, "jobs", [b"v%d" % i for i in range(20)], partition=lambda i: i % 2)
    events = tmp_path / "events.jsonl"
    script = tmp_path / "pool_script.py"
    script.write_text(textwrap.dedent(f"""
        import os, workers

        def handle(record):
            with open({str(events)!r}, "a") as f:
                f.write(f"{{record.partition}} {{record.offset}} {{__name__}}\\n")

        if __name__ == "__main__":
            raise SystemExit(workers.run(handle, topics=["jobs"], group_id="s", processes=2,
                                         socket={broker.socket!r},
                                         stats_path={str(tmp_path / 's.stats')!r}))
        """))
    run_pool_script(script, broker.socket, "s", "jobs", tmp_path)
    lines = events.read_text().split("\n")[:-1]
    assert len(lines) == 20 and all(line.endswith(" __mp_main__") for line in lines)
    assert read_events(tmp_path / "none") == []


def test_a_script_without_the_main_guard_is_told_so(broker, tmp_path):
    """Children import the handler's script; a ``workers.run`` call at its top level would
    start a pool in every child. It raises there instead, and the pool stops saying why."""
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("jobs", 1)
    script = tmp_path / "unguarded.py"
    script.write_text(textwrap.dedent(f"""
        import workers

        def handle(record):
            return None

        raise SystemExit(workers.run(handle, topics=["jobs"], group_id="u", processes=1,
                                     socket={broker.socket!r},
                                     stats_path={str(tmp_path / 'u.stats')!r}))
        """))
    done = subprocess.run([sys.executable, str(script)], env=ENV, cwd=tmp_path,
                          capture_output=True, timeout=60, check=False)
    err = done.stderr.decode()
    assert done.returncode == 1, err
    assert "workers.run() called in a pool's child" in err
    assert "crash loop" in err
