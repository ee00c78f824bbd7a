"""Requests and responses: api numbers, field schemas and their validation.

A request is ``[api, request_id, *fields]``; ``check_request`` checks it against the api's
schema so that the broker never acts on a field of the wrong type — it answers
``InvalidRequest`` instead. A response is ``[api, request_id, error_code, error_message,
*fields]``.

Schemas (fields after ``request_id``)::

    Handshake       18  protocol_version int, client_name str, pid int    (Kafka's ApiVersions)
    Produce          0  topic str, partition int, acks int (0, 1, -1 = all), batch bin
                        (or the frame's raw tail, to a broker whose Handshake info says
                        ``frame_tail``: see frames.py)
    ListOffsets      2  topic str, partition int, timestamp int (-1 latest, -2 earliest, -3 max)
    Metadata         3  topics [str] | nil (nil: all)
    CreateTopics    19  topic str, partitions int, config {str: str}
    DeleteTopics    20  topic str
    DeleteRecords   21  topic str, partition int, offset int
    DescribeConfigs 32  topic str ("": the broker's topic defaults, with no overrides)
                        -> effective config {str: str}, the topic's overrides {str: str}
    AlterConfigs    33  topic str, config {str: str} (merged into the topic's overrides)
    IncrementalAlterConfigs 44  topic str, set {str: str}, delete [str] | nil (overrides
                        removed: the broker default applies again), validate_only int (1:
                        check, change nothing) -> effective config {str: str}
    CreatePartitions 37 topic str, total int
    Wait          1000  semaphore str, [[topic str, partition int, offset int], ...]   (no reply)
    BrokerStats   1001  (no fields) -> {broker, partitions, groups, fsync, cleaner}: one
                        snapshot of the broker's figures (mq/broker/stats.py documents it)
    ShareMemory   1002  size int, with a sealed memfd of that size passed in the same
                        sendmsg (SCM_RIGHTS): the connection's batch arena (to a broker whose
                        Handshake info says ``shared_batches``; see mq/client/arena.py)
    ProduceShared 1003  topic str, partition int, acks int (1 or -1), offset int, length int:
                        Produce for the batch at [offset, offset + length) of the arena;
                        the reply is Produce's

    OffsetCommit     8  group str, member_id str, member_epoch int,
                        [[topic str, partition int, offset int, leader_epoch int, metadata str]]
    OffsetFetch      9  group str, [[topic str, partition int], ...] | nil (nil: all),
                        require_stable int (1: a partition whose offsets an open transaction
                        holds answers UNSTABLE_OFFSET_COMMIT in its row)
                        -> [[topic, partition, offset (-1: none), leader_epoch, metadata,
                             commit_timestamp_ms, error_code int], ...]
    ListGroups      16  (no fields)
    DeleteGroups    42  group str
    OffsetDelete    47  group str, [[topic str, partition int], ...]
                        -> [[topic, partition, error_code int], ...] (GROUP_SUBSCRIBED_TO_TOPIC
                        for a topic a member subscribes to: those offsets stay)
    ConsumerGroupHeartbeat 68  group str, member_id str|nil, member_epoch int,
                        instance_id str|nil, rebalance_timeout_ms int, session_timeout_ms int
                        (-1: broker default), topics [str]|nil, pattern str|nil,
                        assignor str|nil, owned [[topic str, partition int]]|nil
    ConsumerGroupDescribe 69  group str

    InitProducerId  22  transactional_id str|nil, transaction_timeout_ms int
                        -> producer_id int, producer_epoch int
    AddPartitionsToTxn 24  transactional_id str, producer_id int, producer_epoch int,
                        [[topic str, partition int], ...]
    AddOffsetsToTxn 25  transactional_id str, producer_id int, producer_epoch int, group str
    EndTxn          26  transactional_id str, producer_id int, producer_epoch int,
                        commit int (1 commit, 0 abort)
    TxnOffsetCommit 28  transactional_id str, group str, producer_id int, producer_epoch int,
                        member_id str, member_epoch int (-1: no group member),
                        [[topic str, partition int, offset int, leader_epoch int, metadata str]]
    DescribeTransactions 65  [transactional_id str, ...]
                        -> [{transactional_id, state, producer_id, producer_epoch, timeout_ms,
                             start_ms, last_update_ms, partitions [[topic, partition]]}, ...]
    ListTransactions 66  (no fields) -> [[transactional_id, producer_id, state], ...]

    CreateAcls      30  [[resource_type int, resource_name str, pattern_type int,
                        principal str, host str, operation int, permission int], ...]
                        (Kafka's codes: mq/broker/acls.py) -> [[error_code, message], ...]
    DescribeAcls    29  filter [the same seven, name, principal and host nil: any]
                        -> [binding, ...]
    DeleteAcls      31  [filter, ...] -> [[error_code, message, [binding, ...]], ...]
    DescribeUserScramCredentials 50  users [str] | nil (nil: all)
                        -> [[user, error_code int, error_message, [[mechanism str,
                             iterations int], ...]], ...]
    AlterUserScramCredentials 51  deletions [[user str, mechanism str], ...],
                        upsertions [[user str, mechanism str, iterations int, salt bin,
                        salted_password bin], ...] (KIP-554's fields: the password itself
                        never crosses the socket) -> [[user, error_code int, error_message]]

A Produce reply is ``first_offset, log_append_time, log_start_offset``; for a batch an
idempotent producer sent again (a retry the partition has), the first offset is the one the
batch got the first time, and nothing is appended.

The broker also *pushes* ``[68, 0, 0, nil]`` (request id 0, never used by a request) on a
member's heartbeat connection when the member should heartbeat now: its assignment changed.
"""

from __future__ import annotations

import dataclasses
import enum
import fcntl
from typing import Any, Final

from mq.errors import RemoteProtocolError

__all__ = ["PROTOCOL_VERSION", "SUPPORTED_VERSIONS", "Api", "Request", "Response", "ARENA_SEALS",
           "check_request", "request", "response", "ACKS_ALL", "PUSH_REQUEST_ID", "TAIL_APIS"]

PROTOCOL_VERSION: Final = 1
SUPPORTED_VERSIONS: Final = frozenset({1})
ACKS_ALL: Final = -1
# What ShareMemory's memfd must be sealed with: it can neither shrink (so the broker's map can
# never fault) nor grow, and its seals are final.
ARENA_SEALS: Final = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL


class Api(enum.IntEnum):
    PRODUCE = 0
    LIST_OFFSETS = 2
    METADATA = 3
    HANDSHAKE = 18          # Kafka's ApiVersions
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    INCREMENTAL_ALTER_CONFIGS = 44
    CREATE_PARTITIONS = 37
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    LIST_GROUPS = 16
    DELETE_GROUPS = 42
    OFFSET_DELETE = 47
    CONSUMER_GROUP_HEARTBEAT = 68
    CONSUMER_GROUP_DESCRIBE = 69
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    WAIT = 1000             # arm a wake-up: post my semaphore when data passes these offsets
    BROKER_STATS = 1001     # mq top and the metrics: partitions, groups, fsync, cleaner
    SHARE_MEMORY = 1002     # a producer's batch arena, a sealed memfd passed with SCM_RIGHTS
    PRODUCE_SHARED = 1003   # Produce for a batch in that arena: a descriptor, not the bytes


_STR_MAP = ("str_map",)
_WAIT_LIST = ("wait_list",)
_OPT_STR_LIST = ("opt_str_list",)
_OPT_STR = ("opt_str",)
_OPT_TP_LIST = ("opt_tp_list",)
_COMMIT_LIST = ("commit_list",)
_ACL_LIST = ("acl_list",)
_ACL_FILTER = ("acl_filter",)
_ACL_FILTER_LIST = ("acl_filter_list",)
_SCRAM_DELETIONS = ("scram_deletions",)
_SCRAM_UPSERTIONS = ("scram_upsertions",)
PUSH_REQUEST_ID: Final = 0

_SCHEMAS: Final[dict[Api, tuple[tuple[str, Any], ...]]] = {
    Api.HANDSHAKE: (("protocol_version", int), ("client_name", str), ("pid", int)),
    Api.PRODUCE: (("topic", str), ("partition", int), ("acks", int), ("batch", bytes)),
    Api.LIST_OFFSETS: (("topic", str), ("partition", int), ("timestamp", int)),
    Api.METADATA: (("topics", _OPT_STR_LIST),),
    Api.CREATE_TOPICS: (("topic", str), ("partitions", int), ("config", _STR_MAP)),
    Api.DELETE_TOPICS: (("topic", str),),
    Api.DELETE_RECORDS: (("topic", str), ("partition", int), ("offset", int)),
    Api.DESCRIBE_CONFIGS: (("topic", str),),
    Api.ALTER_CONFIGS: (("topic", str), ("config", _STR_MAP)),
    Api.INCREMENTAL_ALTER_CONFIGS: (("topic", str), ("set", _STR_MAP),
                                    ("delete", _OPT_STR_LIST), ("validate_only", int)),
    Api.CREATE_PARTITIONS: (("topic", str), ("total", int)),
    Api.WAIT: (("semaphore", str), ("positions", _WAIT_LIST)),
    Api.BROKER_STATS: (),
    Api.SHARE_MEMORY: (("size", int),),
    Api.PRODUCE_SHARED: (("topic", str), ("partition", int), ("acks", int), ("offset", int),
                         ("length", int)),
    Api.OFFSET_COMMIT: (("group", str), ("member_id", str), ("member_epoch", int),
                        ("offsets", _COMMIT_LIST)),
    Api.OFFSET_FETCH: (("group", str), ("partitions", _OPT_TP_LIST), ("require_stable", int)),
    Api.LIST_GROUPS: (),
    Api.DELETE_GROUPS: (("group", str),),
    Api.OFFSET_DELETE: (("group", str), ("partitions", _OPT_TP_LIST)),
    Api.CONSUMER_GROUP_HEARTBEAT: (
        ("group", str), ("member_id", _OPT_STR), ("member_epoch", int),
        ("instance_id", _OPT_STR), ("rebalance_timeout_ms", int), ("session_timeout_ms", int),
        ("topics", _OPT_STR_LIST), ("pattern", _OPT_STR), ("assignor", _OPT_STR),
        ("owned", _OPT_TP_LIST)),
    Api.CONSUMER_GROUP_DESCRIBE: (("group", str),),
    Api.INIT_PRODUCER_ID: (("transactional_id", _OPT_STR), ("transaction_timeout_ms", int)),
    Api.ADD_PARTITIONS_TO_TXN: (("transactional_id", str), ("producer_id", int),
                                ("producer_epoch", int), ("partitions", _OPT_TP_LIST)),
    Api.ADD_OFFSETS_TO_TXN: (("transactional_id", str), ("producer_id", int),
                             ("producer_epoch", int), ("group", str)),
    Api.END_TXN: (("transactional_id", str), ("producer_id", int), ("producer_epoch", int),
                  ("commit", int)),
    Api.TXN_OFFSET_COMMIT: (("transactional_id", str), ("group", str), ("producer_id", int),
                            ("producer_epoch", int), ("member_id", str), ("member_epoch", int),
                            ("offsets", _COMMIT_LIST)),
    Api.DESCRIBE_TRANSACTIONS: (("transactional_ids", _OPT_STR_LIST),),
    Api.LIST_TRANSACTIONS: (),
    Api.CREATE_ACLS: (("bindings", _ACL_LIST),),
    Api.DESCRIBE_ACLS: (("filter", _ACL_FILTER),),
    Api.DELETE_ACLS: (("filters", _ACL_FILTER_LIST),),
    Api.DESCRIBE_USER_SCRAM_CREDENTIALS: (("users", _OPT_STR_LIST),),
    Api.ALTER_USER_SCRAM_CREDENTIALS: (("deletions", _SCRAM_DELETIONS),
                                       ("upsertions", _SCRAM_UPSERTIONS)),
}

ONE_WAY: Final = frozenset({Api.WAIT})
# Apis whose last field, a record batch, a client may send as a tail frame's tail.
TAIL_APIS: Final = frozenset({Api.PRODUCE})


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    api: Api
    request_id: int
    fields: dict[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.fields[name]


@dataclasses.dataclass(frozen=True, slots=True)
class Response:
    api: int
    request_id: int
    error_code: int
    error_message: str | None
    fields: list[Any]

    @classmethod
    def from_message(cls, message: list) -> Response:
        if len(message) < 4 or not isinstance(message[1], int) or \
                not isinstance(message[2], int):
            raise RemoteProtocolError("a response must be [api, request_id, error_code, "
                                      "error_message, ...]")
        return cls(message[0], message[1], message[2], message[3], message[4:])


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check(kind: Any, value: Any) -> bool:
    if kind is int:
        return _is_int(value)
    if kind is str:
        return isinstance(value, str)
    if kind is bytes:                   # a memoryview: a tail frame's tail (frames.py)
        return isinstance(value, (bytes, bytearray, memoryview))
    if kind is _STR_MAP:
        return isinstance(value, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    if kind is _OPT_STR_LIST:
        return value is None or (isinstance(value, list)
                                 and all(isinstance(t, str) for t in value))
    if kind is _OPT_STR:
        return value is None or isinstance(value, str)
    if kind is _OPT_TP_LIST:
        return value is None or (isinstance(value, list) and all(
            isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) and _is_int(p[1])
            for p in value))
    if kind is _COMMIT_LIST:
        return isinstance(value, list) and all(
            isinstance(p, list) and len(p) == 5 and isinstance(p[0], str) and _is_int(p[1])
            and _is_int(p[2]) and _is_int(p[3]) and isinstance(p[4], str) for p in value)
    if kind is _WAIT_LIST:
        return isinstance(value, list) and all(
            isinstance(p, list) and len(p) == 3 and isinstance(p[0], str)
            and _is_int(p[1]) and _is_int(p[2]) for p in value)
    if kind is _ACL_LIST:
        return isinstance(value, list) and all(_is_acl(b, str) for b in value)
    if kind is _ACL_FILTER:
        return _is_acl(value, _OPT_STR)
    if kind is _ACL_FILTER_LIST:
        return isinstance(value, list) and all(_is_acl(f, _OPT_STR) for f in value)
    if kind is _SCRAM_DELETIONS:
        return isinstance(value, list) and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p)
            for p in value)
    if kind is _SCRAM_UPSERTIONS:
        return isinstance(value, list) and all(
            isinstance(p, list) and len(p) == 5 and isinstance(p[0], str)
            and isinstance(p[1], str) and _is_int(p[2]) and isinstance(p[3], bytes)
            and isinstance(p[4], bytes) for p in value)
    raise AssertionError(kind)


def _is_acl(value: Any, name_kind: Any) -> bool:
    """An ACL binding (``name_kind`` str) or filter (``_OPT_STR``): seven fields, the
    resource name, principal and host strings, the others ints."""
    return isinstance(value, list) and len(value) == 7 and all(
        _check(name_kind if i in (1, 3, 4) else int, v) for i, v in enumerate(value))


def check_request(message: list) -> Request:
    """Validate a decoded request against its schema.

    Raises ``RemoteProtocolError`` naming the api and the field for an unknown api, a wrong
    field count or a field of the wrong type.
    """
    raw_api, request_id = message[0], message[1]
    if not _is_int(request_id):
        raise RemoteProtocolError(f"request id must be an integer, got {request_id!r:.40}")
    try:
        api = Api(raw_api)
    except (ValueError, TypeError) as err:
        raise RemoteProtocolError(f"unknown api {raw_api!r:.40}") from err
    schema = _SCHEMAS[api]
    values = message[2:]
    if len(values) != len(schema):
        raise RemoteProtocolError(f"{api.name} takes {len(schema)} fields, got {len(values)}")
    for (name, kind), value in zip(schema, values, strict=True):
        if not _check(kind, value):
            raise RemoteProtocolError(f"{api.name}: field {name!r} has the wrong type "
                                      f"({type(value).__name__})")
    return Request(api, request_id, dict(zip((n for n, _ in schema), values, strict=True)))


def request(api: Api, request_id: int, *fields: Any) -> list:
    """The message for a request; field order as in the api's schema."""
    return [int(api), request_id, *fields]


def response(api: int, request_id: int, error_code: int = 0, error_message: str | None = None,
             *fields: Any) -> list:
    return [int(api), request_id, error_code, error_message, *fields]
