"""Worker pools on mq: a supervised pool of processes, each a member of one consumer group.

::

    import workers

    def handle(record):                       # an mq.Record; runs in a child process
        ...                                   # raise -> retried in place, then dead-lettered
        return [("out", b"key", b"value")]    # optional outputs (topic, key, value)

    if __name__ == "__main__":
        workers.run(handle, topics=["jobs"], group_id="billing", processes=4,
                    dead_letter_topic="jobs.dlq")

The design, module by module: ``supervisor`` (the parent: starts, restarts and drains
children, kills hung handlers, owns the signals), ``child`` (one group member), ``engine``
and ``aio`` (a child's loop for plain and ``async def`` handlers) over ``handling`` (what
they share: counters, earlier attempts, giving up), ``delivery`` (outputs,
dead letters and commits, at least once or exactly once), ``failures`` (retries and dead-letter
headers), ``stats`` (the shared counter table), ``metrics`` (that table as OpenMetrics),
``redrive`` (dead letters back to a topic).
``README.md`` next to this file is the user's guide.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterable

from workers.config import HandlerRef, PoolConfig, is_async, load_handler
from workers.failures import DLQ_HEADERS
from workers.redrive import redrive
from workers.stats import default_stats_path, find_stats, read_stats

__all__ = ["DLQ_HEADERS", "PoolConfig", "find_stats", "read_stats", "redrive", "run"]


def run(handler: Callable | str, topics: Iterable[str], group_id: str,
        processes: int | None = None, max_retries: int = 3, retry_backoff_ms: float = 100,
        dead_letter_topic: str | None = None, exactly_once: bool = False,
        handler_timeout_s: float | None = 300.0, drain_timeout_s: float = 30.0,
        socket: str | None = None, *, concurrency: int = 16, ordering: str = "key",
        commit_interval_ms: float = 100, max_poll_records: int = 500,
        retry_backoff_max_ms: float = 10_000, transactional_id_prefix: str | None = None,
        transaction_timeout_ms: int = 60_000, restart_backoff_ms: float = 50,
        crash_loop_deaths: int = 5, crash_loop_window_s: float = 10.0,
        log_format: str = "plain", log_level: str = "INFO",
        stats_path: str | None = None, metrics_address: str | None = None) -> int:
    """Run a pool in this process until SIGTERM or SIGINT has drained it; returns the exit
    status: 0 drained, 1 every slot stopped in a crash loop, 128 + n forced by a second
    signal n. Call it from the main thread (it owns the process's signals).

    ``handler``: a module-level function of one ``mq.Record`` (or ``"module:function"``),
    plain or ``async def``; it may return outputs ``(topic, key, value[, headers])``.
    ``processes`` children (default: the CPU count) join ``group_id`` on ``topics``.
    ``max_retries``/``retry_backoff_ms``/``retry_backoff_max_ms``: retries in place with
    exponential backoff and jitter; then the record goes to ``dead_letter_topic`` (None: it
    is logged and skipped). ``exactly_once``: outputs and offsets commit in one transaction
    per child every ``commit_interval_ms``; input read ``read_committed``.
    ``handler_timeout_s``: a handler running longer has its child killed and restarted (a
    failed attempt); None: no limit. ``drain_timeout_s``: how long a drain may take.
    ``concurrency``/``ordering``: records in flight per child for an async handler, keeping
    the order of each key ("key") or of each partition ("partition").
    ``metrics_address``: ``HOST:PORT`` where the supervisor serves the pool's counters as
    OpenMetrics at ``/metrics`` while it runs (port 0: a free one, logged; names in
    ``workers.metrics``). See ``README.md`` for the rest.

    Raises ``ValueError`` for a bad setting (a ``metrics_address`` that is not HOST:PORT
    too) or a handler a child cannot import by name, ``ImportError`` if it does not import,
    ``mq.BrokerUnavailableError`` without a broker, ``mq.errors.UnknownTopicOrPartitionError``
    for a missing input or dead-letter topic, ``OSError`` when ``metrics_address`` cannot be
    listened on.
    """
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("workers.run() must be called from the main thread: the pool owns "
                           "the process's signals")
    if os.environ.get("MQ_WORKERS_PARENT") and os.environ.get("MQ_WORKERS_SLOT"):
        raise RuntimeError("workers.run() called in a pool's child: a child imports the "
                           "script that defines the handler, so call workers.run() under "
                           "'if __name__ == \"__main__\":'")
    ref = HandlerRef.of(handler)
    function = load_handler(ref) if isinstance(handler, str) else handler
    config = PoolConfig(
        handler=ref, topics=tuple([topics] if isinstance(topics, str) else topics),
        group_id=group_id, asynchronous=is_async(function),
        processes=processes or os.cpu_count() or 1, max_retries=max_retries,
        retry_backoff_ms=retry_backoff_ms, retry_backoff_max_ms=retry_backoff_max_ms,
        dead_letter_topic=dead_letter_topic, exactly_once=exactly_once,
        handler_timeout_s=handler_timeout_s, drain_timeout_s=drain_timeout_s, socket=socket,
        concurrency=concurrency, ordering=ordering, commit_interval_ms=commit_interval_ms,
        max_poll_records=max_poll_records, transactional_id_prefix=transactional_id_prefix,
        transaction_timeout_ms=transaction_timeout_ms, restart_backoff_ms=restart_backoff_ms,
        crash_loop_deaths=crash_loop_deaths, crash_loop_window_s=crash_loop_window_s,
        log_format=log_format, log_level=log_level,
        stats_path=stats_path or default_stats_path(group_id), metrics_address=metrics_address,
        sys_path=tuple(os.path.abspath(p) if p else os.getcwd() for p in sys.path))
    _check_topics(config)

    from workers.logs import setup_logging
    from workers.stats import remove_stale
    from workers.supervisor import Supervisor
    log = setup_logging(config.log_format, config.log_level, config.group_id)
    if stats_path is None:
        for path in remove_stale(group_id):
            log.info("removed %s, left by a pool that was killed", path)
    if config.dead_letter_topic is None:
        log.warning("no dead-letter topic: records that fail %d attempts are logged and "
                    "skipped", config.max_attempts)
    return Supervisor(config).run()


def _check_topics(config: PoolConfig) -> None:
    from mq.client.admin import Admin
    from mq.errors import UnknownTopicOrPartitionError
    with Admin(config.socket) as admin:
        existing = set(admin.list_topics())
    for topic in (*config.topics, config.dead_letter_topic):
        if topic is not None and topic not in existing:
            role = "dead-letter" if topic == config.dead_letter_topic else "input"
            raise UnknownTopicOrPartitionError(
                f"unknown {role} topic {topic!r} (create it: mq topics create {topic} "
                f"--partitions N)")
