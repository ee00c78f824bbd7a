"""The log line formats of mq's long-running processes (the broker, worker pools): ``plain`` for
people and journald, ``json`` for log shippers. One module so both speak the same fields.

- plain: ``2026-01-02 10:00:00,123 WARNING mq.broker: message``. When stderr is journald's
  stream (``$JOURNAL_STREAM`` names stderr's device and inode, as systemd sets it for units
  logging to the journal) the time is left out, since journald stamps every line, and the
  line starts with its syslog priority (``<4>`` for a warning), which journald strips and
  keeps as the entry's ``PRIORITY`` (``journalctl -p warning`` works).
- json: one object a line with the stable fields ``ts`` (seconds since the epoch, float),
  ``level``, ``logger``, ``msg`` (arguments merged) and ``pid``; ``exc`` holds a traceback's
  text. A subclass adds its own context fields (``JsonFormatter.fields``); the base fields
  are never renamed or dropped.

Each record is one ``write(2)``: ``logging.StreamHandler`` writes and flushes per record, so
lines of processes sharing stderr do not interleave below the pipe's 4 KiB.
"""

from __future__ import annotations

import json
import logging
import os
import sys

__all__ = ["LOG_FORMATS", "JsonFormatter", "PlainFormatter", "formatter", "stderr_is_journal"]

LOG_FORMATS = ("plain", "json")

# syslog priorities of Python's levels (sd-daemon(3)'s SD_ERR ... SD_DEBUG).
_PRIORITY = {logging.CRITICAL: 2, logging.ERROR: 3, logging.WARNING: 4, logging.INFO: 6,
             logging.DEBUG: 7}


def stderr_is_journal(environ=os.environ, stream=None) -> bool:
    """True if ``stream`` (default stderr) is the journal stream systemd connected:
    ``$JOURNAL_STREAM`` is ``DEVICE:INODE`` of that very file. Checked, not just tested for
    presence, as systemd.exec(5) advises: a unit's process that redirects stderr to a file
    keeps the variable but not the journal."""
    value = environ.get("JOURNAL_STREAM")
    if not value:
        return False
    try:
        device, inode = (int(part) for part in value.split(":"))
        st = os.fstat((stream or sys.stderr).fileno())
    except (ValueError, OSError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (device, inode)


class PlainFormatter(logging.Formatter):
    """``[time ]LEVEL logger: message``; ``body`` replaces what follows the time. ``journal``
    (default: ``stderr_is_journal()``) drops the time and adds the ``<priority>`` prefix."""

    def __init__(self, body: str = "%(levelname)s %(name)s: %(message)s",
                 journal: bool | None = None) -> None:
        self.journal = stderr_is_journal() if journal is None else journal
        super().__init__(body if self.journal else "%(asctime)s " + body)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if self.journal:
            level = record.levelno
            priority = _PRIORITY.get(level) or (3 if level > logging.WARNING else
                                                4 if level > logging.INFO else 6)
            text = f"<{priority}>{text}"
        return text


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``ts``, ``level``, ``logger``, ``msg``, ``pid``, what
    ``fields`` adds, and ``exc`` for a traceback."""

    def fields(self, record: logging.LogRecord) -> dict:
        """Context fields a subclass adds after the base ones (none here)."""
        return {}

    def format(self, record: logging.LogRecord) -> str:
        obj = {"ts": round(record.created, 6), "level": record.levelname,
               "logger": record.name, "msg": record.getMessage(), "pid": record.process}
        obj.update(self.fields(record))
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            obj["exc"] = record.exc_text
        if record.stack_info:
            obj["stack"] = self.formatStack(record.stack_info)
        return json.dumps(obj, default=str)


def formatter(log_format: str) -> logging.Formatter:
    """The formatter for ``log_format`` (``plain`` or ``json``). Raises ``ValueError``."""
    if log_format == "json":
        return JsonFormatter()
    if log_format == "plain":
        return PlainFormatter()
    raise ValueError(f"log format must be plain or json, got {log_format!r}")
