"""The whole exception tree of mq.

One root, ``MQError``. Storage errors name the file, the byte position and what was wrong with
it, so a message read in a log is enough to find the bytes. Broker errors carry Kafka's numeric
error code and a ``retriable`` flag; ``ERRORS_BY_CODE`` is the one table of those codes (the
broker answers with them, clients raise by them, the group coordinator returns them).
"""

from __future__ import annotations

import os
from typing import Final

__all__ = [
    "MQError",
    "StorageError",
    "CorruptRecordError",
    "CorruptIndexError",
    "UnsupportedCodecError",
    "InvalidOffsetError",
    "IndexFullError",
    "OffsetOutOfRangeError",
    "NoOffsetForPartitionError",
    "DataLossError",
    "ClosedError",
    "ConfigError",
    "LogDirLockedError",
    "DataDirError",
    "FileLimitError",
    "LogWriteError",
    "CheckpointError",
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


class ConfigError(MQError, ValueError):
    """A config key or value is not acceptable (a topic config, the broker's TOML file); the
    message says which and why. Also a ``ValueError``, as it was before it joined this tree."""


class LogDirLockedError(StorageError):
    """Another process holds the data directory's lock."""


class DataDirError(StorageError):
    """A path given as a data directory is not one mq may use (empty, a file, a dangling
    symlink, a directory holding something else): refused with nothing changed."""


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


def _broker_error(name: str, code: int, retriable: bool = False, doc: str = "") -> type:
    cls = type(name, (BrokerError,), {"code": code, "retriable": retriable, "__doc__": doc})
    globals()[name] = cls
    __all__.append(name)
    return cls


_ERROR_TABLE = [
    ("UnknownServerError", -1, False, "The broker hit an unexpected error."),
    ("BrokerOffsetOutOfRangeError", 1, False, "The offset is outside the partition's log."),
    ("CorruptMessageError", 2, True, "The batch failed validation (CRC, size, structure)."),
    ("UnknownTopicOrPartitionError", 3, False, "No such topic or partition."),
    ("RequestTimedOutError", 7, True, "The request did not complete in time."),
    ("MessageTooLargeError", 10, False, "The batch is larger than max.message.bytes."),
    ("OffsetMetadataTooLargeError", 12, False, "The commit's metadata string is too long."),
    ("InvalidTopicError", 17, False, "The topic name is not valid."),
    ("RecordListTooLargeError", 18, False, "The request is larger than the broker accepts."),
    ("InvalidTimestampError", 32, False, "A timestamp is outside the accepted range."),
    ("UnsupportedVersionError", 35, False, "The peer speaks a protocol version we do not."),
    ("TopicAlreadyExistsError", 36, False, "The topic exists already."),
    ("InvalidPartitionsError", 37, False, "The partition count is not valid."),
    ("InvalidConfigurationError", 40, False, "A config key or value is not valid."),
    ("InvalidRequestError", 42, False, "The request is malformed."),
    ("InvalidReplicationFactorError", 38, False, "The replication factor is not valid (mq "
                                                 "keeps one replica)."),
    ("FencedLeaderEpochError", 74, False, "The client's leader epoch is older than the "
                                          "broker's."),
    ("UnknownLeaderEpochError", 75, True, "The client's leader epoch is newer than the "
                                          "broker's."),
    # ACLs (mq/broker/acls.py): the principal lacks a matching ALLOW binding, or a DENY matched
    ("TopicAuthorizationFailedError", 29, False, "Not authorized to access the topic."),
    ("GroupAuthorizationFailedError", 30, False, "Not authorized to access the group."),
    ("ClusterAuthorizationFailedError", 31, False, "Not authorized for the cluster operation."),
    ("TransactionalIdAuthorizationFailedError", 53, False, "Not authorized to use the "
                                                           "transactional id."),
    ("PolicyViolationError", 44, False, "The request breaks a broker policy."),
    ("KafkaStorageError", 56, True, "The broker could not read or write its log."),
    ("UnsupportedCompressionTypeError", 76, False, "The batch uses a codec the broker refuses."),
    ("InvalidRecordError", 87, False, "A record is not valid for this topic."),
    # idempotent and transactional producers
    ("OutOfOrderSequenceError", 45, False, "A batch's sequence number does not follow the "
                                           "producer's last one on this partition."),
    ("DuplicateSequenceError", 46, False, "The batch was appended before (a retried send)."),
    ("InvalidProducerEpochError", 47, False, "The producer's epoch is older than the "
                                             "partition's: a newer producer took over."),
    ("InvalidTxnStateError", 48, False, "The request does not fit the transaction's state."),
    ("InvalidProducerIdMappingError", 49, False, "The producer id does not belong to this "
                                                 "transactional id."),
    ("InvalidTransactionTimeoutError", 50, False, "transaction_timeout_ms is outside the "
                                                  "broker's limits."),
    ("ConcurrentTransactionsError", 51, True, "The transaction is completing; retry."),
    ("TransactionCoordinatorFencedError", 52, False, "A marker from an older coordinator."),
    ("UnknownProducerIdError", 59, False, "The partition has no state for this producer."),
    ("ProducerFencedError", 90, False, "A newer producer with the same transactional id "
                                       "fenced this one."),
    ("OperationNotAttemptedError", 55, False, "Not attempted: another part of the request "
                                              "failed."),
    ("TransactionalIdNotFoundError", 105, False, "No such transactional id."),
    ("UnstableOffsetCommitError", 88, True, "An open transaction holds newer offsets for the "
                                            "partition; retry once it ends."),
    # consumer groups
    ("IllegalGenerationError", 22, False, "A classic member's generation is not its current "
                                          "one (rejoin)."),
    ("InconsistentGroupProtocolError", 23, False, "The member's protocol does not match "
                                                  "the group's."),
    ("InvalidGroupIdError", 24, False, "The group id is not valid."),
    ("UnknownMemberIdError", 25, False, "The group does not know this member (rejoin)."),
    ("InvalidSessionTimeoutError", 26, False, "The session timeout is outside the broker's "
                                              "limits."),
    ("RebalanceInProgressError", 27, False, "The group is rebalancing (rejoin)."),
    ("MemberIdRequiredError", 79, False, "A classic member must rejoin with the member id "
                                         "it was given."),
    ("NonEmptyGroupError", 68, False, "The group has live members."),
    ("GroupIdNotFoundError", 69, False, "No such group."),
    ("GroupSubscribedToTopicError", 86, False, "A member of the group subscribes to the "
                                               "topic, so its offsets stay."),
    ("GroupMaxSizeReachedError", 81, False, "The group has as many members as allowed."),
    ("FencedInstanceIdError", 82, False, "Another process took over this static member."),
    ("FencedMemberEpochError", 110, False, "The member's epoch is fenced (rejoin)."),
    ("UnreleasedInstanceIdError", 111, False, "The static member is still in use."),
    ("UnsupportedAssignorError", 112, False, "No such partition assignor."),
    ("StaleMemberEpochError", 113, True, "The member epoch is stale (heartbeat, then retry)."),
    ("InvalidRegularExpressionError", 128, False, "The subscription pattern is not valid."),
    # Kafka's SASL and SCRAM credential errors (KIP-43, KIP-152, KIP-554)
    ("UnsupportedSaslMechanismError", 33, False, "The broker does not offer that SASL "
     "mechanism."),
    ("IllegalSaslStateError", 34, False, "A SASL request out of order."),
    ("SaslAuthenticationFailedError", 58, False, "Wrong user name or password."),
    ("ResourceNotFoundError", 91, False, "No such resource (a user's SCRAM credential)."),
    ("DuplicateResourceError", 92, False, "The request names a resource twice."),
    ("UnacceptableCredentialError", 93, False, "The credential breaks the broker's rules "
     "(an empty user name, iterations out of range)."),
    ("BrokerShuttingDownError", 1001, True, "The broker is stopping; retry after restart."),
]
ERRORS_BY_CODE: dict[int, type] = {code: _broker_error(name, code, retriable, doc)
                                   for name, code, retriable, doc in _ERROR_TABLE}
__all__ += ["NONE", "ProtocolError", "LocalProtocolError", "RemoteProtocolError", "KafkaDecodeError",
            "BrokerUnavailableError", "BrokerError", "ERRORS_BY_CODE", "error_for_code"]


def error_for_code(code: int, message: str = "") -> BrokerError:
    """The exception for a broker error code (``UnknownServerError`` for unknown codes)."""
    return ERRORS_BY_CODE.get(code, ERRORS_BY_CODE[-1])(message)
