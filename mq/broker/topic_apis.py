"""The broker's topic administration apis: metadata, create and delete topics, add partitions,
describe and alter topic configs, delete records.

Each change is recorded in the metadata log (``MetadataStore``) first, then applied to the
partitions; then the state region's metadata version is bumped so that clients re-read the
metadata (slots may have moved), and the group coordinator hears of new partition counts.
Internal topics (``internal_topics.py``) are never in the metadata and cannot be created here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from mq import errors
from mq.broker.internal_topics import INTERNAL_PREFIX, is_internal
from mq.broker.metadata import TopicInfo
from mq.broker.wakeups import _post
from mq.errors import InvalidPartitionsError, UnknownTopicOrPartitionError
from mq.log import files
from mq.log.config import LogConfig
from mq.protocol.messages import Request, response
from mq.protocol.state import PartitionState

if TYPE_CHECKING:
    from mq.broker.server import _Conn

__all__ = ["TopicApis"]

log = logging.getLogger("mq.broker")

MAX_PARTITIONS_PER_TOPIC = 10_000


class TopicApis:
    """Mixed into ``Broker``: uses its ``partitions``, ``logs``, ``metadata``, ``config``,
    ``state``, ``_cleaner``, ``_add_partition``, ``_check_free_slots``, ``_partition`` and
    the group apis' ``_topic_partitions_changed`` and ``_delete_topic_offsets``."""

    def _topic_info(self, name: str) -> TopicInfo:
        """The metadata of a user topic; internal topics are never in it."""
        info = self.metadata.topics.get(name)
        if info is None:
            raise UnknownTopicOrPartitionError(f"unknown topic {name!r}")
        return info

    def _topic_metadata(self, info: TopicInfo) -> dict:
        parts = [self.partitions[(info.name, p)] for p in range(info.partitions)]
        return {"id": info.topic_id, "partitions": info.partitions, "config": info.config,
                "slots": [part.slot for part in parts],
                "size_bytes": [part.log.size_in_bytes for part in parts],
                "offline": [part.log.offline for part in parts]}

    def _api_metadata(self, conn: _Conn, req: Request) -> list:
        names = req["topics"]
        if names is None:
            names = sorted(self.metadata.topics)
        topics = {name: self._topic_metadata(self._topic_info(name)) for name in names}
        return response(req.api, req.request_id, 0, None, topics)

    def _api_create_topics(self, conn: _Conn, req: Request) -> list:
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
        if not 1 <= count <= MAX_PARTITIONS_PER_TOPIC:
            raise InvalidPartitionsError(f"partitions must be 1..{MAX_PARTITIONS_PER_TOPIC}, "
                                         f"got {count}")
        cfg = LogConfig.from_properties(config, self.config.topic_defaults)   # validates
        self._check_free_slots(count)
        self._create_logs(name, range(count), cfg)
        info = self._record_or_undo(name, range(count),
                                    lambda: self.metadata.create_topic(name, count, config))
        for p in range(count):
            self._add_partition(name, p, cfg)
        self.state.bump_metadata_version()
        self._topic_partitions_changed(name, count)
        if cfg.compact_enabled:
            self._cleaner.wake()
        log.info("created topic %s with %d partition(s)", name, count)
        return response(req.api, req.request_id, 0, None, self._topic_metadata(info))

    def _api_delete_topics(self, conn: _Conn, req: Request) -> list:
        name = req["topic"]
        self._topic_info(name)
        self.metadata.delete_topic(name)
        for key in [k for k in self.partitions if k[0] == name]:
            part = self.partitions.pop(key)
            for _, sem, _ in part.waiters:
                _post(sem)                  # let waiters notice the topic is gone
            self.state.publish(part.slot, PartitionState(-1, -1, -1, -1, -1, -1, -1))
            self._free_slots.append(part.slot)
            self._pending_flush.pop(part, None)
            self._dirty.discard(part)
            self._cleaner.remove(part.log)      # waits for a pass over it to let go
            self.logs.delete(*key)
        self.state.bump_metadata_version()
        self._topic_partitions_changed(name, 0)
        self._delete_topic_offsets(name)
        log.info("deleted topic %s", name)
        return response(req.api, req.request_id, 0, None)

    def _api_create_partitions(self, conn: _Conn, req: Request) -> list:
        name, total = req["topic"], req["total"]
        info = self._topic_info(name)
        if total <= info.partitions or total > MAX_PARTITIONS_PER_TOPIC:
            raise InvalidPartitionsError(f"topic {name!r} has {info.partitions} partitions; "
                                         f"the new total must be larger (got {total})")
        cfg = self.metadata.config_for(name, self.config.topic_defaults)
        self._check_free_slots(total - info.partitions)
        new = range(info.partitions, total)
        self._create_logs(name, new, cfg)
        grown = self._record_or_undo(name, new,
                                     lambda: self.metadata.set_partitions(name, total))
        for p in new:
            self._add_partition(name, p, cfg)
        self.state.bump_metadata_version()
        self._topic_partitions_changed(name, total)
        return response(req.api, req.request_id, 0, None, self._topic_metadata(grown))

    def _create_logs(self, name: str, partitions: range, cfg: LogConfig) -> None:
        """Create the partitions' directories and first segments before the metadata names
        them, so a full disk fails the request with nothing recorded (and nothing left)."""
        try:
            for p in partitions:
                self.logs.create(name, p, cfg)
        except OSError as err:
            self._remove_logs(name, partitions)
            raise errors.KafkaStorageError(f"cannot create the partitions of {name!r}: "
                                           f"{err.strerror or err}") from err

    def _record_or_undo(self, name: str, partitions: range, record):
        """Write the metadata record; if that fails, remove the logs made for it."""
        try:
            return record()
        except BaseException:
            self._remove_logs(name, partitions)
            raise

    def _remove_logs(self, name: str, partitions: range) -> None:
        for p in partitions:
            self.logs.delete(name, p)

    def _api_describe_configs(self, conn: _Conn, req: Request) -> list:
        name = req["topic"]
        info = self._topic_info(name)
        cfg = self.metadata.config_for(name, self.config.topic_defaults)
        return response(req.api, req.request_id, 0, None, cfg.to_properties(), info.config)

    def _api_alter_configs(self, conn: _Conn, req: Request) -> list:
        name, changes = req["topic"], req["config"]
        info = self._topic_info(name)
        cfg = LogConfig.from_properties({**info.config, **changes},
                                        self.config.topic_defaults)
        self.metadata.alter_config(name, changes)
        for p in range(info.partitions):
            self.partitions[(name, p)].log.update_config(cfg)
        self.state.bump_metadata_version()
        if cfg.compact_enabled:
            self._cleaner.wake()
        return response(req.api, req.request_id, 0, None, cfg.to_properties())

    def _api_delete_records(self, conn: _Conn, req: Request) -> list:
        part = self._partition(req["topic"], req["partition"])
        start = part.log.delete_records_before(req["offset"])
        self._dirty.add(part)
        return response(req.api, req.request_id, 0, None, start)
