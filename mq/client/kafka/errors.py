"""librdkafka's errors as mq's exceptions, so code written for the local broker catches the
same classes on a cluster.

A broker's error (code 0 and up) is Kafka's code, the one ``mq.errors.ERRORS_BY_CODE`` maps
already. librdkafka's own (negative codes, ``_TRANSPORT``, ``_MSG_TIMED_OUT``...) are mapped
below by meaning; one without a meaning here stays an ``UnknownServerError`` that keeps its
code. The exception's message is librdkafka's, prefixed with its error name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from mq.errors import (
    BrokerUnavailableError,
    ClosedError,
    ConfigError,
    InvalidTxnStateError,
    NoOffsetForPartitionError,
    ProducerFencedError,
    RequestTimedOutError,
    UnknownServerError,
    UnknownTopicOrPartitionError,
    ERRORS_BY_CODE,
    error_for_code,
)

__all__ = ["LIST_OFFSETS_UNKNOWN_GRACE_S", "committed_offsets", "from_kafka", "raising",
           "results"]


def _no_offset(message: str) -> NoOffsetForPartitionError:
    return NoOffsetForPartitionError(-1, -1, -1, message)


def _local() -> dict[int, Callable[[str], Exception]]:
    from confluent_kafka import KafkaError as E
    return {
        E._TRANSPORT: BrokerUnavailableError, E._ALL_BROKERS_DOWN: BrokerUnavailableError,
        E._RESOLVE: BrokerUnavailableError, E._AUTHENTICATION: BrokerUnavailableError,
        E._SSL: BrokerUnavailableError,
        E._MSG_TIMED_OUT: RequestTimedOutError, E._TIMED_OUT: RequestTimedOutError,
        E._TIMED_OUT_QUEUE: RequestTimedOutError,
        E._UNKNOWN_TOPIC: UnknownTopicOrPartitionError,
        E._UNKNOWN_PARTITION: UnknownTopicOrPartitionError,
        E._FENCED: ProducerFencedError,
        E._STATE: InvalidTxnStateError,
        E._AUTO_OFFSET_RESET: _no_offset,
        E._DESTROY: ClosedError, E._PURGE_QUEUE: ClosedError, E._PURGE_INFLIGHT: ClosedError,
        E._INVALID_ARG: ConfigError,
    }


_LOCAL: dict[int, Callable[[str], Exception]] | None = None


def from_kafka(err: Any, what: str = "") -> Exception:
    """The mq exception for a ``KafkaError`` (or a ``KafkaException`` carrying one);
    ``what`` (the operation) prefixes the message."""
    global _LOCAL
    if hasattr(err, "args") and err.args and hasattr(err.args[0], "code"):
        err = err.args[0]                   # a KafkaException
    code = err.code()
    message = f"{what}: {err.str()}" if what else err.str()
    if code >= 0:
        out: Exception = error_for_code(code, message)
    else:
        if _LOCAL is None:
            _LOCAL = _local()
        cls = _LOCAL.get(code)
        message = f"{message} ({err.name()})"
        out = UnknownServerError(message, code) if cls is None else cls(message)
    return out


class raising:
    """``with raising("what"):`` turns a ``KafkaException`` raised inside into mq's
    exception (``from_kafka``), chained to it."""

    def __init__(self, what: str = "") -> None:
        self.what = what

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, exc, tb) -> bool:
        from confluent_kafka import KafkaException
        if isinstance(exc, KafkaException):
            raise from_kafka(exc, self.what) from exc
        return False


# The answers that mean the client's metadata is stale, after which Kafka's own client
# refreshes its metadata before it asks again: LEADER_NOT_AVAILABLE (5),
# NOT_LEADER_OR_FOLLOWER (6), REPLICA_NOT_AVAILABLE (9), FENCED_LEADER_EPOCH (74: asked with
# the epoch of a leader that has since moved), UNKNOWN_LEADER_EPOCH (75) and
# OFFSET_NOT_AVAILABLE (78, a leader catching up after an election). With the codes whose mq
# class says so, they are Kafka's retriable answers, which librdkafka's admin results do not
# flag.
_STALE_METADATA = frozenset({5, 6, 9, 74, 75, 78})
_UNKNOWN_TOPIC_OR_PART = 3
# How long list offsets asks again when a partition's leader does not know its topic (see
# results): a restarted node applies the metadata log in seconds, 5 s on a loaded box; an
# unknown topic's error comes that much later.
LIST_OFFSETS_UNKNOWN_GRACE_S = 5.0
_RETRIABLE = frozenset({code for code, cls in ERRORS_BY_CODE.items() if cls.retriable} |
                       _STALE_METADATA)


def results(call: Callable[[], Mapping[Any, Any]], what: str, timeout: float,
            renew: Callable[[], Any] | None = None, unknown_grace: float = 0.0
            ) -> dict[Any, Any]:
    """The results of an admin call (``call()`` returns its futures by key), asked again
    while the cluster answers with a retriable error (a leader moving, a partition just
    created) for up to ``timeout`` seconds; other failures raised as mq's exceptions.

    An answer that says the client's metadata is stale (a leader or its epoch moved) calls
    ``renew()`` first, which asks the cluster for fresh metadata: librdkafka would otherwise
    send the same stale leader epoch until its cache expires (minutes), as Kafka's own
    client did before KAFKA-9535. So does UNKNOWN_TOPIC_OR_PART (3) for the first
    ``unknown_grace`` seconds: the answer of a partition's leader that has not applied the
    topic's creation yet (a node restarted a moment ago, which the controller made the
    leader of a new topic's partition: CI saw list offsets answered so just after
    create_topic returned)."""
    from confluent_kafka import KafkaException
    start = time.monotonic()
    deadline = start + timeout
    while True:
        futures = call()
        try:
            return {key: fut.result() for key, fut in futures.items()}
        except KafkaException as exc:
            err = exc.args[0]
            now = time.monotonic()
            unknown = err.code() == _UNKNOWN_TOPIC_OR_PART and now < start + unknown_grace
            if not (err.retriable() or err.code() in _RETRIABLE or unknown) or now >= deadline:
                raise from_kafka(err, what) from exc
            if renew is not None and (unknown or err.code() in _STALE_METADATA):
                try:
                    renew()
                except KafkaException:
                    pass                    # asked again below, until the deadline
        time.sleep(0.1)


# A group's coordinator moving or loading its offsets (a node restarted, the offsets topic's
# leader elected anew): COORDINATOR_LOAD_IN_PROGRESS (14), COORDINATOR_NOT_AVAILABLE (15) and
# NOT_COORDINATOR (16). Kafka's own clients find the coordinator again and ask again until
# their timeout; librdkafka's consumer hands them to its caller of committed().
_COORDINATOR_MOVING = frozenset({14, 15, 16})


def committed_offsets(rd: Any, partitions: list, what: str, timeout: float) -> list:
    """librdkafka consumer ``rd``'s ``committed(partitions)`` (confluent-kafka's
    ``TopicPartition``s: their committed offsets, -1001 for none), asked again while the
    cluster answers that the group's coordinator is moving or loading, for up to ``timeout``
    seconds. Raises mq's exception for another failure, or for the coordinator's last answer
    when it had not settled by the deadline (the message says how long it was asked)."""
    from confluent_kafka import KafkaException
    deadline = time.monotonic() + timeout
    while True:
        left = max(0.1, deadline - time.monotonic())
        cause: KafkaException | None = None
        try:
            found = rd.committed(partitions, timeout=left)
            err = next((tp.error for tp in found if tp.error is not None), None)
            if err is None:
                return found
        except KafkaException as exc:
            err, cause = exc.args[0], exc
        if err.code() not in _COORDINATOR_MOVING:
            raise from_kafka(err, what) from cause
        if time.monotonic() >= deadline:
            raise from_kafka(err, f"{what} (the group's coordinator was still moving after "
                                  f"{timeout:g} s)") from cause
        time.sleep(0.1)
