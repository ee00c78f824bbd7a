"""Topic metadata, kept as records in the ``__cluster_metadata-0`` log (like KRaft's).

Each record's key is the topic name; its value is msgpack ``{"id", "partitions", "config"}``
(the config holds only the topic's overrides of the broker defaults); a null value deletes
the topic. Replaying the log from the start rebuilds the current state, so a change is
durable once its record is fsync'd — the broker does that before answering. The log is a
normal partition log: ``mq dump-log --print-data`` shows its history.

Producer ids (KRaft's ProducerIdsRecord): the key ``@producer-ids`` (no topic name holds an
``@``) records the end of the last block of ids handed out, ``{"block_end": N}``. Ids are
taken from a block of ``PRODUCER_ID_BLOCK``; a new block is recorded (and fsync'd) before its
first id is given, and a restart starts a new block, so an id is never handed out twice.

ACLs (KRaft's AccessControlEntryRecord): the key ``@acl `` followed by the binding's seven
fields as a JSON list (``acls.AclBinding.as_list``; readable in ``mq dump-log``), the value
the same list as msgpack; a null value removes it. The key names the whole binding, so creating one twice keeps one.

SCRAM credentials (KRaft's UserScramCredentialRecord): the key ``@scram/MECHANISM/USER``
holds msgpack ``{"salt", "iterations", "stored_key", "server_key"}`` (verifiers, never a
password: ``mq/protocol/kafka/sasl.py``); a null value deletes it.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterable

import msgpack

from mq.broker.acls import AclBinding, AclIndex
from mq.broker.internal_topics import INTERNAL_CONFIG, METADATA_TOPIC
from mq.log.builder import build_batch
from mq.log.config import LogConfig
from mq.log.log import PartitionLog
from mq.protocol.kafka.sasl import ScramCredential

__all__ = ["ACL_KEY_PREFIX", "METADATA_TOPIC", "PRODUCER_IDS_KEY", "PRODUCER_ID_BLOCK",
           "MetadataStore", "TopicInfo"]

PRODUCER_IDS_KEY = "@producer-ids"
PRODUCER_ID_BLOCK = 1000
ACL_KEY_PREFIX = b"@acl "
SCRAM_PREFIX = "@scram/"


@dataclasses.dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: str
    partitions: int
    config: dict[str, str]          # overrides of the broker's topic defaults


class MetadataStore:
    def __init__(self, log: PartitionLog) -> None:
        self.log = log
        self.topics: dict[str, TopicInfo] = {}
        self.scram: dict[tuple[str, str], ScramCredential] = {}    # (user, mechanism)
        self._block_end = 0
        self.acls: set[AclBinding] = set()
        for batch in log.batches():
            for rec in batch.records():
                if rec.key is None:
                    continue
                if bytes(rec.key).startswith(ACL_KEY_PREFIX):
                    self._replay_acl(bytes(rec.key), rec.value)
                    continue
                name = bytes(rec.key).decode()
                if name == PRODUCER_IDS_KEY:
                    self._block_end = msgpack.unpackb(bytes(rec.value))["block_end"]
                    continue
                if name.startswith(SCRAM_PREFIX):
                    self._replay_scram(name, rec.value)
                    continue
                if rec.value is None:
                    self.topics.pop(name, None)
                    continue
                value = msgpack.unpackb(bytes(rec.value), raw=False)
                self.topics[name] = TopicInfo(name, value["id"], value["partitions"],
                                              dict(value["config"]))

        self._next_producer_id = self._block_end      # a restart starts a new block
        self.acl_index = AclIndex(self.acls)

    def allocate_producer_id(self) -> int:
        """A producer id never handed out before (raises ``LogWriteError`` when a new block
        cannot be recorded)."""
        if self._next_producer_id >= self._block_end:
            end = self._next_producer_id + PRODUCER_ID_BLOCK
            self._record(PRODUCER_IDS_KEY, msgpack.packb({"block_end": end}))
            self._block_end = end
        self._next_producer_id += 1
        return self._next_producer_id - 1

    # --- SCRAM credentials ----------------------------------------------------------------------
    def _replay_scram(self, key: str, value) -> None:
        mechanism, _, user = key[len(SCRAM_PREFIX):].partition("/")
        if value is None:
            self.scram.pop((user, mechanism), None)
        else:
            v = msgpack.unpackb(bytes(value))
            self.scram[(user, mechanism)] = ScramCredential(
                v["salt"], v["iterations"], v["stored_key"], v["server_key"])

    def set_scram(self, user: str, mechanism: str, cred: ScramCredential | None) -> None:
        """Record (None: delete) ``user``'s credential for ``mechanism``, fsync'd."""
        value = None if cred is None else msgpack.packb(
            {"salt": cred.salt, "iterations": cred.iterations, "stored_key": cred.stored_key,
             "server_key": cred.server_key})
        self._record(f"{SCRAM_PREFIX}{mechanism}/{user}", value)
        if cred is None:
            self.scram.pop((user, mechanism), None)
        else:
            self.scram[(user, mechanism)] = cred

    def _record(self, key: str, value: bytes | None) -> None:
        self.log.append(build_batch([(int(time.time() * 1000), key.encode(), value)]))
        self.log.flush()            # durable before the broker answers

    def _replay_acl(self, key: bytes, value: bytes | memoryview | None) -> None:
        binding = AclBinding.from_list(json.loads(key[len(ACL_KEY_PREFIX):]))
        if value is None:
            self.acls.discard(binding)
        else:
            self.acls.add(binding)

    def change_acls(self, add: Iterable[AclBinding] = (),
                    remove: Iterable[AclBinding] = ()) -> None:
        """Record ``add`` and ``remove`` in one batch, fsync'd, then apply them (raises
        ``LogWriteError`` with nothing applied when the record cannot be written)."""
        now = int(time.time() * 1000)
        add, remove = list(add), list(remove)
        records = [(now, _acl_key(b), msgpack.packb(b.as_list())) for b in add]
        records += [(now, _acl_key(b), None) for b in remove]
        if not records:
            return
        self.log.append(build_batch(records))
        self.log.flush()            # durable before the broker answers
        self.acls.difference_update(remove)
        self.acls.update(add)
        self.acl_index = AclIndex(self.acls)

    def _write(self, name: str, info: TopicInfo | None) -> None:
        value = None if info is None else msgpack.packb(
            {"id": info.topic_id, "partitions": info.partitions, "config": info.config})
        self._record(name, value)
        if info is None:
            self.topics.pop(name, None)
        else:
            self.topics[name] = info

    def config_for(self, name: str, defaults: LogConfig) -> LogConfig:
        """The topic's config: its overrides (an internal topic's fixed ones) over
        ``defaults``."""
        info = self.topics.get(name)
        overrides = info.config if info else INTERNAL_CONFIG.get(name)
        return defaults if overrides is None else LogConfig.from_properties(overrides, defaults)

    def create_topic(self, name: str, partitions: int, config: dict[str, str], *,
                     topic_id: str | None = None) -> TopicInfo:
        info = TopicInfo(name, topic_id or uuid.uuid4().hex, partitions, dict(config))
        self._write(name, info)
        return info

    def delete_topic(self, name: str) -> None:
        self._write(name, None)

    def set_partitions(self, name: str, total: int) -> TopicInfo:
        info = dataclasses.replace(self.topics[name], partitions=total)
        self._write(name, info)
        return info

    def alter_config(self, name: str, config: dict[str, str], delete: Iterable[str] = ()
                     ) -> TopicInfo:
        """Merge ``config`` into the topic's overrides and remove the ``delete`` ones."""
        merged = {**self.topics[name].config, **config}
        for key in delete:
            merged.pop(key, None)
        info = dataclasses.replace(self.topics[name], config=merged)
        self._write(name, info)
        return info


def _acl_key(binding: AclBinding) -> bytes:
    return ACL_KEY_PREFIX + json.dumps(binding.as_list(), separators=(",", ":")).encode()
