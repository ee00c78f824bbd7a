"""The read options of the ``mq`` source: parsed and validated once, into frozen values.

Spark hands a data source its options as a case-insensitive dict whose keys are lowercased and
whose values are all strings (``.option("maxOffsetsPerTrigger", 5)`` arrives as ``"5"``). The
names and meanings are those of Spark's Kafka source, so a query moves between
``format("mq")`` and ``format("kafka")`` by changing the format (and adding
``kafka.bootstrap.servers``). Every problem is found here, at planning time, and raised as one
``ConfigError`` that names the option: a bad value must not surface as a task failure on an
executor halfway through a query.

Offsets and timestamps given as JSON use Kafka's shapes, ``{"topic": {"0": 23}}`` (partition
numbers as strings; -2 earliest, -1 latest) and ``{"topic": [0, 1]}`` for ``assign``.

Pure: no Spark, no broker, no files.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Final

from mq.errors import ConfigError

__all__ = ["EARLIEST", "LATEST", "Earliest", "Latest", "SpecificOffsets", "GlobalTimestamp",
           "SpecificTimestamps", "OffsetSpec", "Subscription", "ReadOptions",
           "parse_read_options", "parse_duration_ms", "KNOWN_READ_OPTIONS"]

EARLIEST: Final = -2        # Kafka's KafkaOffsetRangeLimit.EARLIEST in offsets JSON
LATEST: Final = -1

TP = tuple[str, int]

# Lowercased option name -> the spelling shown in messages (Kafka's).
KNOWN_READ_OPTIONS: Final = {name.lower(): name for name in (
    "subscribe", "subscribePattern", "assign",
    "startingOffsets", "endingOffsets",
    "startingTimestamp", "startingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy",
    "endingTimestamp", "endingOffsetsByTimestamp",
    "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
    "minPartitions", "maxRecordsPerPartition",
    "includeHeaders", "failOnDataLoss", "kafka.isolation.level",
    "socket", "dataDir",
)}
# Trigger options are accepted and ignored by batch queries, as Kafka does; ending options
# make no sense for a stream.
_BATCH_ONLY = ("endingoffsets", "endingtimestamp", "endingoffsetsbytimestamp")
_DEFAULT_MAX_TRIGGER_DELAY_MS: Final = 15 * 60 * 1000          # Kafka's "15m"
_OFFSETS_EXAMPLE = '{"topicA":{"0":23,"1":-1},"topicB":{"0":-2}}'
_TIMESTAMPS_EXAMPLE = '{"topicA":{"0":1700000000000,"1":1700000000000}}'
_ASSIGN_EXAMPLE = '{"topicA":[0,1],"topicB":[2,4]}'


# --- offset specs: where a range starts or ends, before a broker resolves it ------------------

@dataclasses.dataclass(frozen=True)
class Earliest:
    """Every partition from its log start offset."""


@dataclasses.dataclass(frozen=True)
class Latest:
    """Every partition from its high watermark (last stable offset with read_committed)."""


@dataclasses.dataclass(frozen=True)
class SpecificOffsets:
    """Kafka's JSON offsets: one entry per partition, -2 earliest, -1 latest."""

    offsets: tuple[tuple[TP, int], ...]

    def as_dict(self) -> dict[TP, int]:
        return dict(self.offsets)


@dataclasses.dataclass(frozen=True)
class GlobalTimestamp:
    """``startingTimestamp``/``endingTimestamp``: the same timestamp (ms) for every partition."""

    timestamp_ms: int


@dataclasses.dataclass(frozen=True)
class SpecificTimestamps:
    """``startingOffsetsByTimestamp``/``endingOffsetsByTimestamp``: one timestamp a partition."""

    timestamps: tuple[tuple[TP, int], ...]

    def as_dict(self) -> dict[TP, int]:
        return dict(self.timestamps)


OffsetSpec = Earliest | Latest | SpecificOffsets | GlobalTimestamp | SpecificTimestamps


@dataclasses.dataclass(frozen=True)
class Subscription:
    """Which partitions a query reads: exactly one of Kafka's three ways.

    ``kind`` is ``"subscribe"`` (``topics``), ``"subscribePattern"`` (``pattern``, matched
    against whole topic names) or ``"assign"`` (``partitions``)."""

    kind: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    partitions: tuple[TP, ...] = ()

    def __str__(self) -> str:
        if self.kind == "subscribe":
            return f"subscribe {','.join(self.topics)}"
        if self.kind == "subscribePattern":
            return f"subscribePattern {self.pattern}"
        return f"assign {sorted(self.partitions)}"


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """Everything a read needs from the options, typed. ``streaming`` is None when the kind of
    query is not known yet (``DataSource.schema()``, which only checks the options)."""

    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    no_match_latest: bool               # startingOffsetsByTimestampStrategy=latest
    max_offsets_per_trigger: int | None
    min_offsets_per_trigger: int | None
    max_trigger_delay_ms: int
    min_partitions: int | None
    max_records_per_partition: int | None
    include_headers: bool
    fail_on_data_loss: bool
    read_committed: bool
    socket: str | None
    data_dir: str | None
    streaming: bool | None


def parse_read_options(options: Mapping[str, str], streaming: bool | None = None) -> ReadOptions:
    """Parse Spark's option dict (keys in any case, values strings) for a batch
    (``streaming=False``) or streaming (``True``) read. Raises ``ConfigError`` naming the first
    unknown option or bad value."""
    opts = {str(k).lower(): v for k, v in options.items()}
    for key in opts:
        if key == "path":
            raise ConfigError("the mq source takes no path: name topics with the 'subscribe', "
                              "'subscribePattern' or 'assign' option instead of load(path)")
        if key not in KNOWN_READ_OPTIONS:
            raise ConfigError(f"unknown option {key!r} for the mq source; it takes "
                              + ", ".join(sorted(KNOWN_READ_OPTIONS.values())))
    if streaming is True:
        for key in _BATCH_ONLY:
            if key in opts:
                raise ConfigError(f"option {KNOWN_READ_OPTIONS[key]!r} is for batch queries "
                                  "only (a streaming query reads on as data arrives)")
    subscription = _subscription(opts)
    no_match = _choice(opts, "startingoffsetsbytimestampstrategy", ("error", "latest"), "error")
    starting = _starting(opts, streaming)
    ending = _ending(opts)
    isolation = _choice(opts, "kafka.isolation.level", ("read_uncommitted", "read_committed"),
                        "read_uncommitted")
    delay = opts.get("maxtriggerdelay")
    return ReadOptions(
        subscription=subscription,
        starting=starting,
        ending=ending,
        no_match_latest=no_match == "latest",
        max_offsets_per_trigger=_positive(opts, "maxoffsetspertrigger"),
        min_offsets_per_trigger=_positive(opts, "minoffsetspertrigger"),
        max_trigger_delay_ms=(_DEFAULT_MAX_TRIGGER_DELAY_MS if delay is None
                              else _duration(delay, "maxTriggerDelay")),
        min_partitions=_positive(opts, "minpartitions", limit=(1 << 31) - 1),
        max_records_per_partition=_positive(opts, "maxrecordsperpartition"),
        include_headers=_bool(opts, "includeheaders", False),
        fail_on_data_loss=_bool(opts, "failondataloss", True),
        read_committed=isolation == "read_committed",
        socket=_nonempty(opts, "socket"),
        data_dir=_nonempty(opts, "datadir"),
        streaming=streaming,
    )


# --- the parts --------------------------------------------------------------------------------

def _subscription(opts: dict[str, str]) -> Subscription:
    given = [k for k in ("subscribe", "subscribepattern", "assign") if k in opts]
    if len(given) != 1:
        which = " and ".join(repr(KNOWN_READ_OPTIONS[k]) for k in given) or "none"
        raise ConfigError("exactly one of the options 'subscribe', 'subscribePattern' and "
                          f"'assign' must be set, got {which}")
    key = given[0]
    value = opts[key].strip()
    if key == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))
        if not topics:
            raise ConfigError(f"option 'subscribe' must name at least one topic, got "
                              f"{opts[key]!r}")
        return Subscription("subscribe", topics=topics)
    if key == "subscribepattern":
        if not value:
            raise ConfigError("option 'subscribePattern' must not be empty")
        try:
            re.compile(value)
        except re.error as err:
            raise ConfigError(f"option 'subscribePattern' is not a valid regular expression "
                              f"({err}): {value!r}") from err
        return Subscription("subscribePattern", pattern=value)
    obj = _json(value, "assign", _ASSIGN_EXAMPLE)
    parts: list[TP] = []
    for topic, plist in obj.items():
        if not isinstance(plist, list) or not all(_is_int(p) and p >= 0 for p in plist):
            raise ConfigError(f"option 'assign' expects e.g. {_ASSIGN_EXAMPLE}, got {value!r}")
        parts += [(topic, p) for p in plist]
    if not parts:
        raise ConfigError(f"option 'assign' must name at least one partition, got {value!r}")
    return Subscription("assign", partitions=tuple(dict.fromkeys(parts)))


def _starting(opts: dict[str, str], streaming: bool | None) -> OffsetSpec:
    """startingTimestamp > startingOffsetsByTimestamp > startingOffsets (Kafka's order)."""
    if "startingtimestamp" in opts:
        return GlobalTimestamp(_timestamp(opts["startingtimestamp"], "startingTimestamp"))
    if "startingoffsetsbytimestamp" in opts:
        return _by_timestamp(opts["startingoffsetsbytimestamp"], "startingOffsetsByTimestamp")
    raw = opts.get("startingoffsets")
    if raw is None:
        return Latest() if streaming else Earliest()
    spec = _offsets(raw, "startingOffsets")
    if streaming is False:
        _forbid(spec, "startingOffsets", Latest, LATEST,
                "'latest' for batch queries (they would read nothing)",
                "latest (-1) for batch queries")
    return spec


def _ending(opts: dict[str, str]) -> OffsetSpec:
    """endingTimestamp > endingOffsetsByTimestamp > endingOffsets (default latest)."""
    if "endingtimestamp" in opts:
        return GlobalTimestamp(_timestamp(opts["endingtimestamp"], "endingTimestamp"))
    if "endingoffsetsbytimestamp" in opts:
        return _by_timestamp(opts["endingoffsetsbytimestamp"], "endingOffsetsByTimestamp")
    raw = opts.get("endingoffsets")
    if raw is None:
        return Latest()
    spec = _offsets(raw, "endingOffsets")
    _forbid(spec, "endingOffsets", Earliest, EARLIEST, "'earliest' (the range would be empty)",
            "earliest (-2)")
    return spec


def _forbid(spec: OffsetSpec, name: str, whole: type, sentinel: int, why_whole: str,
            why_one: str) -> None:
    """Reject ``spec`` when it is ``whole`` (e.g. ``Latest``), or JSON offsets giving one
    partition ``sentinel`` (e.g. -1): "option <name> [for <tp>] cannot be <why>"."""
    if isinstance(spec, whole):
        raise ConfigError(f"option {name!r} cannot be {why_whole}")
    if isinstance(spec, SpecificOffsets):
        for (topic, p), off in spec.offsets:
            if off == sentinel:
                raise ConfigError(f"option {name!r} for {topic}-{p} cannot be {why_one}")


def _offsets(raw: str, name: str) -> OffsetSpec:
    value = raw.strip()
    if value.lower() == "earliest":
        return Earliest()
    if value.lower() == "latest":
        return Latest()
    obj = _json(value, name, _OFFSETS_EXAMPLE)
    pairs = _partition_map(obj, name, _OFFSETS_EXAMPLE, value)
    for (topic, p), off in pairs:
        if off < EARLIEST:
            raise ConfigError(f"option {name!r}: offset {off} for {topic}-{p} is negative "
                              "(only -2 earliest and -1 latest are)")
    return SpecificOffsets(pairs)


def _by_timestamp(raw: str, name: str) -> SpecificTimestamps:
    value = raw.strip()
    obj = _json(value, name, _TIMESTAMPS_EXAMPLE)
    pairs = _partition_map(obj, name, _TIMESTAMPS_EXAMPLE, value)
    for (topic, p), ts in pairs:
        if ts < 0:
            raise ConfigError(f"option {name!r}: timestamp {ts} for {topic}-{p} is negative")
    return SpecificTimestamps(pairs)


def _partition_map(obj: dict, name: str, example: str, value: str
                   ) -> tuple[tuple[TP, int], ...]:
    """``{"topic": {"0": n}}`` -> ``(((topic, 0), n), ...)``, sorted."""
    out: dict[TP, int] = {}
    for topic, per in obj.items():
        if not isinstance(per, dict) or not per:
            raise ConfigError(f"option {name!r} expects e.g. {example}, got {value!r}")
        for p, n in per.items():
            try:
                partition = int(p)
            except ValueError:
                partition = -1
            if partition < 0 or str(partition) != p or not _is_int(n):
                raise ConfigError(f"option {name!r} expects e.g. {example}, got {value!r}")
            out[(topic, partition)] = n
    if not out:
        raise ConfigError(f"option {name!r} expects e.g. {example}, got {value!r}")
    return tuple(sorted(out.items()))


def _json(value: str, name: str, example: str) -> dict:
    try:
        obj = json.loads(value)
    except ValueError as err:
        raise ConfigError(f"option {name!r} expects 'earliest', 'latest' or JSON such as "
                          f"{example}, got {value!r}" if name.endswith("Offsets") else
                          f"option {name!r} expects JSON such as {example}, got {value!r}"
                          ) from err
    if not isinstance(obj, dict) or not all(isinstance(t, str) and t for t in obj):
        raise ConfigError(f"option {name!r} expects e.g. {example}, got {value!r}")
    return obj


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _timestamp(raw: str, name: str) -> int:
    try:
        ts = int(raw.strip())
    except ValueError:
        ts = -1
    if ts < 0:
        raise ConfigError(f"option {name!r} must be a timestamp in milliseconds since the "
                          f"epoch (a non-negative integer), got {raw!r}")
    return ts


def _positive(opts: dict[str, str], key: str, limit: int = (1 << 63) - 1) -> int | None:
    raw = opts.get(key)
    if raw is None:
        return None
    try:
        n = int(raw.strip())
    except ValueError:
        n = 0
    if not 0 < n <= limit:
        raise ConfigError(f"option {KNOWN_READ_OPTIONS[key]!r} must be a positive integer, "
                          f"got {raw!r}")
    return n


def _bool(opts: dict[str, str], key: str, default: bool) -> bool:
    raw = opts.get(key)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(f"option {KNOWN_READ_OPTIONS[key]!r} must be 'true' or 'false', "
                          f"got {raw!r}")
    return value == "true"


def _choice(opts: dict[str, str], key: str, allowed: tuple[str, ...], default: str) -> str:
    raw = opts.get(key)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value not in allowed:
        raise ConfigError(f"option {KNOWN_READ_OPTIONS[key]!r} must be "
                          f"{' or '.join(repr(a) for a in allowed)}, got {raw!r}")
    return value


def _nonempty(opts: dict[str, str], key: str) -> str | None:
    raw = opts.get(key)
    if raw is None:
        return None
    if not raw.strip():
        raise ConfigError(f"option {KNOWN_READ_OPTIONS[key]!r} must not be empty")
    return raw.strip()


_DURATION = re.compile(r"\s*(\d+)\s*(us|ms|s|m|min|h|d)?\s*", re.IGNORECASE)
_UNIT_MS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000,
            "d": 86_400_000}


def parse_duration_ms(raw: str) -> int:
    """Spark's ``timeStringAsMs``: ``"15m"``, ``"10s"``, ``"500ms"``, ``"2h"``, or a number of
    milliseconds. Raises ``ValueError``."""
    m = _DURATION.fullmatch(raw)
    if m is None:
        raise ValueError(f"not a duration: {raw!r}")
    return int(int(m.group(1)) * _UNIT_MS[(m.group(2) or "ms").lower()])


def _duration(raw: str, name: str) -> int:
    try:
        return parse_duration_ms(raw)
    except ValueError as err:
        raise ConfigError(f"option {name!r} must be a duration such as '15m', '30s' or "
                          f"'500ms', got {raw!r}") from err
