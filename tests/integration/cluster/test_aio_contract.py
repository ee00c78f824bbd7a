"""mq.aio's clients with ``bootstrap_servers=``: the same coroutines on mq's Kafka listener
and on a real Kafka cluster (``conftest.backend``)."""

from __future__ import annotations

import asyncio

import mq
import mq.aio
from mq import TopicPartition

WAIT_S = 30.0


async def _read(consumer, count: int) -> list:
    out: list = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT_S
    while len(out) < count and loop.time() < deadline:
        for records in (await consumer.getmany(timeout_ms=200)).values():
            out.extend(records)
    return out


def test_produce_and_consume_in_a_group(backend):
    name, group = backend.name("t"), backend.name("g")
    assigned: list = []

    class Listener:
        async def on_partitions_assigned(self, tps):   # a coroutine, run on the loop
            await asyncio.sleep(0)
            assigned.append(tps)

        def on_partitions_revoked(self, tps):
            pass

        def on_partitions_lost(self, tps):
            pass

    async def main():
        async with mq.aio.Admin(bootstrap_servers=backend.bootstrap) as admin:
            await admin.create_topic(name, 2)
            assert name in await admin.list_topics()
        async with mq.aio.Producer(bootstrap_servers=backend.bootstrap) as p:
            futures = [await p.send(name, b"%d" % i, key=b"%d" % i) for i in range(100)]
            metadata = await asyncio.gather(*futures)
            assert {md.partition for md in metadata} == {0, 1}
            assert (await p.send_and_wait(name, b"last")).offset >= 0
        async with mq.aio.Consumer(name, group_id=group, bootstrap_servers=backend.bootstrap,
                                   listener=Listener(), enable_auto_commit=False) as c:
            records = await _read(c, 101)
            assert sorted(r.value for r in records) == \
                sorted([b"%d" % i for i in range(100)] + [b"last"])
            assert assigned == [{TopicPartition(name, 0), TopicPartition(name, 1)}]
            await c.commit()
            for tp in c.assignment():
                assert await c.committed(tp) == await c.position(tp)
    asyncio.run(main())


def test_a_cancelled_getmany_loses_no_record(backend):
    name, group = backend.name("t"), backend.name("g")

    async def main():
        async with mq.aio.Consumer(name, group_id=group, bootstrap_servers=backend.bootstrap,
                                   auto_commit_interval_ms=100) as c:
            async with mq.aio.Producer(bootstrap_servers=backend.bootstrap) as p:
                for i in range(50):
                    await p.send(name, b"%d" % i)
                await p.flush()
            for _ in range(5):                      # cancel polls, some mid-take
                task = asyncio.create_task(c.getmany(timeout_ms=2000))
                await asyncio.sleep(0.05)
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
            records = await _read(c, 50)
            assert sorted(int(r.value) for r in records) == list(range(50))

    with mq.Admin(bootstrap_servers=backend.bootstrap) as admin:
        admin.create_topic(name, 1)
    asyncio.run(main())


def test_a_transaction_block_commits_or_aborts(backend):
    name = backend.name("t")

    async def main():
        async with mq.aio.Admin(bootstrap_servers=backend.bootstrap) as admin:
            await admin.create_topic(name, 1)
        async with mq.aio.Producer(bootstrap_servers=backend.bootstrap,
                                   transactional_id=backend.name("tx")) as p:
            async with p.transaction():
                await p.send(name, b"kept")
            try:
                async with p.transaction():
                    await p.send(name, b"dropped")
                    await p.flush()
                    raise RuntimeError("the block fails")
            except RuntimeError:
                pass
        async with mq.aio.Consumer(name, bootstrap_servers=backend.bootstrap,
                                   isolation_level="read_committed") as c:
            assert [r.value for r in await _read(c, 1)] == [b"kept"]
            assert await c.getmany(timeout_ms=500) == {}
    asyncio.run(main())


class _OnRevoked:
    """A listener whose tests define only ``on_partitions_revoked``."""

    def on_partitions_assigned(self, tps):
        pass

    def on_partitions_lost(self, tps):
        pass


async def _keyed_records(backend, name: str, count: int = 20) -> None:
    """``count`` keyed records in a new topic ``name`` of 2 partitions."""
    async with mq.aio.Admin(bootstrap_servers=backend.bootstrap) as admin:
        await admin.create_topic(name, 2)
    async with mq.aio.Producer(bootstrap_servers=backend.bootstrap) as p:
        for i in range(count):
            await p.send(name, b"%d" % i, key=b"%d" % i)
        await p.flush()


async def _revoked_by_a_new_member(backend, consumer, name: str, group: str,
                                   revoked: list) -> None:
    """Another member joins ``group``: a rebalance revokes from ``consumer`` (its listener
    appends to ``revoked``), read through ``getmany``."""
    other = mq.Consumer(name, group_id=group, bootstrap_servers=backend.bootstrap)
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT_S
        while not revoked and loop.time() < deadline:
            await consumer.getmany(timeout_ms=100)
            await asyncio.to_thread(other.poll, 100)
        assert revoked
    finally:
        other.close()


def test_a_coroutine_listener_may_send_offsets_to_a_transaction_while_revoked(backend):
    """Exactly once's revocation: the listener's coroutine commits a transaction with the
    consumer's group metadata while the consumer's thread waits inside the rebalance."""
    name, group = backend.name("t"), backend.name("g")
    revoked: list = []

    async def main():
        consumer = producer = None

        class Listener(_OnRevoked):
            async def on_partitions_revoked(self, tps):
                await producer.begin_transaction()
                await producer.send(name + "-out", b"revoked")
                await producer.send_offsets_to_transaction(
                    {tp: await consumer.position(tp) for tp in tps}, consumer)
                await producer.commit_transaction()
                revoked.append(tps)

        await _keyed_records(backend, name)
        async with mq.aio.Admin(bootstrap_servers=backend.bootstrap) as admin:
            await admin.create_topic(name + "-out", 1)
        producer = mq.aio.Producer(bootstrap_servers=backend.bootstrap,
                                   transactional_id=backend.name("tx"))
        consumer = mq.aio.Consumer(name, group_id=group, bootstrap_servers=backend.bootstrap,
                                   listener=Listener(), enable_auto_commit=False,
                                   isolation_level="read_committed")
        async with producer, consumer:
            assert len(await _read(consumer, 20)) == 20
            await _revoked_by_a_new_member(backend, consumer, name, group, revoked)
        with mq.Admin(bootstrap_servers=backend.bootstrap) as admin:
            assert sum(admin.list_group_offsets(group).values()) == 20
    asyncio.run(asyncio.wait_for(main(), 120))


def test_a_coroutine_listener_may_commit_while_partitions_are_revoked(backend):
    name, group = backend.name("t"), backend.name("g")
    revoked: list = []

    async def main():
        consumer = None

        class Listener(_OnRevoked):
            async def on_partitions_revoked(self, tps):
                await consumer.commit()             # the consumer's own coroutine, re-entered
                revoked.append(tps)

        await _keyed_records(backend, name)
        consumer = mq.aio.Consumer(name, group_id=group, bootstrap_servers=backend.bootstrap,
                                   listener=Listener(), enable_auto_commit=False)
        async with consumer:
            assert len(await _read(consumer, 20)) == 20
            await _revoked_by_a_new_member(backend, consumer, name, group, revoked)
        with mq.Admin(bootstrap_servers=backend.bootstrap) as admin:
            assert sum(admin.list_group_offsets(group).values()) == 20
    asyncio.run(asyncio.wait_for(main(), 120))
