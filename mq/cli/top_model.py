"""What ``mq top`` shows, computed from broker snapshots (``Admin.broker_stats()``): pure, no
terminal, no socket, so every figure is unit-tested from fixed dicts.

The broker keeps counters, not rates: records and bytes produced per partition since it
started, committed offsets per group, a cumulative fsync histogram. A rate is the difference of
two snapshots over the broker clock between them (``now_ms``: both readings come from the same
clock as the counters, so a slow round trip does not skew the rate). Counters start again at a
broker restart (another pid or ``started_ms``): the older snapshot is then no base, and the
rates are unknown (None, shown as '-') until the next one. A counter that went down (a topic
deleted and created again, a group's offsets reset) gives no rate for that topic or group
rather than a negative one.

Rate out is what consumers commit: they read the log through their own memory maps, so the
broker sees consumption only as committed offsets. It is summed over groups (two groups
reading 100 rec/s each make 200 rec/s out) and moves in steps as often as the groups commit.

fsync latency over the interval is the mean (Δsum / Δcount) and the p99 estimated from the Δ
of the cumulative buckets as Prometheus' ``histogram_quantile`` does: linear inside the bucket
that holds the rank, the last finite bound when it falls in the +Inf bucket. With one snapshot
(``--once --interval 0``, or the first frame) the figures are since the broker started.

On a Kafka cluster (``mq top --bootstrap-server``) the snapshot is what the admin API gives
(``build_cluster_view``, and the format above it): the high watermarks' advance stands for rate
in, leaders and in-sync replicas for the partitions' health; there is no size, fsync or lag age.

``columns`` and ``cells`` give each table's headers and cell texts once, for both the rich view
and the plain ``--once`` tables; cells never contain spaces, so ``awk`` can split them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from mq.broker import space

__all__ = [
    "BrokerRow", "ClusterRow", "ClusterTopicRow", "ClusterView", "GroupRow", "TopicRow", "View",
    "broker_lines", "build_cluster_view", "build_view", "cluster_lines", "cluster_topic_cells",
    "format_bytes", "format_count", "format_duration", "format_seconds", "group_cells",
    "histogram_quantile", "summary_lines", "to_json", "topic_cells", "topics_table",
    "CLUSTER_TOPIC_COLUMNS", "GROUP_COLUMNS", "TOPIC_COLUMNS",
]


@dataclass(frozen=True)
class TopicRow:
    topic: str
    internal: bool
    partitions: int
    size_bytes: int
    records: int                        # retained: Σ (high watermark - log start offset)
    end_offset: int                     # Σ high watermarks: records ever written
    in_records_per_second: float | None      # None: unknown (one snapshot, or a counter went down)
    in_bytes_per_second: float | None
    out_records_per_second: float | None     # committed by its groups, summed over groups


@dataclass(frozen=True)
class GroupRow:
    group: str
    state: str
    members: int
    topics: tuple[str, ...]
    lag: int | None                     # Σ over partitions with a known lag
    lag_seconds: float | None           # the oldest unconsumed record's age, max over partitions
    out_records_per_second: float | None     # its committed offsets' advance


@dataclass(frozen=True)
class BrokerRow:
    pid: int
    version: str
    data_dir: str
    socket: str
    uptime_seconds: float
    connections: int
    fsync_count: int                    # over the window below
    fsync_per_second: float | None
    fsync_mean_seconds: float | None    # None: no fsync in the window
    fsync_p99_seconds: float | None
    cleaner_passes: int
    cleaner_failures: int
    cleaner_bytes_read: int
    cleaner_bytes_written: int


@dataclass(frozen=True)
class View:
    broker: BrokerRow
    topics: tuple[TopicRow, ...]
    groups: tuple[GroupRow, ...]
    interval_seconds: float | None      # between the two snapshots; None: one snapshot only
    hidden_topics: int                  # internal topics left out (without --all)


# --- rates ----------------------------------------------------------------------------------

def _interval_seconds(prev: dict | None, cur: dict) -> float | None:
    """Seconds between two snapshots of the same broker run, or None if ``prev`` is no base."""
    if prev is None:
        return None
    a, b = prev["broker"], cur["broker"]
    if (a["pid"], a["started_ms"]) != (b["pid"], b["started_ms"]):
        return None                     # restarted: its counters started again
    elapsed_ms = b["now_ms"] - a["now_ms"]
    return elapsed_ms / 1000 if elapsed_ms > 0 else None


def _rate(before: int | None, after: int | None, seconds: float | None) -> float | None:
    if before is None or after is None or seconds is None or after < before:
        return None
    return (after - before) / seconds


def _sum_rates(rates: Iterable[float | None]) -> float | None:
    """Σ of the rates, None if any is unknown (a part missing would understate the whole)."""
    total = 0.0
    for r in rates:
        if r is None:
            return None
        total += r
    return total


_NEW_PARTITION = {"produced_records": 0, "produced_bytes": 0}


def _committed(snapshot: dict) -> dict[tuple[str, str, int], int | None]:
    """``{(group, topic, partition): committed offset}``."""
    return {(g["group"], o["topic"], o["partition"]): o["committed_offset"]
            for g in snapshot["groups"] for o in g["offsets"]}


def _commit_rates(prev: dict, cur: dict, seconds: float
                  ) -> dict[tuple[str, str, int], float | None]:
    """Per (group, topic, partition) committed in both snapshots: how fast its offset
    advanced; None where it went back (a reset). An offset committed for the first time is
    left out: the offset is absolute, so the records it covers were not all read in the
    interval."""
    before = _committed(prev)
    return {key: _rate(before[key], offset, seconds) for key, offset in _committed(cur).items()
            if offset is not None and before.get(key) is not None}


# --- fsync ----------------------------------------------------------------------------------

def histogram_quantile(q: float, buckets: Sequence[Sequence[float]]) -> float | None:
    """The ``q`` quantile (0..1) of a cumulative histogram ``[[upper bound, count], ...]``
    whose last bound is +Inf, as Prometheus estimates it: linear interpolation inside the
    bucket holding the rank (from 0 for the first), the last finite bound if the rank is in
    the +Inf bucket. None for an empty histogram."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank and count > below:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def _fsync(prev: dict | None, cur: dict, seconds: float | None
           ) -> tuple[int, float | None, float | None, float | None]:
    """(count, per second, mean seconds, p99 seconds) over the interval, else since start."""
    now = cur["fsync"]
    count, total, buckets = now["count"], now["sum_seconds"], now["buckets"]
    if seconds is not None:
        was = prev["fsync"]
        if now["count"] >= was["count"]:
            count -= was["count"]
            total -= was["sum_seconds"]
            buckets = [[ub, c - c0] for (ub, c), (_, c0) in zip(buckets, was["buckets"],
                                                                strict=True)]
    mean = total / count if count else None
    p99 = histogram_quantile(0.99, buckets) if count else None
    return count, (count / seconds if seconds else None), mean, p99


# --- the view -------------------------------------------------------------------------------

def build_view(cur: dict, prev: dict | None = None, show_internal: bool = False) -> View:
    """The tables of snapshot ``cur`` with rates since ``prev`` (an earlier snapshot, or None:
    no rates). Internal topics (``__consumer_offsets``, ...) only with ``show_internal``.
    Topics and groups sorted by name."""
    seconds = _interval_seconds(prev, cur)
    if prev is None or seconds is None:
        prev, commits, produced_before = None, {}, {}
    else:
        commits = _commit_rates(prev, cur, seconds)
        produced_before = {(p["topic"], p["partition"]): p for p in prev["partitions"]}

    by_topic: dict[str, list[dict]] = {}
    for p in cur["partitions"]:
        by_topic.setdefault(p["topic"], []).append(p)
    topics, hidden = [], 0
    for topic in sorted(by_topic):
        parts = by_topic[topic]
        internal = any(p["internal"] for p in parts)
        if internal and not show_internal:
            hidden += 1
            continue
        # A partition created in the interval produced all of its counters in it: from 0.
        was = [produced_before.get((topic, p["partition"]), _NEW_PARTITION) for p in parts]
        topics.append(TopicRow(
            topic=topic, internal=internal, partitions=len(parts),
            size_bytes=sum(p["size_bytes"] for p in parts),
            records=sum(p["high_watermark"] - p["log_start_offset"] for p in parts),
            end_offset=sum(p["high_watermark"] for p in parts),
            in_records_per_second=_sum_rates(
                _rate(w["produced_records"], p["produced_records"], seconds)
                for p, w in zip(parts, was, strict=True)),
            in_bytes_per_second=_sum_rates(
                _rate(w["produced_bytes"], p["produced_bytes"], seconds)
                for p, w in zip(parts, was, strict=True)),
            out_records_per_second=_sum_rates(r for (_, t, _), r in commits.items() if t == topic)
            if seconds is not None else None))

    groups = _group_rows(cur, commits, seconds)
    b, cleaner = cur["broker"], cur["cleaner"]
    count, per_second, mean, p99 = _fsync(prev, cur, seconds)
    broker = BrokerRow(
        pid=b["pid"], version=b["version"], data_dir=b["data_dir"], socket=b["socket"],
        uptime_seconds=max(0.0, (b["now_ms"] - b["started_ms"]) / 1000),
        connections=b["connections"], fsync_count=count, fsync_per_second=per_second,
        fsync_mean_seconds=mean, fsync_p99_seconds=p99,
        cleaner_passes=cleaner["passes"], cleaner_failures=cleaner["failures"],
        cleaner_bytes_read=cleaner["bytes_read"], cleaner_bytes_written=cleaner["bytes_written"])
    return View(broker=broker, topics=tuple(topics), groups=tuple(groups),
                interval_seconds=seconds, hidden_topics=hidden)


def _group_rows(cur: dict, commits: dict, seconds: float | None) -> tuple[GroupRow, ...]:
    """The groups of snapshot ``cur``, sorted; ``lag_ms`` may be missing (a cluster's)."""
    groups = []
    for g in sorted(cur["groups"], key=lambda g: g["group"]):
        offsets = g["offsets"]
        lags = [o["lag"] for o in offsets if o["lag"] is not None]
        ages = [o["lag_ms"] for o in offsets if o.get("lag_ms") is not None]
        groups.append(GroupRow(
            group=g["group"], state=g["state"], members=g["members"],
            topics=tuple(sorted({o["topic"] for o in offsets})),
            lag=sum(lags) if lags else None,
            lag_seconds=max(ages) / 1000 if ages else None,
            out_records_per_second=_sum_rates(r for (name, _, _), r in commits.items()
                                              if name == g["group"]) if seconds is not None
            else None))
    return tuple(groups)


# --- a Kafka cluster ------------------------------------------------------------------------
#
# ``mq top --bootstrap-server``: what the admin API gives instead of the broker's counters.
# A cluster snapshot is ``{"cluster": {"cluster_id", "controller", "brokers": {id: "host:port"},
# "now_ms"}, "partitions": [{"topic", "partition", "log_start_offset", "high_watermark",
# "leader", "replicas", "isr"}], "groups": [as the broker's, without "lag_ms"]}``; ``now_ms`` is
# this machine's clock when the snapshot was taken. Rate in is how fast the high watermarks
# move (offsets per second: transaction markers count too); a partition new in the interval
# counts from 0; another cluster id is another cluster, and no base for rates.

@dataclass(frozen=True)
class ClusterTopicRow:
    topic: str
    partitions: int
    replication_factor: int             # the most replicas a partition has
    under_replicated: int               # partitions whose ISR is smaller than their replicas
    offline: int                        # partitions without a leader
    records: int                        # retained: Σ (high watermark - log start offset)
    end_offset: int                     # Σ high watermarks
    in_records_per_second: float | None
    out_records_per_second: float | None     # committed by its groups, summed over groups


@dataclass(frozen=True)
class ClusterRow:
    cluster_id: str | None
    controller: int | None
    brokers: tuple[str, ...]            # "id host:port", by id
    partitions: int
    under_replicated: int
    offline: int


@dataclass(frozen=True)
class ClusterView:
    cluster: ClusterRow
    topics: tuple[ClusterTopicRow, ...]
    groups: tuple[GroupRow, ...]
    interval_seconds: float | None
    hidden_topics: int                  # always 0: a cluster's admin API lists no internal topic


def build_cluster_view(cur: dict, prev: dict | None = None) -> ClusterView:
    """``build_view`` for two snapshots of a Kafka cluster (the format above)."""
    a, b = (None, cur["cluster"]) if prev is None else (prev["cluster"], cur["cluster"])
    seconds = None
    if a is not None and a["cluster_id"] == b["cluster_id"] and b["now_ms"] > a["now_ms"]:
        seconds = (b["now_ms"] - a["now_ms"]) / 1000
    commits = {} if seconds is None else _commit_rates(prev, cur, seconds)
    before = {} if seconds is None else {(p["topic"], p["partition"]): p["high_watermark"]
                                         for p in prev["partitions"]}
    by_topic: dict[str, list[dict]] = {}
    for p in cur["partitions"]:
        by_topic.setdefault(p["topic"], []).append(p)
    topics = []
    for topic in sorted(by_topic):
        parts = by_topic[topic]
        topics.append(ClusterTopicRow(
            topic=topic, partitions=len(parts),
            replication_factor=max(len(p["replicas"]) for p in parts),
            under_replicated=sum(len(p["isr"]) < len(p["replicas"]) for p in parts),
            offline=sum(p["leader"] is None for p in parts),
            records=sum(p["high_watermark"] - p["log_start_offset"] for p in parts),
            end_offset=sum(p["high_watermark"] for p in parts),
            in_records_per_second=_sum_rates(
                _rate(before.get((topic, p["partition"]), 0), p["high_watermark"], seconds)
                for p in parts),
            out_records_per_second=_sum_rates(r for (_, t, _), r in commits.items() if t == topic)
            if seconds is not None else None))
    cluster = ClusterRow(
        cluster_id=b["cluster_id"], controller=b["controller"],
        brokers=tuple(f"{i} {address}" for i, address in sorted(b["brokers"].items())),
        partitions=sum(t.partitions for t in topics),
        under_replicated=sum(t.under_replicated for t in topics),
        offline=sum(t.offline for t in topics))
    return ClusterView(cluster=cluster, topics=tuple(topics),
                       groups=_group_rows(cur, commits, seconds), interval_seconds=seconds,
                       hidden_topics=0)


# --- texts ----------------------------------------------------------------------------------

def format_count(n: float | None) -> str:
    """``0``, ``12``, ``12.5``, ``1.2k``, ``3.4M``, ``5.6G``; '-' for None (unknown)."""
    if n is None:
        return "-"
    if n < 1000:
        return str(int(n)) if float(n).is_integer() else f"{n:.1f}"
    for unit in ("k", "M", "G"):
        n /= 1000
        if n < 1000 or unit == "G":
            return f"{n:.1f}{unit}"
    raise AssertionError("unreachable")


def format_bytes(n: float | None) -> str:
    """``512B``, ``1.5KiB``, ``3.0MiB``, ...: ``mq.broker.space.format_bytes`` without its
    space (a table cell); '-' for None."""
    return "-" if n is None else space.format_bytes(int(n)).replace(" ", "")


def format_seconds(s: float | None) -> str:
    """A latency: ``850us``, ``1.2ms``, ``3.40s``; '-' for None."""
    if s is None:
        return "-"
    if s < 0.001:
        return f"{s * 1e6:.0f}us"
    if s < 1:
        return f"{s * 1e3:.1f}ms"
    return f"{s:.2f}s"


def format_duration(s: float | None) -> str:
    """An age or uptime: ``45s``, ``3m07s``, ``2h05m``, ``3d04h``; ``0.4s`` under 10 s; '-'."""
    if s is None:
        return "-"
    if s < 10:
        return f"{s:.1f}s"
    whole = int(s)
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def _mb(bytes_per_second: float | None) -> str:
    return "-" if bytes_per_second is None else f"{bytes_per_second / 1e6:.2f}"


TOPIC_COLUMNS = ("TOPIC", "PARTS", "SIZE", "RECORDS", "IN-REC/S", "IN-MB/S", "OUT-REC/S")
GROUP_COLUMNS = ("GROUP", "STATE", "MEMBERS", "LAG", "LAG-AGE", "OUT-REC/S", "TOPICS")


def topic_cells(row: TopicRow) -> tuple[str, ...]:
    """The texts of a topics-table row, in ``TOPIC_COLUMNS`` order."""
    return (row.topic, str(row.partitions), format_bytes(row.size_bytes),
            format_count(row.records), format_count(row.in_records_per_second),
            _mb(row.in_bytes_per_second), format_count(row.out_records_per_second))


def group_cells(row: GroupRow) -> tuple[str, ...]:
    """The texts of a groups-table row, in ``GROUP_COLUMNS`` order."""
    return (row.group, row.state, str(row.members), "-" if row.lag is None else str(row.lag),
            format_duration(row.lag_seconds), format_count(row.out_records_per_second),
            ",".join(row.topics) or "-")


def broker_lines(view: View) -> tuple[str, str]:
    """Two summary lines, what matters first (a narrow terminal cuts their ends): the broker,
    its connections and fsync latency; then the cleaner and the data dir."""
    b = view.broker
    fsync = (f"fsync {b.fsync_count} since start," if view.interval_seconds is None
             else f"fsync {format_count(b.fsync_per_second)}/s")
    return (f"broker pid {b.pid}  up {format_duration(b.uptime_seconds)}  "
            f"connections {b.connections}  {fsync} mean {format_seconds(b.fsync_mean_seconds)} "
            f"p99 {format_seconds(b.fsync_p99_seconds)}",
            f"cleaner {b.cleaner_passes} passes, {b.cleaner_failures} failed, "
            f"{format_bytes(b.cleaner_bytes_read)} read  data {b.data_dir}")


CLUSTER_TOPIC_COLUMNS = ("TOPIC", "PARTS", "RF", "URP", "OFFLINE", "RECORDS", "IN-REC/S",
                         "OUT-REC/S")


def cluster_topic_cells(row: ClusterTopicRow) -> tuple[str, ...]:
    """The texts of a cluster's topics-table row, in ``CLUSTER_TOPIC_COLUMNS`` order."""
    return (row.topic, str(row.partitions), str(row.replication_factor),
            str(row.under_replicated), str(row.offline), format_count(row.records),
            format_count(row.in_records_per_second), format_count(row.out_records_per_second))


def cluster_lines(view: ClusterView) -> tuple[str, str]:
    """Two summary lines: the cluster and its partitions' health; then its brokers."""
    c = view.cluster
    return (f"cluster {c.cluster_id}  controller {'-' if c.controller is None else c.controller}"
            f"  partitions {c.partitions}  under-replicated {c.under_replicated}  "
            f"offline {c.offline}",
            f"brokers {len(c.brokers)}: {', '.join(c.brokers) or '-'}")


def summary_lines(view: View | ClusterView) -> tuple[str, str]:
    """The two lines above the tables, for the local broker or a cluster."""
    return cluster_lines(view) if isinstance(view, ClusterView) else broker_lines(view)


def topics_table(view: View | ClusterView) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """The topics table's columns and rows, for the local broker or a cluster."""
    if isinstance(view, ClusterView):
        return CLUSTER_TOPIC_COLUMNS, [cluster_topic_cells(t) for t in view.topics]
    return TOPIC_COLUMNS, [topic_cells(t) for t in view.topics]


# --- JSON -----------------------------------------------------------------------------------

def _camel(name: str) -> str:
    """``lag_seconds`` -> ``lagSeconds``: the CLI's JSON keys are camelCase (Kafka's)."""
    head, *rest = name.split("_")
    return head + "".join(word.capitalize() for word in rest)


def _json_value(value):
    if dataclasses.is_dataclass(value):
        return {_camel(f.name): _json_value(getattr(value, f.name))
                for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    return value


def to_json(view: View | ClusterView) -> dict:
    """The view as plain JSON values: camelCase keys, rates per second, null for unknown."""
    return _json_value(view)
