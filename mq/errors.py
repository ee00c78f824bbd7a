"""The whole exception tree of mq.

One root, ``MQError``. Storage errors name the file, the byte position and what was wrong with
it, so a message read in a log is enough to find the bytes. Broker errors carry Kafka's numeric
error code and a ``retriable`` flag: one class written out per code, and ``ERRORS_BY_CODE``
built from those classes is the one table of the codes (the broker answers with them, clients
raise by them, the group coordinator returns them). A code the table lacks stays on the
``UnknownServerError`` raised for it.
"""

from __future__ import annotations

import os
from typing import Final

__all__ = [
    "MQError", "StorageError", "CorruptRecordError", "CorruptIndexError",
    "UnsupportedCodecError", "InvalidOffsetError", "IndexFullError", "OffsetOutOfRangeError",
    "NoOffsetForPartitionError", "DataLossError", "ClosedError", "MetadataChangedError",
    "WouldBlock", "CommitFailedError", "ConfigError", "UnsupportedOperationError",
    "LogDirLockedError", "DataDirError", "LogTransferError", "FileLimitError", "LogWriteError",
    "CheckpointError", "MigrationError",
    "ProtocolError", "LocalProtocolError", "RemoteProtocolError", "KafkaDecodeError",
    "BrokerUnavailableError", "NONE", "BrokerError", "ERRORS_BY_CODE", "error_for_code",
    # broker errors, one Kafka error code each
    "UnknownServerError", "BrokerOffsetOutOfRangeError", "CorruptMessageError",
    "UnknownTopicOrPartitionError", "RequestTimedOutError", "MessageTooLargeError",
    "LeaderNotAvailableError", "NotLeaderOrFollowerError", "CoordinatorLoadInProgressError",
    "CoordinatorNotAvailableError", "NotCoordinatorError", "NotEnoughReplicasError",
    "NotEnoughReplicasAfterAppendError",
    "OffsetMetadataTooLargeError", "InvalidTopicError", "RecordListTooLargeError",
    "InvalidTimestampError", "UnsupportedVersionError", "TopicAlreadyExistsError",
    "InvalidPartitionsError", "InvalidConfigurationError", "InvalidRequestError",
    "InvalidReplicationFactorError", "FencedLeaderEpochError", "UnknownLeaderEpochError",
    "TopicAuthorizationFailedError", "GroupAuthorizationFailedError",
    "ClusterAuthorizationFailedError", "TransactionalIdAuthorizationFailedError",
    "PolicyViolationError", "KafkaStorageError", "UnsupportedCompressionTypeError",
    "InvalidRecordError", "OutOfOrderSequenceError", "DuplicateSequenceError",
    "InvalidProducerEpochError", "InvalidTxnStateError", "InvalidProducerIdMappingError",
    "InvalidTransactionTimeoutError", "ConcurrentTransactionsError",
    "TransactionCoordinatorFencedError", "UnknownProducerIdError", "ProducerFencedError",
    "OperationNotAttemptedError", "TransactionalIdNotFoundError", "UnstableOffsetCommitError",
    "IllegalGenerationError", "InconsistentGroupProtocolError", "InvalidGroupIdError",
    "UnknownMemberIdError", "InvalidSessionTimeoutError", "RebalanceInProgressError",
    "MemberIdRequiredError", "NonEmptyGroupError", "GroupIdNotFoundError",
    "GroupSubscribedToTopicError", "GroupMaxSizeReachedError", "FencedInstanceIdError",
    "FencedMemberEpochError", "UnreleasedInstanceIdError", "UnsupportedAssignorError",
    "StaleMemberEpochError", "InvalidRegularExpressionError", "UnsupportedSaslMechanismError",
    "IllegalSaslStateError", "SaslAuthenticationFailedError", "ResourceNotFoundError",
    "DuplicateResourceError", "UnacceptableCredentialError", "BrokerShuttingDownError",
]


class MQError(Exception):
    """Root of every error mq raises on purpose."""


class StorageError(MQError):
    """Something is wrong with files under a data directory."""


class CorruptRecordError(StorageError):
    """Bytes that should hold a RecordBatch v2 do not.

    ``path`` is the file (or ``None`` for an in-memory buffer), ``position`` the byte offset of
    the batch (or record) that failed, ``reason`` a short description.
    """

    def __init__(self, path: str | os.PathLike[str] | None, position: int, reason: str) -> None:
        self.path = None if path is None else os.fspath(path)
        self.position = position
        self.reason = reason
        where = f"{self.path}" if self.path is not None else "<buffer>"
        super().__init__(f"{where} at byte {position}: {reason}")

    def __reduce__(self):  # keep pickling (multiprocessing, xdist) working with the custom init
        return (type(self), (self.path, self.position, self.reason))


class UnsupportedCodecError(CorruptRecordError):
    """A batch is compressed with a codec whose package is not installed (or that is invalid).

    Subclass of ``CorruptRecordError`` so that readers that only guard against malformed data
    still stop cleanly, but callers can tell "install zstandard" from "this file is damaged".
    """


class CorruptIndexError(StorageError):
    """An ``.index`` or ``.timeindex`` file fails its sanity check; recovery rebuilds it."""

    def __init__(self, path: str | os.PathLike[str] | None, reason: str) -> None:
        self.path = None if path is None else os.fspath(path)
        self.reason = reason
        super().__init__(f"{self.path}: {reason}")

    def __reduce__(self):
        return (type(self), (self.path, self.reason))


class InvalidOffsetError(StorageError):
    """An append or index entry would break offset order (Kafka's InvalidOffsetException)."""


class IndexFullError(StorageError):
    """An index has no free slot; the segment must roll first."""


class OffsetOutOfRangeError(MQError):
    """The requested offset is below the log start offset or above the log end offset."""

    def __init__(self, offset: int, log_start_offset: int, log_end_offset: int,
                 partition: str = "") -> None:
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.log_end_offset = log_end_offset
        self.partition = partition
        where = f"{partition}: " if partition else ""
        super().__init__(
            f"{where}offset {offset} is out of range [{log_start_offset}, {log_end_offset}]")

    def __reduce__(self):
        return (type(self),
                (self.offset, self.log_start_offset, self.log_end_offset, self.partition))


class NoOffsetForPartitionError(OffsetOutOfRangeError):
    """A consumer's partition has no position and ``auto_offset_reset="none"`` forbids choosing
    one."""

    def __str__(self) -> str:
        return (f"{self.partition}: no position and auto_offset_reset='none' (seek first; "
                f"the log holds [{self.log_start_offset}, {self.log_end_offset}))")


class DataLossError(MQError):
    """Offsets a Spark query must read are gone from the log (retention, a deleted topic)
    while ``failOnDataLoss`` is true (Kafka's source raises IllegalStateException)."""


class ClosedError(MQError):
    """The object was closed by its owner and can no longer be used."""


class MetadataChangedError(MQError):
    """The broker's topics changed since the client's last metadata refresh: a read must
    wait for the refresh (``mq.aio.Consumer`` awaits it and reads again; it never reaches
    the user)."""


class WouldBlock(MQError):
    """Internal to ``mq.aio``: the record path, run over an event loop's driver, must wait
    for something (room in flight, a topic's metadata, a partition joining the transaction)
    where the threaded producer would block. ``mq.aio.Producer`` awaits ``wait()`` and sends
    again; it never reaches a user."""

    def __init__(self, wait) -> None:
        super().__init__("the asyncio producer must wait")
        self.wait = wait


class CommitFailedError(MQError):
    """An offset commit that cannot go through: the member no longer holds the partitions
    (fenced, or given to another member after a rebalance or a broker restart), so another
    member may own them now (Kafka's ``CommitFailedException``). Nothing was committed; the
    next ``poll`` drops the partitions (``on_partitions_lost`` or ``on_partitions_revoked``)."""


class UnsupportedOperationError(MQError):
    """An operation this client's backend cannot do: mq's own ones (``broker_stats``...)
    asked of a Kafka cluster."""


class ConfigError(MQError, ValueError):
    """A config key or value is not acceptable (a topic config, the broker's TOML file); the
    message says which and why. Also a ``ValueError``, as it was before it joined this tree."""


class LogDirLockedError(StorageError):
    """Another process holds the data directory's lock."""


class DataDirError(StorageError):
    """A path given as a data directory is not one mq may use (empty, a file, a dangling
    symlink, a directory holding something else): refused with nothing changed."""


class LogTransferError(StorageError):
    """``mq log export-kafka`` or ``import-kafka`` refused to copy a topic between mq's and
    Kafka's log dirs (a live broker, an unclean source, a topic-id mismatch, a destination
    that holds data, ...): the message says why; nothing was changed."""


class MigrationError(MQError):
    """``mq migrate`` cannot go on: the Kafka cluster it copies into fails or refuses, or what
    it finds there (data it did not write, a group that consumed there, ...) or on the mq broker
    (live members, an open transaction) makes the move unsafe. The message says what to do."""


class FileLimitError(MQError):
    """The open-file limit (``RLIMIT_NOFILE``) is too low for the broker's data dir; the
    message names the limit, the number needed and how to raise it."""


class CheckpointError(StorageError):
    """A checkpoint file (recovery points, log start offsets, cleaner progress) is malformed."""


class LogWriteError(StorageError):
    """Writing a partition's files failed: no space left, quota exceeded, an I/O error, a
    short write. Nothing the failed call was writing was stored (the files are as before it).

    ``offline`` says the log takes no more writes until a restart recovers it: an fsync
    failed (the page cache may have dropped what it could not write, so nothing written since
    the last good fsync can be vouched for), or the files could not be put back as they were.
    Otherwise (a space error, contained) the same write can succeed once space returns. The
    broker answers either with Kafka's retriable ``KAFKA_STORAGE_ERROR``."""

    def __init__(self, message: str, offline: bool = False) -> None:
        self.offline = offline
        super().__init__(message)

    def __reduce__(self):
        return (type(self), (str(self), self.offline))


# --- protocol errors (sans-I/O layer) ---------------------------------------------------------

class ProtocolError(MQError):
    """The byte stream on a connection broke the protocol."""


class LocalProtocolError(ProtocolError):
    """We were about to send something the protocol does not allow (a bug on our side)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol does not allow (short or oversized frame, bad
    msgpack, unknown api, wrong field types)."""


class KafkaDecodeError(RemoteProtocolError):
    """A Kafka-protocol frame that does not decode under its api's schema (the peer's
    fault: the listener closes its connection)."""


class BrokerUnavailableError(MQError):
    """No broker answers on the socket, or the broker went away mid-request."""


# --- broker errors: Kafka's error codes where the meaning matches -----------------------------

class BrokerError(MQError):
    """An error response from the broker; ``code`` is Kafka's numeric error code."""

    code = -1
    retriable = False

    def __init__(self, message: str = "") -> None:
        self.message = message or type(self).__name__
        super().__init__(self.message)

    def __reduce__(self):
        return (type(self), (self.message,))


NONE: Final = 0             # Kafka's error code for success


class UnknownServerError(BrokerError):
    """The broker hit an unexpected error."""

    code = -1
    retriable = False

    # An error code this client does not know is kept here, so it is not lost: the
    # exception's ``code`` is the broker's number (``error_for_code``).
    def __init__(self, message: str = "", code: int = -1) -> None:
        super().__init__(message or (f"error code {code}" if code != -1 else ""))
        self.code = code

    def __reduce__(self):
        return (type(self), (self.message, self.code))


class BrokerOffsetOutOfRangeError(BrokerError):
    """The offset is outside the partition's log."""

    code = 1
    retriable = False


class CorruptMessageError(BrokerError):
    """The batch failed validation (CRC, size, structure)."""

    code = 2
    retriable = True


class UnknownTopicOrPartitionError(BrokerError):
    """No such topic or partition."""

    code = 3
    retriable = False


class RequestTimedOutError(BrokerError):
    """The request did not complete in time."""

    code = 7
    retriable = True


# --- a cluster's answers while leaders and coordinators move (mq's one broker never gives them;
# the Kafka backend does, mq/client/kafka/)

class LeaderNotAvailableError(BrokerError):
    """The partition has no leader at the moment (one is being elected)."""

    code = 5
    retriable = True


class NotLeaderOrFollowerError(BrokerError):
    """The node asked no longer leads the partition."""

    code = 6
    retriable = True


class CoordinatorLoadInProgressError(BrokerError):
    """The group or transaction coordinator is still loading its state."""

    code = 14
    retriable = True


class CoordinatorNotAvailableError(BrokerError):
    """The coordinator is not available (its node is starting or gone)."""

    code = 15
    retriable = True


class NotCoordinatorError(BrokerError):
    """The node asked is not the coordinator of the group or transactional id."""

    code = 16
    retriable = True


class NotEnoughReplicasError(BrokerError):
    """Fewer replicas are in sync than ``min.insync.replicas``: an acks=all write is refused."""

    code = 19
    retriable = True


class NotEnoughReplicasAfterAppendError(BrokerError):
    """Written by the leader, but the in-sync replicas fell below ``min.insync.replicas``."""

    code = 20
    retriable = True


class MessageTooLargeError(BrokerError):
    """The batch is larger than max.message.bytes."""

    code = 10
    retriable = False


class OffsetMetadataTooLargeError(BrokerError):
    """The commit's metadata string is too long."""

    code = 12
    retriable = False


class InvalidTopicError(BrokerError):
    """The topic name is not valid."""

    code = 17
    retriable = False


class RecordListTooLargeError(BrokerError):
    """The request is larger than the broker accepts."""

    code = 18
    retriable = False


class InvalidTimestampError(BrokerError):
    """A timestamp is outside the accepted range."""

    code = 32
    retriable = False


class UnsupportedVersionError(BrokerError):
    """The peer speaks a protocol version we do not."""

    code = 35
    retriable = False


class TopicAlreadyExistsError(BrokerError):
    """The topic exists already."""

    code = 36
    retriable = False


class InvalidPartitionsError(BrokerError):
    """The partition count is not valid."""

    code = 37
    retriable = False


class InvalidConfigurationError(BrokerError):
    """A config key or value is not valid."""

    code = 40
    retriable = False


class InvalidRequestError(BrokerError):
    """The request is malformed."""

    code = 42
    retriable = False


class InvalidReplicationFactorError(BrokerError):
    """The replication factor is not valid (mq keeps one replica)."""

    code = 38
    retriable = False


class FencedLeaderEpochError(BrokerError):
    """The client's leader epoch is older than the broker's: its metadata is stale (the
    leader moved); retriable after a metadata refresh, as in Kafka's Java client
    (``FencedLeaderEpochException`` is an ``InvalidMetadataException``)."""

    code = 74
    retriable = True


class UnknownLeaderEpochError(BrokerError):
    """The client's leader epoch is newer than the broker's."""

    code = 75
    retriable = True


# ACLs (mq/broker/acls.py): the principal lacks a matching ALLOW binding, or a DENY matched

class TopicAuthorizationFailedError(BrokerError):
    """Not authorized to access the topic."""

    code = 29
    retriable = False


class GroupAuthorizationFailedError(BrokerError):
    """Not authorized to access the group."""

    code = 30
    retriable = False


class ClusterAuthorizationFailedError(BrokerError):
    """Not authorized for the cluster operation."""

    code = 31
    retriable = False


class TransactionalIdAuthorizationFailedError(BrokerError):
    """Not authorized to use the transactional id."""

    code = 53
    retriable = False


class PolicyViolationError(BrokerError):
    """The request breaks a broker policy."""

    code = 44
    retriable = False


class KafkaStorageError(BrokerError):
    """The broker could not read or write its log."""

    code = 56
    retriable = True


class UnsupportedCompressionTypeError(BrokerError):
    """The batch uses a codec the broker refuses."""

    code = 76
    retriable = False


class InvalidRecordError(BrokerError):
    """A record is not valid for this topic."""

    code = 87
    retriable = False


# idempotent and transactional producers

class OutOfOrderSequenceError(BrokerError):
    """A batch's sequence number does not follow the producer's last one on this partition."""

    code = 45
    retriable = False


class DuplicateSequenceError(BrokerError):
    """The batch was appended before (a retried send)."""

    code = 46
    retriable = False


class InvalidProducerEpochError(BrokerError):
    """The producer's epoch is older than the partition's: a newer producer took over."""

    code = 47
    retriable = False


class InvalidTxnStateError(BrokerError):
    """The request does not fit the transaction's state."""

    code = 48
    retriable = False


class InvalidProducerIdMappingError(BrokerError):
    """The producer id does not belong to this transactional id."""

    code = 49
    retriable = False


class InvalidTransactionTimeoutError(BrokerError):
    """transaction_timeout_ms is outside the broker's limits."""

    code = 50
    retriable = False


class ConcurrentTransactionsError(BrokerError):
    """The transaction is completing; retry."""

    code = 51
    retriable = True


class TransactionCoordinatorFencedError(BrokerError):
    """A marker from an older coordinator."""

    code = 52
    retriable = False


class UnknownProducerIdError(BrokerError):
    """The partition has no state for this producer."""

    code = 59
    retriable = False


class ProducerFencedError(BrokerError):
    """A newer producer with the same transactional id fenced this one."""

    code = 90
    retriable = False


class OperationNotAttemptedError(BrokerError):
    """Not attempted: another part of the request failed."""

    code = 55
    retriable = False


class TransactionalIdNotFoundError(BrokerError):
    """No such transactional id."""

    code = 105
    retriable = False


class UnstableOffsetCommitError(BrokerError):
    """An open transaction holds newer offsets for the partition; retry once it ends."""

    code = 88
    retriable = True


# consumer groups

class IllegalGenerationError(BrokerError):
    """A classic member's generation is not its current one (rejoin)."""

    code = 22
    retriable = False


class InconsistentGroupProtocolError(BrokerError):
    """The member's protocol does not match the group's."""

    code = 23
    retriable = False


class InvalidGroupIdError(BrokerError):
    """The group id is not valid."""

    code = 24
    retriable = False


class UnknownMemberIdError(BrokerError):
    """The group does not know this member (rejoin)."""

    code = 25
    retriable = False


class InvalidSessionTimeoutError(BrokerError):
    """The session timeout is outside the broker's limits."""

    code = 26
    retriable = False


class RebalanceInProgressError(BrokerError):
    """The group is rebalancing (rejoin)."""

    code = 27
    retriable = False


class MemberIdRequiredError(BrokerError):
    """A classic member must rejoin with the member id it was given."""

    code = 79
    retriable = False


class NonEmptyGroupError(BrokerError):
    """The group has live members."""

    code = 68
    retriable = False


class GroupIdNotFoundError(BrokerError):
    """No such group."""

    code = 69
    retriable = False


class GroupSubscribedToTopicError(BrokerError):
    """A member of the group subscribes to the topic, so its offsets stay."""

    code = 86
    retriable = False


class GroupMaxSizeReachedError(BrokerError):
    """The group has as many members as allowed."""

    code = 81
    retriable = False


class FencedInstanceIdError(BrokerError):
    """Another process took over this static member."""

    code = 82
    retriable = False


class FencedMemberEpochError(BrokerError):
    """The member's epoch is fenced (rejoin)."""

    code = 110
    retriable = False


class UnreleasedInstanceIdError(BrokerError):
    """The static member is still in use."""

    code = 111
    retriable = False


class UnsupportedAssignorError(BrokerError):
    """No such partition assignor."""

    code = 112
    retriable = False


class StaleMemberEpochError(BrokerError):
    """The member epoch is stale (heartbeat, then retry)."""

    code = 113
    retriable = True


class InvalidRegularExpressionError(BrokerError):
    """The subscription pattern is not valid."""

    code = 128
    retriable = False


# Kafka's SASL and SCRAM credential errors (KIP-43, KIP-152, KIP-554)

class UnsupportedSaslMechanismError(BrokerError):
    """The broker does not offer that SASL mechanism."""

    code = 33
    retriable = False


class IllegalSaslStateError(BrokerError):
    """A SASL request out of order."""

    code = 34
    retriable = False


class SaslAuthenticationFailedError(BrokerError):
    """Wrong user name or password."""

    code = 58
    retriable = False


class ResourceNotFoundError(BrokerError):
    """No such resource (a user's SCRAM credential)."""

    code = 91
    retriable = False


class DuplicateResourceError(BrokerError):
    """The request names a resource twice."""

    code = 92
    retriable = False


class UnacceptableCredentialError(BrokerError):
    """The credential breaks the broker's rules (an empty user name, iterations out of range)."""

    code = 93
    retriable = False


class BrokerShuttingDownError(BrokerError):
    """The broker is stopping; retry after restart."""

    code = 1001
    retriable = True


# Every broker error class above, by its code: built from the classes, so a class written out
# is in the table (tests/unit/test_errors.py checks the codes are unique).
ERRORS_BY_CODE: dict[int, type[BrokerError]] = {
    cls.code: cls for cls in BrokerError.__subclasses__()}


def error_for_code(code: int, message: str = "") -> BrokerError:
    """The exception for a broker error code: an ``UnknownServerError`` that keeps the
    code for a code this table lacks (a newer broker's)."""
    cls = ERRORS_BY_CODE.get(code)
    return UnknownServerError(message, code) if cls is None else cls(message)
