"""The limits both ends of the protocol check: how many partitions a topic may have, what
an offset may be, and which topic names are the broker's own.

Each is checked by the client before a request is sent (``mq.Admin``, the CLI's flags) and by
the broker when the request arrives (another client may skip the first check), with the same
validator, so the two say the same thing. A message names the value and the limit.

- A topic has 1..``MAX_PARTITIONS_PER_TOPIC`` partitions, and a partition count only grows
  (Kafka's CreatePartitions). 10,000 is a bound for one host, not a cluster: every partition
  is a directory of segment files and a slot of the broker's state region (``state_slots``,
  4,096 by default, bounds all topics' partitions together).
- An offset is an integer from 0 to ``MAX_OFFSET`` (Kafka's int64). A larger one cannot even
  be encoded (msgpack's integers end at 64 bits): without the check the message would be
  ``cannot encode message: Integer value out of range``.
- A topic whose name starts with ``INTERNAL_PREFIX`` (``__``) is one of the broker's internal
  topics (``mq/broker/internal_topics.py`` names them): users cannot create, produce to or
  commit offsets of it, and a pattern subscription never matches one (as Kafka's regexes never
  match ``__consumer_offsets``): the broker's group coordinator and the Spark source's
  subscribe pattern apply the same ``is_internal``.
"""

from __future__ import annotations

import operator
from typing import Final

from mq.errors import InvalidPartitionsError

__all__ = ["INTERNAL_PREFIX", "MAX_OFFSET", "MAX_PARTITIONS_PER_TOPIC", "check_offset",
           "check_partition_count", "is_internal"]

MAX_PARTITIONS_PER_TOPIC: Final = 10_000
MAX_OFFSET: Final = (1 << 63) - 1
INTERNAL_PREFIX: Final = "__"


def check_partition_count(count: object, current: int = 0, topic: str | None = None) -> int:
    """``count`` if a topic may have that many partitions: an integer in
    1..``MAX_PARTITIONS_PER_TOPIC`` and, for a topic that has ``current`` partitions, more
    than those. Raises ``InvalidPartitionsError`` naming the value and the limit."""
    try:
        count = _integer(count)
    except TypeError as err:
        raise InvalidPartitionsError(f"the partition count must be an integer, got "
                                     f"{count!r:.40}") from err
    if not 1 <= count <= MAX_PARTITIONS_PER_TOPIC:
        raise InvalidPartitionsError(f"a topic has 1 to {MAX_PARTITIONS_PER_TOPIC} partitions, "
                                     f"got {count}")
    if count <= current:
        has = f"{current} partition{'' if current == 1 else 's'}"
        raise InvalidPartitionsError(f"topic {topic!r} has {has} and partitions can only be "
                                     f"added: the new total must be {current + 1} to "
                                     f"{MAX_PARTITIONS_PER_TOPIC}, got {count}")
    return count


def check_offset(offset: object, what: str = "offset") -> int:
    """``offset`` if a log can have it: an integer from 0 to ``MAX_OFFSET``. Raises
    ``ValueError`` naming ``what``, the value and the range."""
    try:
        value = _integer(offset)
    except TypeError as err:
        raise ValueError(f"{what} must be an integer, got {offset!r:.40}") from err
    if not 0 <= value <= MAX_OFFSET:
        raise ValueError(f"{what} must be 0 to {MAX_OFFSET} (Kafka's int64), got {value}")
    return value


def _integer(value: object) -> int:
    """``value`` as an int: an int or a numpy integer, not a bool, float or string. Raises
    ``TypeError``."""
    if isinstance(value, bool):
        raise TypeError(value)
    return operator.index(value)


def is_internal(topic: str) -> bool:
    """Is ``topic`` one of the broker's own (``__`` prefix)?"""
    return topic.startswith(INTERNAL_PREFIX)
