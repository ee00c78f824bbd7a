"""A pool's settings (``PoolConfig``, one frozen value the supervisor hands every child) and
the handler reference that lets a child find the handler on its own.

Children are fresh interpreters (``python -m workers.child``), never forks of the supervisor:
nothing of the parent's state (threads, locks, sockets) leaks into them, and a restart imports
the handler's module again, which is what makes SIGHUP a code reload. So the handler travels
as a *reference*: ``module:qualname`` (the CLI's ``MODULE:FUNC``, or a module-level function's
``__module__`` and ``__qualname__``). A function of the script being run (``__main__``) is
found through the script's path and loaded as ``__mp_main__``, as ``multiprocessing``'s spawn
does, so the script's ``if __name__ == "__main__":`` block does not run again in the child.
Lambdas and nested functions have no reference: ``ValueError``.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from mq.logformat import LOG_FORMATS
from mq.metrics import parse_address

__all__ = ["PoolConfig", "HandlerRef", "load_handler"]

ORDERINGS = ("key", "partition")


@dataclasses.dataclass(frozen=True)
class HandlerRef:
    """Where a child finds the handler: ``module`` and ``qualname``, or a script ``path``."""

    module: str
    qualname: str
    path: str | None = None            # the __main__ script, loaded as __mp_main__

    def __str__(self) -> str:
        return f"{self.path or self.module}:{self.qualname}"

    @classmethod
    def parse(cls, text: str) -> HandlerRef:
        """``pkg.mod:func`` (the CLI's form). Raises ``ValueError``."""
        module, sep, qualname = text.rpartition(":")
        if not sep or not module or not qualname or not all(
                part.isidentifier() for part in (*module.split("."), *qualname.split("."))):
            raise ValueError(f"handler must be MODULE:FUNCTION (like pkg.jobs:handle), got "
                             f"{text!r}")
        return cls(module, qualname)

    @classmethod
    def of(cls, handler: Callable | str) -> HandlerRef:
        """The reference of a module-level function (or a ``MODULE:FUNC`` string). Raises
        ``ValueError`` for a callable a fresh interpreter cannot find."""
        if isinstance(handler, str):
            return cls.parse(handler)
        if not callable(handler):
            raise ValueError(f"handler must be a function, got {handler!r}")
        module = getattr(handler, "__module__", None)
        qualname = getattr(handler, "__qualname__", None)
        if not module or not qualname or "<" in qualname:
            raise ValueError(
                f"handler {handler!r} must be a module-level function: each child is a fresh "
                f"interpreter that imports it by name (so SIGHUP reloads code); lambdas, "
                f"nested functions and partials cannot be found that way")
        if module == "__main__":
            path = getattr(sys.modules["__main__"], "__file__", None)
            if not path:
                raise ValueError("a handler defined in an interactive session cannot be found "
                                 "by a child process: put it in a module")
            return cls(module, qualname, os.path.abspath(path))
        return cls(module, qualname)


def load_handler(ref: HandlerRef) -> Callable[..., Any]:
    """Import the handler. Raises ``ImportError``/``AttributeError`` (the module's own errors
    too: it runs), ``ValueError`` if what it names is not callable."""
    if ref.path is not None:
        module = sys.modules.get("__mp_main__")
        if module is None or getattr(module, "__file__", None) != ref.path:
            spec = importlib.util.spec_from_file_location("__mp_main__", ref.path)
            if spec is None or spec.loader is None:
                raise ImportError(f"cannot load {ref.path}")
            module = importlib.util.module_from_spec(spec)
            sys.modules["__mp_main__"] = module
            spec.loader.exec_module(module)
    else:
        module = importlib.import_module(ref.module)
    obj: Any = module
    for part in ref.qualname.split("."):
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{ref} is not callable")
    return obj


def is_async(handler: Callable) -> bool:
    return inspect.iscoroutinefunction(handler)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PoolConfig:
    """Every setting of a pool, checked at construction (``ValueError`` in one line).

    ``topics`` (a name or names) and ``group_id`` are required: ``processes`` children
    (default: the CPU count) join ``group_id`` on ``topics``. ``max_retries``,
    ``retry_backoff_ms``, ``retry_backoff_max_ms``: retries in place with exponential backoff
    and jitter; then the record goes to ``dead_letter_topic`` (None: it is logged and skipped).
    ``exactly_once``: outputs and offsets commit in one transaction per child every
    ``commit_interval_ms``; input read ``read_committed``. ``handler_timeout_s``: a handler
    running longer has its child killed and restarted (a failed attempt); None: no limit.
    ``drain_timeout_s``: how long a drain may take. ``concurrency``/``ordering``: records in
    flight per child for an async handler, keeping the order of each key ("key") or of each
    partition ("partition"). ``metrics_address``: ``HOST:PORT`` where the supervisor serves
    the pool's counters as OpenMetrics at ``/metrics`` (port 0: a free one, logged; names in
    ``workers.metrics``). ``stats_path``: the counter table (None: one in ``/dev/shm`` named
    after the group). ``workers/README.md`` ("Settings") has the rest.

    ``handler``, ``asynchronous`` and ``sys_path`` are not settings: ``workers.run`` fills
    them in from its handler and its process, for the children.
    """

    handler: HandlerRef | None = None
    topics: tuple[str, ...]
    group_id: str
    asynchronous: bool = False
    processes: int | None = None             # None: the CPU count, set at construction
    max_retries: int = 3
    retry_backoff_ms: float = 100.0
    retry_backoff_max_ms: float = 10_000.0
    dead_letter_topic: str | None = None
    exactly_once: bool = False
    handler_timeout_s: float | None = 300.0
    drain_timeout_s: float = 30.0
    socket: str | None = None
    bootstrap_servers: str | None = None     # a Kafka cluster ("host:port,...")
    kafka_config: dict[str, Any] | None = None   # its librdkafka properties
    concurrency: int = 16
    ordering: str = "key"
    commit_interval_ms: float = 100.0
    max_poll_records: int = 500
    transactional_id_prefix: str | None = None
    transaction_timeout_ms: int = 60_000
    restart_backoff_ms: float = 50.0
    crash_loop_deaths: int = 5
    crash_loop_window_s: float = 10.0
    log_format: str = "plain"
    log_level: str = "INFO"
    stats_path: str | None = None
    metrics_address: str | None = None       # HOST:PORT of the pool's /metrics
    sys_path: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        topics = (self.topics,) if isinstance(self.topics, str) else tuple(self.topics)
        object.__setattr__(self, "topics", topics)           # a list, as users write it
        object.__setattr__(self, "sys_path", tuple(self.sys_path))
        if self.processes is None:
            object.__setattr__(self, "processes", os.cpu_count() or 1)

        def need(ok: bool, what: str) -> None:
            if not ok:
                raise ValueError(what)
        need(bool(self.topics) and all(isinstance(t, str) and t for t in self.topics),
             "topics must be a non-empty list of topic names")
        need(len(set(self.topics)) == len(self.topics), f"topics repeat: {list(self.topics)}")
        need(isinstance(self.group_id, str) and bool(self.group_id),
             "group_id must be a non-empty string")
        need(isinstance(self.processes, int) and 1 <= self.processes <= 1024,
             f"processes must be 1 to 1024, got {self.processes!r}")
        need(isinstance(self.max_retries, int) and self.max_retries >= 0,
             f"max_retries must be an integer >= 0, got {self.max_retries!r}")
        need(self.retry_backoff_ms >= 0 and self.retry_backoff_max_ms >= 0,
             "retry_backoff_ms and retry_backoff_max_ms must be >= 0")
        need(self.dead_letter_topic is None or self.dead_letter_topic not in self.topics,
             f"the dead-letter topic {self.dead_letter_topic!r} is one of the input topics")
        need(self.handler_timeout_s is None or self.handler_timeout_s > 0,
             f"handler_timeout_s must be > 0 (or None), got {self.handler_timeout_s!r}")
        need(self.drain_timeout_s >= 0, f"drain_timeout_s must be >= 0, got "
                                        f"{self.drain_timeout_s!r}")
        need(self.socket is None or self.bootstrap_servers is None,
             "give socket (the local broker) or bootstrap_servers (a Kafka cluster), not both")
        need(self.kafka_config is None or self.bootstrap_servers is not None,
             "kafka_config is for a Kafka cluster: give bootstrap_servers too")
        need(self.kafka_config is None or isinstance(self.kafka_config, dict) and all(
            isinstance(k, str) and isinstance(v, (str, int, float, bool))
            for k, v in self.kafka_config.items()),
             f"kafka_config must map librdkafka property names to str, int, float or bool "
             f"values (the children get it as JSON), got {self.kafka_config!r}")
        need(isinstance(self.concurrency, int) and 1 <= self.concurrency <= 4096,
             f"concurrency must be 1 to 4096, got {self.concurrency!r}")
        need(self.ordering in ORDERINGS, f"ordering must be one of {ORDERINGS}, got "
                                         f"{self.ordering!r}")
        need(self.commit_interval_ms >= 0, "commit_interval_ms must be >= 0")
        need(isinstance(self.max_poll_records, int) and self.max_poll_records >= 1,
             "max_poll_records must be >= 1")
        need(self.crash_loop_deaths >= 1 and self.crash_loop_window_s > 0,
             "crash_loop_deaths must be >= 1 and crash_loop_window_s > 0")
        need(self.log_format in LOG_FORMATS, f"log_format must be one of {LOG_FORMATS}, got "
                                             f"{self.log_format!r}")
        if self.metrics_address is not None:
            parse_address(self.metrics_address)           # raises ValueError in one line

    @property
    def max_attempts(self) -> int:
        return self.max_retries + 1

    @property
    def inflight_entries(self) -> int:
        """In-flight entries a child's row needs: one per record it may run at once."""
        return self.concurrency if self.asynchronous else 1

    def broker_options(self) -> dict[str, Any]:
        """Where the clients connect: ``mq.Producer``'s, ``mq.Consumer``'s and ``mq.Admin``'s
        keywords for the local broker or the Kafka cluster."""
        return {"socket": self.socket, "bootstrap_servers": self.bootstrap_servers,
                "kafka_config": self.kafka_config}

    def transactional_id(self, slot: int) -> str:
        """Stable per slot: a restarted child fences its dead predecessor's transaction."""
        return f"{self.transactional_id_prefix or self.group_id + '-worker'}-{slot}"

    def to_json(self) -> str:
        raw = dataclasses.asdict(self)
        return json.dumps(raw)

    @classmethod
    def from_json(cls, text: str) -> PoolConfig:
        raw = json.loads(text)
        raw["handler"] = HandlerRef(**raw["handler"])
        return cls(**raw)
