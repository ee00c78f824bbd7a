"""The broker's internal topics: their names, the one rule that tells them from user topics
(``is_internal``, from ``mq/protocol/limits.py``: the clients apply it too), and their
fixed configs.

A topic whose name starts with ``__`` belongs to the broker: users cannot create it, produce to
it or commit offsets of it, and a pattern subscription never matches it (as Kafka's regexes
never match ``__consumer_offsets``). Internal topics have no record in the topic metadata; the
broker opens their logs itself at start, and a partition directory of one is never taken for
the leftover of a deleted user topic.
"""

from __future__ import annotations

from typing import Final

from mq.protocol.limits import INTERNAL_PREFIX, is_internal

__all__ = ["INTERNAL_CONFIG", "INTERNAL_PREFIX", "INTERNAL_TOPICS", "METADATA_TOPIC",
           "OFFSETS_TOPIC", "TRANSACTION_STATE_TOPIC", "is_internal"]

METADATA_TOPIC: Final = "__cluster_metadata"      # topic metadata records (metadata.py)
OFFSETS_TOPIC: Final = "__consumer_offsets"       # committed offsets (offsets.py)
TRANSACTION_STATE_TOPIC: Final = "__transaction_state"   # the transaction coordinator's
# The only internal topics: a directory named for another ``__`` topic is nobody's partition.
INTERNAL_TOPICS: Final = (METADATA_TOPIC, OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC)

# Their fixed overrides of the broker's topic defaults (they have no metadata record).
INTERNAL_CONFIG: Final[dict[str, dict[str, str]]] = {
    OFFSETS_TOPIC: {"cleanup.policy": "compact", "segment.bytes": str(100 * 1024 * 1024)},
    TRANSACTION_STATE_TOPIC: {"cleanup.policy": "compact",
                              "segment.bytes": str(100 * 1024 * 1024)},
}
