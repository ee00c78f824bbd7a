"""The pool's OpenMetrics: the collector over a counter table the test writes (exact
families, labels and values, parsed back in both text formats), the endpoint's errors, then a
real pool behind a real broker whose ``/metrics`` shows its records being handled, and the
command line's one-line errors for an address it cannot use."""

from __future__ import annotations

import re
import socket
import time
import urllib.parse
import urllib.request

import pytest
from prometheus_client.openmetrics import parser as openmetrics
from prometheus_client.parser import text_string_to_metric_families
from wk_pool import Pool, mq_run, produce

import mq
from workers.config import HandlerRef, PoolConfig
from workers.metrics import exposition, serve_pool
from workers.stats import (
    COMMITTED,
    CRASH_LOOP,
    DEAD_LETTERED,
    DEATHS,
    FAILED,
    HANDLED,
    HANDLER_NS,
    HANG_KILLS,
    INCARNATIONS,
    PID,
    RETRIED,
    RUNNING,
    SKIPPED,
    STATE,
    StatsTable,
)

COUNTERS = {"mq_worker_handled_records", "mq_worker_failed_attempts", "mq_worker_retries",
            "mq_worker_dead_lettered_records", "mq_worker_skipped_records",
            "mq_worker_handler_seconds", "mq_worker_hang_kills", "mq_worker_deaths",
            "mq_worker_starts", "mq_worker_committed_offsets"}
GAUGES = {"mq_worker_state", "mq_worker_in_flight_records", "mq_worker_in_flight_age_seconds",
          "mq_worker_pool_processes", "mq_worker_pool_children",
          "mq_worker_pool_start_time_seconds"}
STATES = ("starting", "running", "draining", "backoff", "stopped", "crash-loop")


def samples(text: str, parse=text_string_to_metric_families) -> dict:
    """``{(sample name, ((label, value), ...)): value}`` of an exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in parse(text) for s in family.samples}


def of(values: dict, name: str, **labels) -> float:
    return values[(name, tuple(sorted(labels.items())))]


@pytest.fixture
def table(tmp_path):
    """Two slots of group ``billing`` on ``jobs`` and ``audit``: slot 0 running with a record
    of ``audit`` in its handler for 2 s, slot 1 stopped by a crash loop."""
    t = StatsTable.create(str(tmp_path / "t.stats"), "billing", ["jobs", "audit"], slots=2,
                          inflight=2)
    for counter, value in ((PID, 4321), (STATE, RUNNING), (INCARNATIONS, 3), (HANDLED, 10),
                           (RETRIED, 2), (FAILED, 3), (DEAD_LETTERED, 1), (SKIPPED, 4),
                           (HANDLER_NS, 1_500_000_000), (HANG_KILLS, 1), (DEATHS, 1),
                           (COMMITTED, 16)):
        t.set(0, counter, value)
    e = t.inflight_entry(0, 1)
    t.words[e + 1], t.words[e + 2], t.words[e + 3] = 3, 77, 1     # partition, offset, attempt
    t.words[e], t.words[e + 4] = 1, time.monotonic_ns() - 2_000_000_000
    t.set(1, STATE, CRASH_LOOP)
    t.set(1, INCARNATIONS, 5)
    t.set(1, DEATHS, 5)
    yield t
    t.close()


def test_families_of_a_counter_table(table):
    text = exposition([table.path], openmetrics=False).decode()
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert families == {**{n: "counter" for n in COUNTERS},      # the parser drops _total
                        **{n: "gauge" for n in GAUGES}}
    values = samples(text)
    slot0, slot1 = dict(group="billing", slot="0"), dict(group="billing", slot="1")
    expected0 = {"handled_records": 10, "failed_attempts": 3, "retries": 2,
                 "dead_lettered_records": 1, "skipped_records": 4, "handler_seconds": 1.5,
                 "hang_kills": 1, "deaths": 1, "starts": 3, "committed_offsets": 16}
    assert {k: of(values, f"mq_worker_{k}_total", **slot0) for k in expected0} == expected0
    assert {k: of(values, f"mq_worker_{k}_total", **slot1) for k in expected0} == \
        {**dict.fromkeys(expected0, 0), "deaths": 5, "starts": 5}
    assert {s: of(values, "mq_worker_state", **slot0, state=s) for s in STATES} == \
        {s: float(s == "running") for s in STATES}
    assert {s: of(values, "mq_worker_state", **slot1, state=s) for s in STATES} == \
        {s: float(s == "crash-loop") for s in STATES}
    assert [of(values, "mq_worker_in_flight_records", **slot, topic=t)
            for slot in (slot0, slot1) for t in ("jobs", "audit")] == [0, 1, 0, 0]
    assert 2.0 <= of(values, "mq_worker_in_flight_age_seconds", **slot0) < 60
    assert of(values, "mq_worker_in_flight_age_seconds", **slot1) == 0
    assert of(values, "mq_worker_pool_processes", group="billing") == 2
    assert of(values, "mq_worker_pool_children", group="billing") == 1
    assert abs(of(values, "mq_worker_pool_start_time_seconds", group="billing")
               - time.time()) < 60
    assert len(values) == 2 * (len(COUNTERS) + len(STATES) + 2 + 1) + 3   # nothing else

    text = exposition([table.path]).decode()                 # OpenMetrics: units, # EOF
    assert text.endswith("# EOF\n")
    assert "# UNIT mq_worker_handler_seconds seconds\n" in text
    again = samples(text, openmetrics.text_string_to_metric_families)
    age = ("mq_worker_in_flight_age_seconds", (("group", "billing"), ("slot", "0")))
    assert again.pop(age) >= values.pop(age) and again == values     # a later scrape


def test_pools_that_are_gone_or_collide(table, tmp_path):
    text = exposition([str(tmp_path / "gone.stats")], openmetrics=False).decode()
    assert samples(text) == {} and "# TYPE mq_worker_handled_records_total counter" in text
    other = StatsTable.create(str(tmp_path / "u.stats"), "billing", ["jobs"], 1, 1)
    try:
        with pytest.raises(ValueError, match="two pools of group 'billing'"):
            exposition([table.path, other.path])
    finally:
        other.close()


def test_the_endpoint_and_its_address_errors(table):
    base = dict(handler=HandlerRef("wk_handlers", "handle"), topics=("jobs",), group_id="g")
    for bad in ("9400", "host:port", "127.0.0.1:65536"):
        with pytest.raises(ValueError, match="metrics (address|port)"):
            PoolConfig(**base, metrics_address=bad)
    server = serve_pool(table.path, "127.0.0.1:0")
    try:
        values = samples(scrape(server.url))
        assert of(values, "mq_worker_handled_records_total", group="billing", slot="0") == 10
        request = urllib.request.Request(
            server.url, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.read().decode().endswith("# EOF\n")
        with pytest.raises(OSError, match=f"cannot serve metrics on 127.0.0.1:"
                                          f"{server.address[1]}: Address already in use"):
            serve_pool(table.path, f"127.0.0.1:{server.address[1]}")
    finally:
        server.close()


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:
        return answer.read().decode()


def test_a_running_pool_serves_its_counters(broker, tmp_path, pools):
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("jobs", 2)
    pool = Pool(tmp_path, broker.socket, processes=2, args=["--metrics", "127.0.0.1:0"])
    pools(pool)
    pool.wait_ready()
    found = re.search(r"metrics at (http://\S+)", pool.stderr())
    assert found, pool.stderr()
    url = found.group(1)

    def total(values: dict, name: str) -> float:
        return sum(v for (n, _), v in values.items() if n == name)

    values = samples(scrape(url))
    assert total(values, "mq_worker_handled_records_total") == 0
    assert of(values, "mq_worker_pool_children", group="g") == 2
    assert [of(values, "mq_worker_state", group="g", slot=s, state="running")
            for s in ("0", "1")] == [1, 1]

    produce(broker.socket, "jobs", [b"v%d" % i for i in range(40)], partition=lambda i: i % 2)
    pool.wait_for(lambda: total(samples(scrape(url)), "mq_worker_handled_records_total") == 40,
                  "/metrics to count 40 records handled")
    pool.wait_for(lambda: total(samples(scrape(url)), "mq_worker_committed_offsets_total")
                  == 40, "/metrics to count 40 offsets committed")

    r = mq_run("workers", "stats", "--file", pool.stats_path, "--openmetrics")
    assert r.code == 0 and r.out.endswith("# EOF\n"), r
    values = samples(r.out, openmetrics.text_string_to_metric_families)
    assert total(values, "mq_worker_handled_records_total") == 40

    port = urllib.parse.urlsplit(url).port
    busy = tmp_path / "busy.stats"
    r = mq_run("workers", "run", "wk_handlers:handle", "--topic", "jobs", "--group", "g2",
               "--socket", broker.socket, "--stats-file", busy, "--metrics",
               f"127.0.0.1:{port}", cwd=tmp_path)
    assert r.code == 1 and r.err.endswith(f"mq: error: cannot serve metrics on 127.0.0.1:"
                                          f"{port}: Address already in use\n"), r
    assert "Traceback" not in r.err and not busy.exists(), r
    r = mq_run("workers", "run", "wk_handlers:handle", "--topic", "jobs", "--group", "g2",
               "--socket", broker.socket, "--metrics", "localhost", cwd=tmp_path)
    assert (r.code, r.err) == (2, "mq: error: metrics address must be HOST:PORT, like "
                                  "127.0.0.1:9400, got 'localhost'\n"), r

    assert pool.stop() == 0
    with pytest.raises(OSError):                       # closed with the pool
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
