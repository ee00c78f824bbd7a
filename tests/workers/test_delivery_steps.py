"""``Delivery``'s operations over scripted clients instead of a broker: the steps a send, a
commit and a transaction take, at least once and exactly once, and what a refused output, a
commit that times out and a fenced producer do. The runner is ``SyncClients.run``; the
steps answer from a script (``Scripted``), as ``tests/unit/client/test_transaction_requests``
answers the transactional producer's requests."""

from __future__ import annotations

import functools

import pytest

import mq
from mq.errors import MessageTooLargeError, ProducerFencedError, UnknownTopicOrPartitionError
from workers.clients import AsyncClients, SyncClients
from workers.config import HandlerRef, PoolConfig
from workers.delivery import BadOutput, Delivery, MissingOutputTopic, TransactionAborted

TP = mq.TopicPartition("in", 0)


class Future:
    """A send's outcome, as the scripted clients' ``outcomes`` reads it."""

    def __init__(self, error: BaseException | None = None) -> None:
        self.error = error


class Scripted(SyncClients):
    """Every step recorded in ``calls``; ``errors[step]``: exceptions raised by its next
    calls; ``missing``: topics that do not exist; ``refused``: output values whose send
    raises ``MessageTooLargeError`` at once; ``lost``: values whose futures fail so."""

    def __init__(self) -> None:
        super().__init__({}, {"topics": ()})
        self.calls: list[tuple] = []
        self.errors: dict[str, list[BaseException]] = {}
        self.missing: set[str] = set()
        self.refused: set[bytes] = set()
        self.lost: set[bytes] = set()
        self.callback = None

    def called(self, name: str, *args) -> None:
        self.calls.append((name, *args))
        pending = self.errors.get(name)
        if pending:
            raise pending.pop(0)

    def names(self) -> list[str]:
        return [call[0] for call in self.calls]

    def partitions_for(self, topic):
        self.called("partitions_for", topic)
        if topic in self.missing:
            raise UnknownTopicOrPartitionError(topic)
        return {0}

    def send(self, output):
        self.called("send", output)
        if output[2] in self.refused:
            raise MessageTooLargeError("too large")
        return Future(MessageTooLargeError("too large") if output[2] in self.lost else None)

    def send_and_wait(self, output):
        self.called("send_and_wait", output)
        if output[2] in self.lost:
            raise MessageTooLargeError("too large")

    def outcomes(self, futures):
        self.called("outcomes", futures)
        return [f.error for f in futures]

    def commit_async(self, offsets, callback):
        self.called("commit_async", offsets)
        self.callback = lambda: callback(offsets, None)

    # The steps with nothing to answer: recorded (or raising what ``errors`` holds).
    begin_transaction = functools.partialmethod(called, "begin_transaction")
    flush = functools.partialmethod(called, "flush")
    send_offsets = functools.partialmethod(called, "send_offsets")
    commit_transaction = functools.partialmethod(called, "commit_transaction")
    abort_transaction = functools.partialmethod(called, "abort_transaction")
    commit = functools.partialmethod(called, "commit")


class Record:
    def __init__(self, offset: int, value: bytes = b"v") -> None:
        self.topic, self.partition, self.offset = TP.topic, TP.partition, offset
        self.key, self.value, self.headers, self.timestamp_ms = b"k", value, [], 0


def delivery(**options) -> Delivery:
    config = PoolConfig(handler=HandlerRef("m", "f"), topics=("in",), group_id="g",
                        stats_path="/nowhere", **options)
    return Delivery(config, 0)


def test_at_least_once_outputs_are_checked_once_and_flushed_before_an_async_commit():
    d, c = delivery(), Scripted()
    first = d.send_now([("out", b"k", b"a", None)], Record(0), c.send)
    c.run(first)                                   # the topic is new: the operation checks it
    assert c.names() == ["partitions_for", "send"]
    assert d.send_now([("out", b"k", b"b", None)], Record(1), c.send) is None   # at once
    d.done[TP] = 2
    c.calls.clear()
    c.run(d.commit())
    assert c.names() == ["flush", "outcomes", "commit_async"]
    c.calls.clear()
    c.run(d.commit())                              # one async commit in flight at a time
    assert c.names() == [] and d.committed == {}
    c.callback()
    assert d.committed == {TP: 2}


def test_a_missing_output_topic_sends_nothing():
    d, c = delivery(), Scripted()
    c.missing.add("nope")
    with pytest.raises(MissingOutputTopic, match="nope"):
        c.run(d.send_normalized([("out", None, b"a", None), ("nope", None, b"b", None)],
                                Record(0)))
    assert "send" not in c.names()


def test_at_least_once_an_output_refused_later_is_dead_lettered_at_the_commit():
    d, c = delivery(), Scripted()
    dead = []

    def on_refused(record, error, dead_letter):
        dead.append((record.offset, error, dead_letter))
        yield from ()
    d.on_refused = on_refused
    c.lost.add(b"big")
    c.run(d.send_normalized([("out", None, b"big", None)], Record(5)))
    d.done[TP] = 6
    c.run(d.commit(sync=True))
    assert dead == [(5, "BadOutput: MessageTooLargeError: too large", False)]
    assert c.names()[-2:] == ["send_and_wait", "commit"] and d.committed == {TP: 6}


def test_at_least_once_an_output_refused_at_once_fails_the_attempt():
    d, c = delivery(), Scripted()
    c.refused.add(b"big")
    with pytest.raises(BadOutput, match="MessageTooLargeError"):
        c.run(d.send_normalized([("out", None, b"big", None)], Record(0)))


def test_exactly_once_a_transaction_commits_its_offsets_and_calls_again_on_timeout(caplog):
    d, c = delivery(exactly_once=True), Scripted()
    c.run(d.send_normalized([("out", None, b"a", None)], Record(0)))
    assert c.names() == ["partitions_for", "begin_transaction", "send"]
    assert d.send_now([("out", None, b"b", None)], Record(1), c.send) is None  # open: at once
    d.done[TP] = 2
    c.errors["commit_transaction"] = [TimeoutError("still committing")]
    c.calls.clear()
    c.run(d.commit())
    assert c.names() == ["send_offsets", "commit_transaction", "commit_transaction"]
    assert c.calls[0][1] == {TP: 2} and d.committed == {TP: 2}
    assert [r.getMessage() for r in caplog.records if r.name == "workers.delivery"] == [
        "commit transaction did not finish (call 1 of 10), calling it again: still committing"]
    assert d.send_now([("out", None, b"c", None)], Record(2), c.send) is not None  # a new txn


def test_exactly_once_a_refused_output_aborts_the_transaction_naming_its_record():
    d, c = delivery(exactly_once=True), Scripted()
    c.refused.add(b"big")
    c.run(d.send_normalized([("out", None, b"a", None)], Record(0)))
    with pytest.raises(TransactionAborted) as caught:
        c.run(d.send_normalized([("out", None, b"big", None)], Record(1)))
    assert [(r.offset, dead_letter) for r, _, dead_letter in caught.value.refused] == \
        [(1, False)]
    assert c.names()[-2:] == ["outcomes", "abort_transaction"]


def test_exactly_once_fenced_is_raised_as_it_is():
    d, c = delivery(exactly_once=True), Scripted()
    c.run(d.send_normalized([("out", None, b"a", None)], Record(0)))
    d.done[TP] = 1
    c.errors["send_offsets"] = [ProducerFencedError("a newer producer")]
    with pytest.raises(ProducerFencedError):
        c.run(d.commit())
    assert "abort_transaction" not in c.names()


class AsyncScripted(Scripted):
    """``Scripted`` whose steps are awaited, as ``AsyncClients``' are (``run`` returns the
    coroutine); ``consumer``: what ``AsyncEngine`` asks locally (nothing paused)."""

    class Consumer:
        def paused(self):
            return set()

    def __init__(self) -> None:
        super().__init__()
        self.consumer = self.Consumer()

    run = AsyncClients.run

    def position(self, tp):
        self.called("position", tp)
        return 0


def test_the_async_engines_commit_waits_for_the_broker_inside_its_task(tmp_path):
    """``AsyncEngine.commit`` (the loop's commit task) commits synchronously. A
    ``commit_async`` is a task of ``AsyncClients`` whose first step, not the call, hands the
    commit to the consumer: the loop's next poll could reach the consumer's thread first, its
    revocation commit newer positions, and the stale commit then move them back (the next
    owner handled those records again, on mq's Kafka listener)."""
    import asyncio

    from workers.aio import AsyncEngine
    from workers.handling import Counters
    from workers.stats import StatsTable

    config = PoolConfig(handler=HandlerRef("m", "f"), topics=("in",), group_id="g",
                        stats_path=str(tmp_path / "stats"))
    table = StatsTable.create(str(tmp_path / "stats"), "g", ["in"], 1, config.concurrency)
    try:
        d, c = delivery(), AsyncScripted()
        engine = AsyncEngine(config, 0, None, c, d, table, Counters(table, 0), lambda: False)
        d.done[TP] = 7
        asyncio.run(engine.commit())
        assert c.calls == [("position", TP), ("commit", {TP: 7})] and d.committed == {TP: 7}
    finally:
        table.close()


def test_a_sync_commit_that_may_be_retried_later_logs_its_failure_and_confirms_nothing(caplog):
    d, c = delivery(), Scripted()
    d.done[TP] = 3
    c.errors["commit"] = [mq.errors.CommitFailedError("rebalance in progress")]
    with pytest.raises(mq.errors.CommitFailedError):
        c.run(d.commit(sync=True))
    c.errors["commit"] = [mq.errors.CommitFailedError("rebalance in progress")]
    c.run(d.commit(sync=True, retry_later=True))
    assert d.committed == {} and "commit failed (the next one retries it)" in caplog.text
    c.run(d.commit(sync=True, retry_later=True))
    assert d.committed == {TP: 3} and c.names() == ["commit"] * 3
