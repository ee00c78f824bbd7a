"""Per-topic log configuration, with Kafka's names and defaults.

Kafka-named keys stay dotted (``segment.bytes``) in files and on the command line; Python code
reads the snake_case attributes of ``LogConfig``. ``LogConfig.from_properties`` validates and
converts a ``{"segment.bytes": "1048576"}`` mapping and rejects unknown keys with one clear line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Final

from mq.errors import ConfigError

__all__ = ["LogConfig", "ConfigError", "DEFAULTS"]

DAY_MS: Final = 24 * 60 * 60 * 1000


@dataclasses.dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 1 << 30                     # segment.bytes
    segment_ms: int = 7 * DAY_MS                     # segment.ms
    segment_jitter_ms: int = 0                       # segment.jitter.ms
    segment_index_bytes: int = 10 * 1024 * 1024      # segment.index.bytes
    index_interval_bytes: int = 4096                 # index.interval.bytes
    retention_ms: int = 7 * DAY_MS                   # retention.ms (-1: unlimited)
    retention_bytes: int = -1                        # retention.bytes (-1: unlimited)
    cleanup_policy: str = "delete"                   # cleanup.policy: delete, compact, both, ""
    max_message_bytes: int = 1048588                 # max.message.bytes
    file_delete_delay_ms: int = 60000                # file.delete.delay.ms
    delete_retention_ms: int = DAY_MS                # delete.retention.ms
    min_compaction_lag_ms: int = 0                   # min.compaction.lag.ms
    max_compaction_lag_ms: int = (1 << 63) - 1       # max.compaction.lag.ms
    min_cleanable_dirty_ratio: float = 0.5           # min.cleanable.dirty.ratio
    message_timestamp_type: str = "CreateTime"       # message.timestamp.type
    # KIP-937. after: Kafka 4.0's default, 1 hour (3.6-3.9: unlimited), so one far-future
    # record cannot hold time-based retention (mq.log.timestamps); before: unlimited.
    message_timestamp_before_max_ms: int = (1 << 63) - 1   # message.timestamp.before.max.ms
    message_timestamp_after_max_ms: int = 60 * 60 * 1000   # message.timestamp.after.max.ms
    flush_messages: int = (1 << 63) - 1              # flush.messages
    flush_ms: int = (1 << 63) - 1                    # flush.ms

    @property
    def delete_enabled(self) -> bool:
        return "delete" in self.cleanup_policy.split(",")

    @property
    def compact_enabled(self) -> bool:
        return "compact" in self.cleanup_policy.split(",")

    @classmethod
    def from_properties(cls, props: Mapping[str, object], base: LogConfig | None = None
                        ) -> LogConfig:
        """Overlay Kafka-named properties on ``base`` (defaults when None).

        Raises ``ConfigError`` naming the key for unknown keys and bad values.
        """
        base = base or cls()
        changes: dict[str, object] = {}
        for key, raw in props.items():
            field = _FIELDS.get(key)
            if field is None:
                raise ConfigError(f"unknown config {key!r}; known: {', '.join(sorted(_FIELDS))}")
            changes[field.name] = _convert(key, field, raw)
        return dataclasses.replace(base, **changes)

    def to_properties(self) -> dict[str, str]:
        return {key: str(getattr(self, f.name)) for key, f in _FIELDS.items()}


_FIELDS: Final = {f.name.replace("_", "."): f for f in dataclasses.fields(LogConfig)}
DEFAULTS: Final = LogConfig()

_MINIMUMS: Final = {"segment.bytes": 14 + 61, "segment.ms": 1, "segment.index.bytes": 12 * 2,
                    "index.interval.bytes": 0, "max.message.bytes": 0, "segment.jitter.ms": 0,
                    "file.delete.delay.ms": 0, "delete.retention.ms": 0,
                    "min.compaction.lag.ms": 0, "max.compaction.lag.ms": 1,
                    "retention.ms": -1, "retention.bytes": -1, "flush.messages": 1,
                    "flush.ms": 0, "message.timestamp.before.max.ms": 0,
                    "message.timestamp.after.max.ms": 0}

# Kafka's INT topic configs; the other integers are LONG.
_INT32_KEYS: Final = frozenset({"segment.bytes", "segment.index.bytes", "index.interval.bytes",
                                "max.message.bytes"})


def _convert(key: str, field: dataclasses.Field, raw: object) -> object:
    if field.type in ("int", int):
        try:
            value = int(str(raw).strip())
        except ValueError as err:
            raise ConfigError(f"{key} must be an integer, got {raw!r}") from err
        low = _MINIMUMS.get(key)
        if low is not None and value < low:
            raise ConfigError(f"{key} must be >= {low}, got {value}")
        if key in _INT32_KEYS and value > (1 << 31) - 1:
            raise ConfigError(f"{key} must be at most {(1 << 31) - 1} (Kafka's int32: file "
                              f"positions and sizes are int32), got {value}")
        if value > (1 << 63) - 1:
            raise ConfigError(f"{key} must be at most {(1 << 63) - 1} (Kafka's int64), "
                              f"got {value}")
        return value
    if field.type in ("float", float):
        try:
            value = float(str(raw).strip())
        except ValueError as err:
            raise ConfigError(f"{key} must be a number, got {raw!r}") from err
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"{key} must be between 0 and 1, got {value}")
        return value
    value = str(raw).strip()
    if key == "cleanup.policy":
        # An empty list is valid, as in Kafka (its ValidList checks each element only): the
        # log is neither deleted by retention nor compacted; only DeleteRecords trims it. The
        # order is kept, as Kafka keeps it ("delete" APPEND "compact" is "delete,compact").
        parts = [p.strip() for p in value.split(",") if p.strip()]
        if any(p not in ("delete", "compact") for p in parts):
            raise ConfigError(f"cleanup.policy must be delete, compact, compact,delete or "
                              f"empty; got {raw!r}")
        return ",".join(dict.fromkeys(parts))
    if key == "message.timestamp.type" and value not in ("CreateTime", "LogAppendTime"):
        raise ConfigError(f"message.timestamp.type must be CreateTime or LogAppendTime, "
                          f"got {raw!r}")
    return value
