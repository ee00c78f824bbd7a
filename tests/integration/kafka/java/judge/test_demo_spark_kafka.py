"""``mq demo --spark --bootstrap-server`` as a user runs it (``python -m mq demo`` in a
subprocess: producer processes on ``mq.Producer(bootstrap_servers=...)``, local-mode Spark with
its own Kafka connector, ``format("kafka")`` source and sink, Python workers), against a real
Apache Kafka and against mq's own Kafka listener: both backends meet one contract. mq's
listener is the SASL_SSL one (SCRAM-SHA-256 in TLS, the ``java`` conftest's), reached with a
``--command-config`` file of librdkafka's properties, so the demo's producers, admin and
reader use them as they are and Spark's connector (a Java client) as translated.

The connector's jars are ``javakafka``'s Maven resolution of ``tests/java/spark/pom.xml``, given
as ``--connector-jars`` (no Ivy download at test time). What the demo claims is checked here
from the cluster itself: every order is in ``mq-demo-orders`` once; the Parquet files (Spark's
exactly-once file sink) hold exactly the totals computed here from those orders by Spark's
rules for tumbling windows; ``mq-demo-order-totals`` (Spark's Kafka sink, at least once) holds
each of them, keyed by its customer, and any total written again is the same."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import os
import re
import subprocess
import sys
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from javakafka import SPARK_CONNECTOR, JavaUnavailable, resolve

import mq

pytestmark = pytest.mark.spark

ORDERS = 2000
WINDOW_MS = 5000


@dataclasses.dataclass(frozen=True)
class Target:
    bootstrap: str
    config: dict                    # librdkafka's properties


@pytest.fixture
def kafka_super_users() -> list[str]:
    return ["alice"]                # the demo deletes and creates topics: no ACLs to grant


@pytest.fixture
def target(backend, security, request) -> Target:
    """The cluster the demo runs on: the tests' three-node Apache Kafka cluster, or mq's own
    Kafka listener on ``security`` (SASL_SSL), as alice."""
    if backend == "kafka":
        return Target(request.getfixturevalue("kafka_cluster").bootstrap, {})
    users, ca = request.getfixturevalue("kafka_users"), request.getfixturevalue("test_ca")
    return Target(request.getfixturevalue("kafka_mq").bootstrap, {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "alice", "sasl.password": users["alice"],
        "ssl.ca.location": str(ca.cert)})


@pytest.fixture(scope="session")
def connector_jars() -> str:
    try:
        return ",".join(map(str, resolve("spark", SPARK_CONNECTOR)))
    except JavaUnavailable as err:
        pytest.fail(str(err))


def environ(tmp_path) -> dict:
    """No broker nor cluster from the caller's environment; temporary files under tmp_path."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("MQ_SOCKET", "MQ_DATA_DIR", "XDG_STATE_HOME", "MQ_BOOTSTRAP_SERVERS")}
    (tmp_path / "tmp").mkdir()
    return {**env, "TMPDIR": str(tmp_path / "tmp"), "PYTHONIOENCODING": "utf-8"}


def epoch_ms(text: str) -> int:
    return round(datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def read_topic(target: Target, topic: str) -> list:
    with mq.Consumer(topic, bootstrap_servers=target.bootstrap, kafka_config=target.config,
                     value_bytes=True, isolation_level="read_committed") as consumer:
        consumer.seek_to_beginning()
        tps = sorted(consumer.assignment())
        ends = consumer.end_offsets(tps)
        out: list = []
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=1000).values():
                out.extend(records)
    return out


def expected_totals(orders: list) -> dict:
    """{(window start ms, customer): (orders, amount, newest produce time ms)}."""
    acc: dict = collections.defaultdict(lambda: [0, Decimal(0), 0])
    for record in orders:
        order = json.loads(record.value, parse_float=Decimal)
        t = acc[(epoch_ms(order["event_time"]) // WINDOW_MS * WINDOW_MS, order["customer"])]
        t[0] += 1
        t[1] += order["amount"]
        t[2] = max(t[2], record.timestamp_ms)
    return {k: tuple(v) for k, v in acc.items()}


def parquet_totals(path) -> dict:
    table = pq.read_table(path)         # Spark's _spark_metadata is skipped (a "_" name)
    ms = {c: table.column(c).cast(pa.timestamp("ms")).cast(pa.int64()).to_pylist()
          for c in ("window_start", "window_end", "last_order_at")}
    rows = {}
    for i, (customer, orders, amount) in enumerate(zip(
            table.column("customer").to_pylist(), table.column("orders").to_pylist(),
            table.column("amount").to_pylist(), strict=True)):
        assert ms["window_end"][i] == ms["window_start"][i] + WINDOW_MS
        assert (ms["window_start"][i], customer) not in rows            # exactly once
        rows[(ms["window_start"][i], customer)] = (orders, amount, ms["last_order_at"][i])
    return rows


@pytest.mark.parametrize("backend, security", [("kafka", "PLAINTEXT"), ("mq", "SASL_SSL")])
def test_demo_spark_on_a_kafka_cluster_writes_exact_totals(target, connector_jars, tmp_path):
    output = tmp_path / "output"
    config = tmp_path / "client.properties"
    config.write_text("".join(f"{k}={v}\n" for k, v in target.config.items()))
    bootstrap = target.bootstrap
    proc = subprocess.run(
        [sys.executable, "-m", "mq", "demo", "--spark", "--bootstrap-server", bootstrap,
         "--command-config", str(config), "--connector-jars", connector_jars,
         "--records", str(ORDERS), "--rate", "2000", "--partitions", "2",
         "--output", str(output)],
        capture_output=True, text=True, env=environ(tmp_path), timeout=540, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out, err = proc.stdout, proc.stderr
    assert "Traceback" not in out + err

    assert f"on the Kafka cluster at {bootstrap}\n" in out, out
    for name in ("totals-to-kafka", "totals-to-parquet"):
        assert re.search(rf"{name}\s+{ORDERS + 2:,} rows in, [\d,]+ rows out in [\d.]+ s: ", out)
    assert "late orders dropped by the watermark: 0\n" in out
    assert "guarantees: Parquet (Spark's file sink) exactly once, the source of truth; " \
        "'mq-demo-order-totals' (Spark's Kafka sink, no transactions) at least once" in out
    check = re.search(rf"check: ([\d,]+) totals in the topic(?: \(and [\d,]+ written again, "
                      rf"the same\))?, \1 in Parquet; {ORDERS:,} orders, amount ([\d,.]+): OK\n",
                      out)
    assert check, out
    assert re.search(r"mq demo: +[\d.]+ s: produced [\d,]+ .* \| totals-to-kafka: batches \d+",
                     err), err
    assert sorted(os.listdir(output)) == ["checkpoints", "order-totals.parquet", "spark.log"]
    assert os.listdir(tmp_path / "tmp") == []            # its temporary dir is gone

    # The orders, once each; the totals they make, exactly once in Parquet.
    events = read_topic(target, "mq-demo-orders")
    orders = [r for r in events if b"order_id" in r.value]
    assert len(orders) == ORDERS and len(events) == ORDERS + 2     # + start and end of stream
    assert len({json.loads(r.value)["order_id"] for r in orders}) == ORDERS
    expected = expected_totals(orders)
    assert len(expected) == int(check.group(1).replace(",", ""))
    assert sum(t[1] for t in expected.values()) == Decimal(check.group(2).replace(",", ""))
    assert parquet_totals(output / "order-totals.parquet") == expected

    # The topic: at least once; each (window, customer) keyed by its customer, all the same.
    got: dict = collections.defaultdict(set)
    for record in read_topic(target, "mq-demo-order-totals"):
        total = json.loads(record.value, parse_float=Decimal)
        assert record.key == total["customer"].encode()
        start = epoch_ms(total["window_start"])
        assert epoch_ms(total["window_end"]) == start + WINDOW_MS
        got[(start, total["customer"])].add(
            (total["orders"], total["amount"], epoch_ms(total["last_order_at"])))
    assert {key: values.pop() for key, values in got.items() if len(values) == 1} == expected
