"""``mq.Admin``: topic operations (create, delete, list, describe, add partitions, configs),
consumer-group operations (list, describe, delete, read and reset committed offsets), the
transaction coordinator's view of transactional ids (list, describe), the Kafka listener's
ACLs (create, describe, delete) and its SCRAM users (add, delete, describe).

Each method is an operation of ``admin_ops.py`` (its checks, requests and result, shared
with ``mq.aio.Admin``) run over a blocking ``Connection`` by ``run``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from mq.client import admin_ops as ops
from mq.client.connection import Connection
from mq.client.kafka.config import backend_args, bootstrap
from mq.client.types import TopicPartition

__all__ = ["Admin", "fetch_committed", "run"]


def run(conn: Connection, op: ops.Op) -> Any:
    """Drive the operation ``op`` over ``conn``: each list of requests it yields is sent
    pipelined and its replies collected before the first error among them is raised (so no
    reply is left behind on the connection)."""
    try:
        requests = next(op)
        while True:
            rids = [conn.send(api, *fields, claim=True) for api, *fields in requests]
            replies = [conn.wait_raw(rid) for rid in rids]
            err = ops.first_error(replies)
            if err is not None:
                raise err
            requests = op.send(replies)
    except StopIteration as stop:
        return stop.value


def fetch_committed(conn: Connection, group: str, partitions: Iterable[TopicPartition] | None,
                    require_stable: bool = False
                    ) -> tuple[dict[TopicPartition, int], set[TopicPartition]]:
    """``admin_ops.committed_offsets`` over ``conn`` (the group consumer's too)."""
    return run(conn, ops.committed_offsets(group, partitions, require_stable))


def _blocking(op: Callable[..., ops.Op]) -> Callable:
    """``op`` as a method of ``Admin``: same signature and documentation."""
    @functools.wraps(op)
    def method(self: Admin, *args: Any, **kwargs: Any) -> Any:
        return run(self._conn, op(*args, **kwargs))
    return method


class Admin:
    """Topics, groups, transactions, ACLs and users (the module doc). ``bootstrap_servers``
    ("host:port,...", else ``$MQ_BOOTSTRAP_SERVERS`` when no ``socket`` is given) and
    ``kafka_config`` (librdkafka properties): a Kafka cluster's instead
    (``mq/client/kafka/admin.py`` says what differs)."""

    def __new__(cls, socket: str | None = None, timeout: float = 30.0, *,
                bootstrap_servers: str | Iterable[str] | None = None,
                kafka_config: dict | None = None) -> Any:
        servers = bootstrap(socket, bootstrap_servers)
        backend_args(servers, (), kafka_config)
        if servers is None:
            return super().__new__(cls)
        from mq.client.kafka.admin import KafkaAdmin
        return KafkaAdmin(servers, timeout, kafka_config)

    def __init__(self, socket: str | None = None, timeout: float = 30.0, *,
                 bootstrap_servers: str | Iterable[str] | None = None,
                 kafka_config: dict | None = None) -> None:
        self._conn = Connection(socket, "mq-admin", timeout)

    @property
    def broker_info(self) -> dict:
        """What the broker said at the handshake: ``data_dir``, ``pid``, ``generation``, ..."""
        return self._conn.broker_info

    create_topic = _blocking(ops.create_topic)
    delete_topic = _blocking(ops.delete_topic)
    list_topics = _blocking(ops.list_topics)
    describe_topic = _blocking(ops.describe_topic)
    create_partitions = _blocking(ops.create_partitions)
    alter_config = _blocking(ops.alter_config)
    delete_records = _blocking(ops.delete_records)
    list_groups = _blocking(ops.list_groups)
    describe_group = _blocking(ops.describe_group)
    delete_group = _blocking(ops.delete_group)
    list_group_offsets = _blocking(ops.list_group_offsets)
    alter_group_offsets = _blocking(ops.alter_group_offsets)
    broker_stats = _blocking(ops.broker_stats)
    list_transactions = _blocking(ops.list_transactions)
    describe_transactions = _blocking(ops.describe_transactions)
    describe_transaction = _blocking(ops.describe_transaction)
    create_acls = _blocking(ops.create_acls)
    describe_acls = _blocking(ops.describe_acls)
    delete_acls = _blocking(ops.delete_acls)
    describe_user_scram_credentials = _blocking(ops.describe_user_scram_credentials)
    alter_user_scram_credentials = _blocking(ops.alter_user_scram_credentials)
    add_user = _blocking(ops.add_user)
    delete_user = _blocking(ops.delete_user)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
