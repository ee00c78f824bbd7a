"""aiokafka 0.14 against the Kafka listener: produce and consume (non-flexible versions on its
whole data path), a consumer group with commits, and ``enable_idempotence=True``."""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from kclients import WAIT, create_topic


def run(main) -> None:
    """``asyncio.run`` bounded in time: a client retrying forever (a group the broker refuses
    to join, say) fails the test instead of hanging it, even inside ``stop()``."""
    asyncio.run(asyncio.wait_for(main(), 3 * WAIT))


async def take(consumer: AIOKafkaConsumer, count: int) -> list:
    """``count`` records from ``getmany``; fails if fewer come within WAIT seconds."""
    out: list = []

    async def loop() -> None:
        while len(out) < count:
            for records in (await consumer.getmany(timeout_ms=200)).values():
                out.extend(records)
    try:
        await asyncio.wait_for(loop(), WAIT)
    except TimeoutError as err:
        raise AssertionError(f"got {len(out)} of {count}: {out}") from err
    return out


def test_produce_consume_group_commit(kafka_mq):
    b = kafka_mq.bootstrap
    create_topic(b, "ak", 2)

    def member() -> AIOKafkaConsumer:
        return AIOKafkaConsumer("ak", bootstrap_servers=b, group_id="akg",
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                fetch_max_wait_ms=100, session_timeout_ms=6000,
                                heartbeat_interval_ms=500)

    async def main() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=b)
        await producer.start()
        try:
            sent = [await producer.send_and_wait("ak", value=b"v%d" % i, key=b"k%d" % i,
                                                 partition=i % 2, timestamp_ms=5_000 + i,
                                                 headers=[("n", b"%d" % i)])
                    for i in range(10)]
            assert [(m.partition, m.offset) for m in sent] == [(i % 2, i // 2)
                                                               for i in range(10)]
            consumer = member()
            await consumer.start()
            try:
                got = sorted(await take(consumer, 10), key=lambda r: (r.partition, r.offset))
                assert [(r.partition, r.offset, r.key, r.value, list(r.headers), r.timestamp)
                        for r in got] == [
                    (p, i // 2, b"k%d" % i, b"v%d" % i, [("n", b"%d" % i)], 5_000 + i)
                    for p in (0, 1) for i in range(p, 10, 2)]
                assert consumer.assignment() == {TopicPartition("ak", 0),
                                                 TopicPartition("ak", 1)}
                await consumer.commit()
                assert await consumer.committed(TopicPartition("ak", 0)) == 5
                assert await consumer.committed(TopicPartition("ak", 1)) == 5
            finally:
                await consumer.stop()
            await producer.send_and_wait("ak", value=b"late", partition=0)
            consumer = member()
            await consumer.start()
            try:
                [record] = await take(consumer, 1)          # resumes at the committed offsets
                assert (record.partition, record.offset, record.value) == (0, 5, b"late")
            finally:
                await consumer.stop()
        finally:
            await producer.stop()
    run(main)


def test_idempotent_producer(kafka_mq):
    b = kafka_mq.bootstrap
    create_topic(b, "akidem", 2)

    async def main() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=b, enable_idempotence=True, linger_ms=5)
        await producer.start()
        try:
            futures = [await producer.send("akidem", value=b"v%d" % i, partition=i % 2)
                       for i in range(100)]
            sent = await asyncio.gather(*futures)
        finally:
            await producer.stop()
        for p in (0, 1):
            assert [m.offset for m in sent if m.partition == p] == list(range(50))
        consumer = AIOKafkaConsumer(bootstrap_servers=b, fetch_max_wait_ms=100,
                                    enable_auto_commit=False)
        await consumer.start()
        try:
            parts = [TopicPartition("akidem", 0), TopicPartition("akidem", 1)]
            consumer.assign(parts)
            await consumer.seek_to_beginning(*parts)
            got = await take(consumer, 100)
        finally:
            await consumer.stop()
        for p in (0, 1):
            assert [(r.offset, r.value) for r in got if r.partition == p] == [
                (i // 2, b"v%d" % i) for i in range(p, 100, 2)]
    run(main)
