"""``mq.Admin``: topic operations (create, delete, list, describe, add partitions, configs)."""

from __future__ import annotations

from typing import Any

from mq.client.connection import Connection
from mq.protocol.messages import Api

__all__ = ["Admin"]


class Admin:
    def __init__(self, socket: str | None = None, timeout: float = 30.0) -> None:
        self._conn = Connection(socket, "mq-admin", timeout)

    def create_topic(self, name: str, partitions: int = 1,
                     config: dict[str, Any] | None = None) -> dict:
        """Create a topic; raises ``TopicAlreadyExistsError``, ``InvalidPartitionsError``,
        ``InvalidConfigurationError`` or ``InvalidTopicError``."""
        cfg = {str(k): str(v) for k, v in (config or {}).items()}
        return self._conn.call(Api.CREATE_TOPICS, name, int(partitions), cfg).fields[0]

    def delete_topic(self, name: str) -> None:
        self._conn.call(Api.DELETE_TOPICS, name)

    def list_topics(self) -> list[str]:
        return sorted(self._conn.call(Api.METADATA, None).fields[0])

    def describe_topic(self, name: str) -> dict:
        """``{"name", "id", "partitions", "config" (effective), "overrides", "offsets":
        [(start, end), ...]}``."""
        meta = self._conn.call(Api.METADATA, [name]).fields[0][name]
        effective, overrides = self._conn.call(Api.DESCRIBE_CONFIGS, name).fields
        offsets = []
        for p in range(meta["partitions"]):
            start = self._conn.call(Api.LIST_OFFSETS, name, p, -2).fields[0]
            end = self._conn.call(Api.LIST_OFFSETS, name, p, -1).fields[0]
            offsets.append((start, end))
        return {"name": name, "id": meta["id"], "partitions": meta["partitions"],
                "config": effective, "overrides": overrides, "offsets": offsets}

    def create_partitions(self, name: str, total: int) -> dict:
        return self._conn.call(Api.CREATE_PARTITIONS, name, int(total)).fields[0]

    def alter_config(self, name: str, config: dict[str, Any]) -> dict:
        cfg = {str(k): str(v) for k, v in config.items()}
        return self._conn.call(Api.ALTER_CONFIGS, name, cfg).fields[0]

    def delete_records(self, name: str, partition: int, before_offset: int) -> int:
        """Kafka's DeleteRecords: records below ``before_offset`` become unreadable."""
        return self._conn.call(Api.DELETE_RECORDS, name, partition, before_offset).fields[0]

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
