"""Logging of the supervisor and its children: stderr, one line per event, plain or JSON.

Only the ``workers`` and ``mq`` loggers are set up (not propagated to the root logger): the
handler's own logging stays the application's business (Celery's hijacking of the root logger
is a known complaint). Every line carries the group and, in a child, the slot and pid; a line
about one record adds its topic, partition and offset (``extra=record_fields(r)``).

- plain: ``2026-01-02 10:00:00,123 WARNING workers[billing/2 pid 4242]: message
  (jobs-3@1207)``; when stderr is journald's stream, without the timestamp (journald stamps
  lines itself) and with the syslog priority first (``mq.logformat``);
- json (``--log-format json``): one object a line with ``ts`` (seconds since the epoch),
  ``level``, ``logger``, ``msg``, ``group``, ``slot`` (null in the supervisor), ``pid`` and,
  when the line is about a record, ``topic``, ``partition``, ``offset``; ``exc`` holds a
  traceback.

Each line is written with one ``write(2)`` (the stream handler flushes per record), so lines
of the supervisor and the children sharing stderr do not interleave below 4 KiB.
"""

from __future__ import annotations

import logging
import sys

from mq import logformat

__all__ = ["record_fields", "setup_logging"]

_CONTEXT: dict = {"group": None, "slot": None}
_FIELDS = ("topic", "partition", "offset")


def record_fields(record) -> dict:
    """``extra=`` for a log line about ``record`` (an ``mq.Record``)."""
    return {"topic": record.topic, "partition": record.partition, "offset": record.offset}


class _Context(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.group = _CONTEXT["group"]
        record.slot = _CONTEXT["slot"]
        return True


class PlainFormatter(logformat.PlainFormatter):
    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s[%(who)s]: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        slot = getattr(record, "slot", None)
        group = getattr(record, "group", None) or "-"
        record.who = f"{group} pid {record.process}" if slot is None \
            else f"{group}/{slot} pid {record.process}"
        text = super().format(record)
        if getattr(record, "topic", None) is not None:
            text += f" ({record.topic}-{record.partition}@{record.offset})"
        return text


class JsonFormatter(logformat.JsonFormatter):
    def fields(self, record: logging.LogRecord) -> dict:
        obj = {"group": getattr(record, "group", None), "slot": getattr(record, "slot", None)}
        for field in _FIELDS:
            value = getattr(record, field, None)
            if value is not None:
                obj[field] = value
        return obj


def setup_logging(log_format: str, level: str | int, group: str,
                  slot: int | None = None) -> logging.Logger:
    """Route the ``workers`` and ``mq`` loggers to stderr in ``log_format``; returns the
    ``workers`` logger."""
    numeric = level if isinstance(level, int) else logging.getLevelName(str(level).upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    _CONTEXT.update(group=group, slot=slot)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else PlainFormatter())
    handler.addFilter(_Context())
    for name in ("workers", "mq"):
        logger = logging.getLogger(name)
        for old in list(logger.handlers):
            logger.removeHandler(old)
        logger.addHandler(handler)
        logger.propagate = False
        # mq's clients log their retries at INFO: a pool shows their warnings only.
        logger.setLevel(numeric if name == "workers" else max(logging.WARNING, numeric))
    return logging.getLogger("workers")
