"""Requests and responses of mq's native protocol: api numbers, one schema table, validation.

A request is ``[api, request_id, *fields]``; ``check_request`` checks it against the api's
request schema, so the broker never acts on a field of the wrong type: it answers
``InvalidRequest`` instead. A response is ``[api, request_id, error_code, error_message,
*fields]``: the api's reply fields when the error code is 0, none otherwise. ``Response``
reads them by name (``reply["first_offset"]``).

``SCHEMAS`` is the protocol's one description: per api, its request fields with their types,
its reply fields, and what each means where the name does not say it.

The broker also *pushes* ``[68, 0, 0, nil]`` (request id 0, never used by a request) on a
member's heartbeat connection when the member should heartbeat now: its assignment changed.
"""

from __future__ import annotations

import dataclasses
import enum
import fcntl
import functools
from collections.abc import Callable
from typing import Any, Final

from mq.errors import RemoteProtocolError

__all__ = ["PROTOCOL_VERSION", "SUPPORTED_VERSIONS", "Api", "Request", "Response", "ARENA_SEALS",
           "SCHEMAS", "Schema", "check_request", "request", "response", "ACKS_ALL",
           "PUSH_REQUEST_ID", "TAIL_APIS"]

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

@dataclasses.dataclass(frozen=True, slots=True)
class Schema:
    """One api: its request fields (name, type) after ``request_id`` and its reply's field
    names after ``error_message``."""
    request: tuple[tuple[str, Any], ...]
    reply: tuple[str, ...] = ()


SCHEMAS: Final[dict[Api, Schema]] = {
    # Kafka's ApiVersions. info: {data_dir, generation, pid, gid, semaphore_prefix, shm,
    # max_request_bytes, frame_tail, shared_batches, futex_wake} (server.py says each).
    Api.HANDSHAKE: Schema((("protocol_version", int), ("client_name", str), ("pid", int)),
                          ("protocol_version", "info")),
    # acks: 0, 1 or -1 (all; acks=0 has no reply). batch: or the frame's raw tail, to a broker
    # whose Handshake info says frame_tail (frames.py). For a batch an idempotent producer
    # sent again (a retry the partition has), first_offset is the one the batch got the first
    # time, and nothing is appended.
    Api.PRODUCE: Schema((("topic", str), ("partition", int), ("acks", int), ("batch", bytes)),
                        ("first_offset", "log_append_time", "log_start_offset")),
    # timestamp: -1 latest, -2 earliest, -3 max timestamp; offset and timestamp -1: none.
    Api.LIST_OFFSETS: Schema((("topic", str), ("partition", int), ("timestamp", int)),
                             ("offset", "timestamp")),
    # topics nil: all; the reply's topics: {name: metadata}.
    Api.METADATA: Schema((("topics", _OPT_STR_LIST),), ("topics",)),
    Api.CREATE_TOPICS: Schema((("topic", str), ("partitions", int), ("config", _STR_MAP)),
                              ("metadata",)),
    Api.DELETE_TOPICS: Schema((("topic", str),)),
    Api.DELETE_RECORDS: Schema((("topic", str), ("partition", int), ("offset", int)),
                               ("log_start_offset",)),
    # topic "": the broker's topic defaults, with no overrides. config: effective
    # {str: str}; overrides: the topic's own {str: str}.
    Api.DESCRIBE_CONFIGS: Schema((("topic", str),), ("config", "overrides")),
    # config: merged into the topic's overrides.
    Api.ALTER_CONFIGS: Schema((("topic", str), ("config", _STR_MAP)), ("config",)),
    # delete: overrides removed (the broker default applies again); validate_only 1: check,
    # change nothing.
    Api.INCREMENTAL_ALTER_CONFIGS: Schema((("topic", str), ("set", _STR_MAP),
                                           ("delete", _OPT_STR_LIST), ("validate_only", int)),
                                          ("config",)),
    Api.CREATE_PARTITIONS: Schema((("topic", str), ("total", int)), ("metadata",)),
    # Arm a wake-up: post my semaphore when data passes these [[topic, partition, offset]].
    # One way: no reply. Semaphore "": push [1000, 0, 0, nil] on this connection instead,
    # once until the next Wait (a client whose event loop watches its socket).
    Api.WAIT: Schema((("semaphore", str), ("positions", _WAIT_LIST))),
    # stats: {broker, partitions, groups, fsync, cleaner}, mq/broker/stats.py says each.
    Api.BROKER_STATS: Schema((), ("stats",)),
    # A sealed memfd of ``size`` passed in the same sendmsg (SCM_RIGHTS): the connection's
    # batch arena, to a broker whose Handshake info says shared_batches (mq/client/arena.py).
    Api.SHARE_MEMORY: Schema((("size", int),)),
    # Produce for the batch at [offset, offset + length) of the arena; acks 1 or -1.
    Api.PRODUCE_SHARED: Schema((("topic", str), ("partition", int), ("acks", int),
                                ("offset", int), ("length", int)),
                               ("first_offset", "log_append_time", "log_start_offset")),
    # offsets: [[topic str, partition int, offset int, leader_epoch int, metadata str], ...]
    Api.OFFSET_COMMIT: Schema((("group", str), ("member_id", str), ("member_epoch", int),
                               ("offsets", _COMMIT_LIST))),
    # partitions nil: all; require_stable 1: a partition whose offsets an open transaction
    # holds answers UNSTABLE_OFFSET_COMMIT in its row. rows: [[topic, partition, offset (-1:
    # none), leader_epoch, metadata, commit_timestamp_ms, error_code], ...]
    Api.OFFSET_FETCH: Schema((("group", str), ("partitions", _OPT_TP_LIST),
                              ("require_stable", int)), ("rows",)),
    # rows: [[group, state, live members], ...]
    Api.LIST_GROUPS: Schema((), ("rows",)),
    Api.DELETE_GROUPS: Schema((("group", str),)),
    # rows: [[topic, partition, error_code], ...] (GROUP_SUBSCRIBED_TO_TOPIC for a topic a
    # member subscribes to: those offsets stay).
    Api.OFFSET_DELETE: Schema((("group", str), ("partitions", _OPT_TP_LIST)), ("rows",)),
    # session_timeout_ms -1: the broker's default. assignment: [[topic, partition], ...]
    Api.CONSUMER_GROUP_HEARTBEAT: Schema(
        (("group", str), ("member_id", _OPT_STR), ("member_epoch", int),
         ("instance_id", _OPT_STR), ("rebalance_timeout_ms", int), ("session_timeout_ms", int),
         ("topics", _OPT_STR_LIST), ("pattern", _OPT_STR), ("assignor", _OPT_STR),
         ("owned", _OPT_TP_LIST)),
        ("member_id", "member_epoch", "heartbeat_interval_ms", "assignment")),
    # description: {group, state, group_epoch, assignment_epoch, assignor, members, offsets}
    Api.CONSUMER_GROUP_DESCRIBE: Schema((("group", str),), ("description",)),
    # transactional_id nil: an idempotent producer's id, epoch 0.
    Api.INIT_PRODUCER_ID: Schema((("transactional_id", _OPT_STR),
                                  ("transaction_timeout_ms", int)),
                                 ("producer_id", "producer_epoch")),
    Api.ADD_PARTITIONS_TO_TXN: Schema((("transactional_id", str), ("producer_id", int),
                                       ("producer_epoch", int), ("partitions", _OPT_TP_LIST))),
    Api.ADD_OFFSETS_TO_TXN: Schema((("transactional_id", str), ("producer_id", int),
                                    ("producer_epoch", int), ("group", str))),
    # commit: 1 commit, 0 abort.
    Api.END_TXN: Schema((("transactional_id", str), ("producer_id", int),
                         ("producer_epoch", int), ("commit", int))),
    # member_epoch -1: no group member.
    Api.TXN_OFFSET_COMMIT: Schema((("transactional_id", str), ("group", str),
                                   ("producer_id", int), ("producer_epoch", int),
                                   ("member_id", str), ("member_epoch", int),
                                   ("offsets", _COMMIT_LIST))),
    # rows: [{transactional_id, state, producer_id, producer_epoch, timeout_ms, start_ms,
    # last_update_ms, partitions [[topic, partition]]}, ...]
    Api.DESCRIBE_TRANSACTIONS: Schema((("transactional_ids", _OPT_STR_LIST),), ("rows",)),
    # rows: [[transactional_id, producer_id, state], ...]
    Api.LIST_TRANSACTIONS: Schema((), ("rows",)),
    # A binding: [resource_type int, resource_name str, pattern_type int, principal str,
    # host str, operation int, permission int] (Kafka's codes: mq/broker/acls.py); a filter
    # the same seven with name, principal and host nil: any. results: [[error_code,
    # message], ...] per binding; DeleteAcls's: [[error_code, message, [binding, ...]], ...]
    # per filter.
    Api.CREATE_ACLS: Schema((("bindings", _ACL_LIST),), ("results",)),
    Api.DESCRIBE_ACLS: Schema((("filter", _ACL_FILTER),), ("bindings",)),
    Api.DELETE_ACLS: Schema((("filters", _ACL_FILTER_LIST),), ("results",)),
    # users nil: all. rows: [[user, error_code, error_message, [[mechanism, iterations],
    # ...]], ...]
    Api.DESCRIBE_USER_SCRAM_CREDENTIALS: Schema((("users", _OPT_STR_LIST),), ("rows",)),
    # deletions: [[user, mechanism], ...]; upsertions: [[user, mechanism, iterations, salt
    # bin, salted_password bin], ...] (KIP-554's fields: the password itself never crosses
    # the socket). results: [[user, error_code, error_message], ...]
    Api.ALTER_USER_SCRAM_CREDENTIALS: Schema((("deletions", _SCRAM_DELETIONS),
                                              ("upsertions", _SCRAM_UPSERTIONS)),
                                             ("results",)),
}
# A reply field's position after error_message, by api number.
_REPLY_POSITIONS: Final[dict[int, dict[str, int]]] = {
    int(api): {name: i for i, name in enumerate(schema.reply)} for api, schema in SCHEMAS.items()}

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

    def __getitem__(self, name: str) -> Any:
        """The reply field ``name`` (``SCHEMAS``); ``KeyError`` for a name the api's reply does
        not have, ``IndexError`` for an error reply, which has no fields."""
        return self.fields[_REPLY_POSITIONS[self.api][name]]

    @classmethod
    def refused(cls, error_code: int, error_message: str | None) -> Response:
        """An error reply for a request never sent (a Kafka handler's denied resource)."""
        return cls(-1, -1, error_code, error_message, [])

    @classmethod
    def from_message(cls, message: list) -> Response:
        if len(message) < 4 or not isinstance(message[1], int) or \
                not isinstance(message[2], int):
            raise RemoteProtocolError("a response must be [api, request_id, error_code, "
                                      "error_message, ...]")
        return cls(message[0], message[1], message[2], message[3], message[4:])


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_str(v: Any) -> bool:
    return isinstance(v, str)


def _is_bytes(v: Any) -> bool:
    return isinstance(v, (bytes, bytearray, memoryview))   # a memoryview: a tail frame's tail


_SIMPLE: Final[dict[Any, Callable[[Any], bool]]] = {int: _is_int, str: _is_str,
                                                    bytes: _is_bytes}


def _check(kind: Any, value: Any) -> bool:
    simple = _SIMPLE.get(kind)
    if simple is not None:
        return simple(value)
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


# Each api's request checks, by the api's number: (api, field names, field checkers); a
# simple kind's checker is called directly (every request runs these, the produce path too).
_REQUEST_CHECKS: Final[dict[int, tuple[Api, tuple[str, ...], tuple[Callable, ...]]]] = {
    int(api): (api, tuple(name for name, _ in schema.request),
               tuple(_SIMPLE.get(kind) or functools.partial(_check, kind)
                     for _, kind in schema.request))
    for api, schema in SCHEMAS.items()}


def check_request(message: list) -> Request:
    """Validate a decoded request against its schema.

    Raises ``RemoteProtocolError`` naming the api and the field for an unknown api, a wrong
    field count or a field of the wrong type.
    """
    raw_api, request_id = message[0], message[1]
    if not _is_int(request_id):
        raise RemoteProtocolError(f"request id must be an integer, got {request_id!r:.40}")
    try:
        api, names, checks = _REQUEST_CHECKS[raw_api]
    except (KeyError, TypeError) as err:           # TypeError: an unhashable api
        raise RemoteProtocolError(f"unknown api {raw_api!r:.40}") from err
    values = message[2:]
    if len(values) != len(names):
        raise RemoteProtocolError(f"{api.name} takes {len(names)} fields, got {len(values)}")
    for name, check, value in zip(names, checks, values):
        if not check(value):
            raise RemoteProtocolError(f"{api.name}: field {name!r} has the wrong type "
                                      f"({type(value).__name__})")
    return Request(api, request_id, dict(zip(names, values)))


def request(api: Api, request_id: int, *fields: Any) -> list:
    """The message for a request; field order as in the api's schema."""
    return [int(api), request_id, *fields]


def response(api: int, request_id: int, error_code: int = 0, error_message: str | None = None,
             *fields: Any) -> list:
    """The message for a reply: none of the fields, or all of the api's reply fields in the
    order of ``SCHEMAS`` (checked where asserts run, as in the test suite)."""
    assert not fields or len(fields) == len(_REPLY_POSITIONS[api]), (api, len(fields))
    return [int(api), request_id, error_code, error_message, *fields]
