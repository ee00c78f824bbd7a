"""Handlers the worker-pool tests run in real pools (``wk_handlers:handle`` and friends),
steered by environment variables the children inherit:

- ``WK_EVENTS``: a file of JSON lines, one ``call`` before and one ``done`` after each
  successful attempt (``pid``, ``slot``, ``partition``, ``offset``, ``key``, ``value``,
  ``t``: CLOCK_MONOTONIC ns, the clock the tests read too). One ``write(2)`` each on an
  ``O_APPEND`` descriptor: a SIGKILL never leaves half a line between two whole ones.
- ``WK_SLEEP_MS``: time each record takes. ``WK_OUTPUT``: the topic of one output per record,
  value ``b"<partition>:<offset>:<value reversed>"`` (``transform``).
- values starting ``poison`` raise ``ValueError`` until the file ``WK_FIXED`` exists;
  ``hang`` sleeps for an hour; ``crash`` ends the child with ``os._exit(13)``; ``big`` adds a
  second output of 20,000 bytes (too large for a topic with ``max.message.bytes=10000``).
- ``awatch``: ``ahandle``, but a record valued ``watch`` first awaits, a millisecond at a
  time, until it sees another task of its loop suspended in a commit step of the child's
  clients (``workers/clients.py``), for up to 20 s. Its ``done`` event names the step
  (``committing``, None if it saw none) and every ``done`` event counts the child's threads
  (``threads``).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

_FD = os.open(os.environ["WK_EVENTS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) \
    if os.environ.get("WK_EVENTS") else None
_SLEEP = float(os.environ.get("WK_SLEEP_MS") or 0) / 1000
_OUTPUT = os.environ.get("WK_OUTPUT")
_FIXED = os.environ.get("WK_FIXED")
_SLOT = os.environ.get("MQ_WORKERS_SLOT")


def transform(partition: int, offset: int, value: bytes) -> bytes:
    return b"%d:%d:%s" % (partition, offset, value[::-1])


def parse_output(value: bytes) -> tuple[int, int, bytes]:
    partition, offset, reversed_value = value.split(b":", 2)
    return int(partition), int(offset), reversed_value[::-1]


def event(kind: str, r, **extra) -> None:
    if _FD is not None:
        os.write(_FD, json.dumps({
            "kind": kind, "pid": os.getpid(), "slot": _SLOT, "partition": r.partition,
            "offset": r.offset, "key": None if r.key is None else bytes(r.key).decode(),
            "value": bytes(r.value).decode(), "t": time.monotonic_ns(), **extra}).encode()
            + b"\n")


def _behave(r) -> None:
    value = bytes(r.value)
    if value.startswith(b"poison") and not (_FIXED and os.path.exists(_FIXED)):
        raise ValueError(f"poison {value.decode()}")
    if value.startswith(b"hang"):
        time.sleep(3600)
    if value.startswith(b"crash"):
        os._exit(13)


def _outputs(r):
    if not _OUTPUT:
        return None
    out = [(_OUTPUT, r.key, transform(r.partition, r.offset, bytes(r.value)))]
    if bytes(r.value).startswith(b"big"):                 # a second output, too large
        out.append((_OUTPUT, r.key, b"x" * 20_000))
    return out


def handle(r):
    event("call", r)
    if _SLEEP:
        time.sleep(_SLEEP)
    _behave(r)
    event("done", r)
    return _outputs(r)


async def ahandle(r):
    event("call", r)
    await asyncio.sleep(_SLEEP * (1 + (r.offset % 3)))       # uneven: completion reorders
    _behave(r)
    event("done", r)
    return _outputs(r)


_COMMIT_STEPS = {"flush", "commit", "send_offsets", "commit_transaction"}
_CLIENTS = os.path.join("workers", "clients.py")


def _suspended_in_a_commit() -> str | None:
    """The commit step of the child's clients that a task of this loop awaits, if any: its
    chain of awaited coroutines goes through it."""
    for task in asyncio.all_tasks():
        coro = task.get_coro()
        while hasattr(coro, "cr_code"):
            code = coro.cr_code
            if code.co_name in _COMMIT_STEPS and code.co_filename.endswith(_CLIENTS):
                return code.co_name
            coro = coro.cr_await
    return None


async def awatch(r):
    event("call", r)
    seen = None
    if bytes(r.value) == b"watch":
        deadline = time.monotonic() + 20
        while seen is None and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
            seen = _suspended_in_a_commit()
    else:
        await asyncio.sleep(_SLEEP)
    event("done", r, threads=threading.active_count(), committing=seen)
    return _outputs(r)
