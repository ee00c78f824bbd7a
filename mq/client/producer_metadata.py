"""What a producer knows of the broker and its topics: each topic's partition count and batch
limits (``TopicState``), and the request size limits they derive from.

``topics`` holds the fresh entries, read by ``send()`` without the lock; ``all_topics`` every
topic seen (an entry is updated in place, so its open batches survive a refresh). An entry
goes stale when the broker's metadata version moves (read from its state file, ``StateReader``:
a topic created, deleted or given partitions) or, without that file, ``metadata_max_age_ms``
after it was fetched; the producer then fetches it again.

Limits: a batch takes at most ``max_request_size`` bytes, never more than the broker accepts
in a request (its ``max_request_bytes``, from the handshake, less ``REQUEST_ENVELOPE_BYTES``
for the rest of the request), and per topic at most its ``max.message.bytes``.
"""

from __future__ import annotations

import math

from mq.client.producer_batches import TopicState
from mq.errors import MQError, UnknownTopicOrPartitionError
from mq.log.layout import RECORD_BATCH_OVERHEAD
from mq.protocol.messages import Api
from mq.protocol.state import StateReader

__all__ = ["REQUEST_ENVELOPE_BYTES", "ProducerMetadata", "unknown_topic"]

# What a Produce request adds to its batch (mq.protocol.messages): at most 278 bytes of
# msgpack — array header 1, api 1, request id 9, topic 3 + 249, partition 9, acks 1, bin header
# 5. The broker refuses a frame whose payload passes its max_request_bytes (and drops the
# connection), so a batch may take at most max_request_bytes less this.
REQUEST_ENVELOPE_BYTES = 512
# A record's encoding adds at most 18 bytes to its key, value and headers (five varints and
# the attributes byte); below this margin the exact single-record size check is skipped.
_RECORD_OVERHEAD_BOUND = 32


def unknown_topic(topic: str, err: UnknownTopicOrPartitionError) -> UnknownTopicOrPartitionError:
    """The error ``send()`` raises for a topic the broker does not have."""
    new = UnknownTopicOrPartitionError(f"unknown topic {topic!r}; create it first "
                                       "(mq topics create)")
    new.__cause__ = err
    return new


class ProducerMetadata:
    """Topic metadata and request limits of one producer (see the module doc)."""

    def __init__(self, batch_size: int, max_request_size: int, max_age_s: float) -> None:
        self.wanted_batch_size = batch_size
        self.wanted_max_request_size = max_request_size
        self.max_age_s = max_age_s
        self.topics: dict[str, TopicState] = {}       # fresh entries, read without the lock
        self.all_topics: dict[str, TopicState] = {}   # every topic seen, updated in place
        self.state: StateReader | None = None
        self.version = -1
        self.broker_max_request: int | None = None    # the broker's max_request_bytes
        self.request_cap = math.inf                    # ... less the request envelope
        self.max_request_size = 0
        self.batch_size = 0
        self.big_record = 0                            # records above: exact size check
        self.limit_requests(None)

    def limit_requests(self, broker_max_request) -> None:
        """Size batches for this broker: ``max_request_size``, capped by the broker's
        ``max_request_bytes`` (None: unknown) less the request envelope. A changed limit
        drops the cached topics, whose batch limits derive from it."""
        if type(broker_max_request) is not int:
            broker_max_request = None
        self.broker_max_request = broker_max_request
        self.request_cap = math.inf if broker_max_request is None else \
            broker_max_request - REQUEST_ENVELOPE_BYTES
        limit = min(self.wanted_max_request_size, self.request_cap)
        if limit == self.max_request_size:
            return
        self.max_request_size = limit
        self.batch_size = max(1, min(self.wanted_batch_size, limit))
        self.big_record = limit - RECORD_BATCH_OVERHEAD - _RECORD_OVERHEAD_BOUND
        self.topics.clear()

    def attach(self, broker_info: dict) -> None:
        """A new connection: the broker's limits and its state file (``data_dir``)."""
        self.limit_requests(broker_info.get("max_request_bytes"))
        try:
            old, self.state = self.state, StateReader(broker_info["data_dir"])
            if old is not None:
                old.close()
        except (MQError, OSError, KeyError):
            self.state = None                          # fall back to metadata_max_age_ms
        self.check_version()

    def check_version(self) -> None:
        """Drop every fresh entry if the broker's metadata changed since they were fetched."""
        version = self.state.metadata_version if self.state is not None else -1
        if version != self.version:
            self.version = version
            self.topics.clear()

    def refresh(self, info: TopicState, now: float) -> None:
        """A batch opens for ``info``'s topic: drop stale entries so the next ``send()``
        fetches them again."""
        if self.state is not None:
            if self.state.metadata_version != self.version:
                self.check_version()
        elif now - info.fetched > self.max_age_s:
            self.topics.pop(info.name, None)

    def store(self, topic: str, num_partitions: int, max_message: int, now: float) -> TopicState:
        """The fetched metadata of ``topic`` (``max_message``: its ``max.message.bytes``)."""
        info = self.all_topics.get(topic)
        if info is None:
            info = self.all_topics[topic] = TopicState(topic)
        info.update(num_partitions, min(self.batch_size, max_message),
                    min(self.max_request_size, max_message), now)
        self.topics[topic] = info
        return info

    @staticmethod
    def requests(topic: str) -> list[tuple]:
        """What the producer asks of the broker to learn ``topic`` (``learned`` takes the
        replies): its partitions, and its effective configs for ``max.message.bytes``."""
        return [(Api.METADATA, [topic]), (Api.DESCRIBE_CONFIGS, topic)]

    def learned(self, topic: str, replies: list, now: float) -> TopicState:
        """The replies to ``requests(topic)``, stored."""
        described, effective = replies
        try:
            max_message = int(effective["config"]["max.message.bytes"])
        except (KeyError, TypeError, ValueError):
            max_message = self.max_request_size
        return self.store(topic, described["topics"][topic]["partitions"], max_message, now)

    def forget(self, topic: str) -> None:
        self.topics.pop(topic, None)

    def close(self) -> None:
        if self.state is not None:
            self.state.close()
            self.state = None
