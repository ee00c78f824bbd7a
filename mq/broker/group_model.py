"""The group coordinator's data (``group_coordinator.py``): member and group records, the
values its methods return, and the parsing of heartbeat fields. Pure: no I/O, no clock.

Errors are mq's broker errors (``mq.errors``, Kafka's codes): the parsers raise them, and the
coordinator returns their classes as values (``HeartbeatResult.error``, ``validate_commit``).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Hashable, Iterable
from typing import Final

from mq import errors
from mq.broker.assignors import canonical_assignor
from mq.broker.internal_topics import is_internal
from mq.errors import BrokerError
from mq.protocol.types import TopicPartition

__all__ = [
    "DEFAULT_HEARTBEAT_INTERVAL_MS",
    "DEFAULT_MAX_SESSION_TIMEOUT_MS",
    "DEFAULT_MIN_SESSION_TIMEOUT_MS",
    "DEFAULT_REBALANCE_TIMEOUT_MS",
    "DEFAULT_SESSION_TIMEOUT_MS",
    "EMPTY",
    "JOIN_GROUP_MEMBER_EPOCH",
    "LEAVE_GROUP_MEMBER_EPOCH",
    "LEAVE_GROUP_STATIC_MEMBER_EPOCH",
    "Effects",
    "Group",
    "GroupDescription",
    "GroupListing",
    "GroupState",
    "HeartbeatResult",
    "LeaveResult",
    "Member",
    "MemberDescription",
    "MemberState",
    "Removal",
    "Wakeup",
    "matches_pattern",
    "merge_effects",
    "parse_assignor",
    "parse_partitions",
    "parse_subscription",
    "pattern_text",
]

JOIN_GROUP_MEMBER_EPOCH: Final = 0
LEAVE_GROUP_MEMBER_EPOCH: Final = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH: Final = -2
EMPTY: Final[frozenset[TopicPartition]] = frozenset()

# The coordinator's defaults, which are also the broker config's (``BrokerConfig.group_*``),
# with Kafka's group.consumer.* names. The minimum session timeout is 45 ms, not Kafka's 45 s,
# so that tests and impatient users can detect hung members fast.
DEFAULT_HEARTBEAT_INTERVAL_MS: Final = 5_000       # group.consumer.heartbeat.interval.ms
DEFAULT_SESSION_TIMEOUT_MS: Final = 45_000         # group.consumer.session.timeout.ms
DEFAULT_MIN_SESSION_TIMEOUT_MS: Final = 45         # group.consumer.min.session.timeout.ms
DEFAULT_MAX_SESSION_TIMEOUT_MS: Final = 1_800_000  # group.consumer.max.session.timeout.ms
DEFAULT_REBALANCE_TIMEOUT_MS: Final = 300_000      # a client's max.poll.interval.ms default


class GroupState(str, enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"        # never observed: the target is computed synchronously
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"                  # what ``describe`` says of a group that does not exist


class MemberState(str, enum.Enum):
    STABLE = "Stable"
    UNREVOKED_PARTITIONS = "UnrevokedPartitions"
    UNRELEASED_PARTITIONS = "UnreleasedPartitions"


@dataclasses.dataclass(frozen=True, slots=True)
class Wakeup:
    """A member whose next heartbeat would change its assignment: ask it to heartbeat now."""
    group_id: str
    member_id: str
    conn_id: Hashable | None
    pid: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class Removal:
    """A member that left the group (``removed``) or a static member that went away with its
    partitions reserved (``departed``); ``reason`` is for the log."""
    group_id: str
    member_id: str
    instance_id: str | None
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Effects:
    wakeups: tuple[Wakeup, ...] = ()
    removed: tuple[Removal, ...] = ()
    departed: tuple[Removal, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class HeartbeatResult:
    member_id: str | None
    member_epoch: int
    assignment: frozenset[TopicPartition]    # what to own now; revoke anything else you own
    heartbeat_interval_ms: int
    error: type[BrokerError] | None = None
    error_message: str | None = None
    effects: Effects = Effects()


@dataclasses.dataclass(frozen=True, slots=True)
class LeaveResult:
    error: type[BrokerError] | None
    effects: Effects = Effects()


@dataclasses.dataclass(frozen=True, slots=True)
class MemberDescription:
    member_id: str
    instance_id: str | None
    pid: int | None
    conn_id: Hashable | None
    subscribed_topics: tuple[str, ...] | None
    subscribed_pattern: str | None
    assignor: str | None
    member_epoch: int
    state: MemberState
    departed: bool
    assigned: frozenset[TopicPartition]
    pending_revocation: frozenset[TopicPartition]
    target: frozenset[TopicPartition]
    owned: frozenset[TopicPartition]           # as last reported by the member
    last_heartbeat_ms: int
    session_timeout_ms: int


@dataclasses.dataclass(frozen=True, slots=True)
class GroupDescription:
    group_id: str
    state: GroupState
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[MemberDescription, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class GroupListing:
    group_id: str
    state: GroupState
    members: int


@dataclasses.dataclass(eq=False)
class Member:
    """One member of a group, as the coordinator tracks it (mutable)."""

    member_id: str
    instance_id: str | None
    topics: frozenset[str] | None
    pattern: re.Pattern[str] | None
    assignor: str | None
    conn_id: Hashable | None
    pid: int | None
    session_timeout_ms: int
    rebalance_timeout_ms: int
    last_heartbeat_ms: int
    epoch: int = JOIN_GROUP_MEMBER_EPOCH
    previous_epoch: int = -1
    state: MemberState = MemberState.STABLE
    assigned: frozenset[TopicPartition] = EMPTY
    pending_revocation: frozenset[TopicPartition] = EMPTY
    revoke_deadline_ms: int | None = None
    owned: frozenset[TopicPartition] = EMPTY
    departed: bool = False
    last_sent: tuple[int, frozenset[TopicPartition]] | None = None
    woken_for: tuple[int, frozenset[TopicPartition]] | None = None


@dataclasses.dataclass(eq=False)
class Group:
    """One group: its members, target assignment and who holds which partition (mutable)."""

    group_id: str
    assignor: str
    epoch: int = 0
    target_epoch: int = 0
    members: dict[str, Member] = dataclasses.field(default_factory=dict)
    instances: dict[str, str] = dataclasses.field(default_factory=dict)
    target: dict[str, frozenset[TopicPartition]] = dataclasses.field(default_factory=dict)
    holder: dict[TopicPartition, str] = dataclasses.field(default_factory=dict)
    known_free: set[TopicPartition] = dataclasses.field(default_factory=set)   # restart grace
    dirty: bool = False


def merge_effects(a: Effects, b: Effects) -> Effects:
    """Both effects, ``a``'s first."""
    return Effects(a.wakeups + b.wakeups, a.removed + b.removed, a.departed + b.departed)


def matches_pattern(member: Member, topic: str) -> bool:
    """Does the member's pattern subscription take ``topic``? Never an internal topic (Kafka's
    regexes never match ``__consumer_offsets``)."""
    if member.pattern is None:
        return False
    return not is_internal(topic) and member.pattern.fullmatch(topic) is not None


def pattern_text(pattern: re.Pattern[str] | None) -> str | None:
    return None if pattern is None else pattern.pattern


def parse_subscription(subscription: object, pattern: str | None) -> tuple | None:
    """-> (topics, None) | (None, compiled regex) | None (unchanged). Raises
    ``InvalidRequestError`` or ``InvalidRegularExpressionError``."""
    if pattern is not None:
        if subscription is not None:
            raise errors.InvalidRequestError("send topic names or a pattern, not both")
        if not isinstance(pattern, str):
            raise errors.InvalidRequestError("the pattern must be a string")
        try:
            return None, re.compile(pattern)
        except re.error as err:
            raise errors.InvalidRegularExpressionError(
                f"bad subscription pattern {pattern!r}: {err}") from err
    if subscription is None:
        return None
    if isinstance(subscription, re.Pattern):
        return None, subscription
    if isinstance(subscription, (str, bytes)) or not isinstance(subscription, Iterable):
        raise errors.InvalidRequestError(
            "the subscription must be a list of topic names or a compiled pattern")
    topics = frozenset(subscription)
    if not all(isinstance(t, str) and t for t in topics):
        raise errors.InvalidRequestError("topic names must be non-empty strings")
    return topics, None


def parse_partitions(partitions: Iterable[Iterable] | None) -> frozenset[TopicPartition] | None:
    """Owned partitions as sent (``[[topic, partition], ...]``); ``None``: unchanged. Raises
    ``InvalidRequestError``."""
    if partitions is None:
        return None
    out = set()
    for item in partitions:
        tp = tuple(item)
        if len(tp) != 2 or not isinstance(tp[0], str) or not isinstance(tp[1], int) \
                or isinstance(tp[1], bool):
            raise errors.InvalidRequestError(f"bad owned partition {item!r:.60}")
        out.add(TopicPartition(tp[0], tp[1]))
    return frozenset(out)


def parse_assignor(name: str) -> str:
    """The canonical assignor name; raises ``UnsupportedAssignorError``."""
    try:
        return canonical_assignor(name)
    except ValueError as err:
        raise errors.UnsupportedAssignorError(str(err)) from err
