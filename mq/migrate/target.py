"""The Kafka cluster ``mq migrate`` copies into, through confluent-kafka (librdkafka): its
topics, the watermarks and records of a partition (the probes of ``mq.migrate.offsets``), its
groups' offsets, and the producer that writes the copy.

Every failure of the cluster or of librdkafka becomes one ``MigrationError`` line naming the
cluster, what was being done and librdkafka's reason; librdkafka's own log goes to the
``mq.kafka`` logger, as the Kafka backend's does (``mq.client.kafka.config``), not to stderr.

The producer is idempotent with ``acks=all`` and ``enable.gapless.guarantee``: a batch that
fails stops the producer (a fatal error) instead of letting later batches of its partition
land after a hole, so a target partition always holds a prefix of what was sent to it, in
order, each record once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import (
    OFFSET_INVALID,
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from mq.client.kafka.config import native, with_overrides
from mq.errors import MigrationError
from mq.migrate.offsets import source_offset

__all__ = ["Target"]

# The producer's settings that make the copy exact, then ones for throughput (the user's
# --to-config may change the latter, not the former).
_EXACT = {"acks": "all", "enable.idempotence": True, "enable.gapless.guarantee": True,
          "max.in.flight.requests.per.connection": 5}
_FAST = {"linger.ms": 20, "batch.size": 1 << 20, "batch.num.messages": 100000,
         "queue.buffering.max.messages": 200000, "queue.buffering.max.kbytes": 1 << 16}


def _reason(err: BaseException) -> str:
    if isinstance(err, KafkaException) and err.args and isinstance(err.args[0], KafkaError):
        return err.args[0].str()
    return str(err) or type(err).__name__


class Target:
    """The cluster at ``bootstrap`` with the client properties ``config`` (librdkafka's
    names: ``security.protocol``, ``sasl.mechanism``, ``ssl.ca.location``, ...). Waits up to
    ``timeout`` seconds for each request. A context manager; ``close()`` is idempotent."""

    def __init__(self, bootstrap: str, config: Mapping[str, str] | None = None,
                 timeout: float = 30.0) -> None:
        self.bootstrap = bootstrap
        self.timeout = timeout
        self._config = with_overrides(bootstrap, {"error_cb": self._on_error}, config)
        self._last_error: str | None = None     # librdkafka's latest: says why a call failed
        self._admin = self._client(AdminClient, {})
        self._consumer: Consumer | None = None
        self._producer: Producer | None = None
        self.error: str | None = None           # the first failed delivery

    def _client(self, kind, extra: dict):
        try:
            return native(self, kind, {**self._config, **extra})
        except (KafkaException, ValueError, TypeError) as err:
            raise MigrationError(f"bad --to-config for Kafka at {self.bootstrap}: "
                                 f"{_reason(err)}") from err

    def _on_error(self, err: KafkaError) -> None:
        self._last_error = err.str()

    def _fail(self, doing: str, err: BaseException) -> MigrationError:
        """One line: what failed, and why as far as librdkafka said (a call's error is often
        "transport failure" while the cause, a refused login say, came to ``error_cb``)."""
        self._admin.poll(0)                     # runs error_cb for what is queued
        reason = _reason(err)
        if self._last_error and self._last_error not in reason:
            reason = f"{reason} ({self._last_error})"
        return MigrationError(f"Kafka at {self.bootstrap}: {doing}: {reason}")

    # --- topics -------------------------------------------------------------------------------
    def topics(self) -> dict[str, int]:
        """``{topic: partition count}`` of the cluster (raises if it cannot be reached)."""
        try:
            meta = self._admin.list_topics(timeout=self.timeout)
        except KafkaException as err:
            raise self._fail("cannot reach the cluster", err) from err
        return {name: len(t.partitions) for name, t in meta.topics.items()}

    def create_topic(self, name: str, partitions: int, replication_factor: int,
                     config: Mapping[str, str]) -> None:
        new = NewTopic(name, num_partitions=partitions, replication_factor=replication_factor,
                       config=dict(config))
        try:
            self._admin.create_topics([new], request_timeout=self.timeout)[name].result()
        except KafkaException as err:
            raise self._fail(f"cannot create topic {name!r} (--topic-config KEY=VALUE "
                             f"overrides a config copied from mq)", err) from err

    # --- records ------------------------------------------------------------------------------
    def _reader(self) -> Consumer:
        if self._consumer is None:
            self._consumer = self._client(Consumer, {
                "group.id": "mq-migrate", "enable.auto.commit": False,
                "enable.partition.eof": True, "fetch.message.max.bytes": 65536,
                "fetch.wait.max.ms": 10,        # a probe wants what is there, or EOF now
                "isolation.level": "read_uncommitted"})
        return self._consumer

    def watermarks(self, topic: str, partitions: Iterable[int]) -> dict[int, tuple[int, int]]:
        """``{partition: (log start offset, high watermark)}``, in two requests."""
        parts = list(partitions)
        found: dict[int, list[int]] = {p: [] for p in parts}
        try:
            for spec in (OffsetSpec.earliest(), OffsetSpec.latest()):
                futures = self._admin.list_offsets(
                    {TopicPartition(topic, p): spec for p in parts},
                    request_timeout=self.timeout)
                for tp, future in futures.items():
                    found[tp.partition].append(future.result().offset)
        except KafkaException as err:
            raise self._fail(f"cannot read the offsets of {topic}", err) from err
        return {p: (start, end) for p, (start, end) in found.items()}

    def record_at(self, topic: str, partition: int, offset: int):
        """The first record of the partition at ``offset`` or after (a ``confluent_kafka``
        ``Message``), or None when there is none."""
        consumer = self._reader()
        consumer.assign([TopicPartition(topic, partition, offset)])
        try:
            msg = consumer.poll(self.timeout)
        except KafkaException as err:
            raise self._fail(f"cannot read {topic}-{partition} at {offset}", err) from err
        finally:
            consumer.unassign()
        if msg is None:
            raise MigrationError(f"Kafka at {self.bootstrap}: no answer reading "
                                 f"{topic}-{partition} at offset {offset} within "
                                 f"{self.timeout:g} s")
        if msg.error() is not None:
            if msg.error().code() == KafkaError._PARTITION_EOF:
                return None
            raise self._fail(f"cannot read {topic}-{partition} at {offset}",
                             KafkaException(msg.error()))
        return msg

    def probe(self, topic: str, partition: int, offset: int) -> tuple[int, int] | None:
        """``mq.migrate.offsets``'s probe: ``(target offset, source offset)`` of the first
        record at ``offset`` or after. Raises ``MigrationError`` for a record without the
        ``mq.source.offset`` header (not written by ``mq migrate``)."""
        msg = self.record_at(topic, partition, offset)
        if msg is None:
            return None
        source = source_offset(msg.headers())
        if source is None:
            raise MigrationError(f"{topic}-{partition} on Kafka at {self.bootstrap} holds a "
                                 f"record without an mq.source.offset header (offset "
                                 f"{msg.offset()}): not written by mq migrate")
        return msg.offset(), source

    # --- groups -------------------------------------------------------------------------------
    def group(self, group: str) -> tuple[int, dict[tuple[str, int], int]]:
        """``(live members, {(topic, partition): committed offset})`` of a group (``(0, {})``
        for one the cluster does not know)."""
        try:
            [described] = self._admin.describe_consumer_groups(
                [group], request_timeout=self.timeout).values()
            members = len(described.result().members)
            [listed] = self._admin.list_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group)], request_timeout=self.timeout).values()
            rows = listed.result().topic_partitions or []
        except KafkaException as err:
            raise self._fail(f"cannot describe group {group!r}", err) from err
        return members, {(tp.topic, tp.partition): tp.offset for tp in rows
                         if tp.offset != OFFSET_INVALID and tp.offset >= 0}

    def commit(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        """Set a group's committed offsets (it must have no live members)."""
        tps = [TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())]
        try:
            [future] = self._admin.alter_consumer_group_offsets(
                [ConsumerGroupTopicPartitions(group, tps)],
                request_timeout=self.timeout).values()
            failed = [tp for tp in future.result().topic_partitions if tp.error is not None]
        except KafkaException as err:
            raise self._fail(f"cannot commit the offsets of group {group!r}", err) from err
        if failed:
            raise MigrationError(f"Kafka at {self.bootstrap}: cannot commit the offsets of group "
                                 f"{group!r}: {failed[0].topic}-{failed[0].partition}: "
                                 f"{failed[0].error.str()}")

    # --- the copy -----------------------------------------------------------------------------
    def open_producer(self, max_message_bytes: int) -> None:
        """Start the idempotent producer; it sends requests of up to ``max_message_bytes``
        (the largest source record must fit)."""
        size = max(1_000_000, max_message_bytes + 1024)
        self._producer = self._client(Producer, {
            **_FAST, **{k: v for k, v in self._config.items() if k not in _EXACT},
            **_EXACT, "message.max.bytes": size, "batch.size": min(size, 1 << 20)})

    def _delivered(self, err, msg) -> None:
        if err is not None and self.error is None:
            self.error = f"{msg.topic()}-{msg.partition()}: {err.str()}"

    def send(self, topic: str, partition: int, key, value, headers: list,
             timestamp_ms: int) -> None:
        """Queue one record. A failed delivery is kept in ``error`` and raised by the next
        ``send`` and by ``flush``."""
        producer = self._producer
        assert producer is not None, "open_producer() first"
        while True:
            try:
                producer.produce(topic, value, key, partition=partition, headers=headers,
                                 timestamp=timestamp_ms, on_delivery=self._delivered)
                break
            except BufferError:                 # the queue is full: let deliveries drain it
                producer.poll(0.05)
            except KafkaException as err:
                raise self._fail(f"cannot send to {topic}-{partition}", err) from err
        if self.error is not None:
            raise MigrationError(f"Kafka at {self.bootstrap}: a copy failed: {self.error}")

    def flush(self) -> None:
        """Wait until every queued record is written; raises the first failure."""
        if self._producer is not None:
            left = self._producer.flush(self.timeout * 4)
            if left:
                self.error = self.error or f"{left} records not written within " \
                                           f"{self.timeout * 4:g} s"
        if self.error is not None:
            raise MigrationError(f"Kafka at {self.bootstrap}: a copy failed: {self.error}")

    def poll(self) -> None:
        if self._producer is not None:
            self._producer.poll(0)

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._producer = None

    def __enter__(self) -> Target:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
