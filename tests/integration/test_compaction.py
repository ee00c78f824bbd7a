"""Compaction in a running broker: the cleaner thread, real clients, kill -9.

Each test runs a broker subprocess on its own data dir with ``cleaner_backoff_ms = 50`` (the
idle cleaner looks again 20 times a second) and topics with tiny segments and
``min.cleanable.dirty.ratio`` 0.01, so every few KB of updates are cleaned. The producer's
``max_request_size`` keeps batches around 1 KB — a busy producer would otherwise grow a batch
past ``segment.bytes``, and the cleaner never touches the active segment. Nothing sleeps to
wait: conditions are polled with ``mq.testing.wait_for``; the only sleep picks the moment of a
kill -9.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import os
import random
import re
import threading
import time
from collections.abc import Iterator

import pytest
from cli_run import mq_run

import mq
import mq.testing
from mq.testing import wait_for

TOPIC = "c"
TP = mq.TopicPartition(TOPIC, 0)
KEYS = [b"key-%02d" % i for i in range(10)]
PAD = b"." * 40
COMPACTING = {"cleanup.policy": "compact", "segment.bytes": "4096",
              "min.cleanable.dirty.ratio": "0.01"}
SETTLE_S = 60.0                 # generous: several cleaner passes on a loaded 2-vCPU box
PASS_LINE = re.compile(rb"cleaned ([1-9]\d*) segment")


@contextlib.contextmanager
def compacting_broker(tmp_path, backoff_ms: int = 50) -> Iterator[mq.testing.BrokerProcess]:
    conf = tmp_path / "mq.toml"
    conf.write_text(f"cleaner_backoff_ms = {backoff_ms}\n")
    # INFO: the cleaner logs each pass, which tests count.
    with mq.testing.broker(tmp_path / "data", config_file=str(conf), log_level="INFO") as b:
        yield b


def create(b, **config: str) -> None:
    with mq.Admin(socket=b.socket) as admin:
        admin.create_topic(TOPIC, 1, config={**COMPACTING, **config})


def value(key: bytes, seq: int) -> bytes:
    return b"%s=%08d" % (key, seq) + PAD


def seq_of(v: bytes) -> int:
    return int(v.split(b"=")[1][:8])


class Writer:
    """Updates of ``KEYS`` (acks=all) and what was acknowledged: key -> latest value."""

    def __init__(self, b) -> None:
        self.producer = mq.Producer(socket=b.socket, acks="all", linger_ms=1,
                                    batch_size=1024, max_request_size=1024)
        self.seq = 0
        self.acked: dict[bytes, bytes | None] = {}
        self._lock = threading.Lock()

    def updates(self, count: int, keys: list[bytes] = KEYS) -> None:
        sent = {}
        for _ in range(count):
            key = keys[self.seq % len(keys)]
            sent[key] = value(key, self.seq)
            self.producer.send(TOPIC, value=sent[key], key=key, partition=0)
            self.seq += 1
        self.producer.flush()
        with self._lock:
            self.acked.update(sent)

    def tombstones(self, keys: list[bytes]) -> None:
        for key in keys:
            self.producer.send(TOPIC, value=None, key=key, partition=0)
        self.producer.flush()
        with self._lock:
            self.acked.update(dict.fromkeys(keys))

    def filler(self, count: int = 100) -> None:
        """Distinct keys, so the updates before them leave the active segment."""
        for i in range(count):
            self.producer.send(TOPIC, value=PAD, key=b"filler-%d-%d" % (self.seq, i),
                               partition=0)
        self.seq += 1
        self.producer.flush()

    def snapshot(self) -> dict[bytes, bytes | None]:
        with self._lock:
            return dict(self.acked)

    def close(self) -> None:
        self.producer.close()


def burst(b, count: int, *, seq: int = 0, tombstones: list[bytes] | None = None,
          filler: bool = False) -> dict[bytes, bytes | None]:
    """A new ``Writer``'s ``count`` updates numbered from ``seq``, then ``tombstones`` and, if
    asked, filler; returns what it acknowledged (key -> latest value) and closes it."""
    writer = Writer(b)
    writer.seq = seq
    writer.updates(count)
    if tombstones:
        writer.tombstones(tombstones)
    if filler:
        writer.filler()
    acked = writer.snapshot()
    writer.close()
    return acked


def read_pass(consumer: mq.Consumer, timeout_s: float = 30.0
              ) -> list[tuple[int, bytes, bytes | None]]:
    """Everything from the log start to the end offset as of the pass's end: reads until
    the position reaches an end offset fetched after the last poll, so a record the cleaner
    removed during the pass has its replacement (below that end) read too."""
    consumer.seek_to_beginning(TP)
    rows = []
    deadline = time.monotonic() + timeout_s
    while consumer.position(TP) < consumer.end_offsets([TP])[TP]:
        assert time.monotonic() < deadline, "a pass over the log did not finish"
        for records in consumer.poll(timeout_ms=200).values():
            rows += [(r.offset, bytes(r.key), None if r.value is None else bytes(r.value))
                     for r in records]
    return rows


def read_all(b) -> list[tuple[int, bytes, bytes | None]]:
    with mq.Consumer(socket=b.socket) as consumer:
        consumer.assign([TP])
        return read_pass(consumer)


def latest(rows) -> dict[bytes, bytes | None]:
    out = {}
    for _, key, v in rows:
        out[key] = v
    return out


def compacted(rows, expected: dict[bytes, bytes | None]) -> bool:
    """One record per key of ``expected`` (none for a key whose latest is a tombstone that
    expired), holding its latest value."""
    counts = collections.Counter(key for _, key, _ in rows if key in expected)
    found = latest(rows)
    return all(counts[key] == 1 and found[key] == v for key, v in expected.items()
               if v is not None) and \
        all(key not in found for key, v in expected.items() if v is None)


def assert_offsets_increase(rows) -> None:
    offsets = [offset for offset, _, _ in rows]
    assert all(a < b for a, b in itertools.pairwise(offsets)), "offsets must increase"


def cleaner_passes(b) -> int:
    """Passes that rewrote segments, from the broker's log."""
    with open(b.stderr_path, "rb") as f:
        return len(PASS_LINE.findall(f.read()))


@pytest.mark.parametrize("policy", ["compact", "compact,delete"])
def test_the_cleaner_keeps_the_latest_record_of_each_key(tmp_path, policy):
    with compacting_broker(tmp_path) as b:
        create(b, **{"cleanup.policy": policy})
        expected = burst(b, 3000, filler=True)
        wait_for(lambda: compacted(read_all(b), expected), timeout=SETTLE_S,
                 message="one record per key with its latest value")
        rows = read_all(b)
        assert_offsets_increase(rows)
        assert rows[0][0] > 0 and rows[-1][0] + 1 > len(rows), "compaction leaves gaps"
        assert latest(rows)[KEYS[0]] == expected[KEYS[0]]
        assert cleaner_passes(b) >= 1


def test_tombstones_disappear_after_delete_retention_ms(tmp_path):
    with compacting_broker(tmp_path) as b:
        create(b, **{"delete.retention.ms": "1000"})
        expected = burst(b, 500, tombstones=KEYS[:5], filler=True)
        # Gone only after a second pass at least 1 s after the first kept them.
        wait_for(lambda: compacted(read_all(b), expected), timeout=SETTLE_S,
                 message="tombstoned keys gone, the others at their latest value")
        rows = read_all(b)
        assert {key for _, key, _ in rows} >= set(KEYS[5:])
        assert all(v is not None for _, _, v in rows)


class RepeatedReader(threading.Thread):
    """Reads the partition from the beginning again and again while it is written and
    cleaned. In every pass: offsets increase, and every key is at least at the latest value
    acknowledged before the pass began (the cleaner never takes a latest record away)."""

    def __init__(self, b, writer: Writer) -> None:
        super().__init__(name="repeated-reader", daemon=True)
        self.socket = b.socket
        self.writer = writer
        self.passes = 0
        self.last: dict[bytes, bytes | None] = {}
        self.error: BaseException | None = None
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            with mq.Consumer(socket=self.socket) as consumer:
                consumer.assign([TP])
                while not self.stopping.is_set():
                    before = self.writer.snapshot()
                    rows = read_pass(consumer)
                    assert_offsets_increase(rows)
                    found = latest(rows)
                    for key, v in before.items():
                        assert key in found and seq_of(found[key]) >= seq_of(v), \
                            f"pass {self.passes}: {key!r} at {found.get(key)!r}, acked {v!r}"
                    self.last = found
                    self.passes += 1
        except BaseException as err:      # reported by the test
            self.error = err


def test_a_reader_repeating_from_the_beginning_during_swaps_always_sees_the_latest(tmp_path):
    with compacting_broker(tmp_path) as b:
        create(b, **{"file.delete.delay.ms": "0"})   # replaced files unlinked at once
        writer = Writer(b)
        writer.updates(200)
        reader = RepeatedReader(b, writer)
        reader.start()
        try:
            passes_at_start = cleaner_passes(b)
            rounds = 0
            while rounds < 20 or cleaner_passes(b) < passes_at_start + 10:
                assert rounds < 2000 and reader.error is None, reader.error
                writer.updates(200)
                rounds += 1
            writer.filler()
            expected = writer.snapshot()
            wait_for(lambda: reader.error is not None or compacted(read_all(b), expected),
                     timeout=SETTLE_S, message="the compacted final state")
            seen = reader.passes
            wait_for(lambda: reader.error is not None or reader.passes > seen + 1,
                     timeout=SETTLE_S, message="two more reader passes")
        finally:
            reader.stopping.set()
            reader.join(60)
            writer.close()
        assert reader.error is None, reader.error
        assert {k: reader.last[k] for k in KEYS} == {k: expected[k] for k in KEYS}
        assert reader.passes > 2


def test_kill_9_while_cleaning_keeps_every_latest_value(tmp_path):
    """Kill -9 shortly after a burst of updates — while the cleaner works through them — and
    restart, until kills caught a pass with ``.cleaned``/``.swap`` files on disk twice (most
    kills do: ~2 in 3 on an idle box). After every restart each key is at its latest
    acknowledged value; after a clean stop ``mq log check`` finds nothing wrong."""
    rng = random.Random(os.getpid())
    partition_dir = tmp_path / "data" / f"{TOPIC}-0"
    with compacting_broker(tmp_path, backoff_ms=10) as b:
        create(b, **{"segment.bytes": "8192"})
        acked: dict[bytes, bytes | None] = {}
        caught_mid_pass = cycles = 0
        while cycles < 6 or caught_mid_pass < 2:
            assert cycles < 40, f"only {caught_mid_pass} kill(s) during a pass"
            acked.update(burst(b, 2000, seq=cycles * 100_000))
            time.sleep(rng.uniform(0.0, 0.06))    # the kill moment, not a wait: see the doc
            b.kill()
            caught_mid_pass += any(name.endswith((".cleaned", ".swap"))
                                   for name in os.listdir(partition_dir))
            b.start()
            rows = read_all(b)
            assert_offsets_increase(rows)
            assert latest(rows) == acked, f"after kill {cycles}"
            cycles += 1
        b.stop()
        check = mq_run("log", "check", partition_dir, timeout=120)
        assert check.code == 0, check
        assert ": OK:" in check.out


def test_deleting_a_topic_while_it_is_cleaned_breaks_nothing(tmp_path):
    """Delete the topic right after a burst of updates (the cleaner is on it), many times;
    create it again each time. The broker stays up, logs no error, and the new topic, whose
    cleaner checkpoint entry went with the old one, is compacted from its start."""
    with compacting_broker(tmp_path, backoff_ms=10) as b:
        with mq.Admin(socket=b.socket) as admin:
            for _ in range(6):
                create(b)
                burst(b, 1000)
                admin.delete_topic(TOPIC)
            create(b)
        expected = burst(b, 1000, filler=True)
        wait_for(lambda: compacted(read_all(b), expected), timeout=SETTLE_S,
                 message="the topic created again to be compacted")
        assert b.proc.poll() is None
        log_text = b.stderr()
        assert "Traceback" not in log_text and " ERROR " not in log_text, log_text[-3000:]


def test_sigterm_while_cleaning_stops_cleanly(tmp_path):
    with compacting_broker(tmp_path, backoff_ms=10) as b:
        create(b)
        acked: dict[bytes, bytes | None] = {}
        for cycle in range(4):
            acked.update(burst(b, 1000, seq=cycle * 100_000))
            assert b.stop(timeout=30) == 0, b.stderr()[-3000:]
            assert os.path.exists(tmp_path / "data" / ".kafka_cleanshutdown")
            assert not [n for n in os.listdir(tmp_path / "data" / f"{TOPIC}-0")
                        if n.endswith((".cleaned", ".swap"))]
            b.start()
            assert latest(read_all(b)) == acked
