"""mq: a single-host, multi-process, persistent message queue with Kafka's data model."""

from mq.errors import (ClosedError, CorruptIndexError, CorruptRecordError, MQError,
                       OffsetOutOfRangeError, StorageError, UnsupportedCodecError)

__version__ = "0.1.0"

__all__ = [
    "MQError", "StorageError", "CorruptRecordError", "CorruptIndexError",
    "UnsupportedCodecError", "OffsetOutOfRangeError", "ClosedError", "__version__",
]
