"""Topic administration apis (Metadata, CreateTopics, DeleteTopics, CreatePartitions,
DescribeConfigs, AlterConfigs, DeleteRecords) and the partitions' lifecycle: opening every
partition the metadata names at start, and the logs behind a topic change.

A change is made safe for a full disk in this order: the new partitions' logs are created
first, then the change is recorded in the metadata log (``MetadataStore``, fsync'd before the
reply) — a failure removes the logs made for it, so nothing is left half done — and only then
do the partitions get slots. Then the state region's metadata version moves so that clients
re-read the metadata (slots may have moved), and the topic listeners (the groups component)
hear of the new partition count. Internal topics (``internal_topics.py``) are never in the
metadata: the broker opens them (``open_internal``), users cannot create them.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from mq import errors
from mq.broker.apis import Handler
from mq.broker.cleaning import BackgroundCleaner
from mq.broker.conns import Conn
from mq.broker.fd_budget import FdBudget
from mq.broker.flushing import GroupCommit
from mq.broker.internal_topics import INTERNAL_PREFIX, is_internal
from mq.broker.metadata import MetadataStore, TopicInfo
from mq.broker.partitions import Partition, PartitionTable
from mq.broker.wakeups import StatePublisher
from mq.errors import UnknownTopicOrPartitionError
from mq.log import files, partition_metadata
from mq.log.log import PartitionLog
from mq.log.config import ConfigError, LogConfig
from mq.log.manager import LogManager
from mq.protocol.limits import check_offset, check_partition_count
from mq.protocol.messages import Api, Request, response

__all__ = ["TopicApis", "TopicListener"]

log = logging.getLogger("mq.broker")

T = TypeVar("T")


class TopicListener(Protocol):
    def topic_partitions_changed(self, topic: str, count: int) -> None:
        """``topic`` was created or grew to ``count`` partitions (0: it was deleted)."""
        ...


class TopicApis:
    """The topic apis, and the owner of which partitions exist."""

    def __init__(self, logs: LogManager, metadata: MetadataStore, table: PartitionTable,
                 publisher: StatePublisher, commit: GroupCommit, cleaner: BackgroundCleaner, *,
                 topic_defaults: LogConfig, high_watermark_follows_log_end: bool,
                 fd_budget: FdBudget | None = None) -> None:
        self.logs = logs
        self.metadata = metadata
        self._table = table
        self._publisher = publisher
        self._commit = commit
        self._cleaner = cleaner
        self.topic_defaults = topic_defaults
        self._hw_follows_log_end = high_watermark_follows_log_end
        self._listeners: list[TopicListener] = []
        self._fds = fd_budget or FdBudget(None)

    def handlers(self) -> Mapping[Api, Handler]:
        return {Api.METADATA: self.metadata_api, Api.CREATE_TOPICS: self.create_topics,
                Api.DELETE_TOPICS: self.delete_topics,
                Api.CREATE_PARTITIONS: self.create_partitions,
                Api.DESCRIBE_CONFIGS: self.describe_configs,
                Api.ALTER_CONFIGS: self.alter_configs,
                Api.INCREMENTAL_ALTER_CONFIGS: self.incremental_alter_configs,
                Api.DELETE_RECORDS: self.delete_records}

    def add_listener(self, listener: TopicListener) -> None:
        """Tell ``listener`` of every partition count change from now on."""
        self._listeners.append(listener)

    # --- the partitions' lifecycle ------------------------------------------------------------
    def open_partitions(self) -> None:
        """At start: make the partition logs match the metadata — load or create what it
        lists; a directory it does not list (a deletion a crash cut short, or something mq
        did not write) is never opened, and is set aside or left alone
        (``LogManager.finish_loading``)."""
        self.logs.load((info.name, p) for info in self.metadata.topics.values()
                       for p in range(info.partitions))
        self.logs.finish_loading()
        for info in self.metadata.topics.values():
            cfg = self.config_for(info.name)
            for p in range(info.partitions):
                part = self.open_partition(info.name, p, cfg)
                self._keep_topic_id(part.log, info.topic_id)

    @staticmethod
    def _keep_topic_id(plog: PartitionLog, topic_id: str) -> None:
        """Write ``partition.metadata`` where a partition made before mq wrote it lacks it
        (a failure is logged: only Kafka's tools read it)."""
        if partition_metadata.read_topic_id(plog.dir) == topic_id:
            return
        try:
            partition_metadata.write_topic_id(plog.dir, topic_id)
        except OSError as err:
            log.warning("%s-%d: partition.metadata not written: %s", plog.topic,
                        plog.partition, err.strerror or err)

    def open_internal(self, topic: str) -> list[Partition]:
        """Open (or create) an internal topic's partitions: as many as are on disk, at least
        one."""
        cfg = self.config_for(topic)
        count = max(1, sum(1 for plog in self.logs if plog.topic == topic))
        return [self.open_partition(topic, p, cfg) for p in range(count)]

    def open_partition(self, topic: str, partition: int, cfg: LogConfig) -> Partition:
        """Open (or create) one partition's log, give it a slot and publish it."""
        plog = self.logs.get(topic, partition)
        if plog is None:
            plog = self.logs.create(topic, partition, cfg)
        else:
            plog.update_config(cfg)
        plog.high_watermark_follows_log_end = self._hw_follows_log_end
        if not plog.high_watermark_follows_log_end:
            plog.high_watermark = min(plog.high_watermark, plog.recovery_point)
        part = self._table.add(topic, partition, plog)
        self._publisher.publish(part)
        return part

    def partition_counts(self) -> dict[str, int]:
        """Every user topic's partition count."""
        return {name: info.partitions for name, info in self.metadata.topics.items()}

    def config_for(self, topic: str) -> LogConfig:
        """The topic's effective config: its overrides over the broker's topic defaults."""
        return self.metadata.config_for(topic, self.topic_defaults)

    def reload(self, topic_defaults: LogConfig) -> None:
        """New broker topic defaults (SIGHUP): every partition's config follows."""
        self.topic_defaults = topic_defaults
        for part in self._table:
            part.log.update_config(self.config_for(part.topic))

    def _changed(self, topic: str, count: int) -> None:
        self._publisher.metadata_changed()
        for listener in self._listeners:
            listener.topic_partitions_changed(topic, count)

    # --- apis ---------------------------------------------------------------------------------
    def topic_info(self, name: str) -> TopicInfo:
        """The metadata of a user topic; internal topics are never in it."""
        info = self.metadata.topics.get(name)
        if info is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        return info

    def _topic_metadata(self, info: TopicInfo) -> dict:
        parts = [self._table.partition(info.name, p) for p in range(info.partitions)]
        return {"id": info.topic_id, "partitions": info.partitions, "config": info.config,
                "slots": [part.slot for part in parts],
                "size_bytes": [part.log.size_in_bytes for part in parts],
                "offline": [part.log.offline for part in parts]}

    def metadata_api(self, conn: Conn, req: Request) -> list:
        names = req["topics"]
        if names is None:
            names = sorted(self.metadata.topics)
        topics = {name: self._topic_metadata(self.topic_info(name)) for name in names}
        return response(req.api, req.request_id, 0, None, topics)

    def create_topics(self, conn: Conn, req: Request) -> list:
        name, count, config = req["topic"], req["partitions"], req["config"]
        if is_internal(name):
            raise errors.InvalidTopicError(f"topic names starting with {INTERNAL_PREFIX!r} are "
                                           "reserved")
        try:
            files.validate_topic_name(name)
        except ValueError as err:
            raise errors.InvalidTopicError(str(err)) from err
        if name in self.metadata.topics:
            raise errors.TopicAlreadyExistsError(f"topic {name!r} already exists")
        check_partition_count(count)
        cfg = LogConfig.from_properties(config, self.topic_defaults)   # validates
        self._check_room(count)
        topic_id = uuid.uuid4().hex
        self._create_logs(name, range(count), cfg, topic_id)
        info = self._record_or_undo(name, range(count), lambda: self.metadata.create_topic(
            name, count, config, topic_id=topic_id))
        for p in range(count):
            self.open_partition(name, p, cfg)
        self._changed(name, count)
        if cfg.compact_enabled:
            self._cleaner.wake()
        log.info("created topic %s with %d partition(s)", name, count)
        return response(req.api, req.request_id, 0, None, self._topic_metadata(info))

    def delete_topics(self, conn: Conn, req: Request) -> list:
        name = req["topic"]
        self.topic_info(name)
        self.metadata.delete_topic(name)
        for part in self._table.of_topic(name):
            self._table.remove(name, part.partition)
            self._publisher.vacate(part)            # its waiters notice the topic is gone
            self._commit.tracker.drop(part)
            self._cleaner.remove(part.log)          # waits for a pass over it to let go
            self.logs.delete(name, part.partition)
        self._changed(name, 0)
        log.info("deleted topic %s", name)
        return response(req.api, req.request_id, 0, None)

    def create_partitions(self, conn: Conn, req: Request) -> list:
        name, total = req["topic"], req["total"]
        info = self.topic_info(name)
        check_partition_count(total, info.partitions, name)
        cfg = self.config_for(name)
        self._check_room(total - info.partitions)
        new = range(info.partitions, total)
        self._create_logs(name, new, cfg, info.topic_id)
        grown = self._record_or_undo(name, new,
                                     lambda: self.metadata.set_partitions(name, total))
        for p in new:
            self.open_partition(name, p, cfg)
        self._changed(name, total)
        return response(req.api, req.request_id, 0, None, self._topic_metadata(grown))

    def _check_room(self, count: int) -> None:
        """Refuse, before anything is created, ``count`` new partitions that the state region
        or the open-file limit cannot hold (``InvalidPartitionsError``)."""
        self._table.check_room(count)
        self._fds.check_create(len(self.logs.logs), count)

    def _create_logs(self, name: str, partitions: range, cfg: LogConfig, topic_id: str
                     ) -> None:
        """Create the partitions' directories and first segments before the metadata names
        them, so a full disk fails the request with nothing recorded (and nothing left)."""
        try:
            for p in partitions:
                self.logs.create(name, p, cfg, topic_id=topic_id)
        except OSError as err:
            self._remove_logs(name, partitions)
            raise errors.KafkaStorageError(f"cannot create the partitions of {name!r}: "
                                           f"{err.strerror or err}") from err

    def _record_or_undo(self, name: str, partitions: range, record: Callable[[], T]) -> T:
        """Write the metadata record; if that fails, remove the logs made for it."""
        try:
            return record()
        except BaseException:
            self._remove_logs(name, partitions)
            raise

    def _remove_logs(self, name: str, partitions: range) -> None:
        for p in partitions:
            self.logs.delete(name, p)

    def describe_configs(self, conn: Conn, req: Request) -> list:
        name = req["topic"]
        if not name:                # the broker's topic defaults (Kafka's broker resource)
            return response(req.api, req.request_id, 0, None,
                            self.topic_defaults.to_properties(), {})
        info = self.topic_info(name)
        cfg = self.config_for(name)
        return response(req.api, req.request_id, 0, None, cfg.to_properties(), info.config)

    def alter_configs(self, conn: Conn, req: Request) -> list:
        cfg = self._alter(req["topic"], req["config"], ())
        return response(req.api, req.request_id, 0, None, cfg.to_properties())

    def incremental_alter_configs(self, conn: Conn, req: Request) -> list:
        name, changes, delete = req["topic"], req["set"], req["delete"] or []
        if set(changes) & set(delete):
            raise errors.InvalidRequestError(
                f"{', '.join(sorted(set(changes) & set(delete)))}: both set and deleted")
        cfg = self._alter(name, changes, delete, validate_only=bool(req["validate_only"]))
        return response(req.api, req.request_id, 0, None, cfg.to_properties())

    def _alter(self, name: str, changes: dict[str, str], delete, *,
               validate_only: bool = False) -> LogConfig:
        """Set ``changes`` and remove the ``delete`` overrides of ``name``; the config that
        results. Raises ``ConfigError`` (nothing changed) for an unknown key or a bad value."""
        info = self.topic_info(name)
        overrides = {**info.config, **changes}
        known = self.topic_defaults.to_properties()
        for key in delete:
            if key not in known:
                raise ConfigError(f"unknown config {key!r}; known: {', '.join(sorted(known))}")
            overrides.pop(key, None)
        cfg = LogConfig.from_properties(overrides, self.topic_defaults)     # validates
        if validate_only:
            return cfg
        self.metadata.alter_config(name, changes, delete)
        for p in range(info.partitions):
            self._table.partition(name, p).log.update_config(cfg)
        self._publisher.metadata_changed()
        if cfg.compact_enabled:
            self._cleaner.wake()
        return cfg

    def delete_records(self, conn: Conn, req: Request) -> list:
        part = self._table.partition(req["topic"], req["partition"])
        try:
            offset = check_offset(req["offset"], "the offset to delete records before")
        except ValueError as err:
            raise errors.InvalidRequestError(str(err)) from err
        start = part.log.delete_records_before(offset)
        self._table.touch(part)
        return response(req.api, req.request_id, 0, None, start)
