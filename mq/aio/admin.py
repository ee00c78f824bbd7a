"""``mq.aio.Admin``: ``mq.Admin`` for asyncio, every method a coroutine.

The operations are ``mq/client/admin_ops.py``'s, the very ones ``mq.Admin`` runs: the same
checks before sending, the same requests (pipelined), results and errors. ``run`` drives
one over an ``AsyncConnection``::

    async with mq.aio.Admin() as admin:
        await admin.create_topic("orders", partitions=3)
        print(await admin.describe_topic("orders"))
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Iterable
from typing import Any

from mq.aio.connection import AsyncConnection, open_connection
from mq.client import admin_ops as ops
from mq.client.kafka.config import backend_args, bootstrap
from mq.errors import ClosedError

__all__ = ["Admin", "run"]


async def run(conn: AsyncConnection, op: ops.Op) -> Any:
    """Drive the operation ``op`` over ``conn``: each list of requests it yields is written
    at once, its replies awaited, then the first error among them raised."""
    try:
        requests = next(op)
        while True:
            futures = [conn.request(api, *fields) for api, *fields in requests]
            replies = [await conn.reply(f) for f in futures]
            err = ops.first_error(replies)
            if err is not None:
                raise err
            requests = op.send(replies)
    except StopIteration as stop:
        return stop.value


def _awaitable(op: Callable[..., ops.Op]) -> Callable:
    """``op`` as a coroutine method of ``Admin``: same signature and documentation."""
    @functools.wraps(op)
    async def method(self: Admin, *args: Any, **kwargs: Any) -> Any:
        return await run(await self._connection(), op(*args, **kwargs))
    return method


class Admin:
    """Connects on ``start()`` (or ``async with``, or the first call)."""

    def __new__(cls, socket: str | None = None, timeout: float = 30.0, *,
                bootstrap_servers: str | Iterable[str] | None = None,
                kafka_config: dict | None = None) -> Any:
        """This client, or on a Kafka cluster (``bootstrap_servers``, else
        ``$MQ_BOOTSTRAP_SERVERS`` when no ``socket`` is given) ``kafka.AsyncKafkaAdmin``."""
        servers = bootstrap(socket, bootstrap_servers)
        backend_args(servers, (), kafka_config)
        if servers is None:
            return super().__new__(cls)
        from mq.aio.kafka import AsyncKafkaAdmin
        return AsyncKafkaAdmin(servers, timeout, kafka_config)

    def __init__(self, socket: str | None = None, timeout: float = 30.0, *,
                 bootstrap_servers: str | Iterable[str] | None = None,
                 kafka_config: dict | None = None) -> None:
        self._socket = socket
        self._timeout = timeout
        self._conn: AsyncConnection | None = None
        self._opening: asyncio.Lock | None = None
        self._closed = False

    async def start(self) -> None:
        await self._connection()

    async def _connection(self) -> AsyncConnection:
        if self._closed:
            raise ClosedError("the admin client is closed")
        if self._conn is None:
            if self._opening is None:
                self._opening = asyncio.Lock()
            async with self._opening:
                if self._conn is None:
                    self._conn = await open_connection(self._socket, "mq-admin",
                                                       self._timeout)
        return self._conn

    @property
    def broker_info(self) -> dict:
        """What the broker said at the handshake (``{}`` before ``start``)."""
        return {} if self._conn is None else self._conn.broker_info

    create_topic = _awaitable(ops.create_topic)
    delete_topic = _awaitable(ops.delete_topic)
    list_topics = _awaitable(ops.list_topics)
    describe_topic = _awaitable(ops.describe_topic)
    create_partitions = _awaitable(ops.create_partitions)
    alter_config = _awaitable(ops.alter_config)
    delete_records = _awaitable(ops.delete_records)
    list_groups = _awaitable(ops.list_groups)
    describe_group = _awaitable(ops.describe_group)
    delete_group = _awaitable(ops.delete_group)
    list_group_offsets = _awaitable(ops.list_group_offsets)
    alter_group_offsets = _awaitable(ops.alter_group_offsets)
    broker_stats = _awaitable(ops.broker_stats)
    list_transactions = _awaitable(ops.list_transactions)
    describe_transactions = _awaitable(ops.describe_transactions)
    describe_transaction = _awaitable(ops.describe_transaction)
    create_acls = _awaitable(ops.create_acls)
    describe_acls = _awaitable(ops.describe_acls)
    delete_acls = _awaitable(ops.delete_acls)
    describe_user_scram_credentials = _awaitable(ops.describe_user_scram_credentials)
    alter_user_scram_credentials = _awaitable(ops.alter_user_scram_credentials)
    add_user = _awaitable(ops.add_user)
    delete_user = _awaitable(ops.delete_user)

    async def close(self) -> None:
        self._closed = True
        if self._conn is not None:
            self._conn.close()

    async def __aenter__(self) -> Admin:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
