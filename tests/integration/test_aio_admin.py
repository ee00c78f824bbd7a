"""``mq.aio.Admin`` against a real broker: the operations ``mq.Admin`` runs, awaited in an
event loop with no thread of the client's own, and the same errors."""

from __future__ import annotations

import asyncio
import inspect
import threading

import pytest

import mq
import mq.aio
from mq.errors import (BrokerUnavailableError, ClosedError, InvalidPartitionsError,
                       TopicAlreadyExistsError, UnknownTopicOrPartitionError)


def test_every_admin_method_has_its_coroutine_twin():
    blocking = {n for n, v in vars(mq.Admin).items() if callable(v) and not n.startswith("_")}
    for name in blocking - {"close"}:
        twin = getattr(mq.aio.Admin, name)
        assert inspect.iscoroutinefunction(twin), name
        assert inspect.signature(twin) == inspect.signature(getattr(mq.Admin, name)), name
        assert twin.__doc__ == getattr(mq.Admin, name).__doc__, name


def test_topics_and_offsets_through_the_event_loop(broker):
    async def main():
        async with mq.aio.Admin(broker.socket) as admin:
            threads = threading.active_count()
            assert admin.broker_info["data_dir"] == str(broker.data_dir)
            await admin.create_topic("orders", partitions=2, config={"retention.ms": 60000})
            with pytest.raises(TopicAlreadyExistsError):
                await admin.create_topic("orders")
            with pytest.raises(InvalidPartitionsError):
                await admin.create_topic("none", partitions=0)      # refused before sending
            described, topics = await asyncio.gather(admin.describe_topic("orders"),
                                                     admin.list_topics())
            assert threading.active_count() == threads              # no thread of its own
            return described, topics
    described, topics = asyncio.run(main())
    assert "orders" in topics
    assert described["partitions"] == 2 and described["offsets"] == [(0, 0), (0, 0)]
    assert described["overrides"] == {"retention.ms": "60000"}
    with mq.Admin(broker.socket) as admin:                          # the same, blocking
        assert admin.describe_topic("orders")["overrides"] == described["overrides"]


def test_an_error_among_pipelined_replies_is_raised_and_the_connection_goes_on(broker):
    async def main():
        async with mq.aio.Admin(broker.socket) as admin:
            with pytest.raises(UnknownTopicOrPartitionError):
                await admin.describe_topic("missing")
            await admin.create_topic("t")
            await admin.alter_group_offsets("g", {mq.TopicPartition("t", 0): 0})
            return await admin.list_group_offsets("g")
    assert asyncio.run(main()) == {mq.TopicPartition("t", 0): 0}


def test_no_broker_is_one_clear_error(tmp_path):
    async def main():
        await mq.aio.Admin(str(tmp_path / "nothing.sock")).list_topics()
    with pytest.raises(BrokerUnavailableError, match="no broker at .*nothing.sock"):
        asyncio.run(main())


def test_a_broker_that_dies_fails_the_waiting_call_and_close_is_final(broker):
    async def main():
        admin = mq.aio.Admin(broker.socket)
        await admin.start()
        broker.kill()
        with pytest.raises(BrokerUnavailableError):
            await admin.list_topics()
        await admin.close()
        with pytest.raises(ClosedError):
            await admin.list_topics()
    asyncio.run(main())
