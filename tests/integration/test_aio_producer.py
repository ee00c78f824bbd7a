"""``mq.aio.Producer`` against a real broker: the threaded producer's record path, sender and
transactions, driven by an event loop with no thread of its own."""

from __future__ import annotations

import asyncio
import threading

import pytest
from brokers import create_topic

import mq
import mq.aio
from mq.client.partitioner import murmur2
from mq.errors import (ClosedError, InvalidTxnStateError, ProducerFencedError,
                       UnknownTopicOrPartitionError)

WAIT = 30.0


@pytest.fixture
def broker(broker):
    create_topic(broker, "t", 3)
    return broker


def read_all(socket: str, topic: str = "t", committed: bool = False) -> list:
    """Every record of ``topic``, ``(partition, offset, key, value)``, in log order."""
    isolation = "read_committed" if committed else "read_uncommitted"
    with mq.Consumer(topic, socket=socket, auto_offset_reset="earliest", value_bytes=True,
                     isolation_level=isolation) as c:
        ends = c.end_offsets(list(c.assignment()))
        got: list = []
        while any(c.position(tp) < end for tp, end in ends.items()):
            got += [(r.partition, r.offset, r.key, r.value)
                    for records in c.poll(timeout_ms=1000).values() for r in records]
    return sorted(got)


def test_records_arrive_in_order_and_where_the_threaded_producer_puts_them(broker):
    async def main():
        threads = threading.active_count()
        async with mq.aio.Producer(broker.socket, linger_ms=2) as p:
            futures = [await p.send("t", b"%d" % i, key=b"k%d" % (i % 7)) for i in range(700)]
            done = [await f for f in futures]
            assert threading.active_count() == threads       # no thread of its own
            return done
    done = asyncio.run(main())
    for i, md in enumerate(done):
        assert md.partition == (murmur2(b"k%d" % (i % 7)) & 0x7FFFFFFF) % 3
    log = read_all(broker.socket)
    assert [(p, o) for p, o, _, _ in log] == sorted((md.partition, md.offset) for md in done)
    for p in range(3):
        values = [int(v) for q, _, _, v in log if q == p]
        assert values == sorted(values)                      # in send order per partition


def test_a_lingering_record_leaves_without_a_flush(broker):
    async def main():
        async with mq.aio.Producer(broker.socket, linger_ms=50) as p:
            future = await p.send("t", b"alone", partition=1)
            return await asyncio.wait_for(future, WAIT)
    md = asyncio.run(main())
    assert (md.partition, md.offset) == (1, 0)


def test_send_and_wait_and_serializers_run_once_per_record(broker):
    calls: list = []

    def serialize(value):
        calls.append(value)
        return value.encode()

    async def main():
        async with mq.aio.Producer(broker.socket, value_serializer=serialize,
                                   key_serializer=str.encode,
                                   transactional_id="once") as p:
            async with p.transaction():        # the first send of a partition waits for it
                md = await p.send_and_wait("t", "v", key="k", partition=2)
            return md
    md = asyncio.run(main())
    assert calls == ["v"]
    assert read_all(broker.socket, committed=True) == [(2, md.offset, b"k", b"v")]


def test_acknowledged_records_survive_kill_9_exactly_once(broker):
    """acks=all and idempotence: the broker is killed with -9 and restarted while records are
    in flight; every acknowledged record is in the log once, in order, none twice."""
    async def main():
        loop = asyncio.get_running_loop()
        acked: list = []
        async with mq.aio.Producer(broker.socket, linger_ms=1, retries=1000,
                                   delivery_timeout_ms=120_000) as p:
            futures = []
            for i in range(3000):
                futures.append(await p.send("t", b"%d" % i, partition=0))
                if i == 1500:
                    await futures[1000]
                    broker.kill()
                    await loop.run_in_executor(None, broker.start)
            for f in futures:
                acked.append(int((await asyncio.wait_for(f, WAIT)) is not None))
        return acked
    acked = asyncio.run(main())
    assert sum(acked) == 3000
    values = [int(v) for _, _, _, v in read_all(broker.socket)]
    assert values == list(range(3000))


def test_transactions_commit_abort_and_fencing(broker):
    async def main():
        async with mq.aio.Producer(broker.socket, transactional_id="tx") as p:
            async with p.transaction():
                await p.send("t", b"committed", partition=0)
            with pytest.raises(RuntimeError):
                async with p.transaction():
                    await p.send("t", b"aborted", partition=0)
                    raise RuntimeError("the block failed")
            await p.begin_transaction()
            await p.send("t", b"zombie's", partition=1)
            async with mq.aio.Producer(broker.socket, transactional_id="tx") as newer:
                async with newer.transaction():
                    await newer.send("t", b"newer", partition=1)
            with pytest.raises(ProducerFencedError):
                await p.commit_transaction()
            with pytest.raises(ProducerFencedError):
                await p.begin_transaction()
    asyncio.run(main())
    assert [v for *_, v in read_all(broker.socket, committed=True)] == [b"committed",
                                                                           b"newer"]


def test_offsets_commit_with_the_transaction(broker):
    tp = mq.TopicPartition("t", 0)

    async def main():
        async with mq.aio.Producer(broker.socket, transactional_id="etl") as p:
            async with p.transaction():
                await p.send("t", b"out", partition=1)
                await p.send_offsets_to_transaction({tp: 42}, "readers")
            await p.begin_transaction()
            await p.send_offsets_to_transaction({tp: 99}, "readers")
            await p.abort_transaction()
    asyncio.run(main())
    with mq.Admin(broker.socket) as admin:
        assert admin.list_group_offsets("readers")[tp] == 42


def test_sends_go_on_across_a_broker_restart(broker):
    async def main():
        async with mq.aio.Producer(broker.socket, linger_ms=0) as p:
            await p.send_and_wait("t", b"before", partition=0)
            broker.kill()
            await asyncio.get_running_loop().run_in_executor(None, broker.start)
            return await asyncio.wait_for(p.send_and_wait("t", b"after", partition=0), WAIT)
    md = asyncio.run(main())
    assert md.offset == 1
    assert [v for *_, v in read_all(broker.socket)] == [b"before", b"after"]


def test_stop_flushes_and_mistakes_are_clear(broker):
    async def main():
        p = mq.aio.Producer(broker.socket, linger_ms=60_000)
        future = await p.send("t", b"flushed by stop", partition=0)   # starts it
        await p.stop()
        assert (await future).offset == 0
        with pytest.raises(ClosedError):
            await p.send("t", b"late")
        async with mq.aio.Producer(broker.socket) as q:
            with pytest.raises(UnknownTopicOrPartitionError, match="missing"):
                await q.send("missing", b"x")
            with pytest.raises(UnknownTopicOrPartitionError, match="no partition 9"):
                await q.send("t", b"x", partition=9)
            with pytest.raises(TypeError):
                await q.send("t", 12)
            with pytest.raises(InvalidTxnStateError, match="transactional_id"):
                await q.begin_transaction()
    asyncio.run(main())
    with pytest.raises(ValueError, match="acks"):
        mq.aio.Producer(acks=2)
