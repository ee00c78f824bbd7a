"""``mq broker --metrics``: a real broker serving ``/metrics`` over HTTP, scraped while real
producers, consumers and groups run, and parsed back with prometheus_client's parser (the
format Prometheus itself reads). Also the BrokerStats api the endpoint and ``mq top`` share.
"""

from __future__ import annotations

import socket
import urllib.request

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
from prometheus_client.parser import text_string_to_metric_families as parse_text

import mq
import mq.testing
from tests.integration.cli_run import mq_run

RECORDS = 600
COMMITTED = 250


def scrape(url: str, openmetrics: bool = False) -> tuple[str, str]:
    """(content type, body) of one GET of ``url``."""
    headers = {"Accept": "application/openmetrics-text; version=1.0.0"} if openmetrics else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                timeout=30) as reply:
        return reply.headers["Content-Type"], reply.read().decode()


def samples(text: str) -> dict[tuple[str, frozenset], float]:
    """{(sample name, labels): value} of a Prometheus text exposition."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in parse_text(text) for s in family.samples}


@pytest.fixture
def metrics_broker(tmp_path):
    config = tmp_path / "mq.toml"
    config.write_text('metrics_address = "127.0.0.1:0"\n')
    with mq.testing.broker(tmp_path / "data", config_file=str(config)) as b:
        with mq.Admin(socket=b.socket) as admin:
            url = admin.broker_stats()["broker"]["metrics_url"]
        assert url and url.startswith("http://127.0.0.1:")
        b.url = url
        yield b


def _traffic(b) -> None:
    """RECORDS records over 2 partitions; group "billing" commits COMMITTED on partition 0."""
    with mq.Admin(socket=b.socket) as admin:
        admin.create_topic("orders", partitions=2)
    with mq.Producer(socket=b.socket) as producer:
        for i in range(RECORDS):
            producer.send("orders", value=b"v" * 100, partition=i % 2,
                          timestamp_ms=1_000_000 + i)
    tp = mq.TopicPartition("orders", 0)
    with mq.Consumer(group_id="billing", socket=b.socket, enable_auto_commit=False) as c:
        c.assign([tp])
        c.commit({tp: COMMITTED})


def test_scrape_reports_partitions_groups_fsync_and_connections(metrics_broker):
    b = metrics_broker
    _traffic(b)
    with mq.Admin(socket=b.socket):                      # one connection open while scraped
        content_type, text = scrape(b.url)
    assert content_type.startswith("text/plain")
    got = samples(text)

    def value(name, **labels):
        return got[(name, frozenset((k, str(v)) for k, v in labels.items()))]

    for p in (0, 1):
        tp = {"topic": "orders", "partition": p}
        assert value("mq_partition_high_watermark", **tp) == RECORDS // 2
        assert value("mq_partition_log_end_offset", **tp) == RECORDS // 2
        assert value("mq_partition_last_stable_offset", **tp) == RECORDS // 2
        assert value("mq_partition_log_start_offset", **tp) == 0
        assert value("mq_partition_segments", **tp) == 1
        assert value("mq_produce_records_total", **tp) == RECORDS // 2
        size = value("mq_partition_size_bytes", **tp)
        assert size == value("mq_produce_bytes_total", **tp) and size > 100 * RECORDS // 2
    key = {"group": "billing", "topic": "orders", "partition": 0}
    assert value("mq_group_committed_offset", **key) == COMMITTED
    assert value("mq_group_lag_records", **key) == RECORDS // 2 - COMMITTED
    # The oldest unconsumed record was stamped 1,000,000 + 2 * COMMITTED ms after the epoch.
    assert value("mq_group_lag_seconds", **key) > 1_700_000_000
    assert value("mq_group_members", group="billing") == 0
    assert value("mq_connections") >= 1
    assert value("mq_fsync_seconds_count") >= 1            # acks=all produces were fsync'd
    assert value("mq_fsync_seconds_bucket", le="+Inf") == value("mq_fsync_seconds_count")
    assert value("mq_fsync_seconds_sum") > 0
    assert value("mq_cleaner_passes_total") >= 0
    assert 0 < value("mq_metrics_snapshot_seconds") < 5
    assert value("mq_broker_info", version=mq.__version__) == 1
    assert value("process_resident_memory_bytes") > 0


def test_openmetrics_format_on_request(metrics_broker):
    b = metrics_broker
    _traffic(b)
    content_type, text = scrape(b.url, openmetrics=True)
    assert content_type.startswith("application/openmetrics-text")
    assert text.endswith("# EOF\n")
    families = {f.name: f for f in parse_om(text)}
    assert families["mq_produce_records"].type == "counter"
    assert families["mq_fsync_seconds"].type == "histogram"
    assert families["mq_fsync_seconds"].unit == "seconds"
    assert families["mq_group_lag_seconds"].unit == "seconds"
    assert families["mq_partition_size_bytes"].unit == "bytes"


def test_broker_stats_matches_the_scrape(metrics_broker):
    b = metrics_broker
    _traffic(b)
    with mq.Admin(socket=b.socket) as admin:
        stats = admin.broker_stats()
    parts = {(p["topic"], p["partition"]): p for p in stats["partitions"]}
    assert parts[("orders", 0)]["produced_records"] == RECORDS // 2
    assert parts[("__consumer_offsets", 0)]["internal"] is True
    assert not parts[("orders", 1)]["internal"]
    (group,) = [g for g in stats["groups"] if g["group"] == "billing"]
    (row,) = group["offsets"]
    assert (row["committed_offset"], row["end_offset"], row["lag"]) == \
        (COMMITTED, RECORDS // 2, RECORDS // 2 - COMMITTED)
    assert stats["broker"]["pid"] == b.pid and stats["broker"]["connections"] >= 1
    assert stats["fsync"]["buckets"][-1][1] == stats["fsync"]["count"]


def test_no_metrics_unless_asked(broker):
    with mq.Admin(socket=broker.socket) as admin:
        assert admin.broker_stats()["broker"]["metrics_url"] is None


def test_bad_metrics_address_is_one_line(tmp_path):
    result = mq_run("broker", "--data-dir", tmp_path / "d", "--metrics", "localhost")
    assert result.code != 0, result
    assert "HOST:PORT" in result.err and "Traceback" not in result.err, result
    assert len(result.err.strip().splitlines()) == 1, result


def test_metrics_port_in_use_is_one_line(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = mq_run("broker", "--data-dir", tmp_path / "d", "--socket",
                        tmp_path / "s.sock", "--metrics", f"127.0.0.1:{port}")
    assert result.code == 1, result
    assert f"cannot serve metrics at 127.0.0.1:{port}" in result.err, result
    assert "Traceback" not in result.err, result
    assert not (tmp_path / "s.sock").exists()                 # nothing left listening


def test_lag_age_follows_the_committed_offset(metrics_broker):
    """The age is cached between snapshots while a group stays put: it still grows with the
    clock, and a commit further on dates the new oldest unconsumed record. Record k of
    partition 0 was stamped 1,000,000 + 2k ms."""
    b = metrics_broker
    _traffic(b)

    def age_error(admin, committed: int) -> int:
        """The reported age minus the age the snapshot's own clock gives (~0 when right)."""
        stats = admin.broker_stats()
        (group,) = [g for g in stats["groups"] if g["group"] == "billing"]
        (row,) = group["offsets"]
        assert row["committed_offset"] == committed
        return row["lag_ms"] - (stats["broker"]["now_ms"] - (1_000_000 + 2 * committed))

    tp = mq.TopicPartition("orders", 0)
    with mq.Admin(socket=b.socket) as admin, \
            mq.Consumer(group_id="billing", socket=b.socket, enable_auto_commit=False) as c:
        for _ in range(2):                                   # a read, then a cached answer
            assert abs(age_error(admin, COMMITTED)) < 50
        c.assign([tp])
        c.commit({tp: COMMITTED + 10})
        assert abs(age_error(admin, COMMITTED + 10)) < 50
