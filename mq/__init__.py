"""mq: a single-host, multi-process, persistent message queue with Kafka's data model.

The public names live here; everything else is private to its module. See docs/api.md.
"""

from mq import errors
from mq.errors import (BrokerError, BrokerUnavailableError, ClosedError, CommitFailedError,
                       CorruptIndexError, CorruptRecordError, InvalidTxnStateError,
                       KafkaStorageError, MQError,
                       NoOffsetForPartitionError, OffsetOutOfRangeError,
                       OutOfOrderSequenceError, ProducerFencedError, StorageError,
                       UnsupportedCodecError)

__version__ = "0.1.0"

_LAZY = {
    "Producer": "mq.client.producer",
    "FutureRecordMetadata": "mq.client.producer",
    "Consumer": "mq.client.consumer",
    "Record": "mq.client.consumer",
    "ConsumerRebalanceListener": "mq.client.membership",
    "Admin": "mq.client.admin",
    "TopicPartition": "mq.protocol.types",
    "RecordMetadata": "mq.client.types",
    "ConsumerGroupMetadata": "mq.client.types",
    "testing": "mq.testing",
    "aio": "mq.aio",
}

__all__ = [
    "Producer", "FutureRecordMetadata", "Consumer", "Admin", "TopicPartition", "Record",
    "RecordMetadata", "NoOffsetForPartitionError", "ConsumerRebalanceListener", "testing", "aio",
    "errors", "MQError", "StorageError", "CorruptRecordError", "CorruptIndexError",
    "UnsupportedCodecError", "OffsetOutOfRangeError", "ClosedError", "BrokerError",
    "BrokerUnavailableError", "KafkaStorageError", "ProducerFencedError",
    "OutOfOrderSequenceError", "InvalidTxnStateError", "CommitFailedError",
    "ConsumerGroupMetadata", "__version__",
]


def __getattr__(name: str):
    # Clients are imported on first use, so `mq dump-log` and the storage layer do not pay
    # for posix_ipc, msgpack and the client modules.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'mq' has no attribute {name!r}")
    import importlib
    mod = importlib.import_module(module)
    value = mod if name in ("testing", "aio") else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
