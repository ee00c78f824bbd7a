"""The admin operations, without I/O: topics, groups and their offsets, transactions, ACLs
and SCRAM users, written once for ``mq.Admin`` and ``mq.aio.Admin``.

An operation is a generator: it yields the requests it needs, a list of ``(api, *fields)``
sent pipelined, and is sent back their replies, every one a success (the driver raises an
error reply as its exception, ``mq.errors.error_for_code``, after collecting the whole list);
it returns the operation's result. Checks a request could not pass (a partition count or
an offset no topic may have) raise before anything is sent. ``run`` drives one over a
blocking ``Connection``; ``mq/aio/admin.py`` drives them over an asyncio one.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterable
from typing import Any, TypeVar

from mq.client.types import TopicPartition
from mq.errors import UnstableOffsetCommitError, error_for_code
from mq.protocol.kafka.sasl import DEFAULT_ITERATIONS, SCRAM_MECHANISMS, salted_password
from mq.protocol.limits import check_offset, check_partition_count
from mq.protocol.messages import Api, Response

__all__ = ["Op", "first_error", "committed_offsets", "create_topic", "delete_topic",
           "list_topics", "describe_topic", "create_partitions", "alter_config",
           "delete_records", "list_groups", "describe_group", "delete_group",
           "list_group_offsets", "alter_group_offsets", "broker_stats", "list_transactions",
           "describe_transactions", "describe_transaction", "create_acls", "describe_acls",
           "delete_acls", "describe_user_scram_credentials", "alter_user_scram_credentials",
           "add_user", "delete_user"]

T = TypeVar("T")
Op = Generator[list[tuple], list[Response], T]


def first_error(replies: list[Response]) -> Exception | None:
    """The exception of the first error reply among ``replies``, else None."""
    for reply in replies:
        if reply.error_code:
            return error_for_code(reply.error_code, reply.error_message or "")
    return None


# --- topics -------------------------------------------------------------------------------------
def create_topic(name: str, partitions: int = 1, config: dict[str, Any] | None = None
                 ) -> Op[dict]:
    """Create a topic; raises ``TopicAlreadyExistsError``, ``InvalidPartitionsError``
    (before sending, for a count no topic may have: ``mq.protocol.limits``),
    ``InvalidConfigurationError`` or ``InvalidTopicError``."""
    count = check_partition_count(partitions)
    cfg = {str(k): str(v) for k, v in (config or {}).items()}
    (reply,) = yield [(Api.CREATE_TOPICS, name, count, cfg)]
    return reply["metadata"]


def delete_topic(name: str) -> Op[None]:
    yield [(Api.DELETE_TOPICS, name)]


def list_topics() -> Op[list[str]]:
    (reply,) = yield [(Api.METADATA, None)]
    return sorted(reply["topics"])


def describe_topic(name: str) -> Op[dict]:
    """``{"name", "id", "partitions", "config" (effective), "overrides", "offsets":
    [(start, end), ...], "size_bytes": [bytes of each partition's segments on disk],
    "offline": [None, or why the partition takes no writes]}``."""
    (reply,) = yield [(Api.METADATA, [name])]
    meta = reply["topics"][name]
    count = meta["partitions"]
    # The rest in one round trip, not 1 + 2 per partition: requests pipeline.
    configs, *bounds = yield [(Api.DESCRIBE_CONFIGS, name)] + [
        (Api.LIST_OFFSETS, name, p, which) for p in range(count) for which in (-2, -1)]
    ends = [r["offset"] for r in bounds]
    return {"name": name, "id": meta["id"], "partitions": count,
            "config": configs["config"], "overrides": configs["overrides"],
            "offsets": list(zip(ends[::2], ends[1::2])),
            "size_bytes": meta.get("size_bytes", [None] * count),
            "offline": meta.get("offline", [None] * count)}


def create_partitions(name: str, total: int) -> Op[dict]:
    """Grow the topic to ``total`` partitions. Raises ``InvalidPartitionsError`` (before
    sending for a count no topic may have), ``UnknownTopicOrPartitionError``."""
    total = check_partition_count(total)
    (reply,) = yield [(Api.CREATE_PARTITIONS, name, total)]
    return reply["metadata"]


def alter_config(name: str, config: dict[str, Any]) -> Op[dict]:
    """Merge ``config`` into the topic's overrides; the effective config after."""
    cfg = {str(k): str(v) for k, v in config.items()}
    (reply,) = yield [(Api.ALTER_CONFIGS, name, cfg)]
    return reply["config"]


def delete_records(name: str, partition: int, before_offset: int) -> Op[int]:
    """Kafka's DeleteRecords: records below ``before_offset`` become unreadable. Raises
    ``ValueError`` (before sending) for an offset out of 0..2**63-1,
    ``BrokerOffsetOutOfRangeError`` for one above the high watermark."""
    offset = check_offset(before_offset, "before_offset")
    (reply,) = yield [(Api.DELETE_RECORDS, name, partition, offset)]
    return reply["log_start_offset"]


# --- consumer groups ----------------------------------------------------------------------------
def committed_offsets(group: str, partitions: Iterable[TopicPartition] | None,
                      require_stable: bool = False
                      ) -> Op[tuple[dict[TopicPartition, int], set[TopicPartition]]]:
    """OffsetFetch: ``group``'s committed offsets of ``partitions`` (None: all), partitions
    without one left out, and, with ``require_stable``, the partitions whose newer offsets an
    unfinished transaction holds (no offset given for them: ask again once it ends)."""
    wanted = None if partitions is None else [[tp.topic, tp.partition] for tp in partitions]
    (reply,) = yield [(Api.OFFSET_FETCH, group, wanted, int(require_stable))]
    offsets: dict[TopicPartition, int] = {}
    unstable: set[TopicPartition] = set()
    for t, p, offset, _epoch, _metadata, _ts, error_code in reply["rows"]:
        if error_code == UnstableOffsetCommitError.code:
            unstable.add(TopicPartition(t, p))
        elif error_code:
            raise error_for_code(error_code, f"committed offset of {t}-{p}")
        elif offset >= 0:
            offsets[TopicPartition(t, p)] = offset
    return offsets, unstable


def list_groups() -> Op[list[dict]]:
    """``[{"group", "state", "members"}]``: groups with live members or committed
    offsets. ``state``: Kafka's Empty, Reconciling or Stable."""
    (reply,) = yield [(Api.LIST_GROUPS,)]
    return [{"group": g, "state": state, "members": n} for g, state, n in reply["rows"]]


def describe_group(group: str) -> Op[dict]:
    """``{"group", "state", "group_epoch", "assignment_epoch", "assignor", "members":
    [{"member_id", "instance_id", "pid", "member_epoch", "state", "assignment", ...}],
    "offsets": [{"topic", "partition", "committed_offset", "metadata", "end_offset", "lag",
    "lag_ms", "member_id", "pid"}]}`` — ``lag_ms`` is the age of the oldest unconsumed
    record. Raises ``GroupIdNotFoundError``."""
    (reply,) = yield [(Api.CONSUMER_GROUP_DESCRIBE, group)]
    return reply["description"]


def delete_group(group: str) -> Op[None]:
    """Delete a group's committed offsets. Raises ``NonEmptyGroupError`` while it has live
    members, ``GroupIdNotFoundError`` for an unknown group."""
    yield [(Api.DELETE_GROUPS, group)]


def list_group_offsets(group: str) -> Op[dict[TopicPartition, int]]:
    """The group's committed offsets (``{}`` for an unknown group)."""
    offsets, _ = yield from committed_offsets(group, None)
    return offsets


def alter_group_offsets(group: str, offsets: dict[TopicPartition, int]) -> Op[None]:
    """Set committed offsets of a group without live members (an offset reset). Raises
    ``NonEmptyGroupError`` while it has live members, ``UnknownTopicOrPartitionError``, and
    ``ValueError`` (before sending) for an offset out of 0..2**63-1."""
    items = [[tp[0], tp[1], check_offset(offset, f"the offset of {tp[0]}-{tp[1]}"), -1, ""]
             for tp, offset in offsets.items()]
    if items:
        yield [(Api.OFFSET_COMMIT, group, "", -1, items)]


# --- the broker and transactions ----------------------------------------------------------------
def broker_stats() -> Op[dict]:
    """One snapshot of the broker's figures: ``broker``, ``partitions``, ``groups``,
    ``fsync`` and ``cleaner`` (``mq/broker/stats.py`` lists the fields). What ``mq top``
    shows and ``--metrics`` exports."""
    (reply,) = yield [(Api.BROKER_STATS,)]
    return reply["stats"]


def list_transactions() -> Op[list[dict]]:
    """``[{"transactional_id", "producer_id", "state"}]``, every transactional id the
    coordinator knows, sorted. ``state`` is Kafka's: Empty, Ongoing, PrepareCommit,
    PrepareAbort, CompleteCommit, CompleteAbort (PrepareEpochFence while fencing)."""
    (reply,) = yield [(Api.LIST_TRANSACTIONS,)]
    return [{"transactional_id": tid, "producer_id": pid, "state": state}
            for tid, pid, state in reply["rows"]]


def describe_transactions(transactional_ids: Iterable[str] | None = None) -> Op[list[dict]]:
    """``describe_transaction`` for several ids (None: every one). Raises
    ``TransactionalIdNotFoundError`` naming the first unknown id."""
    ids = None if transactional_ids is None else [str(t) for t in transactional_ids]
    (reply,) = yield [(Api.DESCRIBE_TRANSACTIONS, ids)]
    return reply["rows"]


def describe_transaction(transactional_id: str) -> Op[dict]:
    """The coordinator's state of a transactional id, as the broker sends it:
    ``{"transactional_id", "state", "producer_id", "producer_epoch", "timeout_ms",
    "start_ms" (when its current or last transaction began; -1: none), "last_update_ms",
    "partitions": [[topic, partition], ...] (of the open transaction)}``. Raises
    ``TransactionalIdNotFoundError``."""
    rows = yield from describe_transactions([transactional_id])
    return rows[0]


# --- ACLs, Kafka's model (mq/broker/acls.py) ----------------------------------------------------
# A binding is the list [resource_type, resource_name, pattern_type, principal, host,
# operation, permission] of Kafka's codes; a filter is the same with None (and the ANY codes)
# for "any".
def create_acls(bindings: Iterable[list]) -> Op[None]:
    """Add the bindings (one record, fsync'd before the reply). Raises the error of the
    first one the broker refuses (``InvalidRequestError``); the valid ones are added."""
    (reply,) = yield [(Api.CREATE_ACLS, [list(b) for b in bindings])]
    for code, message in reply["results"]:
        if code:
            raise error_for_code(code, message)


def describe_acls(acl_filter: list) -> Op[list[list]]:
    """The bindings ``acl_filter`` matches."""
    (reply,) = yield [(Api.DESCRIBE_ACLS, list(acl_filter))]
    return reply["bindings"]


def delete_acls(filters: Iterable[list]) -> Op[list[list]]:
    """Remove the bindings any of ``filters`` matches; the ones removed."""
    (reply,) = yield [(Api.DELETE_ACLS, [list(f) for f in filters])]
    removed: dict[tuple, list] = {}
    for _code, _message, found in reply["results"]:
        for b in found:
            removed.setdefault(tuple(b), b)
    return list(removed.values())


# --- SCRAM users (Kafka's KIP-554; the Kafka listener's SASL checks against these) --------------
def describe_user_scram_credentials(users: Iterable[str] | None = None
                                    ) -> Op[dict[str, list[tuple[str, int]]]]:
    """``{user: [(mechanism, iterations), ...]}`` for ``users`` (None: every user).
    Raises ``ResourceNotFoundError`` naming the first unknown user."""
    wanted = None if users is None else [str(u) for u in users]
    (reply,) = yield [(Api.DESCRIBE_USER_SCRAM_CREDENTIALS, wanted)]
    out: dict[str, list[tuple[str, int]]] = {}
    for user, code, message, infos in reply["rows"]:
        if code:
            raise error_for_code(code, f"user {user!r}: {message}")
        out[user] = [(m, i) for m, i in infos]
    return out


def alter_user_scram_credentials(deletions: Iterable[tuple[str, str]] = (),
                                 upsertions: Iterable[tuple] = ()) -> Op[None]:
    """Delete ``(user, mechanism)`` credentials and upsert ``(user, mechanism,
    iterations, salt, salted_password)`` ones, as Kafka's AlterUserScramCredentials.
    Raises the first user's error (``UnacceptableCredentialError``,
    ``ResourceNotFoundError``...)."""
    (reply,) = yield [(Api.ALTER_USER_SCRAM_CREDENTIALS, [list(d) for d in deletions],
                       [list(u) for u in upsertions])]
    for user, code, message in reply["results"]:
        if code:
            raise error_for_code(code, f"user {user!r}: {message}")


def add_user(name: str, password: str, iterations: int = DEFAULT_ITERATIONS) -> Op[None]:
    """Give ``name`` SCRAM-SHA-256 and -512 credentials for ``password`` (replacing any):
    salted here, so the password never reaches the broker."""
    upsertions = []
    for mechanism in SCRAM_MECHANISMS:
        salt = os.urandom(32)
        upsertions.append((name, mechanism, iterations, salt,
                           salted_password(mechanism, password, salt, iterations)))
    yield from alter_user_scram_credentials((), upsertions)


def delete_user(name: str) -> Op[None]:
    """Remove every credential of ``name``. Raises ``ResourceNotFoundError``."""
    held = yield from describe_user_scram_credentials([name])
    yield from alter_user_scram_credentials([(name, m) for m, _ in held[name]], ())
