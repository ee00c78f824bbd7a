"""The broker's event loop: one thread serving the Unix socket and the Kafka listeners, with a
flusher thread for fsyncs, a cleaner thread for compaction and, with ``--metrics``, an HTTP one.

The loop thread owns every ``PartitionLog``: it validates and appends whole batches (never
decoding records), publishes partition state to shared memory and wakes waiting consumers
(a published slot's futex word, ``mq/protocol/state.py``; the semaphores of WAITs,
``wakeups.py``). The flusher thread only runs ``fdatasync`` on
duplicated file descriptors (the call releases the GIL) and tells the loop through a pipe when
a round is durable, so one fsync covers every ``acks="all"`` produce that arrived meanwhile
(group commit, ``flushing.py``). The cleaner and metrics threads never touch a log: what they
need from one (a compaction swap, a stats snapshot) runs on this loop through ``LoopCalls``.

High watermark: by default it follows the *written* offset — a record is visible to consumers
as soon as it is in the page cache, which survives any process crash (kill -9 of the broker
included) and keeps end-to-end latency at a wake-up. With ``high_watermark = "durable"`` it
follows the fsync'd offset instead, so consumers never see a record that a power loss could
take back, at the cost of an fsync in every record's latency.

This module is the loop only: accept, read, write and close connections, dispatch requests,
signals, housekeeping timers and the broker's lifecycle. What requests do lives in the api
components (``apis/``: produce, topics, groups, transactions, ACLs, users); each exposes its
``{Api: handler}`` table and the loop merges them into one, so a request costs one dict lookup
to dispatch. The Kafka listener (``kafka/``) calls the same components. One loop round::

    select() -> accept | read requests -> handler(conn, request) -> reply queued on the conn
             | Kafka listener: accept, read frames -> its handlers' native calls
             | flusher done -> GroupCommit.done: recovery points, held replies
             | loop calls -> a compaction swap, a stats snapshot (cleaner, metrics threads)
    background steps: group, transaction and Kafka timers, periodic flush + checkpoint,
                      retention, SIGHUP reload (a step that raises is logged; the loop goes on)
    end of round: GroupCommit.submit (one fsync job), publish touched partitions and wake
                  their waiters (parked Kafka Fetches too), write every connection with
                  output; then the systemd watchdog ping when due (``service.py``: a wedged
                  loop stops the pings)

Under systemd the broker serves the listening socket it was passed (socket activation) and
leaves its path alone at exit, so clients queue in its backlog while the broker restarts.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import resource
import selectors
import signal
import socket
import struct
import time
from collections.abc import Iterable

from mq import errors
from mq.broker.apis import ApiComponent, Handler, answer_for
from mq.broker.apis.acls import AclApis
from mq.broker.apis.groups import GroupApis
from mq.broker.apis.produce import ProduceApis
from mq.broker.apis.topics import TopicApis
from mq.broker.apis.transactions import TransactionApis
from mq.broker.apis.users import UserApis
from mq.broker.cleaning import BackgroundCleaner, LoopCalls
from mq.broker.config import BrokerConfig
from mq.broker.conns import Conn, Connections
from mq.broker.fd_budget import FDS_PER_PARTITION, FdBudget
from mq.broker.kafka.conn import KafkaConn
from mq.broker.kafka.handlers import KafkaApis
from mq.broker.kafka.listener import KafkaListener
from mq.broker.kafka.addresses import parse_listener
from mq.broker.kafka.tls import server_context
from mq.broker.flushing import GroupCommit
from mq.broker.internal_topics import INTERNAL_TOPICS, METADATA_TOPIC
from mq.broker.metadata import MetadataStore
from mq.broker.partitions import PartitionTable
from mq.broker.service import ServiceNotifier, status_line
from mq.broker.space import FreeSpaceGuard, format_bytes
from mq.broker.stats import BrokerStats
from mq.broker.wakeups import StatePublisher
from mq.errors import ConfigError, InvalidRequestError, RemoteProtocolError
from mq.log import diskio, files, native
from mq.log.cleaner import CleanerConfig
from mq.log.log import PartitionLog
from mq.log.manager import LogManager
from mq.protocol.messages import (
    ONE_WAY,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    Api,
    Request,
    check_request,
    response,
)
from mq.protocol.paths import check_socket_path
from mq.protocol.state import HEADER_SIZE, SLOT_SIZE, StateWriter, futex, semaphore_prefix

__all__ = ["Broker", "run_broker", "state_region"]

log = logging.getLogger("mq.broker")

_PEERCRED = struct.Struct("3i")
_PRODUCE = int(Api.PRODUCE)
_FD_ROOM = socket.CMSG_SPACE(4 * 4)     # fds one read may bring (a client sends one at a time)


class Broker:
    """One broker: ``start()`` recovers the data dir and listens, ``serve_forever()`` runs the
    loop until ``request_stop()`` (any thread, or SIGTERM/SIGINT), then stops cleanly."""

    def __init__(self, config: BrokerConfig, listener: socket.socket | None = None,
                 service: ServiceNotifier | None = None) -> None:
        """``listener``: a listening Unix socket to serve instead of binding
        ``config.socket_path`` (socket activation; its path is never unlinked here).
        ``service``: what the broker tells systemd (default: from the environment)."""
        self.config = config
        self.data_dir = config.data_dir
        self.socket_path = config.socket_path
        self._inherited = listener
        if listener is not None:
            path = listener.getsockname()
            if config.socket and config.socket != path:
                log.warning("serving the socket systemd passed, %s, not %s", path,
                            config.socket)
            self.socket_path = path
        self.service = service or ServiceNotifier()
        self.logs: LogManager | None = None
        self.metadata: MetadataStore | None = None
        self.state: StateWriter | None = None
        self.partitions = PartitionTable(config.state_slots)
        self.conns = Connections(config.max_request_bytes)
        # The api components and the loop side of group commit, built by start().
        self.topics: TopicApis | None = None
        self.groups: GroupApis | None = None
        self.transactions: TransactionApis | None = None
        self.users: UserApis | None = None
        self.stats: BrokerStats | None = None
        self._metrics = None                   # the /metrics endpoint (metrics_address)
        self._publisher: StatePublisher | None = None
        self._commit: GroupCommit | None = None
        self._handlers: dict[Api, Handler] = {}
        self._sel = selectors.DefaultSelector()
        self._spin_s = config.spin_us / 1e6
        self._listener: socket.socket | None = None
        self._stop = False
        self._reload = False
        # The log cleaner thread (started once the logs are open); its swaps run on this
        # loop through _calls.
        self._calls = LoopCalls()
        self._cleaner = BackgroundCleaner(
            self._calls, lambda: list(self.logs or ()), self.data_dir,
            config=CleanerConfig(dedupe_buffer_bytes=config.cleaner_dedupe_buffer_bytes),
            backoff_ms=config.cleaner_backoff_ms, on_swapped=self._on_swapped)
        self._space = FreeSpaceGuard(self.data_dir, config.min_free_bytes)
        self._next_retention = 0.0
        self._next_flush = 0.0
        self._signal_r, self._signal_w = os.pipe()
        self._sem_prefix = semaphore_prefix(self.data_dir)   # realpath + sha1: compute once
        self.generation = int(time.time() * 1000)
        self._fds = FdBudget(None)             # the open-file limit, known at start()
        self.kafka: KafkaListener | None = None   # kafka_listeners (mq/broker/kafka/)
        self._kafka_tls = None                 # their TLS context (kafka/tls.py), at start()

    # --- start --------------------------------------------------------------------------------
    def start(self) -> None:
        """Recover the data dir, publish state and listen. Raises on a second broker, and
        ``ConfigError`` before anything else for a socket path too long to bind."""
        if self._inherited is None:
            try:
                check_socket_path(self.socket_path)     # <data dir>/mq.sock may be too long
            except ValueError as err:
                raise ConfigError(f"{err}; set socket (--socket, $MQ_SOCKET) to a shorter "
                                  "path") from err
        self._kafka_tls = _kafka_tls_context(self.config)    # TLS hook: before the data dir
        diskio.ops.file_mode = self.config.file_mode
        diskio.ops.dir_mode = diskio.dir_mode_for(self.config.file_mode)
        defaults = self.config.topic_defaults
        self._fds, fds_line = _open_files_budget(self.data_dir)   # refuses before the dir
        self.logs = LogManager.open(self.data_dir, lambda topic: defaults,
                                    progress=self.service.recovery_progress, load_all=False)
        log.info("%s", fds_line)
        try:
            # The internal topics first: the metadata says which other directories are
            # partitions (TopicApis.open_partitions loads those and sets the rest aside).
            self.logs.load([key for key in self.logs.unloaded if key[0] in INTERNAL_TOPICS])
            meta_log = self.logs.get(METADATA_TOPIC, 0) or self.logs.create(METADATA_TOPIC, 0)
            self.metadata = MetadataStore(meta_log)
            self.state = state_region(self.data_dir, self.config.state_slots, self.generation)
            self._build_components()
            self._listen()
            self._listen_kafka()
        except BaseException:
            self._close_resources()
            raise
        self._commit.start()
        self._sel.register(self._calls, selectors.EVENT_READ, "calls")
        self._cleaner.start()
        self._sel.register(self._commit.fileno(), selectors.EVENT_READ, "flush")
        for fd in (self._signal_r, self._signal_w):
            os.set_blocking(fd, False)
        self._sel.register(self._signal_r, selectors.EVENT_READ, "signal")
        if self.config.metrics_address:
            self._serve_metrics()
        self._next_flush = time.monotonic() + self.config.flush_interval_ms / 1e3
        self._next_retention = time.monotonic() + self.config.retention_check_interval_ms / 1e3
        log.info("broker ready: data dir %s, socket %s, %d topic(s) with %d partition(s), "
                 "recovery %s", self.data_dir, self.socket_path, len(self.metadata.topics),
                 sum(info.partitions for info in self.metadata.topics.values()),
                 "skipped (clean shutdown)" if self.logs.clean_shutdown else "done")

    def _build_components(self) -> None:
        """Wire the parts: every partition the metadata names gets a slot and is published,
        then ``__consumer_offsets`` is opened and replayed by the groups component, which hears
        of topic changes from the topics component; then the one dispatch table."""
        assert self.logs is not None and self.metadata is not None and self.state is not None
        self._publisher = publisher = StatePublisher(self.state, self.partitions)
        self._commit = GroupCommit(self.partitions, self.conns, publisher)
        self.topics = TopicApis(
            self.logs, self.metadata, self.partitions, publisher, self._commit, self._cleaner,
            topic_defaults=self.config.topic_defaults,
            high_watermark_follows_log_end=self.config.high_watermark == "written",
            fd_budget=self._fds)
        self.topics.open_partitions()
        self.groups = GroupApis(self.topics, self.partitions, self.conns, self._commit,
                                self.config)
        self.topics.add_listener(self.groups)
        self.transactions = TransactionApis(
            self.topics, self.partitions, self.conns, self._commit, self.groups, self.metadata,
            coordinator_epoch=self.logs.leader_epoch,
            max_timeout_ms=self.config.transaction_max_timeout_ms)
        produce = ProduceApis(self.partitions, self._commit, self._space, self._sem_prefix,
                              self.conns.send, leader_epoch=self.logs.leader_epoch,
                              verify_transaction=self.transactions.verify)
        self.stats = BrokerStats(self.partitions, self.conns, self.groups, self._commit,
                                 self._cleaner, data_dir=self.data_dir,
                                 socket_path=lambda: self.socket_path,
                                 metadata_log=self.metadata.log)
        self.users = UserApis(self.metadata)        # SCRAM credentials (mq users, Kafka)
        self._handlers = dispatch_table([self, produce, self.topics, self.groups,
                                         self.transactions, self.stats,
                                         AclApis(self.metadata), self.users])
        self._produce = produce
        self._append = produce.append
        self.transactions.recover()

    def handlers(self) -> dict[Api, Handler]:
        """The loop's own api: the Handshake every connection opens with."""
        return {Api.HANDSHAKE: self._handshake}

    def _listen(self) -> None:
        if self._inherited is not None:         # systemd made, bound and owns it
            self._listener = self._inherited
            self._listener.setblocking(False)
            self._sel.register(self._listener, selectors.EVENT_READ, "accept")
            return
        path = self.socket_path
        if os.path.exists(path):
            probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                probe.connect(path)
            except OSError:
                os.unlink(path)                  # a dead broker's socket
            else:
                probe.close()
                raise errors.LogDirLockedError(f"socket {path} is in use by another broker")
            finally:
                probe.close()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        os.chmod(path, self.config.socket_mode)
        sock.listen(128)
        sock.setblocking(False)
        self._listener = sock
        self._sel.register(sock, selectors.EVENT_READ, "accept")

    def _listen_kafka(self) -> None:
        """The Kafka listeners (``kafka_listeners``), served by the same components."""
        if not self.config.kafka_listeners:
            return
        self.kafka = KafkaListener(self.config.kafka_listeners, selector=self._sel,
                                   conns=self.conns, dispatch=self.call, close=self._close,
                                   max_request_bytes=self.config.max_request_bytes,
                                   ssl_context=self._kafka_tls)
        self.kafka.set_handlers(KafkaApis(
            self.config, self.partitions, self.groups, self.transactions, self.metadata,
            self.users, leader_epoch=self.logs.leader_epoch).handlers())
        self.kafka.listen()
        self.stats.kafka_listeners = self.kafka.bound

    def _serve_metrics(self) -> None:
        """``/metrics`` at ``metrics_address``, from the snapshot the loop takes per scrape."""
        from mq.broker.metrics import serve_broker_metrics
        address = self.config.metrics_address
        try:
            self._metrics = serve_broker_metrics(address, self._snapshot)
        except BaseException as err:
            self._close_resources()
            if isinstance(err, OSError):
                raise errors.MQError(f"cannot serve metrics at {address}: "
                                     f"{err.strerror or err}") from err
            raise
        self.stats.metrics_url = self._metrics.url
        log.info("metrics at %s", self._metrics.url)

    def _snapshot(self) -> tuple[dict, float]:
        """The stats snapshot, taken on the loop thread (any thread may call this), and the
        seconds the loop spent on it. Raises ``ValueError`` once the broker is stopping."""
        def timed() -> tuple[dict, float]:
            started = time.perf_counter()
            snap = self.stats.snapshot()
            return snap, time.perf_counter() - started
        return self._calls.call(timed, lambda: self._stop)

    # --- the loop -----------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop, SIGHUP reloads; the wake-up fd makes select return at once."""
        signal.set_wakeup_fd(self._signal_w)
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGHUP, self.request_reload)

    def serve_forever(self) -> None:
        assert self.groups is not None and self._commit is not None
        if not self._stop:
            self.service.ready(self.status())
        while not self._stop:
            now = time.monotonic()
            timeout = max(0.0, min(self._next_retention, self._next_flush) - now)
            timeout = min(timeout, self.groups.deadline_s(),
                          self.transactions.deadline_s(now), self.service.deadline_s())
            if self.kafka is not None:
                timeout = min(timeout, self.kafka.deadline_s(now))
            for key, events in self._select(timeout):
                what = key.data
                if type(what) is Conn:            # a client's request: the hot path, first
                    if events & selectors.EVENT_READ:
                        self._read(what)
                    if events & selectors.EVENT_WRITE:
                        self._write(what)
                    continue
                if what == "accept":
                    self._accept()
                elif what is self.kafka:
                    self.kafka.accept(key)
                elif what == "flush":
                    self._commit.done()
                elif what == "calls":
                    self._background(self._calls.run_pending, "a cleaner call")
                elif what == "signal":
                    try:
                        os.read(self._signal_r, 4096)
                    except BlockingIOError:
                        pass
                elif events & selectors.EVENT_READ:
                    if isinstance(what, KafkaConn):
                        self.kafka.read(what)
                    else:
                        self._read(what)
                if isinstance(what, Conn) and events & selectors.EVENT_WRITE:
                    self._write(what)
            self._publish_touched()    # before the timers: a wake-up waits for no bookkeeping
            self._background(self.groups.timers, "group timers")
            now = time.monotonic()
            self._background(self.transactions.timers, "transaction timers", now)
            if self.kafka is not None:
                self.kafka.timers(now)
            if now >= self._next_flush:
                self._background(self._periodic_flush, "the periodic flush", now)
                self.conns.trim_buffers()
            if now >= self._next_retention:
                self._background(self._retention, "retention")
            if self._reload:
                self._reload = False
                self.service.reloading()
                self._reload_config()
                self.service.ready(self.status())
            self._end_of_round()
            self.service.tick(self.status)     # from this loop: a stuck loop stops the pings
        self._shutdown()

    def _select(self, timeout: float) -> list:
        """The ready connections and pipes, waiting up to ``timeout`` seconds: with
        ``spin_us``, watched without sleeping for that long first (the wait strategy)."""
        spin_s = self._spin_s
        if spin_s and timeout > 0:
            select, clock = self._sel.select, time.monotonic
            until = clock() + min(spin_s, timeout)
            while True:
                ready = select(0)
                if ready:
                    return ready
                now = clock()
                if now >= until:
                    break
            timeout = max(0.0, timeout - spin_s)
        return self._sel.select(timeout)

    @staticmethod
    def _background(step, what: str, *args) -> None:
        """Run a step of the loop that answers no request: whatever it raises is logged, and
        the broker keeps serving (a storage error is one line; anything else is a bug in mq
        and gets its traceback)."""
        try:
            step(*args)
        except errors.LogWriteError as err:
            log.warning("%s: %s", what, err)
        except Exception:
            log.exception("%s failed; the broker carries on", what)

    def _end_of_round(self) -> None:
        """Once per loop round: one flush job for every acks=all append (and the periodic
        flush), then state publication and wake-ups for partitions whose high watermark or
        segments moved, then the replies queued this round."""
        self._commit.submit()
        self._publish_touched()        # what the timers moved since the requests
        while True:    # a write that closes a member's conn may push to others
            unsent = self.conns.take_unsent()
            if not unsent:
                return
            for conn in unsent:
                self._write(conn)

    def _publish_touched(self) -> None:
        """Publish the partitions whose state moved, wake their consumers and the Kafka
        listener's Fetches parked on them. Right after a round's requests and again at its end,
        so a record's wake-up does not wait for the timers and checks in between."""
        touched = self.partitions.touched
        if touched:
            if self.kafka is not None:
                self.kafka.partitions_moved(touched)              # parked Fetches
            self._publisher.publish_touched()

    # --- connections --------------------------------------------------------------------------
    def _accept(self) -> None:
        assert self._listener is not None
        while True:
            try:
                sock, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as err:
                log.warning("accept failed: %s", err)
                return
            sock.setblocking(False)
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
            pid, _, _ = _PEERCRED.unpack(creds)
            conn = self.conns.add(sock, pid)
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: Conn) -> None:
        # Straight into the connection's reader (frames.py): a large frame lands in place in
        # one buffer of its size and its batch is appended from there, never copied here.
        # recvmsg, not recv: a producer's ShareMemory comes with its arena's fd (SCM_RIGHTS),
        # which a plain recv would close.
        reader = conn.reader
        try:
            n, ancillary, flags = reader.recvmsg(conn.sock, _FD_ROOM)
            if ancillary:
                conn.take_fds(ancillary, flags)
        except (BlockingIOError, InterruptedError):
            return
        except RemoteProtocolError as err:
            log.info("closing connection of pid %d: %s", conn.pid, err)
            self._close(conn)
            return
        except OSError:
            n = 0
        if not n:
            self._close(conn)
            return
        try:
            take = native.take_produce
            if conn.greeted and take is not None:
                # The hot path: a producer's Produce frames parsed in C (else None).
                while (produce := reader.take_with(take)) is not None:
                    rid, topic, partition, acks, batch = produce
                    with batch:
                        self._produce_tail(conn, rid, topic, partition, acks, batch)
                    if conn.closing:
                        return
                if not reader.buffered:
                    return          # all taken (a large buffer goes back at the next trim)
            for message in reader.messages():
                self._handle(conn, message)
                if conn.closing:
                    return
        except RemoteProtocolError as err:
            log.info("closing connection of pid %d: %s", conn.pid, err)
            self._close(conn)

    def _write(self, conn: Conn) -> None:
        if conn.closing:
            return
        if isinstance(conn, KafkaConn):
            self.kafka.write(conn)
            return
        try:
            n = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError:
            self._close(conn)
            return
        del conn.out[:n]
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if conn.out else 0)
        try:
            self._sel.modify(conn.sock, events, conn)
        except (KeyError, ValueError):
            pass

    def _close(self, conn: Conn) -> None:
        if conn.closing:
            return
        conn.closing = True
        self.conns.remove(conn)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        conn.release_shared()
        self.partitions.disarm(conn)
        for sem in conn.semaphores.values():
            sem.close()
        conn.semaphores.clear()
        if conn.group_member and not self._stop and self.groups is not None:
            self.groups.connection_closed(conn.conn_id)

    # --- requests -----------------------------------------------------------------------------
    def _produce_tail(self, conn: Conn, rid: int, topic: str, partition: int, acks: int,
                      batch: memoryview) -> None:
        """A greeted client's Produce whose batch is a frame's tail, straight to the append
        (``check_request``'s checks of its fields made by the caller)."""
        try:
            reply = self._append(conn, rid, topic, partition, acks, batch)
        except Exception as err:
            reply = self._failed(conn, Api.PRODUCE, rid, err)
        # The last request of this read: its record's consumers are woken now, before its
        # reply is encoded and the round goes on (a burst publishes once).
        if not conn.reader.has_message():
            self._publish_touched()
        if reply is not None:
            self.conns.send(conn, reply)

    def _handle(self, conn: Conn, message: list) -> None:
        # The hot path, for a Produce the C parse left to msgpack (``_read``).
        if message[0] == _PRODUCE and len(message) == 6 and conn.greeted:
            _, rid, topic, partition, acks, batch = message
            if type(rid) is int and type(topic) is str and type(partition) is int and \
                    type(acks) is int and type(batch) is memoryview:
                self._produce_tail(conn, rid, topic, partition, acks, batch)
                return
        try:
            req = check_request(message)
        except RemoteProtocolError as err:
            rid = message[1] if isinstance(message[1], int) else None
            if rid is None:
                raise
            api = message[0] if isinstance(message[0], int) else -1
            self.conns.send(conn, response(api, rid, InvalidRequestError.code, str(err)))
            return
        if not conn.greeted and req.api != Api.HANDSHAKE:
            self.conns.send(conn, response(req.api, req.request_id, InvalidRequestError.code,
                                           "the first request must be a Handshake"))
            return
        reply = self.call(conn, req)
        # One-way requests still hear about errors.
        if reply is not None and (req.api not in ONE_WAY or reply[2] != 0):
            self.conns.send(conn, reply)

    def call(self, conn: Conn, req: Request) -> list | None:
        """Run a request's handler: its reply now, or None (sent later, or one-way). What
        the handler raises is answered as an error reply with Kafka's code (``answer_for``);
        anything else than mq's own errors is a bug in mq: answered UNKNOWN_SERVER_ERROR and
        logged with its traceback."""
        try:
            handler = self._handlers.get(req.api)
            if handler is None:
                raise InvalidRequestError(f"this broker does not serve {req.api.name}")
            return handler(conn, req)
        except Exception as err:
            return self._failed(conn, req.api, req.request_id, err)

    @staticmethod
    def _failed(conn: Conn, api: Api, request_id: int, err: Exception) -> list:
        """The error reply for what a handler raised (``call``)."""
        answer = answer_for(err)
        if answer is None:      # a bug in mq: answer, log, keep serving everyone else
            log.exception("error handling %s from %s", api.name, _peer(conn))
            answer = (errors.UnknownServerError.code, f"{type(err).__name__}: {err}")
        return response(api, request_id, *answer)

    def _handshake(self, conn: Conn, req: Request) -> list | None:
        version = req["protocol_version"]
        if version not in SUPPORTED_VERSIONS:
            reply = response(req.api, req.request_id, errors.UnsupportedVersionError.code,
                             f"client speaks protocol version {version}; this broker speaks "
                             f"{', '.join(map(str, sorted(SUPPORTED_VERSIONS)))} — upgrade mq "
                             "on the older side")
            self.conns.send(conn, reply)
            self._write(conn)
            self._close(conn)
            return None
        conn.greeted = True
        return response(req.api, req.request_id, 0, None, PROTOCOL_VERSION,
                        {"data_dir": self.data_dir, "generation": self.generation,
                         "pid": os.getpid(), "gid": os.getegid(),
                         "semaphore_prefix": self._sem_prefix, "shm": self.state.name,
                         "max_request_bytes": self.config.max_request_bytes,
                         "frame_tail": True,      # Produce's batch may follow as a raw tail
                         "shared_batches": True,  # ShareMemory / ProduceShared (arena.py)
                         "futex_wake": futex is not None})   # every publish wakes a sleeper

    # --- background work ----------------------------------------------------------------------
    def _on_swapped(self, plog: PartitionLog) -> None:
        """After a compaction swap (run on this loop by the cleaner): republish the partition
        at the end of the round, which bumps its segment-set generation so readers re-list.
        The metadata log has no slot: nothing to publish."""
        part = self.partitions.get(plog.topic, plog.partition)
        if part is not None and part.log is plog:
            self.partitions.touch(part)

    def _periodic_flush(self, now: float) -> None:
        """Every ``flush_interval_ms``: fsync what acks=0/1 produces left in the page cache
        (``GroupCommit.periodic``) and checkpoint recovery points, the files written off this
        loop (their fsyncs took milliseconds from the records arriving meanwhile)."""
        self._next_flush = now + self.config.flush_interval_ms / 1e3
        self._commit.periodic(self.metadata.log)
        self.logs.checkpoint_in_background()

    def _retention(self) -> None:
        """Apply retention, and forget producers idle past ``producer_id_expiration_ms``
        (Kafka's producer.id.expiration.ms); ``_end_of_round`` publishes what changed."""
        self._next_retention = time.monotonic() + self.config.retention_check_interval_ms / 1e3
        changed = False
        now_ms = int(time.time() * 1000)
        for part in self.partitions:
            part.log.producers.expire(now_ms, self.config.producer_id_expiration_ms)
            if self._cleaner.is_cleaning(part.log):
                continue        # a pass reads its segments (Kafka skips it too): next check
            try:
                if part.log.apply_retention():
                    self.partitions.touch(part)
                    changed = True
            except errors.LogWriteError as err:
                log.warning("retention of %s-%d: %s", part.topic, part.partition, err)
            except Exception:
                log.exception("retention failed for %s-%d", part.topic, part.partition)
        if changed:
            self.logs.checkpoint()

    def _reload_config(self) -> None:
        try:
            new = BrokerConfig.load(self.config.config_file, data_dir=self.data_dir,
                                    socket=self.config.socket or None)
        except ConfigError as err:
            log.error("SIGHUP: config not reloaded: %s", err)
            return
        logging.getLogger("mq").setLevel(new.log_level)
        self.config = dataclasses.replace(self.config, log_level=new.log_level,
                                          retention_check_interval_ms=
                                          new.retention_check_interval_ms,
                                          topic_defaults=new.topic_defaults)
        self.topics.reload(self.config.topic_defaults)
        self._cleaner.wake()                    # the defaults may have turned compact on
        log.info("SIGHUP: configuration reloaded")

    # --- stopping -----------------------------------------------------------------------------
    def request_stop(self, *_: object) -> None:
        """Stop serving (a signal handler, or any thread: the loop wakes at once)."""
        self._stop = True
        try:
            if self._signal_w >= 0:
                os.write(self._signal_w, b"\0")
        except OSError:
            pass                 # closed, or full: the loop is stopping or already awake

    def request_reload(self, *_: object) -> None:
        self._reload = True

    def status(self) -> str:
        """The one-line summary for systemd: topics, partitions, connections."""
        topics = self.metadata.topics if self.metadata is not None else {}
        return status_line(len(topics), sum(info.partitions for info in topics.values()),
                           len(self.conns))

    def _shutdown(self) -> None:
        """Stop accepting, answer in-flight acks=all produces, flush, mark clean, exit."""
        # STOPPING=1 from the loop thread, woken at once by the signal pipe: sent from the
        # signal handler it could land between a ping's check and its send (a WATCHDOG=1
        # after STOPPING=1).
        self.service.stopping()
        self._stop_cleaner()
        self._close_listener()
        self._end_of_round()
        while self._commit is not None and self._commit.inflight:
            self._sel.select(1.0)
            self._commit.done()
        for conn in self.conns:
            if conn.out or isinstance(conn, KafkaConn) and conn.has_output:
                conn.sock.setblocking(True)
                conn.sock.settimeout(1.0)
                try:
                    if isinstance(conn, KafkaConn):
                        conn.send_some()
                    else:
                        conn.sock.sendall(conn.out)
                except OSError:
                    pass
            self._close(conn)
        self._close_resources()
        log.info("broker stopped cleanly")

    def _close_listener(self) -> None:
        """Stop accepting and remove the socket file (idempotent)."""
        if self.kafka is not None:
            self.kafka.close()
        if self._listener is None:
            return
        try:
            self._sel.unregister(self._listener)
        except (KeyError, ValueError):
            pass
        self._listener.close()
        self._listener = None
        if self._inherited is not None:
            return                             # systemd's: it stays, with its backlog
        try:
            os.unlink(self.socket_path)
        except FileNotFoundError:
            pass

    def _stop_cleaner(self) -> None:
        """Stop the log cleaner and wait for it, before the logs close (idempotent). This loop
        runs no more calls: a swap the cleaner waits for is given up (its .cleaned files are
        removed, the old segments stay) instead of deadlocking the join."""
        self._cleaner.stop()
        if self._cleaner.is_alive():
            self._cleaner.join()
        try:
            self._sel.unregister(self._calls)
        except (KeyError, ValueError):
            pass
        self._calls.close()

    def _close_resources(self) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        self._stop_cleaner()
        if self._commit is not None:
            self._commit.close()                # stops and joins the flusher first
        if self.logs is not None:
            self.logs.close()
            self.logs = None
        if self.state is not None:
            self.state.close()
            self.state = None
        self._close_listener()
        signal_w, self._signal_w = self._signal_w, -1      # never written once closed
        for fd in (self._signal_r, signal_w):
            try:
                os.close(fd)
            except OSError:
                pass


def _peer(conn: Conn) -> str:
    return f"pid {conn.pid}" if conn.pid is not None else getattr(conn, "peer", "a TCP peer")


def state_region(data_dir: str, slots: int, generation: int) -> StateWriter:
    """The shared state region of ``slots`` slots. Raises ``ConfigError`` naming
    ``state_slots`` when /dev/shm cannot hold it (Docker's default is 64 MiB, the region of
    the most slots 64 MiB and 64 bytes), rather than a bare 'No space left on device'."""
    try:
        return StateWriter(data_dir, slots, generation)
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.ENOMEM):
            raise
        size = format_bytes(HEADER_SIZE + SLOT_SIZE * slots)
        raise ConfigError(f"cannot reserve the {size} state region of state_slots = {slots} "
                          f"in /dev/shm: {err.strerror}; lower state_slots or give /dev/shm "
                          "more room") from err


def _open_files_budget(data_dir: str) -> tuple[FdBudget, str]:
    """Raise the soft open-file limit to the hard one (what Kafka's and most daemons' docs
    ask operators to do by hand: a shell's default soft limit is often 1,024) and raise
    ``FileLimitError`` if what ``data_dir`` needs does not fit; else return the budget and a
    line for the log saying both. Reads the data dir's listing only."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    before = soft
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as err:
            log.warning("open files: soft limit %d not raised to the hard limit %d: %s",
                        soft, hard, err)
    budget = FdBudget(None if soft == resource.RLIM_INFINITY else soft)
    partitions = files.count_partition_dirs(data_dir)
    budget.check_start(partitions)
    needed = budget.needed(partitions)
    return budget, (f"open files: limit {'unlimited' if budget.limit is None else budget.limit}"
                    f"{f' (raised from {before})' if soft != before else ''}; the data dir's "
                    f"{partitions} partition(s) need about {needed} ({FDS_PER_PARTITION} "
                    f"each, {needed - partitions * FDS_PER_PARTITION} for the broker and its "
                    "clients)")


def dispatch_table(components: Iterable[ApiComponent]) -> dict[Api, Handler]:
    """One ``{Api: handler}`` table from the components' own; an api claimed twice is a bug."""
    table: dict[Api, Handler] = {}
    for component in components:
        for api, handler in component.handlers().items():
            if api in table:
                raise ValueError(f"{api.name} is handled by two components")
            table[api] = handler
    return table


def _kafka_tls_context(config: BrokerConfig):
    """The SSL:// Kafka listeners' TLS context (mq/broker/kafka/tls.py), None without one.
    Raises ``ConfigError`` for a file that is missing, unreadable or does not match."""
    if not any(parse_listener(a).tls for a in config.kafka_listeners):
        return None
    return server_context(config.kafka_ssl_certfile, config.kafka_ssl_keyfile,
                          config.kafka_ssl_cafile)


def run_broker(config: BrokerConfig, ready=None, listener: socket.socket | None = None
               ) -> int:
    """Run a broker in the foreground until SIGTERM/SIGINT; returns the exit status.
    ``listener``: the socket systemd passed (``service.inherited_listener``), if any."""
    broker = Broker(config, listener)
    broker.start()
    broker.install_signal_handlers()
    if ready is not None:
        ready(broker)
    broker.serve_forever()
    return 0
