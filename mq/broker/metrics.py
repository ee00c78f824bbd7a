"""``mq broker --metrics HOST:PORT``: the broker's figures as OpenMetrics at ``/metrics``.

A scrape runs on prometheus_client's HTTP thread. It asks the loop for one snapshot
(``stats.py``; the loop runs it between two rounds, so every figure is from the same instant
and no broker structure is read from another thread) and builds the metric families from it
off the loop. What the loop spent on the snapshot is itself exported
(``mq_metrics_snapshot_seconds``), so the cost of being scraped is visible where it is paid.

Families (labels ``topic``, ``partition``, ``group`` where they apply)::

    mq_partition_log_start_offset, mq_partition_high_watermark,
    mq_partition_last_stable_offset, mq_partition_log_end_offset     gauges, offsets
    mq_partition_size_bytes, mq_partition_segments                   gauges, on disk
    mq_produce_records_total, mq_produce_bytes_total                 counters since start
    mq_fsync_seconds                                                 histogram, per fdatasync
    mq_group_members                                                 gauge, live members
    mq_group_committed_offset, mq_group_lag_records                  gauges, per partition
    mq_group_lag_seconds          gauge, age of the oldest unconsumed record (0: caught up)
    mq_connections                                                   gauge, client sockets
    mq_cleaner_passes_total, mq_cleaner_failures_total,
    mq_cleaner_read_bytes_total, mq_cleaner_written_bytes_total,
    mq_cleaner_seconds_total                                         counters, compaction
    mq_broker_info{version}, mq_broker_start_time_seconds
    mq_metrics_snapshot_seconds   gauge, loop time the last scrape's snapshot took
    process_*                     prometheus_client's process collector (CPU, memory, fds)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from mq.metrics import MetricsServer, serve

__all__ = ["BrokerCollector", "serve_broker_metrics"]

log = logging.getLogger("mq.broker")

_PARTITION_GAUGES = (
    ("mq_partition_log_start_offset", "log_start_offset", "First offset still in the log."),
    ("mq_partition_high_watermark", "high_watermark", "Offset consumers can read up to."),
    ("mq_partition_last_stable_offset", "last_stable_offset",
     "Offset read_committed consumers can read up to."),
    ("mq_partition_log_end_offset", "log_end_offset", "Offset the next record gets."),
    ("mq_partition_size_bytes", "size_bytes", "Bytes of the partition's .log segments."),
    ("mq_partition_segments", "segments", "Segments in the partition's log."),
)
_CLEANER_COUNTERS = (
    ("mq_cleaner_passes", "passes", "Compaction passes finished or stopped early."),
    ("mq_cleaner_failures", "failures", "Compaction passes that failed (retried later)."),
    ("mq_cleaner_read_bytes", "bytes_read", "Bytes the cleaner read."),
    ("mq_cleaner_written_bytes", "bytes_written", "Bytes the cleaner wrote."),
    ("mq_cleaner_seconds", "elapsed_seconds", "Seconds spent compacting."),
)


class BrokerCollector(Collector):
    """Builds the families from ``fetch()`` -> (snapshot, seconds the loop spent on it)."""

    def __init__(self, fetch: Callable[[], tuple[dict, float]]) -> None:
        self._fetch = fetch

    def collect(self) -> Iterator[Metric]:
        try:
            snap, loop_seconds = self._fetch()
        except ValueError:                   # the broker is stopping: nothing to report
            return
        broker = snap["broker"]
        info = InfoMetricFamily("mq_broker", "The broker's version.")
        info.add_metric([], {"version": broker["version"]})
        yield info
        yield GaugeMetricFamily("mq_broker_start_time_seconds",
                                "When the broker started, in seconds since the epoch.",
                                value=broker["started_ms"] / 1000, unit="seconds")
        yield GaugeMetricFamily("mq_connections", "Open client connections.",
                                value=broker["connections"])
        yield GaugeMetricFamily("mq_metrics_snapshot_seconds",
                                "Loop time the snapshot behind this scrape took.",
                                value=loop_seconds, unit="seconds")
        yield from _partition_families(snap["partitions"])
        yield _fsync_histogram(snap["fsync"])
        yield from _group_families(snap["groups"])
        cleaner = snap["cleaner"]
        for name, key, doc in _CLEANER_COUNTERS:
            unit = "seconds" if name.endswith("seconds") else \
                "bytes" if name.endswith("bytes") else ""
            yield CounterMetricFamily(name, doc, value=cleaner[key], unit=unit)


def _partition_families(partitions: list[dict]) -> Iterator[Metric]:
    labels = ["topic", "partition"]
    for name, key, doc in _PARTITION_GAUGES:
        unit = "bytes" if name.endswith("_bytes") else ""
        family = GaugeMetricFamily(name, doc, labels=labels, unit=unit)
        for p in partitions:
            family.add_metric([p["topic"], str(p["partition"])], p[key])
        yield family
    records = CounterMetricFamily("mq_produce_records", "Records appended by Produce.",
                                  labels=labels)
    size = CounterMetricFamily("mq_produce_bytes", "Batch bytes appended by Produce.",
                               labels=labels, unit="bytes")
    for p in partitions:
        tp = [p["topic"], str(p["partition"])]
        records.add_metric(tp, p["produced_records"])
        size.add_metric(tp, p["produced_bytes"])
    yield records
    yield size


def _fsync_histogram(fsync: dict) -> Metric:
    buckets = [("+Inf" if math.isinf(bound) else repr(bound), count)
               for bound, count in fsync["buckets"]]
    return HistogramMetricFamily("mq_fsync_seconds", "Time each fdatasync of a log took.",
                                 buckets=buckets, sum_value=fsync["sum_seconds"],
                                 unit="seconds")


def _group_families(groups: list[dict]) -> Iterator[Metric]:
    members = GaugeMetricFamily("mq_group_members", "Live members of the group.",
                                labels=["group"])
    labels = ["group", "topic", "partition"]
    committed = GaugeMetricFamily("mq_group_committed_offset",
                                  "The group's committed offset.", labels=labels)
    lag = GaugeMetricFamily("mq_group_lag_records",
                            "Records between the committed offset and the high watermark.",
                            labels=labels)
    age = GaugeMetricFamily("mq_group_lag_seconds",
                            "Age of the oldest record the group has not consumed.",
                            labels=labels, unit="seconds")
    for g in groups:
        members.add_metric([g["group"]], g["members"])
        for o in g["offsets"]:
            key = [g["group"], o["topic"], str(o["partition"])]
            committed.add_metric(key, o["committed_offset"])
            if o["lag"] is not None:
                lag.add_metric(key, o["lag"])
            if o["lag_ms"] is not None:
                age.add_metric(key, o["lag_ms"] / 1000)
    yield members
    yield committed
    yield lag
    yield age


def serve_broker_metrics(address: str, fetch: Callable[[], tuple[dict, float]]
                         ) -> MetricsServer:
    """Serve the broker's families and the process collector at ``address``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BrokerCollector(fetch))
    ProcessCollector(registry=registry)
    return serve(registry, address)
