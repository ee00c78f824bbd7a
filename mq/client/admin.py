"""``mq.Admin``: topic operations (create, delete, list, describe, add partitions, configs),
consumer-group operations (list, describe, delete, read and reset committed offsets), the
transaction coordinator's view of transactional ids (list, describe), the Kafka listener's
ACLs (create, describe, delete) and its SCRAM users (add, delete, describe)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from mq.client.connection import Connection
from mq.client.types import TopicPartition
from mq.errors import UnstableOffsetCommitError, error_for_code
from mq.protocol.kafka.sasl import DEFAULT_ITERATIONS, SCRAM_MECHANISMS, salted_password
from mq.protocol.limits import check_offset, check_partition_count
from mq.protocol.messages import Api

__all__ = ["Admin"]


def fetch_committed(conn: Connection, group: str, partitions: Iterable[TopicPartition] | None,
                    require_stable: bool = False
                    ) -> tuple[dict[TopicPartition, int], set[TopicPartition]]:
    """OffsetFetch: ``group``'s committed offsets of ``partitions`` (None: all), partitions
    without one left out, and, with ``require_stable``, the partitions whose newer offsets an
    unfinished transaction holds (no offset given for them: ask again once it ends). (Shared
    with the group consumer.)"""
    wanted = None if partitions is None else [[tp.topic, tp.partition] for tp in partitions]
    rows = conn.call(Api.OFFSET_FETCH, group, wanted, int(require_stable))["rows"]
    offsets: dict[TopicPartition, int] = {}
    unstable: set[TopicPartition] = set()
    for t, p, offset, _epoch, _metadata, _ts, error_code in rows:
        if error_code == UnstableOffsetCommitError.code:
            unstable.add(TopicPartition(t, p))
        elif error_code:
            raise error_for_code(error_code, f"committed offset of {t}-{p}")
        elif offset >= 0:
            offsets[TopicPartition(t, p)] = offset
    return offsets, unstable


class Admin:
    def __init__(self, socket: str | None = None, timeout: float = 30.0) -> None:
        self._conn = Connection(socket, "mq-admin", timeout)

    @property
    def broker_info(self) -> dict:
        """What the broker said at the handshake: ``data_dir``, ``pid``, ``generation``, ..."""
        return self._conn.broker_info

    def create_topic(self, name: str, partitions: int = 1,
                     config: dict[str, Any] | None = None) -> dict:
        """Create a topic; raises ``TopicAlreadyExistsError``, ``InvalidPartitionsError``
        (before sending, for a count no topic may have: ``mq.protocol.limits``),
        ``InvalidConfigurationError`` or ``InvalidTopicError``."""
        count = check_partition_count(partitions)
        cfg = {str(k): str(v) for k, v in (config or {}).items()}
        return self._conn.call(Api.CREATE_TOPICS, name, count, cfg)["metadata"]

    def delete_topic(self, name: str) -> None:
        self._conn.call(Api.DELETE_TOPICS, name)

    def list_topics(self) -> list[str]:
        return sorted(self._conn.call(Api.METADATA, None)["topics"])

    def describe_topic(self, name: str) -> dict:
        """``{"name", "id", "partitions", "config" (effective), "overrides", "offsets":
        [(start, end), ...], "size_bytes": [bytes of each partition's segments on disk],
        "offline": [None, or why the partition takes no writes]}``."""
        conn = self._conn
        meta = conn.call(Api.METADATA, [name])["topics"][name]
        # The rest in one round trip, not 1 + 2 per partition: requests pipeline and replies
        # are matched by id (after an error, the replies left unread are never looked at).
        configs = conn.send(Api.DESCRIBE_CONFIGS, name)
        bounds = [conn.send(Api.LIST_OFFSETS, name, p, which)
                  for p in range(meta["partitions"]) for which in (-2, -1)]
        reply = conn.wait(configs)
        effective, overrides = reply["config"], reply["overrides"]
        ends = [conn.wait(rid)["offset"] for rid in bounds]
        offsets = list(zip(ends[::2], ends[1::2]))
        count = meta["partitions"]
        return {"name": name, "id": meta["id"], "partitions": count,
                "config": effective, "overrides": overrides, "offsets": offsets,
                "size_bytes": meta.get("size_bytes", [None] * count),
                "offline": meta.get("offline", [None] * count)}

    def create_partitions(self, name: str, total: int) -> dict:
        """Grow the topic to ``total`` partitions. Raises ``InvalidPartitionsError`` (before
        sending for a count no topic may have), ``UnknownTopicOrPartitionError``."""
        total = check_partition_count(total)
        return self._conn.call(Api.CREATE_PARTITIONS, name, total)["metadata"]

    def alter_config(self, name: str, config: dict[str, Any]) -> dict:
        cfg = {str(k): str(v) for k, v in config.items()}
        return self._conn.call(Api.ALTER_CONFIGS, name, cfg)["config"]

    def delete_records(self, name: str, partition: int, before_offset: int) -> int:
        """Kafka's DeleteRecords: records below ``before_offset`` become unreadable. Raises
        ``ValueError`` (before sending) for an offset out of 0..2**63-1,
        ``BrokerOffsetOutOfRangeError`` for one above the high watermark."""
        offset = check_offset(before_offset, "before_offset")
        return self._conn.call(Api.DELETE_RECORDS, name, partition, offset)["log_start_offset"]

    # --- consumer groups ------------------------------------------------------------------------
    def list_groups(self) -> list[dict]:
        """``[{"group", "state", "members"}]``: groups with live members or committed
        offsets. ``state``: Kafka's Empty, Reconciling or Stable."""
        rows = self._conn.call(Api.LIST_GROUPS)["rows"]
        return [{"group": g, "state": state, "members": n} for g, state, n in rows]

    def describe_group(self, group: str) -> dict:
        """``{"group", "state", "group_epoch", "assignment_epoch", "assignor", "members":
        [{"member_id", "instance_id", "pid", "member_epoch", "state", "assignment", ...}],
        "offsets": [{"topic", "partition", "committed_offset", "metadata", "end_offset", "lag",
        "lag_ms", "member_id", "pid"}]}`` — ``lag_ms`` is the age of the oldest unconsumed
        record. Raises ``GroupIdNotFoundError``."""
        return self._conn.call(Api.CONSUMER_GROUP_DESCRIBE, group)["description"]

    def delete_group(self, group: str) -> None:
        """Delete a group's committed offsets. Raises ``NonEmptyGroupError`` while it has live
        members, ``GroupIdNotFoundError`` for an unknown group."""
        self._conn.call(Api.DELETE_GROUPS, group)

    def list_group_offsets(self, group: str) -> dict[TopicPartition, int]:
        """The group's committed offsets (``{}`` for an unknown group)."""
        return fetch_committed(self._conn, group, None)[0]

    def alter_group_offsets(self, group: str, offsets: dict[TopicPartition, int]) -> None:
        """Set committed offsets of a group without live members (an offset reset). Raises
        ``NonEmptyGroupError`` while it has live members, ``UnknownTopicOrPartitionError``, and
        ``ValueError`` (before sending) for an offset out of 0..2**63-1."""
        items = [[tp[0], tp[1], check_offset(offset, f"the offset of {tp[0]}-{tp[1]}"), -1, ""]
                 for tp, offset in offsets.items()]
        if items:
            self._conn.call(Api.OFFSET_COMMIT, group, "", -1, items)

    # --- transactions ---------------------------------------------------------------------------
    def broker_stats(self) -> dict:
        """One snapshot of the broker's figures: ``broker``, ``partitions``, ``groups``,
        ``fsync`` and ``cleaner`` (``mq/broker/stats.py`` lists the fields). What ``mq top``
        shows and ``--metrics`` exports."""
        return self._conn.call(Api.BROKER_STATS)["stats"]

    def list_transactions(self) -> list[dict]:
        """``[{"transactional_id", "producer_id", "state"}]``, every transactional id the
        coordinator knows, sorted. ``state`` is Kafka's: Empty, Ongoing, PrepareCommit,
        PrepareAbort, CompleteCommit, CompleteAbort (PrepareEpochFence while fencing)."""
        rows = self._conn.call(Api.LIST_TRANSACTIONS)["rows"]
        return [{"transactional_id": tid, "producer_id": pid, "state": state}
                for tid, pid, state in rows]

    def describe_transactions(self, transactional_ids: Iterable[str] | None = None
                              ) -> list[dict]:
        """``describe_transaction`` for several ids (None: every one). Raises
        ``TransactionalIdNotFoundError`` naming the first unknown id."""
        ids = None if transactional_ids is None else [str(t) for t in transactional_ids]
        return self._conn.call(Api.DESCRIBE_TRANSACTIONS, ids)["rows"]

    def describe_transaction(self, transactional_id: str) -> dict:
        """The coordinator's state of a transactional id, as the broker sends it:
        ``{"transactional_id", "state", "producer_id", "producer_epoch", "timeout_ms",
        "start_ms" (when its current or last transaction began; -1: none), "last_update_ms",
        "partitions": [[topic, partition], ...] (of the open transaction)}``. Raises
        ``TransactionalIdNotFoundError``."""
        return self.describe_transactions([transactional_id])[0]

    # ACLs, Kafka's model (mq/broker/acls.py). A binding is the list [resource_type,
    # resource_name, pattern_type, principal, host, operation, permission] of Kafka's codes;
    # a filter is the same with None (and the ANY codes) for "any".
    def create_acls(self, bindings: Iterable[list]) -> None:
        """Add the bindings (one record, fsync'd before the reply). Raises the error of the
        first one the broker refuses (``InvalidRequestError``); the valid ones are added."""
        results = self._conn.call(Api.CREATE_ACLS, [list(b) for b in bindings])["results"]
        for code, message in results:
            if code:
                raise error_for_code(code, message)

    def describe_acls(self, acl_filter: list) -> list[list]:
        """The bindings ``acl_filter`` matches."""
        return self._conn.call(Api.DESCRIBE_ACLS, list(acl_filter))["bindings"]

    def delete_acls(self, filters: Iterable[list]) -> list[list]:
        """Remove the bindings any of ``filters`` matches; the ones removed."""
        results = self._conn.call(Api.DELETE_ACLS, [list(f) for f in filters])["results"]
        removed: dict[tuple, list] = {}
        for _code, _message, found in results:
            for b in found:
                removed.setdefault(tuple(b), b)
        return list(removed.values())

    # --- SCRAM users (Kafka's KIP-554; the Kafka listener's SASL checks against these) --------
    def describe_user_scram_credentials(self, users: Iterable[str] | None = None
                                        ) -> dict[str, list[tuple[str, int]]]:
        """``{user: [(mechanism, iterations), ...]}`` for ``users`` (None: every user).
        Raises ``ResourceNotFoundError`` naming the first unknown user."""
        wanted = None if users is None else [str(u) for u in users]
        rows = self._conn.call(Api.DESCRIBE_USER_SCRAM_CREDENTIALS, wanted)["rows"]
        out: dict[str, list[tuple[str, int]]] = {}
        for user, code, message, infos in rows:
            if code:
                raise error_for_code(code, f"user {user!r}: {message}")
            out[user] = [(m, i) for m, i in infos]
        return out

    def alter_user_scram_credentials(self, deletions: Iterable[tuple[str, str]] = (),
                                     upsertions: Iterable[tuple] = ()) -> None:
        """Delete ``(user, mechanism)`` credentials and upsert ``(user, mechanism,
        iterations, salt, salted_password)`` ones, as Kafka's AlterUserScramCredentials.
        Raises the first user's error (``UnacceptableCredentialError``,
        ``ResourceNotFoundError``...)."""
        rows = self._conn.call(Api.ALTER_USER_SCRAM_CREDENTIALS,
                               [list(d) for d in deletions],
                               [list(u) for u in upsertions])["results"]
        for user, code, message in rows:
            if code:
                raise error_for_code(code, f"user {user!r}: {message}")

    def add_user(self, name: str, password: str, iterations: int = DEFAULT_ITERATIONS) -> None:
        """Give ``name`` SCRAM-SHA-256 and -512 credentials for ``password`` (replacing any):
        salted here, so the password never reaches the broker."""
        upsertions = []
        for mechanism in SCRAM_MECHANISMS:
            salt = os.urandom(32)
            upsertions.append((name, mechanism, iterations, salt,
                               salted_password(mechanism, password, salt, iterations)))
        self.alter_user_scram_credentials((), upsertions)

    def delete_user(self, name: str) -> None:
        """Remove every credential of ``name``. Raises ``ResourceNotFoundError``."""
        held = self.describe_user_scram_credentials([name])[name]
        self.alter_user_scram_credentials([(name, m) for m, _ in held], ())

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
