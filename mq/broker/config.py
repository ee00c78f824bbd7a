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
    kafka_listeners = ["127.0.0.1:9092"]  # Kafka's wire protocol (mq/broker/kafka), [PROTOCOL://]HOST:PORT
                                      # "SSL://127.0.0.1:9093": TLS, with the kafka_ssl_* files
    kafka_ssl_certfile = "/etc/mq/broker.pem"   # PEM certificate (chain) of SSL:// listeners
    kafka_ssl_keyfile = "/etc/mq/broker.key"    # its unencrypted PEM key
    kafka_ssl_cafile = "/etc/mq/clients-ca.pem" # optional: client certificates required
    kafka_sasl_mechanisms = ["SCRAM-SHA-256", "SCRAM-SHA-512"]   # of SASL_* listeners; or "PLAIN"
    kafka_allow_anonymous = false     # true: PLAINTEXT listeners may bind non-loopback addresses
    auto_create_topics = true         # Metadata and Produce create unknown topics (Kafka's default)
    num_partitions = 1                # ... with this many partitions
    kafka_super_users = ["admin"]     # Kafka principals User:admin bypass ACLs
    kafka_acl_enforce_anonymous = false  # true: unauthenticated Kafka clients need ACLs too
    [topic_defaults]                  # Kafka-named topic configs
    "retention.ms" = "604800000"
    "segment.bytes" = "1073741824"

Unknown keys are rejected with one line naming them; every value is checked for its type and
range (``_INT_RANGES``: each integer has a top, e.g. ``state_slots`` at most 1,048,576), whether
it comes from the file, ``MQ_*`` or a flag, and the line names where it came from.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from typing import Any

from mq.broker.assignors import canonical_assignor
from mq.broker.kafka.addresses import check_listener, parse_listener
from mq.broker.group_model import (
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    DEFAULT_MAX_SESSION_TIMEOUT_MS,
    DEFAULT_MIN_SESSION_TIMEOUT_MS,
    DEFAULT_SESSION_TIMEOUT_MS,
)
from mq.broker.partitions import MAX_STATE_SLOTS
from mq.errors import ConfigError
from mq.log.config import LogConfig
from mq.logformat import LOG_FORMATS
from mq.metrics import parse_address
from mq.protocol.kafka.sasl import MECHANISMS
from mq.protocol.paths import check_socket_path, default_data_dir, default_socket_path

__all__ = ["BrokerConfig", "ConfigError"]


_INT32_MAX = (1 << 31) - 1           # Kafka's INT configs
_INT64_MAX = (1 << 63) - 1           # Kafka's LONG configs
_WAIT = "epoll's int32 milliseconds: 24.8 days"
# Each integer key's range, and why its top is there (named in the message): Kafka's type
# where Kafka has the key; a period the broker waits for is bounded by its loop's epoll wait,
# a request by a frame's 31-bit length (frames.py), the state region by MAX_STATE_SLOTS.
_INT_RANGES: dict[str, tuple[int, int, str]] = {
    "min_free_bytes": (0, _INT64_MAX, "a 64-bit integer"),
    "transaction_max_timeout_ms": (1, _INT32_MAX, "Kafka's int32"),
    "producer_id_expiration_ms": (1, _INT32_MAX, "Kafka's int32"),
    "retention_check_interval_ms": (1, _INT32_MAX, _WAIT),
    "flush_interval_ms": (1, _INT32_MAX, _WAIT),
    "max_request_bytes": (1, _INT32_MAX, "a frame's 31-bit length"),
    "state_slots": (1, MAX_STATE_SLOTS, "64 MiB of shared memory at 64 bytes a slot"),
    "cleaner_backoff_ms": (1, _INT32_MAX, _WAIT),
    "cleaner_dedupe_buffer_bytes": (1, _INT64_MAX, "a 64-bit integer"),
    "offsets_retention_check_interval_ms": (1, _INT32_MAX, _WAIT),
    "group_heartbeat_interval_ms": (1, _INT32_MAX, "Kafka's int32"),
    "group_session_timeout_ms": (1, _INT32_MAX, "Kafka's int32"),
    "group_min_session_timeout_ms": (1, _INT32_MAX, "Kafka's int32"),
    "group_max_session_timeout_ms": (1, _INT32_MAX, "Kafka's int32"),
    "num_partitions": (1, 200_000, "Kafka's partition count limit"),
    "node_id": (0, _INT32_MAX, "Kafka's int32"),
    "spin_us": (0, 1_000_000, "one second: a spin is bounded"),
}
# The variables over the file, and the flags over both: a message names where a bad value came
# from (the file, $MQ_SOCKET, --socket).
_ENV = {"data_dir": "MQ_DATA_DIR", "socket": "MQ_SOCKET", "log_level": "MQ_LOG_LEVEL"}
_FLAGS = {"metrics_address": "--metrics", "kafka_listeners": "--kafka-listener"}   # the others are --key-with-dashes


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
    # The loop's wait strategy: watch the connections this long before sleeping (0: sleep at
    # once). A spinning broker keeps one CPU busy and answers without a scheduler wake-up.
    spin_us: int = 0
    # Kafka's wire protocol (mq/broker/kafka/): [PROTOCOL://]HOST:PORTs to serve it on (none:
    # off); one that does not authenticate binds loopback only (addresses.py).
    kafka_listeners: tuple[str, ...] = ()
    # TLS of SSL:// listeners (tls.py): PEM files; a CA file requires client certificates.
    kafka_ssl_certfile: str = ""
    kafka_ssl_keyfile: str = ""
    kafka_ssl_cafile: str = ""
    kafka_allow_anonymous: bool = False
    # SCRAM only by default: PLAIN sends the password itself, readable on the wire of a
    # SASL_PLAINTEXT listener; SCRAM sends a proof that is useless to replay.
    kafka_sasl_mechanisms: tuple[str, ...] = ("SCRAM-SHA-256", "SCRAM-SHA-512")
    auto_create_topics: bool = True               # auto.create.topics.enable
    num_partitions: int = 1                       # num.partitions: of an auto-created topic
    node_id: int = 0                              # node.id: the one node Metadata names
    # ACLs (mq/broker/acls.py): these user names bypass them (Kafka's super.users); the
    # unauthenticated User:ANONYMOUS is held to them only when enforce_anonymous is on.
    kafka_super_users: tuple[str, ...] = ()
    kafka_acl_enforce_anonymous: bool = False
    topic_defaults: LogConfig = dataclasses.field(default_factory=LogConfig)
    config_file: str | None = None

    @property
    def socket_path(self) -> str:
        return self.socket or default_socket_path(self.data_dir)

    @classmethod
    def load(cls, path: str | None = None, **overrides: Any) -> BrokerConfig:
        """Defaults < TOML file < environment (``MQ_DATA_DIR``, ``MQ_SOCKET``,
        ``MQ_LOG_LEVEL``) < ``overrides`` (flags; ``None`` values are ignored).
        Raises ``ConfigError`` for unreadable files, unknown keys and bad values, naming the
        key, the value, what it must be and where it came from."""
        values: dict[str, Any] = {}
        sources: dict[str, str] = {}
        if path:
            try:
                with open(path, "rb") as f:
                    values.update(tomllib.load(f))
            except OSError as err:
                raise ConfigError(f"cannot read config file {path}: {err.strerror}") from err
            except tomllib.TOMLDecodeError as err:
                raise ConfigError(f"config file {path} is not valid TOML: {err}") from err
            sources.update(dict.fromkeys(values, f"config file {path}"))
            values["config_file"] = path
        for key, var in _ENV.items():
            if os.environ.get(var):
                values[key], sources[key] = os.environ[var], f"${var}"
        for key, value in overrides.items():
            if value is not None:
                values[key], sources[key] = value, _FLAGS.get(key, "--" + key.replace("_", "-"))
        return cls.from_mapping(values, sources)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any],
                     sources: Mapping[str, str] | None = None) -> BrokerConfig:
        """The config of ``values`` (key: value) over the defaults. Raises ``ConfigError``
        naming the key (and its ``sources`` entry: ``config file F``, ``$MQ_SOCKET``, a flag)
        for an unknown key or a value of the wrong type or out of its range."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for key, value in values.items():
            try:
                if key not in known:
                    raise ConfigError(f"unknown broker config {key!r}; known: "
                                      f"{', '.join(sorted(known))}")
                kwargs[key] = _checked(key, value)
            except ConfigError as err:
                where = (sources or {}).get(key)
                if where is None:
                    raise
                raise ConfigError(f"{where}: {err}") from err
        config = cls(**kwargs)
        _check_session_timeouts(config, sources or {})
        _check_kafka_listeners(config, sources or {})
        return config


def _checked(key: str, value: Any) -> Any:
    """``value`` as the config holds it. Raises ``ConfigError`` naming ``key``."""
    if key == "topic_defaults":
        if not isinstance(value, Mapping):
            raise ConfigError("topic_defaults must be a table of Kafka topic configs")
        try:
            return LogConfig.from_properties(value)
        except ConfigError as err:
            raise ConfigError(f"topic_defaults: {err}") from err
    if key in ("socket_mode", "file_mode"):
        example = "0660" if key == "socket_mode" else "0640"
        mode = value if type(value) is int else -1          # not True, not 432.0
        if isinstance(value, str):
            try:
                mode = int(value, 8)
            except ValueError:
                pass
        if not 0 <= mode <= 0o777 or mode & 0o600 != 0o600:
            raise ConfigError(f"{key} must be octal like \"{example}\" and let the "
                              f"owner read and write, got {value!r}")
        return mode
    if key in _INT_RANGES:
        low, high, why = _INT_RANGES[key]
        if type(value) is not int or not low <= value <= high:
            raise ConfigError(f"{key} must be an integer from {low} to {high} ({why}), "
                              f"got {value!r}")
        return value
    if key == "offsets_retention_minutes":
        # A fraction is allowed (Kafka takes whole minutes): tests and short-lived setups
        # want seconds. The top is Kafka's int32 of minutes (4,085 years).
        if type(value) not in (int, float) or not 0 < value <= _INT32_MAX:
            raise ConfigError(f"{key} must be a number above 0 and at most {_INT32_MAX} "
                              f"(Kafka's int32), got {value!r}")
        return value
    if key == "data_dir":
        # A path, never a number taken for one, and never "" for "here".
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"data_dir must be a non-empty path, got {value!r}")
        return os.path.abspath(os.path.expanduser(value))
    if key == "kafka_listeners":
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"kafka_listeners must be a list of \"[PROTOCOL://]HOST:PORT\", "
                              f"got {value!r}")
        try:
            for text in value:
                parse_listener(text)       # the loopback rule needs the other keys: at the end
        except ValueError as err:
            raise ConfigError(str(err)) from err
        return tuple(value)
    if key in ("kafka_ssl_certfile", "kafka_ssl_keyfile", "kafka_ssl_cafile"):
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a path, got {value!r}")
        return os.path.abspath(os.path.expanduser(value)) if value else ""
    if key == "kafka_sasl_mechanisms":
        if not isinstance(value, (list, tuple)) or not value or \
                any(m not in MECHANISMS for m in value):
            raise ConfigError(f"kafka_sasl_mechanisms must be a non-empty list of "
                              f"{', '.join(MECHANISMS)}, got {value!r}")
        return tuple(dict.fromkeys(value))
    if key in ("auto_create_topics", "kafka_acl_enforce_anonymous", "kafka_allow_anonymous"):
        if type(value) is not bool:
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        return value
    if key == "kafka_super_users":
        if not isinstance(value, (list, tuple)) or not all(
                isinstance(u, str) and u and ":" not in u for u in value):
            raise ConfigError(f"kafka_super_users must be a list of user names like "
                              f"[\"admin\"], got {value!r}")
        return tuple(value)
    if key in ("socket", "log_level", "log_format", "high_watermark", "group_assignor",
               "metrics_address") and not isinstance(value, str):
        raise ConfigError(f"{key} must be a string, got {value!r}")
    if key == "socket":
        if value:
            try:
                check_socket_path(value)
            except ValueError as err:
                raise ConfigError(f"{err}; give a shorter one") from err
        return value or ""
    if key == "group_assignor":
        try:
            return canonical_assignor(value)
        except ValueError as err:
            raise ConfigError(f"group_assignor: {err}") from err
    if key == "metrics_address":
        if value:
            try:
                parse_address(value)
            except ValueError as err:
                raise ConfigError(str(err)) from err
        return value or ""
    if key == "high_watermark":
        if value not in ("written", "durable"):
            raise ConfigError(f"high_watermark must be \"written\" or \"durable\", "
                              f"got {value!r}")
        return value
    if key == "log_format":
        if value not in LOG_FORMATS:
            raise ConfigError(f"log_format must be \"plain\" or \"json\", got {value!r}")
        return value
    if key == "log_level":
        level = value.upper()
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ConfigError(f"log_level must be DEBUG, INFO, WARNING or ERROR, "
                              f"got {value!r}")
        return level
    return None if value is None else str(value)


def _check_kafka_listeners(config: BrokerConfig, sources: Mapping[str, str]) -> None:
    """Every Kafka listener that does not authenticate binds loopback only, unless
    ``kafka_allow_anonymous`` (addresses.py). Raises ``ConfigError`` naming the listener."""
    client_certificates = bool(config.kafka_ssl_cafile)     # required when a CA is given
    for text in config.kafka_listeners:
        try:
            check_listener(text, allow_anonymous=config.kafka_allow_anonymous,
                           client_certificates=client_certificates)
        except ValueError as err:
            where = sources.get("kafka_listeners")
            raise ConfigError(f"{where}: {err}" if where else str(err)) from err


def _check_session_timeouts(config: BrokerConfig, sources: Mapping[str, str]) -> None:
    """The default session timeout lies within the bounds members must keep (as Kafka's
    group.consumer.session.timeout.ms must), or every member without one is refused."""
    low, default, high = (config.group_min_session_timeout_ms, config.group_session_timeout_ms,
                          config.group_max_session_timeout_ms)
    if not low <= default <= high:
        names = ("group_min_session_timeout_ms", "group_session_timeout_ms",
                 "group_max_session_timeout_ms")
        where = ", ".join(sorted({sources[n] for n in names if n in sources}))
        raise ConfigError(f"{where + ': ' if where else ''}group_session_timeout_ms ({default}) "
                          f"must be between group_min_session_timeout_ms ({low}) and "
                          f"group_max_session_timeout_ms ({high})")
