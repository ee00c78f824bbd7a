"""One run of ``mq migrate`` (``mq.migrate`` has the design): plan what to copy from the mq
broker, copy the records, then translate and write the groups' offsets.

``Migration(source_socket, target)`` holds the source's clients; ``plan(topics, groups)``
checks everything it can before anything is written and returns ``TopicPlan``s (what each
partition copies) and the groups' committed source offsets; ``copy(plan, progress)`` copies
one topic after another; ``translate(groups)`` and ``commit(translated)`` move the groups.
Each refusal is a ``MigrationError`` (or a broker error of mq's) with one line that says what
to do.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable

from mq.client.admin import Admin
from mq.client.consumer import Consumer
from mq.client.types import TopicPartition
from mq.errors import MigrationError, UnknownTopicOrPartitionError
from mq.migrate import offsets as core
from mq.migrate.target import Target

__all__ = ["GroupOffsets", "Migration", "PartitionCopy", "TopicPlan"]

# A run that resumes waits until the target partitions' ends held still this long (a killed
# run's requests land within milliseconds; the high watermark follows once the followers
# fetched them: replica.fetch.wait.max.ms, 500 ms by default), and gives up after the second.
SETTLE_S = 2.0
SETTLE_MAX_S = 60.0

_OPEN_TRANSACTION = frozenset({"Ongoing", "PrepareCommit", "PrepareAbort", "PrepareEpochFence"})


@dataclasses.dataclass(frozen=True)
class PartitionCopy:
    """What one partition copies: source offsets [``resume``, ``source_end``) (its last stable
    offset when planned), appended after the target's ``target_end``. ``gone``: offsets past
    the last one copied that mq's retention deleted before they could be."""

    topic: str
    partition: int
    source_start: int
    source_end: int
    resume: int
    target_end: int
    gone: int = 0


@dataclasses.dataclass(frozen=True)
class TopicPlan:
    name: str
    partitions: tuple[PartitionCopy, ...]
    create: bool                    # not on the target yet
    config: dict[str, str]          # what it is created with
    max_message_bytes: int


@dataclasses.dataclass(frozen=True)
class GroupOffsets:
    group: str
    offsets: dict[tuple[str, int], int]     # (topic, partition): committed offset


Progress = Callable[[PartitionCopy, int, int], None]     # (partition, position, records)


class Migration:
    """The source broker (at ``source_socket``) and the ``target`` cluster of one run."""

    def __init__(self, source_socket: str | None, target: Target,
                 replication_factor: int = -1, topic_config: dict[str, str] | None = None
                 ) -> None:
        self.target = target
        self.replication_factor = replication_factor
        self.topic_config = dict(topic_config or {})
        self._admin = Admin(source_socket)
        self._consumer = Consumer(socket=source_socket, isolation_level="read_committed",
                                  enable_auto_commit=False, auto_offset_reset="earliest",
                                  value_bytes=True)

    def close(self) -> None:
        self._consumer.close()
        self._admin.close()

    def __enter__(self) -> Migration:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- planning -----------------------------------------------------------------------------
    def plan(self, topics: Iterable[str] | None = None, groups: Iterable[str] | None = None,
             with_groups: bool = True) -> tuple[list[TopicPlan], list[GroupOffsets]]:
        """The copy of ``topics`` (None: every topic not named ``__*``) and the committed
        offsets on them of ``groups`` (None: every group; none without ``with_groups``).
        Raises ``MigrationError`` for what cannot be moved, ``UnknownTopicOrPartitionError``
        for an unknown topic."""
        existing = [t for t in self._admin.list_topics() if not t.startswith("__")]
        names = existing if topics is None else list(dict.fromkeys(topics))
        for name in names:
            if name.startswith("__"):
                raise MigrationError(f"{name!r} is an internal topic: not copied")
            if name not in existing:
                raise UnknownTopicOrPartitionError(f"unknown topic {name!r} on the mq broker")
        on_target = self.target.topics()
        marks = self._settled({name: self.target.watermarks(name, range(on_target[name]))
                               for name in names if name in on_target})
        plans = [self._plan_topic(name, on_target.get(name), marks.get(name, {}))
                 for name in names]
        chosen = self._groups(groups, set(names)) if with_groups else []
        return plans, chosen

    def _settled(self, marks: dict[str, dict[int, tuple[int, int]]]
                 ) -> dict[str, dict[int, tuple[int, int]]]:
        """The target's watermarks once they hold still for ``SETTLE_S``, when a partition
        already holds records (a run to resume): a killed run's last produce requests are
        appended when they arrive and counted (high watermark) once replicated, which may be
        after it died. Raises ``MigrationError`` if they still move after ``SETTLE_MAX_S``
        (something is writing there)."""
        if not any(end > start for parts in marks.values() for start, end in parts.values()):
            return marks
        deadline = time.monotonic() + SETTLE_MAX_S
        while True:
            time.sleep(SETTLE_S)
            again = {name: self.target.watermarks(name, parts) for name, parts in marks.items()}
            if again == marks:
                return marks
            if time.monotonic() > deadline:
                moving = sorted(f"{t}-{p}" for t in marks for p in marks[t]
                                if marks[t][p] != again[t][p])
                raise MigrationError(f"{', '.join(moving[:3])} on Kafka at "
                                     f"{self.target.bootstrap} keep growing: something writes "
                                     f"there (another mq migrate?)")
            marks = again

    def _plan_topic(self, name: str, target_partitions: int | None,
                    marks: dict[int, tuple[int, int]]) -> TopicPlan:
        described = self._admin.describe_topic(name)
        count = described["partitions"]
        if target_partitions is not None and target_partitions != count:
            raise MigrationError(f"topic {name!r} has {count} partitions on mq but "
                                 f"{target_partitions} on Kafka: delete it there, or create it "
                                 f"with {count}")
        tps = [TopicPartition(name, p) for p in range(count)]
        self._consumer.assign(tps)
        ends = self._consumer.end_offsets(tps)          # last stable offsets
        parts = []
        for tp, (start, _) in zip(tps, described["offsets"]):
            target_start, target_end = marks.get(tp.partition, (0, 0))
            resume = start
            if target_end > target_start:
                resume = self._resume_point(tp, target_end, ends[tp])
            elif target_end > 0:
                raise MigrationError(
                    f"{name}-{tp.partition} on Kafka at {self.target.bootstrap} has had "
                    f"{target_end} records but holds none (retention, or deleted records): "
                    f"where to continue is unknown; delete the topic there and run again")
            parts.append(PartitionCopy(name, tp.partition, start, ends[tp], max(resume, start),
                                       target_end, gone=max(0, start - resume)))
        config = {**core.target_config(described["config"]), **self.topic_config}
        return TopicPlan(name, tuple(parts), target_partitions is None, config,
                         int(described["config"].get("max.message.bytes", 1048588)))

    def _resume_point(self, tp: TopicPartition, target_end: int, source_end: int) -> int:
        """The source offset after the last one copied into a non-empty target partition,
        once its last record is shown to be the source's."""
        where = f"{tp.topic}-{tp.partition} on Kafka at {self.target.bootstrap}"
        tail = self.target.record_at(tp.topic, tp.partition, target_end - 1)
        last = None if tail is None else core.source_offset(tail.headers())
        if last is None:
            raise MigrationError(f"{where} holds records mq migrate did not write (its last "
                                 f"record has no mq.source.offset header): delete the topic "
                                 f"there, or leave it out with --topic")
        if last >= source_end:
            raise MigrationError(f"{where} holds source offset {last}, but mq's partition "
                                 f"ends at {source_end}: copied from another mq broker?")
        self._consumer.assign([tp])
        self._consumer.seek(tp, last)
        record = next(iter(self._consumer.poll(timeout_ms=5000, max_records=1).get(tp, [])),
                      None)
        if record is not None and record.offset == last and not _same(record, tail):
            raise MigrationError(f"{where}: its last record (target offset {tail.offset()}) "
                                 f"differs from mq's record at offset {last}: copied from "
                                 f"another mq broker?")
        return last + 1

    def _groups(self, wanted: Iterable[str] | None, topics: set[str]) -> list[GroupOffsets]:
        listed = {g["group"]: g for g in self._admin.list_groups()}
        names = sorted(listed) if wanted is None else list(dict.fromkeys(wanted))
        for name in names:
            if name not in listed:
                raise MigrationError(f"unknown group {name!r} on the mq broker (no committed "
                                     f"offsets, no members)")
            if listed[name]["members"]:
                raise MigrationError(f"group {name!r} has {listed[name]['members']} live "
                                     f"members on mq: stop its consumers first (or copy "
                                     f"records only, with --no-groups)")
        for txn in self._admin.list_transactions():
            if txn["state"] in _OPEN_TRANSACTION:
                raise MigrationError(f"transaction {txn['transactional_id']!r} is open on mq "
                                     f"({txn['state']}): stop its producer and let it end "
                                     f"first (or copy records only, with --no-groups)")
        out = []
        for name in names:
            committed = self._admin.list_group_offsets(name)
            out.append(GroupOffsets(name, {(tp.topic, tp.partition): o
                                           for tp, o in sorted(committed.items())
                                           if tp.topic in topics}))
        return out

    # --- the copy -----------------------------------------------------------------------------
    def copy(self, plans: list[TopicPlan], progress: Progress) -> dict[tuple[str, int], int]:
        """Create the missing topics and copy every partition; ``{(topic, partition): records
        copied}``. ``progress(partition, position, records)`` runs now and then."""
        self.target.open_producer(max((p.max_message_bytes for p in plans), default=0))
        copied: dict[tuple[str, int], int] = {}
        for plan in plans:
            if plan.create:
                self.target.create_topic(plan.name, len(plan.partitions),
                                         self.replication_factor, plan.config)
            for part in plan.partitions:
                copied[part.topic, part.partition] = self._copy_partition(part, progress)
            self.target.flush()
            self._check_ends(plan, copied)
        return copied

    def _copy_partition(self, part: PartitionCopy, progress: Progress) -> int:
        tp = TopicPartition(part.topic, part.partition)
        consumer, target = self._consumer, self.target
        consumer.assign([tp])
        consumer.seek(tp, part.resume)
        records = 0
        position = part.resume
        progress(part, position, records)
        while position < part.source_end:
            for r in consumer.poll(timeout_ms=200).get(tp, ()):
                if r.offset >= part.source_end:
                    break
                target.send(part.topic, part.partition, r.key, r.value,
                            core.stamp(r.headers, r.offset), r.timestamp_ms)
                records += 1
            target.poll()
            position = consumer.position(tp)
            progress(part, position, records)
        return records

    def _check_ends(self, plan: TopicPlan, copied: dict[tuple[str, int], int]) -> None:
        marks = self.target.watermarks(plan.name, range(len(plan.partitions)))
        for part in plan.partitions:
            expected = part.target_end + copied[part.topic, part.partition]
            _, end = marks[part.partition]
            if end != expected:
                raise MigrationError(
                    f"{part.topic}-{part.partition} on Kafka ends at offset {end}, not "
                    f"{expected} as this run's records put it: something else wrote there "
                    f"during the copy (another mq migrate, or a killed one's late request), "
                    f"so it may hold records twice; delete the topic there and run again")

    # --- the groups ---------------------------------------------------------------------------
    def translate(self, groups: list[GroupOffsets]) -> list[GroupOffsets]:
        """The groups' offsets on the target (after the copy)."""
        wanted: dict[str, set[int]] = {}
        for g in groups:
            for topic, p in g.offsets:
                wanted.setdefault(topic, set()).add(p)
        bounds = {t: self.target.watermarks(t, sorted(ps)) for t, ps in wanted.items()}
        found: dict[tuple[str, int, int], int] = {}
        out = []
        for g in groups:
            for (topic, p), offset in g.offsets.items():
                if (topic, p, offset) not in found:
                    found[topic, p, offset] = core.translate(
                        offset, lambda t, topic=topic, p=p: self.target.probe(topic, p, t),
                        *bounds[topic][p])
            out.append(GroupOffsets(g.group, {(t, p): found[t, p, o]
                                              for (t, p), o in g.offsets.items()}))
        return out

    def commit(self, translated: list[GroupOffsets]) -> None:
        """Write the groups' offsets on the target, once none is refused."""
        for g in translated:
            members, existing = self.target.group(g.group)
            if members:
                raise MigrationError(f"group {g.group!r} has {members} live members on Kafka "
                                     f"at {self.target.bootstrap}: stop them first")
            for tp, offset in g.offsets.items():
                if existing.get(tp, offset) != offset:
                    raise MigrationError(
                        f"group {g.group!r} has committed offset {existing[tp]} of "
                        f"{tp[0]}-{tp[1]} on Kafka, not {offset} as translated from mq: it "
                        f"has consumed there; not overwritten (delete the group there to "
                        f"move it again)")
        for g in translated:
            if g.offsets:
                self.target.commit(g.group, g.offsets)


def _same(record, msg) -> bool:
    """Whether target message ``msg`` is a copy of source ``record``."""
    headers = [(k, None if v is None else bytes(v)) for k, v in record.headers]
    return (msg.key() == record.key and msg.value() == record.value
            and msg.timestamp()[1] == record.timestamp_ms
            and core.stamp(headers, record.offset) == [(k, v) for k, v in msg.headers() or []])
