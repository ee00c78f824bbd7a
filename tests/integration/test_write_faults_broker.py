"""Write failures under a running broker: the broker runs in this process (a thread serving
its real socket, shared memory and semaphores) with a ``FaultyDiskIO`` seam, and real clients
talk to it. What every test checks (``docs/architecture.md``, "Write failures"):

- the broker never exits: its loop is still serving when the test ends;
- a request whose write failed is answered with ``KAFKA_STORAGE_ERROR`` and stored nothing;
- every acknowledged record (``acks="all"``) is readable at its offset with its value, now
  and after a restart, and no offset is handed out twice;
- reads keep working while writes fail, and writes work again once space returns;
- a failed fsync acknowledges nothing and takes only its partition offline, until a restart;
- after a clean stop and a restart, ``mq log check`` finds every partition clean.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import threading

import pytest

from mq.broker.config import BrokerConfig
from mq.broker.server import Broker
from mq.client.admin import Admin
from mq.client.consumer import Consumer
from mq.client.producer import Producer
from mq.client.types import TopicPartition
from mq.errors import KafkaStorageError, MQError
from mq.log import diskio, files
from mq.log.check import check_partition
from mq.log.diskio import ALLOCATING_OPS, Fault, FaultyDiskIO

SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
TOPIC = "orders"
PWRITE = frozenset({"pwrite"})


class InProcessBroker:
    """A ``Broker`` serving from a thread of this process (so a test's seam reaches it)."""

    def __init__(self, data_dir: str, socket: str, **settings) -> None:
        self.config = BrokerConfig.from_mapping({
            "data_dir": data_dir, "socket": socket, "min_free_bytes": 0,
            "flush_interval_ms": 50, "log_level": "WARNING", **settings})
        self.broker: Broker | None = None
        self.thread: threading.Thread | None = None
        self.crashed: BaseException | None = None

    def start(self) -> InProcessBroker:
        self.broker = Broker(self.config)
        self.broker.start()
        self.crashed = None
        self.thread = threading.Thread(target=self._serve, name="broker", daemon=True)
        self.thread.start()
        return self

    def _serve(self) -> None:
        try:
            self.broker.serve_forever()
        except BaseException as err:                  # the test fails on it
            self.crashed = err

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def stop(self) -> None:
        assert self.alive, f"the broker's loop ended by itself: {self.crashed!r}"
        self.broker.request_stop()
        self.thread.join(30)
        assert not self.thread.is_alive() and self.crashed is None, self.crashed

    def __enter__(self) -> InProcessBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        if self.alive:                # a test failed half-way: stop it before its dir goes
            self.broker.request_stop()
            self.thread.join(30)


@contextlib.contextmanager
def scratch():
    """A data dir on tmpfs where there is one (fsyncs cost nothing: what is tested is what a
    failed one does) and a short socket path."""
    root = tempfile.mkdtemp(prefix="mq-wf-", dir=SCRATCH)
    try:
        yield os.path.join(root, "data"), os.path.join(root, "mq.sock")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def read_all(socket: str, partitions: int) -> dict[tuple[int, int], bytes]:
    """Every record of the topic, read through a consumer's maps."""
    tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
    out: dict[tuple[int, int], bytes] = {}
    with Consumer(socket=socket, enable_auto_commit=False) as consumer:
        consumer.assign(tps)
        consumer.seek_to_beginning()
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for tp, records in consumer.poll(timeout_ms=2000).items():
                for rec in records:
                    out[(tp.partition, rec.offset)] = bytes(rec.value)
    return out


def check_acked(socket: str, partitions: int, acked: dict[tuple[int, int], bytes]) -> None:
    stored = read_all(socket, partitions)
    lost = {k: v for k, v in acked.items() if stored.get(k) != v}
    assert not lost, f"acknowledged records lost or changed: {sorted(lost)[:5]}"


def check_clean_on_disk(data_dir: str, partitions: int) -> None:
    for p in range(partitions):
        result = check_partition(os.path.join(data_dir, f"{TOPIC}-{p}"))
        assert result.clean, [problem.message for problem in result.problems]


class Acks:
    """Sends ``acks="all"`` one batch at a time and keeps what was acknowledged."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self.acked: dict[tuple[int, int], bytes] = {}
        self.failed: list[BaseException] = []
        self.sent = 0

    def send(self, partition: int) -> bool:
        value = b"v%05d" % self.sent
        self.sent += 1
        try:
            meta = self.producer.send(TOPIC, value, partition=partition).get(timeout=30)
        except MQError as err:
            self.failed.append(err)
            return False
        key = (partition, meta.offset)
        assert key not in self.acked, f"offset {key} acknowledged twice"
        self.acked[key] = value
        return True


@contextlib.contextmanager
def seamed(b: InProcessBroker, partitions: int = 2):
    """The broker's writes behind a fresh ``FaultyDiskIO``, the topic created, and a
    producer that does not retry (a failed send is seen at once): yields seam, admin, acks."""
    seam = FaultyDiskIO()
    sock = b.config.socket
    with diskio.installed(seam), Admin(sock) as admin, \
            Producer(socket=sock, retries=0, linger_ms=0) as producer:
        admin.create_topic(TOPIC, partitions)
        yield seam, admin, Acks(producer)


def test_full_disk_refuses_writes_serves_reads_and_recovers_when_space_returns():
    with scratch() as (data_dir, sock), InProcessBroker(data_dir, sock) as b:
        with seamed(b) as (seam, admin, acks):
            for i in range(20):
                assert acks.send(i % 2)
            seam.disk_full()
            assert not acks.send(0) and not acks.send(1)
            assert all(isinstance(err, KafkaStorageError) for err in acks.failed)
            assert "No space left" in str(acks.failed[0])
            check_acked(sock, 2, acks.acked)                    # reads go on
            with pytest.raises(KafkaStorageError):
                admin.create_topic("more", 1)                   # metadata write refused
            assert "more" not in admin.list_topics()
            assert not os.path.exists(os.path.join(data_dir, "more-0"))
            with Consumer(socket=sock, group_id="g", enable_auto_commit=False) as consumer:
                consumer.assign([TopicPartition(TOPIC, 0)])
                with pytest.raises(KafkaStorageError):
                    consumer.commit({TopicPartition(TOPIC, 0): 3})
            seam.clear()                                        # space is back
            for i in range(10):
                assert acks.send(i % 2)
            admin.create_topic("more", 1)
            with Consumer(socket=sock, group_id="g", enable_auto_commit=False) as consumer:
                consumer.assign([TopicPartition(TOPIC, 0)])
                consumer.commit({TopicPartition(TOPIC, 0): 3})
            # Offsets run on from the last stored one: none skipped, none reused.
            for p in (0, 1):
                offsets = sorted(o for (q, o) in acks.acked if q == p)
                assert offsets == list(range(len(offsets)))
            assert b.alive
        b.stop()
        assert not os.path.exists(os.path.join(data_dir, files.CLEAN_SHUTDOWN_FILE))
        check_clean_on_disk(data_dir, 2)
        b.start()                                               # recovers; all there
        check_acked(sock, 2, acks.acked)
        with Consumer(socket=sock, group_id="g") as consumer:
            assert consumer.committed(TopicPartition(TOPIC, 0)) == 3
        b.stop()


def test_failed_fsync_acknowledges_nothing_and_takes_only_its_partition_offline():
    with scratch() as (data_dir, sock), InProcessBroker(data_dir, sock) as b:
        with seamed(b) as (seam, admin, acks):
            for i in range(6):
                assert acks.send(i % 2)
            seam.add(Fault(errno.EIO, ops=frozenset({"fdatasync"}),
                           path_contains=f"{TOPIC}-0/"))
            assert not acks.send(0)
            assert "fsync failed" in str(acks.failed[-1]) and "offline" in str(acks.failed[-1])
            # Never retried: the next produce is refused without an fsync claiming success.
            assert not acks.send(0)
            assert "offline" in str(acks.failed[-1])
            assert acks.send(1) and acks.send(1)                # the other partition is fine
            info = admin.describe_topic(TOPIC)
            assert info["offline"][0] and "fsync failed" in info["offline"][0]
            assert info["offline"][1] is None
            check_acked(sock, 2, acks.acked)
        b.stop()
        assert not os.path.exists(os.path.join(data_dir, files.CLEAN_SHUTDOWN_FILE))
        b.start()                                # the restart recovers the partition
        with Admin(sock) as admin, Producer(socket=sock) as producer:
            assert admin.describe_topic(TOPIC)["offline"] == [None, None]
            acks.producer = producer
            assert acks.send(0)
            check_acked(sock, 2, acks.acked)
        b.stop()
        check_clean_on_disk(data_dir, 2)


def test_checkpoints_that_cannot_be_written_never_stop_the_broker():
    with scratch() as (data_dir, sock), \
            InProcessBroker(data_dir, sock, flush_interval_ms=10) as b:
        seam = FaultyDiskIO([Fault(errno.EIO, path_contains="checkpoint", times=-1)])
        with diskio.installed(seam), Admin(sock) as admin, \
                Producer(socket=sock, acks=1) as producer:
            admin.create_topic(TOPIC, 1)
            acks = Acks(producer)
            for _ in range(5):
                assert acks.send(0)
                # Several periodic flushes (every 10 ms) pass while the producer waits.
                producer.send(TOPIC, b"x", partition=0).get(timeout=10)
            deadline = 50
            while len(seam.injected) < 3 and deadline:
                acks.send(0)
                deadline -= 1
            assert len(seam.injected) >= 3 and b.alive
            assert not [n for n in os.listdir(data_dir) if n.endswith(files.TMP_SUFFIX)]
        b.stop()
        assert not os.path.exists(os.path.join(data_dir, files.CLEAN_SHUTDOWN_FILE))
        b.start()
        check_acked(sock, 1, acks.acked)
        b.stop()


def test_produce_is_refused_below_min_free_bytes_before_the_disk_fills():
    with scratch() as (data_dir, sock):
        free = shutil.disk_usage(os.path.dirname(data_dir)).free
        b = InProcessBroker(data_dir, sock, min_free_bytes=free * 4)
        with b, Admin(sock) as admin, Producer(socket=sock, retries=0) as producer, \
                Consumer(socket=sock, group_id="g", enable_auto_commit=False) as consumer:
            admin.create_topic(TOPIC, 1)                      # admin writes go on
            with pytest.raises(KafkaStorageError, match="min_free_bytes") as refused:
                producer.send(TOPIC, b"x", partition=0).get(timeout=10)
            assert refused.value.retriable
            consumer.assign([TopicPartition(TOPIC, 0)])
            consumer.commit({TopicPartition(TOPIC, 0): 0})     # so do offset commits


# --- every write operation failing in turn, under a live broker -----------------------------

WORKLOAD_PARTITIONS = 2


def broker_workload(sock: str, acks: Acks) -> None:
    """Topic creation, acks=all produce across rolls, offset commits, a config change."""
    with Admin(sock) as admin:
        try:
            admin.create_topic(TOPIC, WORKLOAD_PARTITIONS,
                               {"segment.bytes": "600", "index.interval.bytes": "100"})
        except KafkaStorageError:
            return
    with Consumer(socket=sock, group_id="g", enable_auto_commit=False) as consumer:
        consumer.assign([TopicPartition(TOPIC, p) for p in range(WORKLOAD_PARTITIONS)])
        for i in range(24):
            acks.send(i % WORKLOAD_PARTITIONS)
            if i % 8 == 7:
                with contextlib.suppress(KafkaStorageError):
                    consumer.commit({TopicPartition(TOPIC, 0): i})


@pytest.mark.parametrize("mode", ["enospc-once", "short-write", "eio-once"])
def test_every_write_operation_failing_in_turn_under_a_live_broker(mode):
    faults = {"enospc-once": lambda n: [Fault(errno.ENOSPC, ops=ALLOCATING_OPS, after=n)],
              "short-write": lambda n: [Fault(errno.ENOSPC, ops=PWRITE, after=n, short=0.5),
                                        Fault(errno.ENOSPC, ops=PWRITE, after=n)],
              "eio-once": lambda n: [Fault(errno.EIO, after=n)]}[mode]
    n, step = 0, 1
    while True:
        with scratch() as (data_dir, sock), InProcessBroker(data_dir, sock) as b:
            seam = FaultyDiskIO(faults(n))
            with diskio.installed(seam), Producer(socket=sock, retries=0,
                                                  linger_ms=0) as producer:
                acks = Acks(producer)
                broker_workload(sock, acks)
                assert b.alive, b.crashed
                b.stop()
            reached = bool(seam.injected)
            if mode != "eio-once" and reached:
                with_errors = [e for e in acks.failed if not isinstance(e, KafkaStorageError)]
                assert not with_errors, with_errors
            b.start()                                        # no faults: recovery
            with Admin(sock) as admin:
                created = TOPIC in admin.list_topics()
            if created:
                check_acked(sock, WORKLOAD_PARTITIONS, acks.acked)
            else:
                assert not acks.acked
            b.stop()
            if created:
                check_clean_on_disk(data_dir, WORKLOAD_PARTITIONS)
        if not reached:
            break
        n += step
        step = 1 if n < 30 else 7          # every operation early on, then a sample
    assert n > 30, f"the workload reached only {n} write operations"
