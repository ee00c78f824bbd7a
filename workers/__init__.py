"""Worker pools on mq: a supervised pool of processes, each a member of one consumer group.

::

    import workers

    def handle(record):                       # an mq.Record; runs in a child process
        ...                                   # raise -> retried in place, then dead-lettered
        return [("out", b"key", b"value")]    # optional outputs (topic, key, value)

    if __name__ == "__main__":
        workers.run(handle, topics=["jobs"], group_id="billing", processes=4,
                    dead_letter_topic="jobs.dlq")
        # or: workers.run(handle, workers.PoolConfig(topics=["jobs"], group_id="billing"))

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

import dataclasses
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

from workers.config import HandlerRef, PoolConfig, is_async, load_handler
from workers.failures import DLQ_HEADERS
from workers.redrive import redrive
from workers.stats import default_stats_path, find_stats, read_stats

__all__ = ["DLQ_HEADERS", "PoolConfig", "find_stats", "read_stats", "redrive", "run"]


def run(handler: Callable | str, config: PoolConfig | None = None, **options: Any) -> int:
    """Run a pool in this process until SIGTERM or SIGINT has drained it; returns the exit
    status: 0 drained, 1 every slot stopped in a crash loop, 128 + n forced by a second
    signal n. Call it from the main thread (it owns the process's signals).

    ``handler``: a module-level function of one ``mq.Record`` (or ``"module:function"``),
    plain or ``async def``; it may return outputs ``(topic, key, value[, headers])``.
    The settings are one ``PoolConfig``, given as ``run(handler, config)`` or built from
    keywords, ``run(handler, topics=[...], group_id=..., processes=4)``; ``PoolConfig`` says
    what each one means.

    Raises ``TypeError`` for a config and options together, an option ``PoolConfig`` does not
    have, or a config that is not a ``PoolConfig``; ``ValueError`` for a bad setting or a
    handler a child cannot import by name, ``ImportError`` if it does not import,
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
    given = _settings(config, options)
    ref = HandlerRef.of(handler)
    function = load_handler(ref) if isinstance(handler, str) else handler
    config = dataclasses.replace(
        given, handler=ref, asynchronous=is_async(function),
        bootstrap_servers=given.bootstrap_servers or _bootstrap_from_env(given),
        stats_path=given.stats_path or default_stats_path(given.group_id),
        sys_path=tuple(os.path.abspath(p) if p else os.getcwd() for p in sys.path))
    _check_topics(config)

    from workers.logs import setup_logging
    from workers.stats import remove_stale
    from workers.supervisor import Supervisor
    log = setup_logging(config.log_format, config.log_level, config.group_id)
    if given.stats_path is None:
        for path in remove_stale(config.group_id):
            log.info("removed %s, left by a pool that was killed", path)
    if config.dead_letter_topic is None:
        log.warning("no dead-letter topic: records that fail %d attempts are logged and "
                    "skipped", config.max_attempts)
    return Supervisor(config).run()


def _settings(config: PoolConfig | None, options: dict[str, Any]) -> PoolConfig:
    """``run``'s settings: ``config`` as it is, or a ``PoolConfig`` built from ``options``.
    Raises ``TypeError`` for both, neither's required settings, or an unknown option."""
    if config is not None:
        if not isinstance(config, PoolConfig):
            raise TypeError(f"workers.run(handler, config): config must be a "
                            f"workers.PoolConfig, got {type(config).__name__} (or give the "
                            f"settings as keywords: topics=..., group_id=...)")
        if options:
            raise TypeError(f"workers.run() takes a PoolConfig or keyword options, not both: "
                            f"got a config and {', '.join(sorted(options))} (put them in the "
                            f"config: dataclasses.replace(config, ...))")
        return config
    unknown = sorted(set(options) - _OPTIONS)
    if unknown:
        raise TypeError(f"workers.run() got unknown options {', '.join(unknown)} (the options "
                        f"are workers.PoolConfig's settings)")
    missing = [name for name in ("topics", "group_id") if name not in options]
    if missing:
        raise TypeError(f"workers.run() needs {' and '.join(missing)} (or a PoolConfig)")
    return PoolConfig(**options)


# What run() fills in itself is not an option.
_OPTIONS = frozenset(field.name for field in dataclasses.fields(PoolConfig)) - {
    "handler", "asynchronous", "sys_path"}


def _bootstrap_from_env(config: PoolConfig) -> str | None:
    """``$MQ_BOOTSTRAP_SERVERS`` when no broker is named, as mq's clients read it: written
    into the config, so that every child and the checks agree on the backend."""
    if config.socket is not None:
        return None
    return os.environ.get("MQ_BOOTSTRAP_SERVERS") or None


def _check_topics(config: PoolConfig) -> None:
    from mq import Admin
    from mq.errors import UnknownTopicOrPartitionError
    with Admin(**config.broker_options()) as admin:
        existing = set(admin.list_topics())
    for topic in (*config.topics, config.dead_letter_topic):
        if topic is not None and topic not in existing:
            role = "dead-letter" if topic == config.dead_letter_topic else "input"
            raise UnknownTopicOrPartitionError(
                f"unknown {role} topic {topic!r} (create it: mq topics create {topic} "
                f"--partitions N)")
