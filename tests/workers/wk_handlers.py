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
"""

from __future__ import annotations

import asyncio
import json
import os
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


def event(kind: str, r) -> None:
    if _FD is not None:
        os.write(_FD, json.dumps({
            "kind": kind, "pid": os.getpid(), "slot": _SLOT, "partition": r.partition,
            "offset": r.offset, "key": None if r.key is None else bytes(r.key).decode(),
            "value": bytes(r.value).decode(), "t": time.monotonic_ns()}).encode() + b"\n")


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
