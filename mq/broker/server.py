"""The broker: one event-loop thread serving a Unix socket, plus a flusher thread.

The loop thread owns every ``PartitionLog``: it validates and appends whole batches (never
decoding records), publishes partition state to shared memory and posts the semaphores of
waiting consumers. The flusher thread only runs ``fdatasync`` on duplicated file descriptors
(the call releases the GIL) and tells the loop through a pipe when a round is durable, so one
fsync covers every ``acks="all"`` produce that arrived meanwhile (group commit).

High watermark: by default it follows the *written* offset — a record is visible to consumers
as soon as it is in the page cache, which survives any process crash (kill -9 of the broker
included) and keeps end-to-end latency at a semaphore wake-up. With ``high_watermark =
"durable"`` it follows the fsync'd offset instead, so consumers never see a record that a power
loss could take back, at the cost of an fsync in every record's latency.

This module holds the loop, connections, request dispatch, produce and the broker's lifecycle.
``Broker`` mixes in the rest: group and offset apis (``group_apis.py``), topic administration
apis (``topic_apis.py``), state publication and consumer wake-ups (``wakeups.py``), and group
commit with the flusher thread (``flushing.py``).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import selectors
import signal
import socket
import struct
import time

import posix_ipc

from mq import errors
from mq.broker.cleaning import BackgroundCleaner, LoopCalls
from mq.broker.config import BrokerConfig
from mq.broker.flushing import Flusher, Flushing
from mq.broker.group_apis import GroupApis
from mq.broker.internal_topics import METADATA_TOPIC, is_internal
from mq.broker.metadata import MetadataStore
from mq.broker.space import FreeSpaceGuard
from mq.protocol.state import StateWriter, semaphore_prefix
from mq.broker.topic_apis import TopicApis
from mq.broker.wakeups import Wakeups
from mq.errors import (BrokerError, InvalidPartitionsError, InvalidRequestError,
                       RemoteProtocolError, UnknownTopicOrPartitionError)
from mq.log import diskio
from mq.log.cleaner import CleanerConfig
from mq.log.config import ConfigError, LogConfig
from mq.log.log import PartitionLog
from mq.log.manager import LogManager
from mq.protocol.frames import FrameReader, encode_frame
from mq.protocol.messages import (ACKS_ALL, ONE_WAY, PROTOCOL_VERSION, SUPPORTED_VERSIONS, Api,
                                  Request, check_request, response)

__all__ = ["Broker", "run_broker"]

log = logging.getLogger("mq.broker")

_RECV_BYTES = 1 << 20
_PEERCRED = struct.Struct("3i")


@dataclasses.dataclass(eq=False)
class _Conn:
    sock: socket.socket
    pid: int
    reader: FrameReader
    conn_id: int = 0
    group_member: bool = False         # sent a group heartbeat: its close is a member leaving
    out: bytearray = dataclasses.field(default_factory=bytearray)
    greeted: bool = False
    closing: bool = False
    semaphores: dict[str, posix_ipc.Semaphore] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(eq=False)
class _Partition:
    topic: str
    partition: int
    log: PartitionLog
    slot: int
    generation: int = 0
    shape: tuple = ()
    waiters: list = dataclasses.field(default_factory=list)   # [(conn, sem, offset)]


class Broker(GroupApis, TopicApis, Wakeups, Flushing):
    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.data_dir = config.data_dir
        self.socket_path = config.socket_path
        self.logs: LogManager | None = None
        self.metadata: MetadataStore | None = None
        self.partitions: dict[tuple[str, int], _Partition] = {}
        self._free_slots: list[int] = []
        self._next_slot = 0
        self.state: StateWriter | None = None
        self._sel = selectors.DefaultSelector()
        self._listener: socket.socket | None = None
        self._conns: dict[int, _Conn] = {}                   # by conn_id
        self._unsent: set[_Conn] = set()                     # _send queued output this round
        self._conn_ids = itertools.count(1)
        self._stop = False
        self._reload = False
        self._dirty: set[_Partition] = set()                 # HW moved this round
        self._pending_flush: dict[_Partition, int] = {}      # -> log end offset to fsync
        self._pending_replies: list[tuple[_Conn, list, _Partition]] = []
        self._inflight_jobs = 0
        self._flush_r, self._flush_w = os.pipe()
        self._flusher = Flusher(self._flush_w)
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
        self._recv_buf = bytearray(_RECV_BYTES)
        self._recv_view = memoryview(self._recv_buf)
        self._sem_prefix = semaphore_prefix(self.data_dir)   # realpath + sha1: compute once
        self.generation = int(time.time() * 1000)

    # --- start --------------------------------------------------------------------------------
    def start(self) -> None:
        """Recover the data dir, publish state and listen. Raises on a second broker."""
        diskio.ops.file_mode = self.config.file_mode
        diskio.ops.dir_mode = diskio.dir_mode_for(self.config.file_mode)
        defaults = self.config.topic_defaults
        self.logs = LogManager.open(self.data_dir, lambda topic: defaults)
        try:
            meta_log = self.logs.get(METADATA_TOPIC, 0) or self.logs.create(METADATA_TOPIC, 0)
            self.metadata = MetadataStore(meta_log)
            self.state = StateWriter(self.data_dir, self.config.state_slots, self.generation)
            self._sync_partitions_with_metadata()
            self._open_groups()
            self._listen()
        except BaseException:
            self._close_resources()
            raise
        self._flusher.start()
        self._sel.register(self._calls, selectors.EVENT_READ, "calls")
        self._cleaner.start()
        self._sel.register(self._flush_r, selectors.EVENT_READ, "flush")
        os.set_blocking(self._flush_r, False)
        for fd in (self._signal_r, self._signal_w):
            os.set_blocking(fd, False)
        self._sel.register(self._signal_r, selectors.EVENT_READ, "signal")
        self._next_flush = time.monotonic() + self.config.flush_interval_ms / 1e3
        self._next_retention = time.monotonic() + self.config.retention_check_interval_ms / 1e3
        log.info("broker ready: data dir %s, socket %s, %d topic(s) with %d partition(s), "
                 "recovery %s", self.data_dir, self.socket_path, len(self.metadata.topics),
                 sum(info.partitions for info in self.metadata.topics.values()),
                 "skipped (clean shutdown)" if self.logs.clean_shutdown else "done")

    def _sync_partitions_with_metadata(self) -> None:
        """Make the partition logs match the metadata: open or create what it lists, remove
        directories of deleted topics (a crash between the record and the removal)."""
        assert self.logs is not None and self.metadata is not None
        for plog in list(self.logs):
            key = (plog.topic, plog.partition)
            if is_internal(plog.topic):
                continue
            info = self.metadata.topics.get(plog.topic)
            if info is None or plog.partition >= info.partitions:
                log.warning("removing %s-%d: not in the topic metadata", *key)
                self.logs.delete(*key)
        for info in self.metadata.topics.values():
            cfg = self.metadata.config_for(info.name, self.config.topic_defaults)
            for p in range(info.partitions):
                self._add_partition(info.name, p, cfg)

    def _add_partition(self, topic: str, partition: int, cfg: LogConfig) -> _Partition:
        assert self.logs is not None
        plog = self.logs.get(topic, partition)
        if plog is None:
            plog = self.logs.create(topic, partition, cfg)
        else:
            plog.update_config(cfg)
        plog.high_watermark_follows_log_end = self.config.high_watermark == "written"
        if not plog.high_watermark_follows_log_end:
            plog.high_watermark = min(plog.high_watermark, plog.recovery_point)
        slot = self._free_slots.pop() if self._free_slots else self._take_slot()
        part = _Partition(topic, partition, plog, slot)
        self.partitions[(topic, partition)] = part
        self._publish(part)
        return part

    def _check_free_slots(self, count: int) -> None:
        """Before a topic change is recorded: ``count`` more partitions must fit the state
        region (``_take_slot`` failing half-way would leave the metadata ahead of the
        partitions, and the broker unable to start)."""
        if self._next_slot - len(self._free_slots) + count > self.config.state_slots:
            raise InvalidPartitionsError("not enough state slots for this many partitions")

    def _take_slot(self) -> int:
        if self._next_slot >= self.config.state_slots:
            raise InvalidPartitionsError(f"the broker's state region holds "
                                         f"{self.config.state_slots} partitions; raise "
                                         "state_slots in the broker config")
        self._next_slot += 1
        return self._next_slot - 1

    def _listen(self) -> None:
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

    # --- the loop -----------------------------------------------------------------------------
    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT stop, SIGHUP reloads; the wake-up fd makes select return at once."""
        signal.set_wakeup_fd(self._signal_w)
        signal.signal(signal.SIGTERM, self.request_stop)
        signal.signal(signal.SIGINT, self.request_stop)
        signal.signal(signal.SIGHUP, self.request_reload)

    def serve_forever(self) -> None:
        while not self._stop:
            now = time.monotonic()
            timeout = max(0.0, min(self._next_retention, self._next_flush) - now)
            timeout = min(timeout, self._group_deadline_s())
            for key, events in self._sel.select(timeout):
                what = key.data
                if what == "accept":
                    self._accept()
                elif what == "flush":
                    self._flush_done()
                elif what == "calls":
                    self._background(self._calls.run_pending, "a cleaner call")
                elif what == "signal":
                    try:
                        os.read(self._signal_r, 4096)
                    except BlockingIOError:
                        pass
                elif events & selectors.EVENT_READ:
                    self._read(what)
                if isinstance(what, _Conn) and events & selectors.EVENT_WRITE:
                    self._write(what)
            self._background(self._group_timers, "group timers")
            now = time.monotonic()
            if now >= self._next_flush:
                self._background(self._periodic_flush, "the periodic flush", now)
            if now >= self._next_retention:
                self._background(self._retention, "retention")
            if self._reload:
                self._reload = False
                self._reload_config()
            self._end_of_round()
        self._shutdown()

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
        if self._pending_flush or self._pending_replies:
            self._submit_flush_job()
        for part in self._dirty:
            self._publish(part)
            if part.waiters:
                self._wake(part)
        self._dirty.clear()
        while self._unsent:    # a write that closes a member's conn may push to others
            unsent, self._unsent = self._unsent, set()
            for conn in unsent:
                self._write(conn)

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
            conn = _Conn(sock, pid, FrameReader(self.config.max_request_bytes),
                         next(self._conn_ids))
            self._conns[conn.conn_id] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: _Conn) -> None:
        # One preallocated buffer for every read (the loop is single-threaded): recv() would
        # allocate, map and unmap 1 MiB per call even for a 60-byte Wait (~14 us vs ~2 us).
        try:
            n = conn.sock.recv_into(self._recv_buf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            n = 0
        if not n:
            self._close(conn)
            return
        conn.reader.feed(self._recv_view[:n])
        try:
            for message in conn.reader.messages():
                self._handle(conn, message)
                if conn.closing:
                    return
        except RemoteProtocolError as err:
            log.info("closing connection of pid %d: %s", conn.pid, err)
            self._close(conn)

    def _send(self, conn: _Conn, message: list) -> None:
        if conn.closing:
            return
        conn.out += encode_frame(message)
        self._unsent.add(conn)

    def _write(self, conn: _Conn) -> None:
        if conn.closing:
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

    def _close(self, conn: _Conn) -> None:
        if conn.closing:
            return
        conn.closing = True
        self._conns.pop(conn.conn_id, None)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        for part in self.partitions.values():
            if part.waiters:
                part.waiters = [w for w in part.waiters if w[0] is not conn]
        for sem in conn.semaphores.values():
            sem.close()
        conn.semaphores.clear()
        if conn.group_member and not self._stop:
            self._member_connection_closed(conn.conn_id)

    # --- requests -----------------------------------------------------------------------------
    def _handle(self, conn: _Conn, message: list) -> None:
        try:
            req = check_request(message)
        except RemoteProtocolError as err:
            rid = message[1] if isinstance(message[1], int) else None
            if rid is None:
                raise
            api = message[0] if isinstance(message[0], int) else -1
            self._send(conn, response(api, rid, InvalidRequestError.code, str(err)))
            return
        if not conn.greeted and req.api != Api.HANDSHAKE:
            self._send(conn, response(req.api, req.request_id, InvalidRequestError.code,
                                      "the first request must be a Handshake"))
            return
        try:
            reply = self._dispatch(conn, req)
        except BrokerError as err:
            reply = response(req.api, req.request_id, err.code, err.message)
        except (ConfigError, ValueError) as err:
            code = errors.InvalidConfigurationError.code if isinstance(err, ConfigError) \
                else InvalidRequestError.code
            reply = response(req.api, req.request_id, code, str(err))
        except errors.LogWriteError as err:
            reply = response(req.api, req.request_id, errors.KafkaStorageError.code, str(err))
        except errors.CorruptRecordError as err:
            reply = response(req.api, req.request_id, errors.CorruptMessageError.code,
                             err.reason)
        except errors.OffsetOutOfRangeError as err:
            reply = response(req.api, req.request_id, errors.BrokerOffsetOutOfRangeError.code,
                             str(err))
        except Exception as err:   # a bug in mq: answer, log, keep serving everyone else
            log.exception("error handling %s from pid %d", req.api.name, conn.pid)
            reply = response(req.api, req.request_id, errors.UnknownServerError.code,
                             f"{type(err).__name__}: {err}")
        # One-way requests still hear about errors.
        if reply is not None and (req.api not in ONE_WAY or reply[2] != 0):
            self._send(conn, reply)

    def _dispatch(self, conn: _Conn, req: Request) -> list | None:
        handler = getattr(self, f"_api_{req.api.name.lower()}")
        return handler(conn, req)

    def _partition(self, topic: str, partition: int) -> _Partition:
        part = self.partitions.get((topic, partition))
        if part is None:
            info = self._topic_info(topic)             # raises for an unknown topic
            raise UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {partition} "
                                               f"(it has {info.partitions})")
        return part

    def _api_handshake(self, conn: _Conn, req: Request) -> list:
        version = req["protocol_version"]
        if version not in SUPPORTED_VERSIONS:
            reply = response(req.api, req.request_id, errors.UnsupportedVersionError.code,
                             f"client speaks protocol version {version}; this broker speaks "
                             f"{', '.join(map(str, sorted(SUPPORTED_VERSIONS)))} — upgrade mq "
                             "on the older side")
            self._send(conn, reply)
            self._write(conn)
            self._close(conn)
            return None
        conn.greeted = True
        return response(req.api, req.request_id, 0, None, PROTOCOL_VERSION,
                        {"data_dir": self.data_dir, "generation": self.generation,
                         "pid": os.getpid(), "semaphore_prefix": self._sem_prefix,
                         "shm": self.state.name,
                         "max_request_bytes": self.config.max_request_bytes})

    def _api_produce(self, conn: _Conn, req: Request) -> list | None:
        topic, acks = req["topic"], req["acks"]
        if is_internal(topic):
            raise InvalidRequestError(f"cannot produce to internal topic {topic!r}")
        if acks not in (0, 1, ACKS_ALL):
            raise InvalidRequestError(f"acks must be 0, 1 or -1 (all), got {acks}")
        part = self._partition(topic, req["partition"])
        batch = req["batch"]
        if len(batch) > part.log.config.max_message_bytes:
            raise errors.MessageTooLargeError(
                f"batch of {len(batch)} bytes exceeds max.message.bytes "
                f"{part.log.config.max_message_bytes} of topic {topic!r}")
        self._space.admit(len(batch))
        info = part.log.append(batch if isinstance(batch, bytearray) else bytearray(batch),
                               leader_epoch=0)
        self._dirty.add(part)
        reply = response(req.api, req.request_id, 0, None, info.first_offset,
                         info.log_append_time, part.log.log_start_offset)
        if acks == ACKS_ALL:
            self._ack_after_flush(part, conn, reply)
            return None
        if not part.log.high_watermark_follows_log_end:
            self._ack_after_flush(part)
        return reply if acks == 1 else None

    def _api_list_offsets(self, conn: _Conn, req: Request) -> list:
        part = self._partition(req["topic"], req["partition"])
        found = part.log.offset_for_timestamp(req["timestamp"])
        offset, ts = found if found is not None else (-1, -1)
        return response(req.api, req.request_id, 0, None, offset, ts)

    # --- background work ----------------------------------------------------------------------
    def _on_swapped(self, plog: PartitionLog) -> None:
        """After a compaction swap (run on this loop by the cleaner): republish the partition
        at the end of the round, which bumps its segment-set generation so readers re-list.
        The metadata log has no slot: nothing to publish."""
        part = self.partitions.get((plog.topic, plog.partition))
        if part is not None and part.log is plog:
            self._dirty.add(part)

    def _retention(self) -> None:
        """Apply retention; ``_end_of_round`` publishes the partitions it changed."""
        self._next_retention = time.monotonic() + self.config.retention_check_interval_ms / 1e3
        changed = False
        for part in list(self.partitions.values()):
            if self._cleaner.is_cleaning(part.log):
                continue        # a pass reads its segments (Kafka skips it too): next check
            try:
                if part.log.apply_retention():
                    self._dirty.add(part)
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
        for part in self.partitions.values():
            part.log.update_config(self.metadata.config_for(part.topic,
                                                            self.config.topic_defaults))
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

    def _shutdown(self) -> None:
        """Stop accepting, answer in-flight acks=all produces, flush, mark clean, exit."""
        self._stop_cleaner()
        self._close_listener()
        self._end_of_round()
        while self._inflight_jobs:
            self._sel.select(1.0)
            self._flush_done()
        for conn in list(self._conns.values()):
            if conn.out:
                conn.sock.setblocking(True)
                conn.sock.settimeout(1.0)
                try:
                    conn.sock.sendall(conn.out)
                except OSError:
                    pass
            self._close(conn)
        self._close_resources()
        log.info("broker stopped cleanly")

    def _close_listener(self) -> None:
        """Stop accepting and remove the socket file (idempotent)."""
        if self._listener is None:
            return
        try:
            self._sel.unregister(self._listener)
        except (KeyError, ValueError):
            pass
        self._listener.close()
        self._listener = None
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
        self._stop_cleaner()
        self._flusher.stop()
        if self._flusher.is_alive():
            self._flusher.join()
        if self.logs is not None:
            self.logs.close()
            self.logs = None
        if self.state is not None:
            self.state.close()
            self.state = None
        self._close_listener()
        signal_w, self._signal_w = self._signal_w, -1      # never written once closed
        for fd in (self._flush_r, self._flush_w, self._signal_r, signal_w):
            try:
                os.close(fd)
            except OSError:
                pass


def run_broker(config: BrokerConfig, ready=None) -> int:
    """Run a broker in the foreground until SIGTERM/SIGINT; returns the exit status."""
    broker = Broker(config)
    broker.start()
    broker.install_signal_handlers()
    if ready is not None:
        ready(broker)
    broker.serve_forever()
    return 0
