"""``python -m workers.child``: one child of a pool — one member of the consumer group.

The supervisor starts it with three environment variables: ``MQ_WORKERS_CONFIG`` (the
``PoolConfig`` as JSON), ``MQ_WORKERS_SLOT`` (its slot, 0..processes-1; handlers may read it)
and ``MQ_WORKERS_PARENT`` (the supervisor's pid). Records never pass through the supervisor:
the child reads them from mq itself.

Signals: the child dies with the supervisor (``PR_SET_PDEATHSIG`` = SIGKILL, set first thing;
a child whose parent is already gone exits), so no child outlives a supervisor killed with
SIGKILL. SIGTERM and SIGINT are ignored — the supervisor owns shutdown, and a Ctrl-C or a
systemd stop that reaches every process must not kill handlers mid-record; the supervisor
asks for a drain with SIGUSR1: finish the record in hand (the running ones, for an async
handler), commit, leave the group, exit 0.

Exit status: 0 after a drain; 3 fenced (a newer producer holds the slot's transactional id);
70 the handler could not be imported; 75 outputs were not acknowledged (the records are
redelivered to the next owner); 1 anything else (traceback in the log).
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

ENV_CONFIG, ENV_SLOT, ENV_PARENT = "MQ_WORKERS_CONFIG", "MQ_WORKERS_SLOT", "MQ_WORKERS_PARENT"
ENV_FENCE = "MQ_WORKERS_FENCE"
EXIT_FENCED, EXIT_STARTUP, EXIT_OUTPUTS_LOST = 3, 70, 75
_PR_SET_PDEATHSIG = 1
_MAX_POLL_INTERVAL_MS = 86_400_000     # librdkafka's upper bound of max.poll.interval.ms


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when the supervisor dies (Linux); exit now if it already did."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass                                          # not Linux: the loop checks getppid()
    if os.getppid() != parent:
        sys.exit("workers: the supervisor that started this child is gone")


class Child:
    """The child's state between signals and the loop."""

    def __init__(self) -> None:
        self.parent = int(os.environ[ENV_PARENT])
        self.slot = int(os.environ[ENV_SLOT])
        self.drain_requested = False
        self.joined = False
        self.table = None

    def draining(self) -> bool:
        return self.drain_requested

    def on_drain(self, *_) -> None:
        self.drain_requested = True
        if self.table is not None:
            from workers.stats import DRAINING, STATE
            self.table.set(self.slot, STATE, DRAINING)


def main() -> int:
    child = Child()
    die_with_parent(child.parent)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, child.on_drain)
    # The supervisor started this process with them blocked; now they may come.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1, signal.SIGTERM, signal.SIGINT,
                                                signal.SIGHUP})

    from workers.config import PoolConfig, load_handler
    config = PoolConfig.from_json(os.environ[ENV_CONFIG])
    sys.path[:0] = [p for p in config.sys_path if p not in sys.path]

    from workers.logs import setup_logging
    from workers.stats import StatsTable
    log = setup_logging(config.log_format, config.log_level, config.group_id, child.slot)
    assert config.stats_path is not None
    child.table = table = StatsTable.open(config.stats_path, writable=True)
    try:
        handler = load_handler(config.handler)
    except BaseException:                          # noqa: BLE001 -- reported, then exit 70
        log.exception("cannot load the handler %s", config.handler)
        return EXIT_STARTUP
    try:
        return serve(child, config, handler, table, log)
    finally:
        table.close()


def _connecting(step: str, child: Child, log: logging.Logger, until_drain: bool = True):
    """Perform ``step`` until a broker answers; its result (None if a drain is asked for
    meanwhile and ``until_drain``)."""
    from mq.errors import BrokerUnavailableError
    delay = 0.05
    while True:
        try:
            return (yield (step,))
        except BrokerUnavailableError as err:
            if until_drain and child.draining():
                return None
            if delay == 0.05:
                log.warning("waiting for the broker: %s", err)
            yield ("sleep", delay)                  # backoff between connection attempts
            delay = min(1.0, delay * 2)


def consumer_options(config) -> dict:
    """The consumer's topics and keywords (``mq.Consumer``'s and ``mq.aio.Consumer``'s)."""
    # The supervisor's hang limit acts first; without one, a long handler is no reason to
    # leave the group (a week; librdkafka takes at most a day).
    interval_ms = int(((config.handler_timeout_s or 7 * 86400) + 30) * 1000)
    if config.bootstrap_servers is not None:
        interval_ms = min(interval_ms, _MAX_POLL_INTERVAL_MS)
    return dict(
        topics=config.topics, group_id=config.group_id, **config.broker_options(),
        enable_auto_commit=False, value_bytes=True,
        isolation_level="read_committed" if config.exactly_once else "read_uncommitted",
        max_poll_records=config.max_poll_records, max_poll_interval_ms=interval_ms)


def serve(child: Child, config, handler, table, log: logging.Logger) -> int:
    """Run the child: its clients are the threaded ones for a plain handler, ``mq.aio``'s
    (in one event loop) for an ``async def`` one (``workers/clients.py``)."""
    from mq.errors import ProducerFencedError
    from workers.clients import AsyncClients, SyncClients
    from workers.config import is_async
    from workers.delivery import Delivery, OutputsLost
    from workers.handling import Counters

    if is_async(handler):
        from workers.aio import AsyncEngine as engine_type
        kind = AsyncClients
    else:
        from workers.engine import SyncEngine as engine_type
        kind = SyncClients
    counters = Counters(table, child.slot)
    delivery = Delivery(config, child.slot)
    clients = kind(delivery.producer_options(), consumer_options(config))
    try:
        return clients.drive(_serving(child, config, handler, table, log, clients, delivery,
                                      counters, engine_type))
    except ProducerFencedError as err:
        log.error("fenced: another producer uses transactional id %s (a second pool with "
                  "this group and transactional_id_prefix?): %s",
                  config.transactional_id(child.slot), err)
        return EXIT_FENCED
    except OutputsLost as err:
        log.error("%s; exiting so that the records are handled again", err)
        return EXIT_OUTPUTS_LOST
    except Exception:                              # noqa: BLE001 -- reported, then exit 1
        log.exception("child failed")
        return 1


def _serving(child: Child, config, handler, table, log: logging.Logger, clients, delivery,
             counters, engine_type):
    """The child's life as steps (``clients.Op``): connect, run the engine, commit, close."""
    from workers.stats import RUNNING, STATE

    def tick() -> None:
        if not child.joined and _joined(consumer, config):
            child.joined = True
            if not child.drain_requested:
                table.set(child.slot, STATE, RUNNING)
            log.debug("joined group %s", config.group_id)
        if os.getppid() != child.parent:
            child.drain_requested = True

    try:
        # Exactly once, even a child asked to drain at once fences its slot's transactional
        # id first: a dead predecessor's transaction must not wait for its timeout.
        if delivery.eos:
            yield from _connecting("start_producer", child, log, until_drain=False)
        if os.environ.get(ENV_FENCE):
            return 0
        consumer = yield from _connecting("start_consumer", child, log)
        if consumer is None:
            return 0
        engine = engine_type(config, child.slot, handler, clients, delivery, table, counters,
                             child.draining)
        engine.tick = tick
        clients.listener.engine = engine
        yield ("engine", engine)
        yield from engine.settle(engine.busy())
        yield from delivery.commit(sync=True)
        counters.committed = delivery.commits
        log.debug("drained")
        return 0
    finally:
        counters.publish()
        yield ("close",)


def _joined(consumer, config) -> bool:
    """The consumer is a member of its group: it has an epoch from the local broker. A
    Kafka cluster's consumer reports none (-1; librdkafka keeps the generation to itself),
    so there a member id, which the coordinator gives at the join, tells."""
    meta = consumer.group_metadata()
    return meta.member_epoch > 0 or (config.bootstrap_servers is not None and
                                     bool(meta.member_id))


if __name__ == "__main__":
    sys.exit(main())
