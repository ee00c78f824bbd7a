"""``mq demo --spark`` as a user runs it: ``python -m mq demo --spark`` in a subprocess, with its
broker, producer processes, local-mode Spark and Python workers all real. The totals it wrote
to the topic ``order-totals`` and to Parquet are checked against totals computed here, from the
orders in the topic ``orders`` (what the producers wrote), by Spark's rules for tumbling
windows. The expected errors (no PySpark, no Java) are one line each."""

from __future__ import annotations

import collections
import datetime
import json
import os
import re
import socket
import subprocess
import sys
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import mq
import mq.testing

pytestmark = pytest.mark.spark

WINDOW_MS = 5000
ORDERS = 2000


def environ(tmp_path) -> dict:
    """No broker from the caller's environment; temporary files under the test's dir."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MQ_SOCKET", "MQ_DATA_DIR", "XDG_STATE_HOME")}
    (tmp_path / "tmp").mkdir()
    return {**env, "TMPDIR": str(tmp_path / "tmp"), "PYTHONIOENCODING": "utf-8"}


def epoch_ms(text: str) -> int:
    when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return round(when.timestamp() * 1000)


def read_topic(b, topic: str) -> list:
    with mq.Consumer(topic, socket=b.socket, value_bytes=True,
                     isolation_level="read_committed") as consumer:
        consumer.seek_to_beginning()
        tps = sorted(consumer.assignment())
        ends = consumer.end_offsets(tps)
        out = []
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=1000).values():
                out.extend(records)
    return out


def expected_totals(orders: list) -> dict:
    """{(window start ms, customer): (orders, amount, newest produce time ms)} of the order
    events, by Spark's tumbling windows (start = event time floored to 5 s)."""
    acc: dict = collections.defaultdict(lambda: [0, Decimal(0), 0])
    for record in orders:
        order = json.loads(record.value, parse_float=Decimal)
        start = epoch_ms(order["event_time"]) // WINDOW_MS * WINDOW_MS
        t = acc[(start, order["customer"])]
        t[0] += 1
        t[1] += order["amount"]
        t[2] = max(t[2], record.timestamp_ms)
    return {k: tuple(v) for k, v in acc.items()}


def parquet_totals(path) -> list[tuple]:
    table = pq.read_table(path)         # Spark's _spark_metadata is skipped (a "_" name)
    ms = {c: table.column(c).cast(pa.timestamp("ms")).cast(pa.int64()).to_pylist()
          for c in ("window_start", "window_end", "last_order_at")}
    return [(ms["window_start"][i], ms["window_end"][i], customer, orders, amount,
             ms["last_order_at"][i])
            for i, (customer, orders, amount) in enumerate(zip(
                table.column("customer").to_pylist(), table.column("orders").to_pylist(),
                table.column("amount").to_pylist(), strict=True))]


def test_demo_spark_writes_exact_totals_to_the_topic_and_parquet(tmp_path):
    data, output = tmp_path / "data", tmp_path / "output"
    proc = subprocess.run(
        [sys.executable, "-m", "mq", "demo", "--spark", "--records", str(ORDERS), "--rate",
         "2000", "--partitions", "2", "--data-dir", str(data), "--output", str(output)],
        capture_output=True, text=True, env=environ(tmp_path), timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    out, err = proc.stdout, proc.stderr

    # The summary: rates, lag, checks; progress lines on stderr.
    assert re.search(rf"producers \(2 processes\)\s+{ORDERS:,} orders in [\d.]+ s", out), out
    for name in ("totals-to-mq", "totals-to-parquet"):
        assert re.search(rf"{name}\s+{ORDERS + 2:,} rows in, [\d,]+ rows out in [\d.]+ s: "
                         r"[\d,]+ rows/s in, [\d,.]+ rows/s out; \d+ micro-batches", out), out
    assert re.search(r"end-to-end lag, .*: p50 [\d.]+ s, max [\d.]+ s", out), out
    assert "late orders dropped by the watermark: 0\n" in out
    check = re.search(rf"check: ([\d,]+) totals in the topic, \1 in Parquet; {ORDERS:,} "
                      r"orders, amount ([\d,.]+): OK\n", out)
    assert check, out
    assert re.search(r"mq demo: +[\d.]+ s: produced [\d,]+ .* \| totals-to-mq: batches \d+, "
                     r"in [\d,]+ \([\d,]+ rows/s\), out [\d,]+ rows, lag [\d,]+", err), err
    assert sorted(os.listdir(output)) == ["checkpoints", "order-totals.parquet", "spark.log"]
    assert os.listdir(tmp_path / "tmp") == []            # its temporary dir is gone

    with mq.testing.broker(data) as b:
        events = read_topic(b, "orders")
        topic = read_topic(b, "order-totals")
    orders = [r for r in events if b"order_id" in r.value]
    assert len(orders) == ORDERS and len(events) == ORDERS + 2     # + start and end of stream
    assert len({json.loads(r.value)["order_id"] for r in orders}) == ORDERS
    expected = expected_totals(orders)
    assert len(expected) == int(check.group(1).replace(",", ""))
    assert sum(t[1] for t in expected.values()) == Decimal(check.group(2).replace(",", ""))

    # The topic: one record per (window, customer), keyed by the customer, exact totals.
    got = {}
    for record in topic:
        total = json.loads(record.value, parse_float=Decimal)
        assert record.key == total["customer"].encode()
        start = epoch_ms(total["window_start"])
        assert epoch_ms(total["window_end"]) == start + WINDOW_MS
        assert (start, total["customer"]) not in got
        got[(start, total["customer"])] = (total["orders"], total["amount"],
                                           epoch_ms(total["last_order_at"]))
    assert got == expected

    # Parquet: the same totals.
    rows = parquet_totals(output / "order-totals.parquet")
    assert len(rows) == len(expected)
    assert {(start, customer): (orders, amount, last)
            for start, end, customer, orders, amount, last in rows} == expected
    assert all(end == start + WINDOW_MS for start, end, *_ in rows)


def _assert_one_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("mq: error: mq demo --spark needs ")
    for fragment in fragments:
        assert fragment in proc.stderr


def test_without_java_one_line_says_how_to_install_it(tmp_path):
    env = environ(tmp_path)
    env.pop("JAVA_HOME", None)
    env["PATH"] = str(tmp_path)                          # no java on it
    proc = subprocess.run([sys.executable, "-m", "mq", "demo", "--spark"], capture_output=True,
                          text=True, env=env, timeout=120, check=False)
    _assert_one_error(proc, "Java 17", "apt-get install openjdk-17-jre-headless")


def test_without_pyspark_one_line_says_how_to_install_it(tmp_path):
    hide = ("import sys; sys.modules['pyspark'] = None; from mq.cli.main import main; "
            "sys.exit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", hide, "demo", "--spark"],
                          capture_output=True, text=True, env=environ(tmp_path), timeout=120,
                          check=False)
    _assert_one_error(proc, "PySpark", "pip install 'mq[spark]'")


def test_an_unreachable_kafka_cluster_is_one_line(tmp_path):
    """``--bootstrap-server`` where nothing listens: one line within the probe's 10 s (the
    port is this test's: bound, never listening, so a connection is refused)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        address = "127.0.0.1:%d" % held.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "mq", "demo", "--spark",
                               "--bootstrap-server", address], capture_output=True, text=True,
                              env=environ(tmp_path), timeout=120, check=False)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"mq: error: no answer from the Kafka cluster at {address} "
                                  "within 10 s (")


@pytest.mark.parametrize("argv, message", [
    (["--bootstrap-server", "k:9092"], "--bootstrap-server, --command-config and "
                                       "--connector-jars go with --spark"),
    (["--spark", "--bootstrap-server", "k:9092", "--socket", "/tmp/mq.sock"],
     "--socket and --data-dir name a local broker, --bootstrap-server a Kafka cluster"),
    (["--spark", "--command-config", "client.properties"], "go with --bootstrap-server")])
def test_kafka_options_that_do_not_go_together_are_one_usage_error(tmp_path, argv, message):
    proc = subprocess.run([sys.executable, "-m", "mq", "demo", *argv], capture_output=True,
                          text=True, env=environ(tmp_path), timeout=120, check=False)
    assert proc.returncode == 2 and proc.stdout == "", (proc.stdout, proc.stderr)
    assert len(proc.stderr.splitlines()) == 1 and message in proc.stderr, proc.stderr
