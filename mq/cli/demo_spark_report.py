"""What ``mq demo --spark`` prints, pure: the queries' counts from their progress reports
(``QueryStats``), the progress line, and the summary with its checks. No Spark, no broker:
everything comes in as values (progress dicts as ``StreamingQuery.recentProgress`` gives them,
result rows as JSON dicts), so it is tested without processes.

Counting rules. A progress report is one micro-batch; reports are taken from
``recentProgress`` again and again, so each batch is counted once, by its id, and an *idle*
report (no batch ran: no ``addBatch`` duration) not at all. In append mode a (window, customer)
group leaves the aggregation's state exactly when its total is written, so the rows a batch
wrote are its state operator's ``numRowsRemoved`` (the Parquet sink reports no row count).
"""

from __future__ import annotations

import bisect
import datetime
import json
import statistics
from collections.abc import Sequence
from decimal import Decimal

__all__ = ["QueryStats", "compare_totals", "distinct_totals", "parse_time", "report",
           "seconds_behind"]

RATE_WINDOW_S = 5.0


def parse_time(text: str) -> float:
    """Epoch seconds of an ISO 8601 time as Spark writes them (``...Z`` or an offset)."""
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class QueryStats:
    """What one streaming query did so far, from its progress reports (module doc)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.batches: dict[int, tuple[float, float, int, int]] = {}   # id: start, end, in, out
        self.dropped = 0
        self.end_offsets: dict[tuple[str, str], int] = {}    # of the newest batch
        self.state_rows: int | None = None                    # groups in state after it
        self._newest = -1

    def add(self, progress: dict) -> None:
        batch = progress["batchId"]
        if batch in self.batches or "addBatch" not in progress.get("durationMs", {}):
            return
        ops = progress.get("stateOperators") or []
        start = parse_time(progress["timestamp"])
        self.batches[batch] = (start, start + progress["batchDuration"] / 1000,
                               progress["numInputRows"],
                               sum(op.get("numRowsRemoved", 0) for op in ops))
        self.dropped += sum(op.get("numRowsDroppedByWatermark", 0) for op in ops)
        if batch > self._newest:
            self._newest = batch
            self.end_offsets = {(topic, part): offset
                                for source in progress.get("sources", [])
                                for topic, parts in json.loads(source["endOffset"]).items()
                                for part, offset in parts.items()}
            self.state_rows = ops[0].get("numRowsTotal") if ops else None

    @property
    def rows_in(self) -> int:
        return sum(b[2] for b in self.batches.values())

    @property
    def rows_out(self) -> int:
        return sum(b[3] for b in self.batches.values())

    @property
    def processed(self) -> int:
        """Offsets read so far, all partitions together."""
        return sum(self.end_offsets.values())

    def has_read(self, ends: dict[tuple[str, str], int]) -> bool:
        """Whether the newest batch read every offset up to ``ends``."""
        return all(self.end_offsets.get(tp, 0) >= end for tp, end in ends.items())

    def caught_up(self, ends: dict[tuple[str, str], int]) -> bool:
        """Every offset up to ``ends`` read, and one group left in the state: the end-of-stream
        event's, whose window never closes. So every window was written."""
        return self.has_read(ends) and self.state_rows == 1

    def span(self, since: float) -> float:
        """Seconds from ``since`` (epoch) to the end of the last batch."""
        return max((b[1] for b in self.batches.values()), default=since) - since

    def recent_rate(self, now: float) -> float:
        """Rows in per second over the batches that ended in the last ``RATE_WINDOW_S``."""
        return sum(b[2] for b in self.batches.values() if b[1] > now - RATE_WINDOW_S) \
            / RATE_WINDOW_S

    def median_batch_s(self) -> float:
        return statistics.median(b[1] - b[0] for b in self.batches.values()) \
            if self.batches else 0.0


def seconds_behind(history: Sequence[tuple[float, int]], processed: int, now: float) -> float:
    """How long ago the topic first held a record that ``processed`` does not cover:
    ``history`` is (time, records in the topic) samples, in time order."""
    i = bisect.bisect_right([n for _, n in history], processed)
    return now - history[i][0] if i < len(history) else 0.0


def progress_line(elapsed: float, produced: int, produce_rate: float,
                  queries: Sequence[QueryStats], history, now_epoch: float,
                  now: float) -> str:
    parts = [f"{elapsed:5.1f} s: produced {produced:,} ({produce_rate:,.0f}/s)"]
    for q in queries:
        lag = produced - q.processed
        parts.append(f"{q.name}: batches {len(q.batches)}, in {q.rows_in:,} "
                     f"({q.recent_rate(now_epoch):,.0f} rows/s), out {q.rows_out:,} rows, "
                     f"lag {lag:,} ({seconds_behind(history, q.processed, now):.1f} s)")
    return " | ".join(parts)


def _key(total: dict) -> tuple[str, str]:
    return total["window_start"], total["customer"]


def distinct_totals(topic: list[dict]) -> tuple[list[dict], int, int]:
    """(the first total of each (window, customer), how many more were identical, how many
    differed) of the totals in the topic, in order."""
    first: dict[tuple[str, str], dict] = {}
    same = differ = 0
    for total in topic:
        seen = first.get(_key(total))
        if seen is None:
            first[_key(total)] = total
        elif seen == total:
            same += 1
        else:
            differ += 1
    return list(first.values()), same, differ


def compare_totals(topic: list[dict], parquet: list[dict], at_least_once: bool = False
                   ) -> list[str]:
    """Problems between the totals in the topic and in Parquet: each (window, customer) once,
    the same in both. ``at_least_once`` (Spark's Kafka sink): a total may be in the topic
    again (a micro-batch written again), the same; Parquet (exactly once) is the truth."""
    problems = []
    distinct, same, differ = distinct_totals(topic)
    if differ:
        problems.append(f"{differ} totals are in the topic again with other values")
    if same and not at_least_once:
        problems.append(f"{same} totals are in the topic twice")
    if len(distinct) != len(parquet) or \
            {_key(t): t for t in distinct} != {_key(t): t for t in parquet}:
        problems.append(f"the topic's {len(distinct):,} totals differ from Parquet's "
                        f"{len(parquet):,}")
    return problems


def _ms(seconds: float) -> str:
    return f"{seconds:.1f} s"


def _guarantees(cluster: str | None, totals_topic: str) -> str:
    if cluster is None:
        return (f"  guarantees: '{totals_topic}' (mq's sink) exactly once per micro-batch for "
                "read_committed readers; Parquet (Spark's file sink) exactly once")
    return (f"  guarantees: Parquet (Spark's file sink) exactly once, the source of truth; "
            f"'{totals_topic}' (Spark's Kafka sink, no transactions) at least once: a "
            "micro-batch written again (a retried task, a restart) writes the same totals "
            "again, so readers keep one per (window, customer)")


def report(records: int, partitions: int, producers: list[dict], queries: list[QueryStats],
           since: float, topic: list[tuple[int, dict]], parquet: list[dict],
           watermark_s: int, cluster: str | None = None, orders_topic: str = "orders",
           totals_topic: str = "order-totals") -> tuple[str, list[str]]:
    """The summary (text for stdout) and its problems (empty: every check passed).
    ``since``: when the producers started (epoch s); ``topic``: (record timestamp ms, total)
    of each record of the output topic; ``parquet``: the totals read from Parquet, as the same
    JSON dicts; ``watermark_s``: the pipeline's watermark delay; ``cluster``: the Kafka
    cluster's bootstrap servers (Spark's Kafka sink, at least once), or None (the local
    broker, mq's exactly-once sink)."""
    written, again, _ = distinct_totals([t for _, t in topic])
    firsts = {id(t) for t in written}                 # the objects of the first writes
    orders = sum(t["orders"] for t in written)
    amount = sum((t["amount"] for t in written), Decimal(0))
    sent_cents = sum(p["cents"] for p in producers)
    seconds = max(p["seconds"] for p in producers)
    dropped = max((q.dropped for q in queries), default=0)
    where = "" if cluster is None else f" on the Kafka cluster at {cluster}"
    lines = [f"mq demo --spark: {records:,} orders through Structured Streaming (local[2]) from "
             f"the topic '{orders_topic}' to the topic '{totals_topic}' and to Parquet{where}",
             ""]
    lines.append(f"  {'producers (' + str(len(producers)) + ' processes)':<26}{records:>11,} "
                 f"orders in {_ms(seconds)}: {records / max(seconds, 1e-9):,.0f} orders/s "
                 f"({partitions} partitions)")
    for q in queries:
        span = max(q.span(since), 1e-9)
        lines.append(f"  {q.name:<26}{q.rows_in:>11,} rows in, {q.rows_out:,} rows out in "
                     f"{_ms(span)}: {q.rows_in / span:,.0f} rows/s in, "
                     f"{q.rows_out / span:,.1f} rows/s out; {len(q.batches):,} micro-batches "
                     f"(median {_ms(q.median_batch_s())})")
    lines.append("  (rows in: the orders and the start and end-of-stream events; rows out: "
                 "totals of a customer in a window; from the producers' start)")
    lags = sorted(ts / 1000 - parse_time(t["last_order_at"]) for ts, t in topic
                  if id(t) in firsts)
    if lags:
        lines.append(f"  end-to-end lag, a window's newest order produced -> its total written "
                     f"to '{totals_topic}': p50 {_ms(lags[len(lags) // 2])}, max "
                     f"{_ms(lags[-1])} ({watermark_s} s of it is the watermark: a window is "
                     f"written once an order {watermark_s} s past its end was read, by the "
                     "next micro-batch)")
    lines.append(f"  late orders dropped by the watermark: {dropped:,}")
    lines.append(_guarantees(cluster, totals_topic))
    problems = compare_totals([t for _, t in topic], parquet, at_least_once=cluster is not None)
    if orders + dropped != records:
        problems.append(f"the totals count {orders:,} orders, {dropped:,} were dropped as "
                        f"late, but {records:,} were produced")
    if not dropped and amount != Decimal(sent_cents) / 100:
        problems.append(f"the totals add up to {amount:,} but the producers sent "
                        f"{Decimal(sent_cents) / 100:,}")
    verdict = "OK" if not problems else "MISMATCH: " + "; ".join(problems)
    again_text = f" (and {again:,} written again, the same)" if again else ""
    lines.append(f"  check: {len(written):,} totals in the topic{again_text}, {len(parquet):,} "
                 f"in Parquet; {orders:,} orders, amount {amount:,}: {verdict}")
    lines += ["", "sample totals (from Parquet; times UTC):",
              f"  {'window':<21} {'customer':<12} {'orders':>7} {'amount':>12}  last order at"]
    first = sorted(parquet, key=lambda t: (t["window_start"], int(t["customer"].split("-")[-1])))
    for t in first[:5]:
        window = f"{t['window_start'][11:19]}-{t['window_end'][11:19]}"
        lines.append(f"  {window:<21} {t['customer']:<12} {t['orders']:>7,} {t['amount']:>12,}  "
                     f"{t['last_order_at'][11:23]}")
    return "".join(line + "\n" for line in lines), problems
