"""Broker configuration: defaults, then a TOML file, then ``MQ_*`` environment, then flags.

::

    # mq.toml
    data_dir = "/var/lib/mq"
    socket = "/run/mq/mq.sock"
    socket_mode = "0660"
    file_mode = "0640"                # data files; directories get x where r is set (0750)
    min_free_bytes = 67108864         # refuse produce below this much free space (0: off)
    log_level = "INFO"
    log_format = "plain"              # or "json": one object a line (mq.logformat)
    retention_check_interval_ms = 300000
    high_watermark = "written"        # or "durable": consumers only see fsync'd data
    metrics_address = "127.0.0.1:9400"  # OpenMetrics at http://127.0.0.1:9400/metrics
    [topic_defaults]                  # Kafka-named topic configs
    "retention.ms" = "604800000"
    "segment.bytes" = "1073741824"

Unknown keys are rejected with one line naming them.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from typing import Any

from mq.broker.assignors import canonical_assignor
from mq.broker.group_model import (
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    DEFAULT_MAX_SESSION_TIMEOUT_MS,
    DEFAULT_MIN_SESSION_TIMEOUT_MS,
    DEFAULT_SESSION_TIMEOUT_MS,
)
from mq.errors import ConfigError
from mq.log.config import LogConfig
from mq.logformat import LOG_FORMATS
from mq.metrics import parse_address
from mq.protocol.paths import default_data_dir, default_socket_path

__all__ = ["BrokerConfig", "ConfigError"]


_NON_NEGATIVE_INTS = frozenset({"min_free_bytes"})
_POSITIVE_INTS = frozenset({
    "transaction_max_timeout_ms", "producer_id_expiration_ms",
    "retention_check_interval_ms", "flush_interval_ms", "max_request_bytes", "state_slots",
    "cleaner_backoff_ms", "cleaner_dedupe_buffer_bytes",
    "offsets_retention_check_interval_ms", "group_heartbeat_interval_ms",
    "group_session_timeout_ms", "group_min_session_timeout_ms", "group_max_session_timeout_ms"})


@dataclasses.dataclass(frozen=True)
class BrokerConfig:
    data_dir: str = dataclasses.field(default_factory=default_data_dir)
    socket: str = ""                              # "" = <data_dir>/mq.sock or $MQ_SOCKET
    socket_mode: int = 0o660
    # Data files: the owner writes, the socket's group reads (clients map the logs), others
    # nothing; directories get search permission wherever read is granted.
    file_mode: int = 0o640
    min_free_bytes: int = 64 * 1024 * 1024        # produce refused below this (0: never)
    transaction_max_timeout_ms: int = 900_000     # transaction.max.timeout.ms (15 min)
    producer_id_expiration_ms: int = 86_400_000   # producer.id.expiration.ms (1 day)
    log_level: str = "INFO"
    log_format: str = "plain"                     # "plain" or "json" (mq.logformat)
    retention_check_interval_ms: int = 300_000    # log.retention.check.interval.ms
    flush_interval_ms: int = 1000                 # background fsync + checkpoint period
    high_watermark: str = "written"               # "written" or "durable"
    max_request_bytes: int = 100 * 1024 * 1024    # socket.request.max.bytes
    state_slots: int = 4096                       # partitions the shared region can hold
    cleaner_backoff_ms: int = 15_000              # log.cleaner.backoff.ms: idle cleaner sleep
    cleaner_dedupe_buffer_bytes: int = 128 * 1024 * 1024   # log.cleaner.dedupe.buffer.size
    offsets_retention_minutes: float = 10_080     # offsets.retention.minutes (7 days)
    offsets_retention_check_interval_ms: int = 600_000   # offsets.retention.check.interval.ms
    # The group coordinator's own defaults (group.consumer.* in Kafka; group_model.py says why
    # the minimum session timeout is 45 ms).
    group_heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS        # 5 s
    group_session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS              # 45 s
    group_min_session_timeout_ms: int = DEFAULT_MIN_SESSION_TIMEOUT_MS      # 45 ms
    group_max_session_timeout_ms: int = DEFAULT_MAX_SESSION_TIMEOUT_MS      # 30 min
    group_assignor: str = "sticky"                # default when members name none
    metrics_address: str = ""                     # HOST:PORT of /metrics ("" = off)
    topic_defaults: LogConfig = dataclasses.field(default_factory=LogConfig)
    config_file: str | None = None

    @property
    def socket_path(self) -> str:
        return self.socket or default_socket_path(self.data_dir)

    @classmethod
    def load(cls, path: str | None = None, **overrides: Any) -> BrokerConfig:
        """Defaults < TOML file < environment (``MQ_DATA_DIR``, ``MQ_SOCKET``,
        ``MQ_LOG_LEVEL``) < ``overrides`` (flags; ``None`` values are ignored).
        Raises ``ConfigError`` for unreadable files, unknown keys and bad values."""
        values: dict[str, Any] = {}
        if path:
            try:
                with open(path, "rb") as f:
                    values.update(tomllib.load(f))
            except OSError as err:
                raise ConfigError(f"cannot read config file {path}: {err.strerror}") from err
            except tomllib.TOMLDecodeError as err:
                raise ConfigError(f"config file {path} is not valid TOML: {err}") from err
            values["config_file"] = path
        env = {"data_dir": "MQ_DATA_DIR", "socket": "MQ_SOCKET", "log_level": "MQ_LOG_LEVEL"}
        for key, var in env.items():
            if os.environ.get(var):
                values[key] = os.environ[var]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_mapping(values)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> BrokerConfig:
        known = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            if key not in known:
                raise ConfigError(f"unknown broker config {key!r}; known: "
                                  f"{', '.join(sorted(known))}")
            if key == "topic_defaults":
                if not isinstance(value, Mapping):
                    raise ConfigError("topic_defaults must be a table of Kafka topic configs")
                kwargs[key] = LogConfig.from_properties(value)
            elif key in ("socket_mode", "file_mode"):
                example = "0660" if key == "socket_mode" else "0640"
                try:
                    mode = int(str(value), 8) if isinstance(value, str) else int(value)
                except ValueError:
                    mode = -1
                if not 0 <= mode <= 0o777 or mode & 0o600 != 0o600:
                    raise ConfigError(f"{key} must be octal like \"{example}\" and let the "
                                      f"owner read and write, got {value!r}")
                kwargs[key] = mode
            elif key in _NON_NEGATIVE_INTS:
                if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                    raise ConfigError(f"{key} must be an integer >= 0, got {value!r}")
                kwargs[key] = value
            elif key in _POSITIVE_INTS:
                if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                    raise ConfigError(f"{key} must be a positive integer, got {value!r}")
                kwargs[key] = value
            elif key == "offsets_retention_minutes":
                # A fraction is allowed (Kafka takes whole minutes): tests and short-lived
                # setups want seconds.
                if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                    raise ConfigError(f"{key} must be a positive number, got {value!r}")
                kwargs[key] = value
            elif key == "group_assignor":
                try:
                    kwargs[key] = canonical_assignor(str(value))
                except ValueError as err:
                    raise ConfigError(f"group_assignor: {err}") from err
            elif key == "metrics_address":
                if value:
                    try:
                        parse_address(str(value))
                    except ValueError as err:
                        raise ConfigError(str(err)) from err
                kwargs[key] = str(value or "")
            elif key == "high_watermark":
                if value not in ("written", "durable"):
                    raise ConfigError(f"high_watermark must be \"written\" or \"durable\", "
                                      f"got {value!r}")
                kwargs[key] = value
            elif key == "log_format":
                if value not in LOG_FORMATS:
                    raise ConfigError(f"log_format must be \"plain\" or \"json\", got "
                                      f"{value!r}")
                kwargs[key] = value
            elif key == "log_level":
                level = str(value).upper()
                if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
                    raise ConfigError(f"log_level must be DEBUG, INFO, WARNING or ERROR, "
                                      f"got {value!r}")
                kwargs[key] = level
            elif key == "data_dir":
                # A path, never a number taken for one, and never "" for "here".
                if not isinstance(value, str) or not value.strip():
                    raise ConfigError(f"data_dir must be a non-empty path, got {value!r}")
                kwargs[key] = os.path.abspath(os.path.expanduser(value))
            else:
                kwargs[key] = None if value is None else str(value)
        return cls(**kwargs)
