"""``mq.aio.Consumer`` in a consumer group, against a real broker: the threaded consumer's
group steps (reconcile, commit, leave) awaited in an event loop, over a heartbeat task."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from brokers import create_topic

import mq
import mq.aio

WAIT = 30.0


@pytest.fixture
def broker(broker):
    create_topic(broker, "t", 4)
    with mq.Producer(socket=broker.socket, linger_ms=0) as p:
        for i in range(400):
            p.send("t", value=b"%d" % i, partition=i % 4)
        p.flush()
    return broker


async def drain(*consumers, count: int) -> list:
    """Read with every consumer at once until ``count`` records came."""
    got: list = []
    deadline = time.monotonic() + WAIT

    async def read(c):
        while len(got) < count and time.monotonic() < deadline:
            batch = await c.getmany(timeout_ms=100)
            got.extend((r.partition, r.offset) for rs in batch.values() for r in rs)
    await asyncio.gather(*(read(c) for c in consumers))
    return got


def test_members_split_the_partitions_and_read_each_record_once(broker):
    async def main():
        threads = threading.active_count()
        a = mq.aio.Consumer("t", socket=broker.socket, group_id="g", enable_auto_commit=False)
        b = mq.aio.Consumer("t", socket=broker.socket, group_id="g", enable_auto_commit=False)
        async with a, b:
            got = await drain(a, b, count=400)
            assert threading.active_count() == threads       # no thread of its own
            assert a.assignment() | b.assignment() == {mq.TopicPartition("t", p)
                                                       for p in range(4)}
            await a.commit()
            await b.commit()
        return got
    got = asyncio.run(main())
    assert sorted(got) == sorted((p, o) for p in range(4) for o in range(100))
    with mq.Admin(broker.socket) as admin:
        assert admin.list_group_offsets("g") == {mq.TopicPartition("t", p): 100
                                                 for p in range(4)}


def test_a_member_that_leaves_hands_its_partitions_over_with_async_listeners(broker):
    events: list = []

    class Listener(mq.ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked):
            await asyncio.sleep(0)
            events.append(("revoked", sorted(tp.partition for tp in revoked)))

        async def on_partitions_assigned(self, assigned):
            events.append(("assigned", sorted(tp.partition for tp in assigned)))

    async def main():
        a = mq.aio.Consumer("t", socket=broker.socket, group_id="g", listener=Listener())
        b = mq.aio.Consumer("t", socket=broker.socket, group_id="g")
        async with a:
            async with b:
                async def both():
                    return len(a.assignment()) == 2 and len(b.assignment()) == 2
                deadline = time.monotonic() + WAIT
                while not await both():
                    assert time.monotonic() < deadline
                    await asyncio.gather(a.getmany(timeout_ms=50), b.getmany(timeout_ms=50))
            deadline = time.monotonic() + WAIT
            while len(a.assignment()) < 4:
                assert time.monotonic() < deadline
                await a.getmany(timeout_ms=50)
    asyncio.run(main())
    assert events[0] == ("assigned", [0, 1, 2, 3])
    assert events[-1] == ("revoked", [0, 1, 2, 3])              # a's own leaving
    given = [ps for kind, ps in events[1:-1] if kind == "revoked"]
    back = [ps for kind, ps in events[1:-1] if kind == "assigned"]
    assert len(given[0]) == 2 and back[-1] == given[0]           # b's half came back


def test_auto_commit_on_leaving_and_a_new_member_resumes_there(broker):
    async def main():
        async with mq.aio.Consumer("t", socket=broker.socket, group_id="g") as a:
            first = await drain(a, count=400)
        async with mq.aio.Consumer("t", socket=broker.socket, group_id="g") as b:
            later = await b.getmany(timeout_ms=300)
            assert await b.committed(mq.TopicPartition("t", 0)) == 100
        return first, later
    first, later = asyncio.run(main())
    assert len(first) == 400 and later == {}


def test_an_aio_member_and_a_threaded_member_share_a_group(broker):
    stop = threading.Event()
    threaded: list = []

    def threaded_member():
        with mq.Consumer("t", socket=broker.socket, group_id="g") as c:
            while not stop.is_set():
                for rs in c.poll(timeout_ms=50).values():
                    threaded.extend((r.partition, r.offset) for r in rs)

    worker = threading.Thread(target=threaded_member)
    worker.start()
    try:
        async def main():
            async with mq.aio.Consumer("t", socket=broker.socket, group_id="g") as a:
                got: list = []
                deadline = time.monotonic() + WAIT
                while len(got) + len(threaded) < 400 or len(a.assignment()) != 2:
                    assert time.monotonic() < deadline, (len(got), len(threaded))
                    batch = await a.getmany(timeout_ms=50)
                    got.extend((r.partition, r.offset) for rs in batch.values() for r in rs)
                return got
        got = asyncio.run(main())
    finally:
        stop.set()
        worker.join()
    assert sorted(set(got) | set(threaded)) == sorted((p, o) for p in range(4)
                                                      for o in range(100))


def test_consume_transform_produce_exactly_once(broker):
    """read_committed in, a transaction per batch out, offsets in the transaction; one
    transaction aborted midway is read again: the output holds every input once."""
    create_topic(broker, "out", 1)

    async def main():
        async with mq.aio.Consumer("t", socket=broker.socket, group_id="etl",
                                   enable_auto_commit=False,
                                   isolation_level="read_committed") as c, \
                mq.aio.Producer(broker.socket, transactional_id="etl-1") as p:
            done, aborted = 0, False
            deadline = time.monotonic() + WAIT
            while done < 400:
                assert time.monotonic() < deadline
                batch = await c.getmany(timeout_ms=100, max_records=50)
                if not batch:
                    continue
                await p.begin_transaction()
                for records in batch.values():
                    for r in records:
                        await p.send("out", r.value, partition=0)
                await p.send_offsets_to_transaction(
                    {tp: rs[-1].offset + 1 for tp, rs in batch.items()}, c.group_metadata())
                if not aborted:
                    aborted = True
                    await p.abort_transaction()
                    for tp in batch:
                        c.seek(tp, await c.committed(tp) or 0)
                    continue
                await p.commit_transaction()
                done += sum(len(rs) for rs in batch.values())
    asyncio.run(main())
    with mq.Consumer("out", socket=broker.socket, isolation_level="read_committed",
                     value_bytes=True) as c:
        values: list = []
        while len(values) < 400:
            values += [r.value for rs in c.poll(timeout_ms=1000).values() for r in rs]
        assert c.poll(timeout_ms=200) == {}
    assert sorted(int(v) for v in values) == sorted(range(400))


def test_position_waits_for_a_transaction_holding_the_groups_offsets(broker):
    """read_committed: a partition whose newer committed offset an open transaction holds is
    not started at the older one; position() waits for the transaction (KIP-447)."""
    tp = mq.TopicPartition("t", 0)
    producer = mq.Producer(socket=broker.socket, transactional_id="holder")
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_offsets_to_transaction({tp: 5}, "g")

    async def main():
        loop = asyncio.get_running_loop()
        async with mq.aio.Consumer("t", socket=broker.socket, group_id="g",
                                   isolation_level="read_committed") as c:
            deadline = time.monotonic() + WAIT
            while tp not in c.assignment():
                assert time.monotonic() < deadline
                await c.getmany(timeout_ms=50)
            position = asyncio.ensure_future(c.position(tp))
            await loop.run_in_executor(None, producer.commit_transaction)
            return await asyncio.wait_for(position, WAIT)
    try:
        assert asyncio.run(main()) == 5
    finally:
        producer.close()


def test_group_mistakes_are_clear(broker):
    with pytest.raises(ValueError, match="pattern"):
        mq.aio.Consumer(pattern="t.*")
    with pytest.raises(ValueError, match="group_id"):
        mq.aio.Consumer("t", group_id="")

    async def main():
        async with mq.aio.Consumer("t", socket=broker.socket) as c:
            with pytest.raises(ValueError, match="group_id"):
                c.subscribe(["t"])
            with pytest.raises(ValueError, match="group_id"):
                await c.commit()
        async with mq.aio.Consumer("t", socket=broker.socket, group_id="g") as c:
            with pytest.raises(ValueError, match="unsubscribe"):
                c.assign([mq.TopicPartition("t", 0)])
    asyncio.run(main())


@pytest.mark.parametrize("when", ["just restarted", "down"])
def test_a_commit_rides_out_a_broker_restart(broker, when):
    """The restarted broker knows no members: a commit sent before the member rejoined, or
    while the broker is down, goes through with the member's new epoch once it rejoined."""
    every = {mq.TopicPartition("t", p): 5 for p in range(4)}

    async def main():
        c = mq.aio.Consumer("t", socket=broker.socket, group_id="g", enable_auto_commit=False)
        async with c:
            await drain(c, count=400)
            broker.kill()
            if when == "down":
                committing = asyncio.create_task(c.commit(every))
                await asyncio.to_thread(broker.start)
                await committing
            else:
                broker.start()
                await c.getmany(timeout_ms=100)         # reconnected: commit at once
                await c.commit(every)
    asyncio.run(main())
    with mq.Admin(broker.socket) as admin:
        assert admin.list_group_offsets("g") == every
