"""Broker snapshots as ``Admin.broker_stats()`` returns them, built from a few numbers: the
fixed inputs of the ``mq top`` unit tests."""

from __future__ import annotations

import math

INF = math.inf
BOUNDS = (0.001, 0.01, 0.1, 1.0, INF)


def partition(topic, p, produced=0, produced_bytes=0, start=0, hw=None, internal=False,
              size=0):
    hw = produced if hw is None else hw
    return {"topic": topic, "partition": p, "internal": internal, "log_start_offset": start,
            "high_watermark": hw, "last_stable_offset": hw, "log_end_offset": hw,
            "size_bytes": size, "segments": 1, "produced_records": produced,
            "produced_bytes": produced_bytes}


def offset(topic, p, committed, end=None, lag_ms=None):
    lag = None if committed is None or end is None else end - committed
    return {"topic": topic, "partition": p, "committed_offset": committed, "end_offset": end,
            "lag": lag, "lag_ms": lag_ms}


def snapshot(now_ms=10_000, partitions=(), groups=(), fsync=None, pid=42, started_ms=0,
             connections=3):
    return {
        "broker": {"pid": pid, "data_dir": "/var/lib/mq", "socket": "/var/lib/mq/mq.sock",
                   "version": "0.1.0", "started_ms": started_ms, "now_ms": now_ms,
                   "connections": connections},
        "partitions": list(partitions),
        "groups": list(groups),
        "fsync": fsync or {"count": 0, "sum_seconds": 0.0,
                           "buckets": [[b, 0] for b in BOUNDS]},
        "cleaner": {"passes": 2, "completed": 2, "failures": 0, "bytes_read": 2048,
                    "bytes_written": 1024, "elapsed_seconds": 0.5},
    }


def group(name, offsets, members=1, state="Stable"):
    return {"group": name, "state": state, "members": members, "offsets": list(offsets)}


def fsync(counts, sum_seconds):
    """A cumulative histogram from per-bucket counts."""
    cumulative, total = [], 0
    for bound, n in zip(BOUNDS, counts, strict=True):
        total += n
        cumulative.append([bound, total])
    return {"count": total, "sum_seconds": sum_seconds, "buckets": cumulative}


def cluster_partition(topic, p, hw=0, start=0, leader=1, replicas=(1, 2, 3), isr=None):
    """A partition of a Kafka cluster snapshot (``mq.cli.top.cluster_snapshot``)."""
    return {"topic": topic, "partition": p, "log_start_offset": start, "high_watermark": hw,
            "leader": leader, "replicas": list(replicas),
            "isr": list(replicas if isr is None else isr)}


def cluster_snapshot(now_ms=10_000, partitions=(), groups=(), cluster_id="c1", controller=1,
                     brokers=None):
    return {"cluster": {"cluster_id": cluster_id, "controller": controller,
                        "brokers": brokers or {1: "k1:9092", 2: "k2:9092", 3: "k3:9092"},
                        "now_ms": now_ms},
            "partitions": list(partitions), "groups": list(groups)}
