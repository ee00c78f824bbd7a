"""``bench.kafka_wire``'s section ``kafka``: mq's Kafka listener against Apache Kafka itself, the
same librdkafka workers driving both, in one run.

A real Kafka 4.3.1 node (``bench.kafka_peer``: KRaft, broker and controller in one JVM, 1 GiB
heap) runs beside mq's broker. For every figure the two sides alternate, in an order rotated
run by run, and the ratio mq / Kafka is paired per run:

- produce 100 B and 64 KiB with 1 and 4 producer processes (each writes its share of ``n`` to
  partition 0 of a fresh topic), acks=1 and acks=all. **Durability differs on acks=all**: mq
  answers after an fsync (group commit), Kafka after the batch is in its page cache (it
  fsyncs on the OS's schedule; ``log.flush.interval.messages`` is unbounded). On acks=1 both
  answer from the page cache. Goal: mq >= 1.5x Kafka. Each row also gives how busy the
  producer processes were (their CPU over the timed loop's wall time): near 100 % the client
  is the limit, whatever the broker.
- broker ingest: the same with ``bench.kafka_raw``'s producer, which sends one prebuilt batch
  again and again (9,000 records of 100 B, or 15 of 64 KiB) and costs almost nothing per
  record, so the broker is the limit: what each broker takes, and its CPU per MB.
- consume the same records from offset 0 (Fetch + sendfile on both). Goal: mq >= 1.5x.
- end-to-end latency at 1 k and 10 k records/s (100 B, acks=1, linger.ms=0 on both). Goal: mq
  p50 <= 0.5x Kafka's. With it, each broker's CPU per record over the run (a record's
  Produce, and the Fetch that delivers it): the broker's share of the path.
- broker CPU per GB fetched by 1 and 8 consumers reading the whole topic. Goal: <= Kafka's.
- each broker's RSS at rest (after start, before load) and its start-up time (exec to a
  listener that answers Metadata).
"""

from __future__ import annotations

import os
import time

import psutil

from bench import harness
from bench.harness import KIB, MIB, WorkerError, process_cpu, rotated, run_workers, summary
from bench.kafka_peer import KAFKA_VERSION, KafkaNode
from bench.kafka_raw import raw_producer
from bench.kafka_workers import rdk_consumer, rdk_lat_consumer, rdk_lat_producer, rdk_producer

__all__ = ["run_vs_kafka", "table_rows"]

SIDES = ("mq", "kafka")
PRODUCERS = (1, 4)
CONSUMERS = (1, 8)
LAT_RATES = (1_000, 10_000)
SIZES = (("100B", 100), ("64KiB", 64 * KIB))
# ``--quick`` runs a smoke test of every path, not a comparison: half the cases, yet each
# size, acks, producer and consumer count (and each pair of produce settings) at least once.
QUICK_PRODUCE = ("100B acks=1 x1", "100B acks=all x4", "64KiB acks=1 x4", "64KiB acks=all x1")
QUICK_INGEST = ("100B acks=1 x1", "64KiB acks=1 x4")
QUICK_CONSUME = ("100B x8", "64KiB x1")
QUICK_LAT_RATES = (1_000,)


class _Side:
    """One broker as the workers see it: its bootstrap address, its pid, its topics."""

    def __init__(self, bootstrap: str, pid: int) -> None:
        from confluent_kafka.admin import AdminClient
        self.bootstrap = bootstrap
        self.pid = pid
        self.admin = AdminClient({"bootstrap.servers": bootstrap})
        self._n = 0

    def topic(self) -> str:
        from confluent_kafka.admin import NewTopic
        self._n += 1
        name = f"vs-{os.getpid()}-{self._n}"
        self.admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:        # Kafka: the leader takes a moment
            meta = self.admin.list_topics(name, timeout=5).topics.get(name)
            if meta is not None and meta.error is None and meta.partitions and \
                    meta.partitions[0].leader >= 0:
                return name
            time.sleep(0.05)
        raise WorkerError(f"topic {name} has no leader on {self.bootstrap}")

    def drop(self, topic: str) -> None:
        try:
            self.admin.delete_topics([topic])[topic].result(30)
        except Exception:       # noqa: BLE001 - a leftover topic only costs disk
            pass

    def cpu(self) -> float:
        return process_cpu(self.pid)


def _timed(side: _Side, jobs: list, timeout: float) -> tuple[list[dict], float]:
    def meter() -> tuple[int, float]:
        return time.perf_counter_ns(), side.cpu()
    results, s0, s1 = run_workers(jobs, timeout, meter, meter)
    return results, s1[1] - s0[1]


def _produce(side: _Side, size: int, acks, producers: int, n: int) -> dict:
    topic = side.topic()
    values = harness.payloads(size, 64 if size > 4096 else 1024, seed=3)
    share = n // producers
    try:
        results, cpu = _timed(side, [(rdk_producer, {"bootstrap": side.bootstrap,
                                                     "topic": topic, "values": values,
                                                     "n": share, "acks": acks})
                                     for _ in range(producers)], 300.0)
    finally:
        side.drop(topic)
    secs = (max(w["t_end"] for w in results) - min(w["t_first"] for w in results)) / 1e9
    total = share * producers
    busy = [w["cpu_s_loop"] / ((w["t_end"] - w["t_first"]) / 1e9) for w in results]
    return {"rate": total / secs, "mb_s": total * size / secs / 1e6,
            "broker_cpu_ms_per_mb": cpu / (total * size / 1e6) * 1e3,
            "client_busy": sum(busy) / len(busy)}


# (label, records per batch, record size): batches just under 1 MB, librdkafka's batch.size
# and within max.message.bytes (1,048,588), which both brokers enforce.
INGEST = (("100B", 9_000, 100), ("64KiB", 15, 64 * KIB))


def _ingest(side: _Side, records: int, size: int, producers: int, requests: int) -> dict:
    topic = side.topic()
    try:
        results, cpu = _timed(side, [(raw_producer, {
            "bootstrap": side.bootstrap, "topic": topic, "records": records, "size": size,
            "requests": requests}) for _ in range(producers)], 300.0)
    finally:
        side.drop(topic)
    secs = (max(w["t_end"] for w in results) - min(w["t_first"] for w in results)) / 1e9
    mb = sum(w["bytes"] for w in results) / 1e6
    return {"rate": sum(w["n"] for w in results) / secs, "mb_s": mb / secs,
            "broker_cpu_ms_per_mb": cpu / mb * 1e3}


def _fill(side: _Side, size: int, n: int) -> str:
    topic = side.topic()
    values = harness.payloads(size, 64 if size > 4096 else 1024, seed=7)
    run_workers([(rdk_producer, {"bootstrap": side.bootstrap, "topic": topic,
                                 "values": values, "n": n, "acks": 1})], 300.0)
    return topic


def _consume(side: _Side, topic: str, n: int, size: int, consumers: int) -> dict:
    results, cpu = _timed(side, [(rdk_consumer, {"bootstrap": side.bootstrap, "topic": topic,
                                                 "n": n}) for _ in range(consumers)], 300.0)
    for w in results:
        if w["n"] != n:
            raise WorkerError(f"consume on {side.bootstrap}: {w['n']} of {n} records")
    secs = (max(w["t_last"] for w in results) - min(w["t_start"] for w in results)) / 1e9
    fetched = n * size * consumers
    return {"rate": n * consumers / secs, "mb_s": fetched / secs / 1e6,
            "cpu_s_per_gb": cpu / (fetched / 1e9)}


def _latency(side: _Side, rate: int, seconds: float, warm_s: float) -> dict:
    topic = side.topic()
    warm = int(rate * warm_s)
    n = warm + int(rate * seconds)
    timeout = warm_s + seconds + 15.0
    try:
        (_, cons), cpu = _timed(side, [
            (rdk_lat_producer, {"bootstrap": side.bootstrap, "topic": topic, "size": 100,
                                "rate": rate, "n": n, "linger_ms": 0}),
            (rdk_lat_consumer, {"bootstrap": side.bootstrap, "topic": topic, "n": n,
                                "warm": warm, "timeout_s": timeout})], timeout + 30)
    finally:
        side.drop(topic)
    return {**harness.hist_stats(harness.merge_hists([cons["hist"]])),
            "broker_cpu_us_per_record": cpu / n * 1e6}


def _paired(per: dict, key: str, better_high: bool = True) -> dict:
    out = {s: summary([x[key] for x in per[s]]) for s in SIDES}
    out["ratio"] = summary([a[key] / b[key] for a, b in zip(per["mq"], per["kafka"],
                                                             strict=True)])
    return out


def _rotation(runs: int, what: str, one, progress) -> dict:
    per: dict = {s: [] for s in SIDES}
    for r in range(runs):
        for side in rotated(list(SIDES), r):
            per[side].append(one(side))
    progress(f"vs Kafka: {what} done")
    return per


def run_vs_kafka(ctx, progress) -> dict:
    """The section: a Kafka node in ``ctx.base``, then every comparison (module docstring)."""
    node = KafkaNode(os.path.join(ctx.base, "kafka"))
    node.start()
    try:
        progress(f"vs Kafka: Kafka {KAFKA_VERSION} at {node.bootstrap}, started in "
                 f"{node.started_s:.1f} s")
        sides = {"mq": _Side(ctx.bootstrap, ctx.broker.pid),
                 "kafka": _Side(node.bootstrap, node.pid)}
        res: dict = {"kafka_version": KAFKA_VERSION, "at_rest": {
            "mq": {"rss_mib": psutil.Process(ctx.broker.pid).memory_info().rss / MIB,
                   "start_s": ctx.broker_start_s},
            "kafka": {"rss_mib": psutil.Process(node.pid).memory_info().rss / MIB,
                      "start_s": node.started_s}}}
        runs = 1 if ctx.quick else 3
        cap = (8 if ctx.quick else 256) * MIB
        least = 100 if ctx.quick else 1000              # records of a run: 64 KiB ones too
        # A JVM runs interpreted until its JIT has seen the hot paths: one discarded produce
        # and consume on each side first (mq's broker gets the same, for symmetry).
        for s in SIDES:
            warm_n = 50_000 if ctx.quick else 1_000_000
            warm = _fill(sides[s], 100, warm_n)
            _consume(sides[s], warm, warm_n, 100, 1)
            sides[s].drop(warm)
        progress("vs Kafka: both brokers warmed up")
        res["produce"] = {}
        for label, size in SIZES:
            n = max(least, cap // size // (4 if size < 4096 else 1))
            for acks in (1, "all"):
                for k in PRODUCERS:
                    case = f"{label} acks={acks} x{k}"
                    if ctx.quick and case not in QUICK_PRODUCE:
                        continue
                    per = _rotation(runs, f"produce {case}", lambda s, size=size, acks=acks,
                                    k=k, n=n: _produce(sides[s], size, acks, k, n), progress)
                    res["produce"][case] = {**_paired(per, "rate"), "runs": per,
                                            "cpu": _paired(per, "broker_cpu_ms_per_mb"),
                                            "client_busy": _paired(per, "client_busy")}
        res["ingest"] = {}
        for label, records, size in INGEST:
            for k in PRODUCERS:
                case = f"{label} acks=1 x{k}"
                if ctx.quick and case not in QUICK_INGEST:
                    continue
                requests = (20 if ctx.quick else 200) // k
                per = _rotation(runs, f"ingest {case}", lambda s, records=records, size=size,
                                k=k, requests=requests: _ingest(sides[s], records, size, k,
                                                                requests), progress)
                res["ingest"][case] = {**_paired(per, "mb_s"), "runs": per,
                                       "cpu": _paired(per, "broker_cpu_ms_per_mb")}
        res["consume"] = {}
        for label, size in SIZES:
            n = max(least, cap // size // (4 if size < 4096 else 1))
            topics = {s: _fill(sides[s], size, n) for s in SIDES}
            try:
                for k in CONSUMERS:
                    case = f"{label} x{k}"
                    if ctx.quick and case not in QUICK_CONSUME:
                        continue
                    per = _rotation(runs, f"consume {case}", lambda s, n=n, size=size, k=k:
                                    _consume(sides[s], topics[s], n, size, k), progress)
                    res["consume"][case] = {**_paired(per, "rate"), "runs": per,
                                            "cpu_s_per_gb": _paired(per, "cpu_s_per_gb")}
            finally:
                for s, t in topics.items():
                    sides[s].drop(t)
        res["latency"] = {}
        seconds, warm_s = (0.3, 0.1) if ctx.quick else (4.0, 0.5)
        for rate in QUICK_LAT_RATES if ctx.quick else LAT_RATES:
            per = _rotation(runs, f"latency {rate}/s", lambda s, rate=rate:
                            _latency(sides[s], rate, seconds, warm_s), progress)
            res["latency"][str(rate)] = {
                s: {"p50_us": summary([x["p50_us"] for x in per[s]]),
                    "p99_us": summary([x["p99_us"] for x in per[s]]),
                    "cpu_us": summary([x["broker_cpu_us_per_record"] for x in per[s]])}
                for s in SIDES}
            res["latency"][str(rate)]["p50_ratio"] = summary(
                [a["p50_us"] / b["p50_us"] for a, b in zip(per["mq"], per["kafka"],
                                                           strict=True)])
        return res
    finally:
        node.stop()


def table_rows(rows, res: dict) -> None:
    """The section's rows in ``bench.kafka_wire``'s table."""
    def med(s: dict) -> float:
        return s["median"]

    def ratio(s: dict) -> str:
        return f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})"
    for case, e in res.get("produce", {}).items():
        fs = "mq fsyncs, Kafka does not" if "acks=all" in case else "page cache on both"
        busy = e.get("client_busy")
        clients = "" if busy is None else \
            f"; producers busy mq {med(busy['mq']):.0%}, Kafka {med(busy['kafka']):.0%}"
        rows.add(f"vs Kafka: produce {case} ({fs})",
                 f"mq {med(e['mq']):,.0f}, Kafka {med(e['kafka']):,.0f}{clients}", "rec/s",
                 ratio(e["ratio"]) + " Kafka", ">= 1.5x",
                 "yes" if med(e["ratio"]) >= 1.5 else "NO")
    for case, e in res.get("ingest", {}).items():
        c = e["cpu"]
        rows.add(f"vs Kafka: broker ingest {case} (raw producer)",
                 f"mq {med(e['mq']):,.0f}, Kafka {med(e['kafka']):,.0f}; broker CPU mq "
                 f"{med(c['mq']):.2f}, Kafka {med(c['kafka']):.2f} ms/MB "
                 f"({ratio(c['ratio'])})", "MB/s",
                 ratio(e["ratio"]) + " Kafka", ">= 1.5x",
                 "yes" if med(e["ratio"]) >= 1.5 else "NO")
    for case, e in res.get("consume", {}).items():
        rows.add(f"vs Kafka: consume {case} from offset 0",
                 f"mq {med(e['mq']):,.0f}, Kafka {med(e['kafka']):,.0f}", "rec/s",
                 ratio(e["ratio"]) + " Kafka", ">= 1.5x",
                 "yes" if med(e["ratio"]) >= 1.5 else "NO")
        c = e["cpu_s_per_gb"]
        rows.add(f"vs Kafka: broker CPU per GB fetched, {case}",
                 f"mq {med(c['mq']):.2f}, Kafka {med(c['kafka']):.2f}", "CPU-s/GB",
                 ratio(c["ratio"]) + " Kafka", "<= 1x",
                 "yes" if med(c["ratio"]) <= 1 else "NO")
    for rate, e in res.get("latency", {}).items():
        rows.add(f"vs Kafka: e2e latency {int(rate) // 1000} k/s 100 B acks=1 linger 0",
                 f"p50 mq {med(e['mq']['p50_us']):,.0f} / Kafka "
                 f"{med(e['kafka']['p50_us']):,.0f}; p99 mq {med(e['mq']['p99_us']):,.0f} / "
                 f"Kafka {med(e['kafka']['p99_us']):,.0f}; broker CPU/record mq "
                 f"{med(e['mq']['cpu_us']):.0f} / Kafka {med(e['kafka']['cpu_us']):.0f}",
                 "us",
                 ratio(e["p50_ratio"]) + " Kafka p50", "<= 0.5x",
                 "yes" if med(e["p50_ratio"]) <= 0.5 else "NO")
    rest = res.get("at_rest")
    if rest:
        rows.add("vs Kafka: RSS at rest; start-up time",
                 f"mq {rest['mq']['rss_mib']:.0f} MiB, {rest['mq']['start_s']:.2f} s; Kafka "
                 f"{rest['kafka']['rss_mib']:.0f} MiB, {rest['kafka']['start_s']:.2f} s",
                 "MiB; s", "-", "-", "-")
