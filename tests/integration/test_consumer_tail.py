"""The tail take (``Fetcher._take_tail``, ``_crecords.take_batches``) and the fast tail poll
(``Consumer._poll_tail``, ``_crecords.tail_take``) against the Python path, on a real
broker's files.

A consumer going on where its last read ended, in the active segment, reads plain batches in
one C call; a consumer of one partition also reads the broker's published state in it, and
sleeps on the partition's futex word with no other Python between. At anything else (a
transaction marker, a compressed batch, a rolled segment, a reset position, changed topics)
the Python path reads. Both must hand out the same records in the same polls' worth,
whatever the log holds.
"""

from __future__ import annotations

import time

import pytest

import mq
from mq.client import fetcher
from mq.log import native

pytest.importorskip("mq.log._crecords")


def plain(r) -> tuple:
    def b(v):
        return None if v is None else bytes(v)
    return (r.topic, r.partition, r.offset, r.timestamp_ms, r.timestamp_type, b(r.key),
            b(r.value), [(k, b(v)) for k, v in r.headers])


@pytest.fixture
def counted(monkeypatch):
    """Counts the tail takes that took records (``take_batches``, and ``tail_take``: those of
    the fast tail poll)."""
    took: list[int] = []
    real = native.take_batches

    def take(*args):
        out = real(*args)
        if out[0]:
            took.append(len(out[0]))
        return out
    monkeypatch.setattr(native, "take_batches", take)
    count_tail_takes(monkeypatch, took)
    return took


def count_tail_takes(monkeypatch, took: list[int]) -> None:
    """Append to ``took`` the number of records each fast tail poll's take
    (``native.tail_take``) took, when it took some."""
    real = native.tail_take

    def tail_take(*args):
        out = real(*args)
        if out[0] == fetcher.TAIL_TOOK and out[2]:
            took.append(len(out[2]))
        return out
    monkeypatch.setattr(native, "tail_take", tail_take)


def python_path(monkeypatch) -> None:
    """From now on this process reads through the Python path only (the reference)."""
    monkeypatch.setattr(native, "take_batches", None)
    monkeypatch.setattr(native, "tail_take", None)


def create(socket: str) -> None:
    """Topic ``mixed`` of 2 partitions over segments of 4 KiB; ``appended`` (LogAppendTime)."""
    with mq.Admin(socket=socket) as admin:
        admin.create_topic("mixed", 2, config={"segment.bytes": 4096})
        admin.create_topic("appended", 1, config={"message.timestamp.type": "LogAppendTime"})


def phases(socket: str):
    """Fills ``mixed`` in phases, yielding the number of its records after each: plain
    batches with keys, nulls and headers; lz4 batches; a committed and an aborted
    transaction (markers); plain batches again. ``appended`` gets 60 records."""
    n = 0
    with mq.Producer(socket=socket, linger_ms=0) as p:
        for i in range(60):
            p.send("mixed", b"v%d" % i if i % 7 else None, key=None if i % 3 else b"k%d" % i,
                   headers=[("h", b"x")] if i % 5 == 0 else [], partition=i % 2).get()
            p.send("appended", b"a%d" % i).get()
            n += 1
    yield n
    with mq.Producer(socket=socket, linger_ms=50, compression_type="lz4") as p:
        for i in range(40):
            p.send("mixed", b"z%d" % i * 20, partition=i % 2)
            n += 1
    yield n
    for commit in (True, False):
        with mq.Producer(socket=socket, transactional_id=f"tx-{commit}") as p:
            p.init_transactions()
            p.begin_transaction()
            for i in range(10):
                p.send("mixed", b"t%d" % i, partition=i % 2)
                n += 1
            p.commit_transaction() if commit else p.abort_transaction()
        yield n
    with mq.Producer(socket=socket, linger_ms=0) as p:
        for i in range(30):
            p.send("mixed", b"after%d" % i, partition=i % 2).get()
            n += 1
            if i % 10 == 9:
                yield n


def fill(socket: str) -> int:
    create(socket)
    for n in phases(socket):
        pass
    return n


def read_all(socket: str, topic: str, expected: int, **options) -> list[list[tuple]]:
    """Every poll's records, in order, until ``expected`` records came."""
    polls: list[list[tuple]] = []
    with mq.Consumer(topic, socket=socket, auto_offset_reset="earliest", **options) as c:
        while sum(map(len, polls)) < expected:
            out = c.poll(5000)
            assert out, f"nothing after {sum(map(len, polls))} records"
            polls.append([plain(r) for tp in sorted(out) for r in out[tp]])
    return polls


def records_of(polls) -> list[tuple]:
    return sorted((r for poll in polls for r in poll), key=lambda r: (r[1], r[2]))


@pytest.mark.parametrize("options", [{"max_partition_fetch_bytes": 100},
                                     {"max_partition_fetch_bytes": 100, "max_poll_records": 3},
                                     {"max_partition_fetch_bytes": 700}])
def test_the_tail_take_hands_out_what_the_python_path_does(broker, counted, monkeypatch,
                                                           options):
    """A consumer catching up in small reads goes on from its last read in the active
    segment. The C path hands out the Python path's records; a poll may end earlier, where
    it leaves a batch to the Python path (which takes it at the next poll)."""
    n = fill(broker.socket)
    fast = read_all(broker.socket, "mixed", n, **options)
    assert counted, "the tail take never took anything"
    python_path(monkeypatch)
    assert records_of(fast) == records_of(read_all(broker.socket, "mixed", n, **options))
    assert len(records_of(fast)) == n == len({(r[1], r[2]) for r in records_of(fast)})
    assert max(map(len, fast)) <= options.get("max_poll_records", 500)


def test_a_consumer_tailing_a_mixed_log_reads_what_the_python_path_reads(broker, counted,
                                                                         monkeypatch):
    create(broker.socket)
    polls: list[list[tuple]] = []
    with mq.Consumer("mixed", socket=broker.socket, auto_offset_reset="earliest") as c:
        for n in phases(broker.socket):
            while sum(map(len, polls)) < n:
                out = c.poll(5000)
                assert out, f"nothing after {sum(map(len, polls))} of {n} records"
                polls.append([plain(r) for tp in sorted(out) for r in out[tp]])
    assert counted
    python_path(monkeypatch)
    assert records_of(polls) == records_of(read_all(broker.socket, "mixed", n))


def test_log_append_time_records_carry_the_broker_s_timestamp(broker, counted):
    create(broker.socket)
    with mq.Producer(socket=broker.socket, linger_ms=0) as p, \
            mq.Consumer("appended", socket=broker.socket, auto_offset_reset="earliest") as c:
        got = []
        for i in range(20):
            before = time.time_ns() // 1_000_000
            p.send("appended", b"a%d" % i, timestamp_ms=1).get()
            after = time.time_ns() // 1_000_000
            got += [(r, before, after) for rs in c.poll(5000).values() for r in rs]
    assert len(counted) >= 15
    assert [bytes(r.value) for r, _, _ in got] == [b"a%d" % i for i in range(20)]
    assert all(r.timestamp_type == 1 and before <= r.timestamp_ms <= after
               for r, before, after in got)


def test_a_tailing_consumer_takes_each_new_record_in_c(broker, counted):
    with mq.Admin(socket=broker.socket) as admin:
        admin.create_topic("tail", 1)
    with mq.Producer(socket=broker.socket, linger_ms=0) as p, \
            mq.Consumer("tail", socket=broker.socket, auto_offset_reset="earliest") as c:
        p.send("tail", b"first").get()
        assert [bytes(r.value) for rs in c.poll(5000).values() for r in rs] == [b"first"]
        got = []
        for i in range(50):
            p.send("tail", b"r%d" % i, key=b"k", headers=[("n", b"%d" % i)]).get()
            out = c.poll(5000)
            got += [r for rs in out.values() for r in rs]
        assert [(r.offset, bytes(r.value), bytes(r.headers[0][1])) for r in got] == \
            [(i + 1, b"r%d" % i, b"%d" % i) for i in range(50)]
        assert all(isinstance(r, fetcher.Record) for r in got)
        assert len(counted) >= 45         # after the first read, the C path takes them
        assert c.position(mq.TopicPartition("tail", 0)) == 51
        assert c.poll(0) == {} and c.poll(20) == {}        # caught up: nothing, then waits


def test_a_partition_left_to_python_is_read_while_another_streams(broker, counted):
    """Two partitions tailed together: one stops at a transaction marker, which the fast take
    leaves to the Python path, while the other, read first, keeps receiving. The first one's
    records after the marker still come at the next poll: the poll after a take that left a
    partition to the Python path (and returned another's records) reads through the Python
    path first, so a partition that streams cannot starve it."""
    with mq.Admin(socket=broker.socket) as admin:
        admin.create_topic("pair", 2)
    seen: list[tuple[int, bytes]] = []

    def poll(c, **kw) -> None:
        seen.extend((r.partition, bytes(r.value)) for rs in c.poll(2000, **kw).values()
                    for r in rs)
    with mq.Producer(socket=broker.socket, linger_ms=0) as p, \
            mq.Consumer("pair", socket=broker.socket, auto_offset_reset="earliest") as c:
        p.send("pair", b"a", partition=0).get()
        p.send("pair", b"b", partition=1).get()
        while len(seen) < 2:
            poll(c)
        p.send("pair", b"a2", partition=0).get()
        while (0, b"a2") not in seen:
            poll(c, max_records=1)        # filled on partition 0: the next take starts at 1
        with mq.Producer(socket=broker.socket, transactional_id="pair-tx") as tx:
            tx.init_transactions()
            tx.begin_transaction()
            tx.send("pair", b"t", partition=0)
            tx.commit_transaction()
        p.send("pair", b"after", partition=0).get()
        for i in range(20):
            p.send("pair", b"s%d" % i, partition=1).get()
            poll(c)
            if (0, b"after") in seen:
                break
    assert [v for part, v in seen if part == 0] == [b"a", b"a2", b"t", b"after"]
    assert len([v for part, v in seen if part == 1]) <= 4      # a few polls, not a stream
    assert counted, "the fast take never took anything"


def test_a_group_member_tails_in_c_and_hands_a_partition_over(broker, monkeypatch):
    """A caught-up group member polls through the fast tail poll as an assigned consumer
    does (``tail_take``: from the published state to its records in one C call). A second
    member joining wakes it from that poll's sleep: it reconciles, hands one partition over,
    and each record reaches exactly one member, in order."""
    import threading
    took: list[int] = []
    count_tail_takes(monkeypatch, took)
    with mq.Admin(socket=broker.socket) as admin:
        admin.create_topic("g", 2)
    tps = [mq.TopicPartition("g", p) for p in (0, 1)]
    got: dict[str, list] = {"a": [], "b": []}

    def records(out) -> list:
        return [(r.partition, bytes(r.value)) for rs in out.values() for r in rs]

    with mq.Producer(socket=broker.socket, linger_ms=0) as p, \
            mq.Consumer("g", group_id="tailers", socket=broker.socket,
                        auto_offset_reset="earliest") as a:
        deadline = time.monotonic() + 30
        while set(a.assignment()) != set(tps):
            assert time.monotonic() < deadline, "the first member got no assignment"
            got["a"] += records(a.poll(100))
        for i in range(40):
            p.send("g", b"a%d" % i, partition=i % 2).get()
            want = len(got["a"]) + 1
            while len(got["a"]) < want:
                assert time.monotonic() < deadline + 30, "a record did not come"
                got["a"] += records(a.poll(5000))
        assert len(took) >= 30                    # caught up: the fast tail poll takes them
        stop = threading.Event()

        def poll_a():
            while not stop.is_set():
                got["a"].extend(records(a.poll(200)))

        poller = threading.Thread(target=poll_a)
        poller.start()
        try:
            with mq.Consumer("g", group_id="tailers", socket=broker.socket,
                             auto_offset_reset="earliest") as b:
                deadline = time.monotonic() + 30
                while len(b.assignment()) != 1 or len(a.assignment()) != 1:
                    assert time.monotonic() < deadline, "the partition was not handed over"
                    got["b"] += records(b.poll(100))
                for i in range(40, 80):
                    p.send("g", b"a%d" % i, partition=i % 2).get()
                deadline = time.monotonic() + 30
                while len(got["a"]) + len(got["b"]) < 80:
                    assert time.monotonic() < deadline, "records did not come"
                    got["b"] += records(b.poll(100))
                (mine,) = b.assignment()
        finally:
            stop.set()
            poller.join(30)
    sent = {(i % 2, b"a%d" % i) for i in range(80)}
    everything = got["a"] + got["b"]
    assert sorted(everything) == sorted(sent)      # each record once
    for who in ("a", "b"):
        for part in (0, 1):
            values = [int(v[1:]) for q, v in got[who] if q == part]
            assert values == sorted(values)        # in order per partition
    assert all(q == mine.partition for q, v in got["b"] if int(v[1:]) >= 40)
