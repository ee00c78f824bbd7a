"""The consumers' option checks, shared by ``mq.Consumer``, ``mq.aio.Consumer`` and the
Kafka cluster backend's consumer (``kafka/consumer.py``), so that each refuses the same
settings with the same words."""

from __future__ import annotations

import re
from collections.abc import Iterable

__all__ = ["check_group_options", "check_read_options", "check_spin", "check_subscription"]

MAX_SPIN_US = 1_000_000          # a spin is bounded; past a second, sleeping costs nothing


def check_read_options(auto_offset_reset: str, isolation_level: str, max_poll_records: int,
                       max_partition_fetch_bytes: int) -> None:
    """Raise ``ValueError`` for a reading option no consumer takes (``mq.aio``'s too)."""
    if auto_offset_reset not in ("earliest", "latest", "none"):
        raise ValueError(f"auto_offset_reset must be 'earliest', 'latest' or 'none', got "
                         f"{auto_offset_reset!r}")
    if isolation_level not in ("read_uncommitted", "read_committed"):
        raise ValueError(f"isolation_level must be 'read_uncommitted' or 'read_committed', "
                         f"got {isolation_level!r}")
    if max_poll_records < 1 or max_partition_fetch_bytes < 1:
        raise ValueError("max_poll_records and max_partition_fetch_bytes must be positive")


def check_spin(spin_us: float) -> float:
    """``spin_us`` (a consumer's busy wait before each sleep) in seconds; ``ValueError`` unless
    it is a number from 0 to ``MAX_SPIN_US``."""
    if isinstance(spin_us, bool) or not isinstance(spin_us, (int, float)) or \
            not 0 <= spin_us <= MAX_SPIN_US:
        raise ValueError(f"spin_us must be from 0 to {MAX_SPIN_US} microseconds, got "
                         f"{spin_us!r}")
    return spin_us / 1e6


def check_group_options(group_id: str | None, pattern: str | None, session_timeout_ms: int,
                        max_poll_interval_ms: int, auto_commit_interval_ms: int) -> None:
    """Raise ``ValueError`` for group options no consumer takes (``mq.aio``'s too)."""
    if group_id is not None and (not isinstance(group_id, str) or not group_id):
        raise ValueError(f"group_id must be a non-empty string, got {group_id!r}")
    if pattern is not None and group_id is None:
        raise ValueError("a pattern subscription needs a group_id")
    if session_timeout_ms <= 0 or max_poll_interval_ms <= 0 or auto_commit_interval_ms <= 0:
        raise ValueError("session_timeout_ms, max_poll_interval_ms and "
                         "auto_commit_interval_ms must be positive")


def check_subscription(group_id: str | None, topics: Iterable[str] | str,
                       pattern: str | None) -> list[str]:
    """``subscribe``'s topics as a list; ``ValueError`` for a subscription no consumer takes
    (``mq.aio``'s too)."""
    if group_id is None:
        raise ValueError("subscribe() needs a group_id; without one, pass topics to the "
                         "constructor or use assign()")
    topics = [topics] if isinstance(topics, str) else list(topics)
    if bool(topics) == (pattern is not None):
        raise ValueError("subscribe to topic names or to a pattern (exactly one)")
    if not all(isinstance(t, str) and t for t in topics):
        raise ValueError("topic names must be non-empty strings")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as err:
            raise ValueError(f"bad subscription pattern {pattern!r}: {err}") from err
    return topics
