"""What happens to a record whose handler fails: the retry delay, the error text, and the
dead letter's headers. Pure functions; the child's engine applies them.

- Retries happen in place: the record's partition waits (other partitions go on) and the
  same record is tried again, so partition order holds. The delay before try ``n + 1`` is
  ``min(retry_backoff_max_ms, retry_backoff_ms * 2 ** (n - 1))`` with "equal jitter": uniform
  between half of that and all of it, so children that failed together do not retry in step.
- A failure the child cannot see — its handler hung past ``handler_timeout_s`` and the
  supervisor killed it, or the child died in the handler (segfault, OOM kill, ``os._exit``) —
  still spends an attempt: the supervisor records it in the counter table (``stats.py``) and
  whichever child gets the record next starts from there. Without that a record that kills
  its child would be redelivered forever (dramatiq#213).
- After ``max_retries + 1`` failed attempts the record is dead-lettered: produced to the
  dead-letter topic with its key, value and headers, plus the ``mq.dlq.*`` headers below
  (``docs/api.md``, "Worker pools"); ``mq workers redrive`` removes them again.
"""

from __future__ import annotations

import random
import signal

from workers.stats import KIND_DIED, KIND_TIMEOUT

__all__ = ["DLQ_HEADERS", "DLQ_PREFIX", "backoff_s", "dead_letter_headers", "death_error",
           "error_text", "exit_text", "original_headers"]

DLQ_PREFIX = "mq.dlq."
# Where the record was and why it failed, then what a triage wants: the group that gave up
# and the record's time.
DLQ_HEADERS = ("mq.dlq.topic", "mq.dlq.partition", "mq.dlq.offset", "mq.dlq.error",
               "mq.dlq.attempts", "mq.dlq.group", "mq.dlq.timestamp")
MAX_ERROR_CHARS = 2000


def backoff_s(attempt: int, base_ms: float, max_ms: float, rng: random.Random | None = None
              ) -> float:
    """Seconds to wait after failed attempt ``attempt`` (1, 2, ...) before the next."""
    ceiling = min(max_ms, base_ms * 2 ** (attempt - 1)) / 1000
    return (rng or random).uniform(ceiling / 2, ceiling)


def error_text(exc: BaseException) -> str:
    """``Type: message`` on one line, at most ``MAX_ERROR_CHARS``."""
    message = " ".join(str(exc).split())
    text = f"{type(exc).__name__}: {message}" if message else type(exc).__name__
    return text[:MAX_ERROR_CHARS]


def death_error(kind: int, detail: int, handler_timeout_s: float | None) -> str:
    """The error of an attempt the supervisor recorded (the child could not)."""
    if kind == KIND_TIMEOUT:
        return (f"HandlerTimeout: the handler ran longer than handler_timeout_s="
                f"{handler_timeout_s:g} s; the supervisor killed its child")
    if kind == KIND_DIED:
        return f"ChildDied: the child died while handling the record ({exit_text(detail)})"
    return f"Unknown: attempt failed (kind {kind}, detail {detail})"


def exit_text(status: int) -> str:
    """A child's exit status as ``Popen`` gives it (negative: a signal), in words."""
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


def dead_letter_headers(headers, topic: str, partition: int, offset: int, error: str,
                        attempts: int, group_id: str, timestamp_ms: int
                        ) -> list[tuple[str, bytes]]:
    """The record's own headers (an earlier dead letter's ``mq.dlq.*`` dropped) and the new
    ``mq.dlq.*`` ones."""
    values = (topic, partition, offset, error, attempts, group_id, timestamp_ms)
    return original_headers(headers) + [
        (name, str(value).encode()) for name, value in zip(DLQ_HEADERS, values, strict=True)]


def original_headers(headers) -> list[tuple[str, bytes]]:
    """``headers`` without the ``mq.dlq.*`` ones (values as bytes)."""
    return [(k, bytes(v) if isinstance(v, memoryview) else v) for k, v in headers or ()
            if not k.startswith(DLQ_PREFIX)]
