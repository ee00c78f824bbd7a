"""``mq.aio.Consumer`` against a real broker: the threaded consumer's reads, awaited in an
event loop with no thread of its own, woken by the broker's push on its connection."""

from __future__ import annotations

import asyncio
import threading

import pytest
from brokers import create_topic

import mq
import mq.aio
from mq.errors import UnknownTopicOrPartitionError

WAIT = 30.0


def produce(socket: str, topic: str, values: list[bytes], partition: int = 0) -> None:
    with mq.Producer(socket=socket, linger_ms=0) as p:
        for v in values:
            p.send(topic, value=v, partition=partition)
        p.flush()


@pytest.fixture
def broker(broker):
    create_topic(broker, "t", 2)
    return broker


async def read(consumer, count: int) -> list:
    got: list = []
    while len(got) < count:
        batch = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), WAIT)
        got += [r for records in batch.values() for r in records]
    return got


def test_reads_what_was_produced_in_order_with_no_thread(broker):
    produce(broker.socket, "t", [b"%d" % i for i in range(500)])

    async def main():
        threads = threading.active_count()
        async with mq.aio.Consumer("t", socket=broker.socket, value_bytes=True) as c:
            got = await read(c, 500)
            assert threading.active_count() == threads
            assert await c.getmany(timeout_ms=50) == {}
            return got
    got = asyncio.run(main())
    assert [(r.partition, r.offset, r.value) for r in got] == \
        [(0, i, b"%d" % i) for i in range(500)]


def test_a_caught_up_consumer_is_woken_by_the_push(broker):
    async def main():
        async with mq.aio.Consumer("t", socket=broker.socket, value_bytes=True) as c:
            waiting = asyncio.ensure_future(c.getmany(timeout_ms=600_000))
            await asyncio.sleep(0)           # armed: the getmany is awaiting the push
            await asyncio.get_running_loop().run_in_executor(
                None, produce, broker.socket, "t", [b"late"], 1)
            batch = await asyncio.wait_for(waiting, WAIT)
            return [(r.partition, r.value) for records in batch.values() for r in records]
    assert asyncio.run(main()) == [(1, b"late")]


def test_iteration_seek_and_position(broker):
    produce(broker.socket, "t", [b"a", b"b", b"c", b"d"])
    tp = mq.TopicPartition("t", 0)

    async def main():
        async with mq.aio.Consumer(socket=broker.socket, value_bytes=True) as c:
            c.assign([tp])
            first = [(await c.__anext__()).value for _ in range(2)]
            assert await c.position(tp) == 2
            c.seek(tp, 1)
            again = []
            async for record in c:
                again.append(record.value)
                if len(again) == 3:
                    break
            await c.seek_to_end(tp)
            assert await c.position(tp) == 4 == (await c.end_offsets([tp]))[tp]
            return first, again
    assert asyncio.run(main()) == ([b"a", b"b"], [b"b", b"c", b"d"])


def test_paused_partitions_are_not_read_until_resumed(broker):
    produce(broker.socket, "t", [b"a0", b"a1"], partition=0)
    produce(broker.socket, "t", [b"b0"], partition=1)
    tp0, tp1 = mq.TopicPartition("t", 0), mq.TopicPartition("t", 1)

    async def main():
        async with mq.aio.Consumer("t", socket=broker.socket, value_bytes=True) as c:
            held = await c.getone()       # a0 (partition 0 is read first); a1, b0 held
            c.pause(tp0, tp1)
            assert c.paused() == {tp0, tp1}
            assert await c.getmany(timeout_ms=50) == {}
            c.resume(tp1)
            assert c.paused() == {tp0}
            only1 = [r.value for r in await read(c, 1)]
            c.resume(tp0)
            rest = [r.value for r in await read(c, 1)]
            return held.value, only1, rest
    held, only1, rest = asyncio.run(main())
    assert held == b"a0" and only1 == [b"b0"] and rest == [b"a1"]


def test_reading_goes_on_across_a_broker_restart(broker):
    produce(broker.socket, "t", [b"before"])

    async def main():
        async with mq.aio.Consumer("t", socket=broker.socket, value_bytes=True) as c:
            assert [r.value for r in await read(c, 1)] == [b"before"]
            broker.kill()
            broker.start()
            await asyncio.get_running_loop().run_in_executor(
                None, produce, broker.socket, "t", [b"after"])
            return [r.value for r in await read(c, 1)]
    assert asyncio.run(main()) == [b"after"]


def test_positions_and_reads_go_on_when_the_brokers_topics_change(broker):
    """Another topic created after start changes the broker's metadata: the next position,
    end offset and read await a refresh instead of failing."""
    tp = mq.TopicPartition("t", 0)

    async def main():
        async with mq.aio.Consumer(socket=broker.socket, value_bytes=True) as c:
            c.assign([tp])
            assert await c.position(tp) == 0
            create_topic(broker, "later", 1)
            produce(broker.socket, "t", [b"x"])
            assert await c.position(tp) == 0
            assert (await c.end_offsets([tp]))[tp] == 1
            await c.seek_to_beginning()
            create_topic(broker, "later-still", 1)
            return [r.value for r in await read(c, 1)]
    assert asyncio.run(main()) == [b"x"]


def test_mistakes_are_clear(broker):
    with pytest.raises(ValueError, match="auto_offset_reset"):
        mq.aio.Consumer("t", auto_offset_reset="soon")

    async def main():
        await mq.aio.Consumer("missing", socket=broker.socket).start()
    with pytest.raises(UnknownTopicOrPartitionError, match="missing"):
        asyncio.run(main())
