"""``partition.metadata``: the topic id of a partition directory, as Kafka keeps it
(``PartitionMetadataFile``)::

    version: 0
    topic_id: 3q2-7wAAQACAAAAAAAAAAA        Kafka's Uuid.toString: 16 bytes, URL-safe
                                            base64 without padding (22 characters)

mq keeps a topic's id in its metadata log (32 hex digits) and writes this file beside each
partition's segments when the partition is created (and at open for one made before mq wrote
it), so Kafka's tools and a Kafka broker given the directory see the same id, and the Kafka
listener serves it in Metadata. Written atomically (``files.atomic_write``).
"""

from __future__ import annotations

import base64
import os
import uuid

from mq.log import files

__all__ = ["PARTITION_METADATA", "read_topic_id", "write_topic_id"]

PARTITION_METADATA = "partition.metadata"


def _kafka_uuid(topic_id_hex: str) -> str:
    return base64.urlsafe_b64encode(uuid.UUID(hex=topic_id_hex).bytes).decode().rstrip("=")


def write_topic_id(directory: str, topic_id_hex: str) -> None:
    """Write the file for ``topic_id_hex`` (32 hex digits). Raises ``ValueError`` for an id
    that is not one, ``OSError`` when the file cannot be written."""
    files.atomic_write(os.path.join(directory, PARTITION_METADATA),
                       f"version: 0\ntopic_id: {_kafka_uuid(topic_id_hex)}\n".encode())


def read_topic_id(directory: str) -> str | None:
    """The topic id of the file as 32 hex digits, or None when there is no readable file."""
    try:
        with open(os.path.join(directory, PARTITION_METADATA), encoding="ascii") as f:
            lines = dict(line.split(": ", 1) for line in f.read().splitlines() if ": " in line)
        raw = lines["topic_id"].strip()
        return uuid.UUID(bytes=base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4))).hex
    except (OSError, KeyError, ValueError):
        return None
