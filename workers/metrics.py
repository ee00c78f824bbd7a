"""OpenMetrics for worker pools: the pool's counter table (``stats.py``) as Prometheus
families, built at scrape time, served at ``/metrics`` by the supervisor
(``workers.run(metrics_address=...)``, ``mq workers run --metrics HOST:PORT``) and printed
once by ``mq workers stats --openmetrics`` / ``--prometheus``.

Why read the table and nothing else: it already holds every counter, written by the children
without waiting for anyone, so a scrape never blocks a child or the supervisor's loop. Each
scrape opens the table, copies it (``read_stats``, a few hundred words) and closes it; a
table that is gone (the pool is exiting) gives families without samples rather than an error.
The families live on a ``CollectorRegistry`` of their own, so nothing else in the process
leaks into the endpoint (``mq.metrics``).

The names are a public interface; they follow Prometheus' conventions (``_total`` on
counters, base units in the name, ``_seconds``) and the broker's labels. Labels: ``group``
(the consumer group), ``slot`` (0 .. processes - 1: a slot keeps its counters across its
children, so ``pid`` is not a label), ``topic`` where one applies. Counters are cumulative
per slot since the pool started and reset when a new supervisor starts (Prometheus'
``rate`` handles that).

Per slot (``group``, ``slot``):

=========================================  ======= ================================================
``mq_worker_handled_records_total``        counter records whose handler returned and whose
                                                   outputs were accepted
``mq_worker_failed_attempts_total``        counter attempts that raised (or whose outputs were
                                                   refused); a record can fail several
``mq_worker_retries_total``                counter failed attempts followed by another try
``mq_worker_dead_lettered_records_total``  counter records sent to the dead-letter topic
``mq_worker_skipped_records_total``        counter records given up without a dead letter
                                                   (none configured, or it was refused)
``mq_worker_handler_seconds_total``        counter time spent in the handler
``mq_worker_hang_kills_total``             counter children killed for a handler running past
                                                   ``handler_timeout_s``
``mq_worker_deaths_total``                 counter children that exited unasked (not drains,
                                                   not hang kills)
``mq_worker_starts_total``                 counter children started, the first included:
                                                   restarts are ``starts - 1``
``mq_worker_committed_offsets_total``      counter how far the slot's children moved the
                                                   group's committed offsets (records handled,
                                                   dead-lettered or skipped, plus transaction
                                                   markers and compaction gaps stepped over)
``mq_worker_state``                        gauge   1 for the slot's state, 0 for the others;
                                                   label ``state``: starting, running, draining,
                                                   backoff, stopped, crash-loop
``mq_worker_in_flight_records``            gauge   records in the handler now, per ``topic``
``mq_worker_in_flight_age_seconds``        gauge   how long the oldest of them has run (0: none)
=========================================  ======= ================================================

Per pool (``group``): ``mq_worker_pool_processes`` (slots, ``processes=``),
``mq_worker_pool_children`` (children alive: starting, running or draining) and
``mq_worker_pool_start_time_seconds`` (when the supervisor created the table, Unix time).

Choices: the counters count what they say, so ``committed`` is offsets (it counts the
committed position's advance, which steps over markers) and ``failed``/``retried`` are
attempts. The state is an enum gauge with a ``state`` label and every state present (the
kube-state-metrics form, ``kube_pod_status_phase``), not an OpenMetrics StateSet: the
StateSet's label must carry the metric's own name (``mq_worker_state="running"``), and in the
Prometheus text format, which most scrapers still negotiate, it turns into that same gauge
anyway. ``sum by (state) (mq_worker_state)`` counts slots per state, ``mq_worker_state{state=
"crash-loop"} == 1`` alerts. There is no ``mq_worker_up``: ``up`` is Prometheus' own series
for the scrape target, and a slot's health is its state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from mq.metrics import MetricsServer, serve
from workers.stats import STATES, read_stats

__all__ = ["PoolCollector", "exposition", "serve_pool"]

# (the snapshot's key, the family's name without _total, its unit, its help)
_SLOT_COUNTERS = (
    ("handled", "mq_worker_handled_records", "",
     "Records whose handler returned and whose outputs were accepted."),
    ("failed", "mq_worker_failed_attempts", "",
     "Handler attempts that raised or whose outputs were refused."),
    ("retried", "mq_worker_retries", "", "Failed attempts followed by another try."),
    ("dead_lettered", "mq_worker_dead_lettered_records", "",
     "Records sent to the dead-letter topic after their last attempt."),
    ("skipped", "mq_worker_skipped_records", "",
     "Records given up without a dead letter (none configured, or it was refused)."),
    ("handler_seconds", "mq_worker_handler_seconds", "seconds", "Time spent in the handler."),
    ("hang_kills", "mq_worker_hang_kills", "",
     "Children killed for a handler running past handler_timeout_s."),
    ("deaths", "mq_worker_deaths", "", "Children that exited without being asked to."),
    ("incarnations", "mq_worker_starts", "",
     "Children started in the slot, the first included."),
    ("committed", "mq_worker_committed_offsets", "",
     "Advance of the group's committed offsets by the slot's children."),
)
_ALIVE = ("starting", "running", "draining")
_SHOWN_STATES = STATES[1:]                   # "empty" is a slot before its first child


def families(snapshots: Iterable[dict]) -> list[Any]:
    """The metric families of ``read_stats`` snapshots (one per pool). Raises ``ValueError``
    when two pools share a group (their series would collide)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    slot_labels = ["group", "slot"]
    counters = [(key, CounterMetricFamily(name, text, labels=slot_labels, unit=unit))
                for key, name, unit, text in _SLOT_COUNTERS]
    state = GaugeMetricFamily("mq_worker_state", "1 for the slot's state, 0 for the others.",
                              labels=["group", "slot", "state"])
    in_flight = GaugeMetricFamily("mq_worker_in_flight_records",
                                  "Records in the handler now.",
                                  labels=["group", "slot", "topic"])
    age = GaugeMetricFamily("mq_worker_in_flight_age_seconds",
                            "How long the oldest record in the handler has run (0: none).",
                            labels=slot_labels, unit="seconds")
    processes = GaugeMetricFamily("mq_worker_pool_processes", "Slots of the pool.",
                                  labels=["group"])
    children = GaugeMetricFamily("mq_worker_pool_children",
                                 "Children alive: starting, running or draining.",
                                 labels=["group"])
    started = GaugeMetricFamily("mq_worker_pool_start_time_seconds",
                                "When the pool started, seconds since the Unix epoch.",
                                labels=["group"], unit="seconds")
    groups: set[str] = set()
    for snap in snapshots:
        group = snap["group"]
        if group in groups:
            raise ValueError(f"two pools of group {group!r} run here; name one's counter "
                             f"table (--file)")
        groups.add(group)
        for s in snap["slots"]:
            labels = [group, str(s["slot"])]
            for key, family in counters:
                family.add_metric(labels, s[key])
            for name in _SHOWN_STATES:
                state.add_metric([*labels, name], float(s["state"] == name))
            for topic in snap["topics"]:
                in_flight.add_metric([*labels, topic],
                                     sum(e["topic"] == topic for e in s["in_flight"]))
            age.add_metric(labels, max((e["running_s"] for e in s["in_flight"]), default=0.0))
        processes.add_metric([group], len(snap["slots"]))
        children.add_metric([group], sum(s["state"] in _ALIVE for s in snap["slots"]))
        started.add_metric([group], snap["created_ns"] / 1e9)
    return [*(family for _, family in counters), state, in_flight, age, processes, children,
            started]


class PoolCollector:
    """A ``prometheus_client`` collector of the pools whose tables ``paths()`` names, read
    at each scrape."""

    def __init__(self, paths: Callable[[], Iterable[str]]) -> None:
        self.paths = paths

    def collect(self) -> Iterator[Any]:
        snapshots = []
        for path in self.paths():
            try:
                snapshots.append(read_stats(path))
            except (OSError, ValueError):       # the pool exited since: no samples
                continue
        yield from families(snapshots)


def registry_of(paths: Callable[[], Iterable[str]]) -> Any:
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(PoolCollector(paths))
    return registry


def serve_pool(stats_path: str, address: str) -> MetricsServer:
    """Serve the pool whose table is ``stats_path`` at ``http://address/metrics``. Raises
    ``ValueError`` for a bad address, ``OSError`` naming it when it cannot listen."""
    registry = registry_of(lambda: [stats_path])
    try:
        return serve(registry, address)
    except OSError as err:
        raise OSError(f"cannot serve metrics on {address}: {err.strerror or err}") from err


def exposition(paths: Iterable[str], openmetrics: bool = True) -> bytes:
    """The tables at ``paths`` once, in the OpenMetrics text format (or Prometheus' 0.0.4,
    which node_exporter's textfile collector reads). Raises ``ValueError`` when two pools
    share a group."""
    if openmetrics:
        from prometheus_client.openmetrics.exposition import generate_latest
    else:
        from prometheus_client.exposition import generate_latest
    paths = list(paths)
    return generate_latest(registry_of(lambda: paths))
