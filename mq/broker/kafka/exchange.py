"""A Kafka request in progress: a handler written as a generator, driven by the loop.

A Kafka handler (``handlers.py`` and the family modules) gets the decoded request and returns
its response body — a dict, or None for no response — or, when it needs the broker's
components, is a generator that yields what it waits for and returns the body::

    replies = yield Calls([Call(Api.PRODUCE, {...}), ...])   # native requests, answered
                                                            # now or later (acks=all)
    yield Park(deadline, partitions)     # sleep until data arrives there or the deadline

The components answer native requests exactly as they answer mq's own clients (one set of
logs, coordinators, free-space guard and group commit for both protocols); the handler turns
their replies into Kafka's response. A handler gets each native reply as a ``Response``
(``reply.error_code``, ``reply["first_offset"]``: the fields ``SCHEMAS`` names); a call marked
``one_way`` (a Produce with acks=0) gets None unless it failed at once.

Nothing here does I/O: ``Exchange`` asks its ``Runner`` (the listener) to dispatch a native
request, to park, and to finish the connection's slot.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Generator, Sequence
from typing import Any, Protocol, TypeVar

from mq.broker.kafka.conn import KafkaConn, Slot
from mq.protocol.kafka.schemas import APIS
from mq.protocol.messages import Api, Request, Response

__all__ = ["Call", "Calls", "CloseConnection", "Exchange", "Park", "Runner", "call_each"]

log = logging.getLogger("mq.broker")


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """One native request: its api and fields (``mq/protocol/messages.py`` schemas)."""

    api: Api
    fields: dict[str, Any]
    one_way: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Calls:
    calls: Sequence[Call]


K = TypeVar("K")


def call_each(calls: dict[K, Call]) -> Generator[Calls, Any, dict[K, Response]]:
    """In a handler, ``replies = yield from call_each({key: call})``: each call's reply by
    its key, with no wait when there is none to make (every resource of a request denied)."""
    if not calls:
        return {}
    replies = yield Calls(list(calls.values()))
    return dict(zip(calls, replies, strict=True))


@dataclasses.dataclass(frozen=True, slots=True)
class Park:
    """Wait until one of ``partitions`` (``(topic, partition)``) moves, or ``deadline``
    (the loop's monotonic seconds)."""

    deadline: float
    partitions: Sequence[tuple[str, int]]


@dataclasses.dataclass(frozen=True, slots=True)
class CloseConnection:
    """Returned by a handler: close the connection without a response (Kafka's answer to a
    failed acks=0 Produce). ``reason`` is logged at INFO."""

    reason: str


class Runner(Protocol):
    def dispatch(self, conn: KafkaConn, req: Request) -> list | None:
        """Run a native request; its reply now, or None (later through ``enqueue``)."""
        ...

    def park(self, exchange: Exchange, park: Park) -> None: ...

    def failed(self, conn: KafkaConn, what: str) -> None:
        """A handler raised: close the connection (a bug in mq; it is logged)."""
        ...


class Exchange:
    """One request's handler generator and what it waits for."""

    __slots__ = ("runner", "conn", "slot", "gen", "_replies", "_missing", "_parked",
                 "_dispatching", "done")

    def __init__(self, runner: Runner, conn: KafkaConn, slot: Slot,
                 gen: Generator[Any, Any, dict | None]) -> None:
        self.runner = runner
        self.conn = conn
        self.slot = slot
        self.gen = gen
        self._replies: list = []
        self._missing: dict[int, int] = {}       # native request id -> index in _replies
        self._parked = False
        self._dispatching = False
        self.done = False

    def start(self) -> None:
        self._advance(None)

    def _advance(self, value: Any) -> None:
        """Run the handler to its next wait or its end. Whatever goes wrong in it (a bug in
        mq: a handler raising, a body the schema cannot encode) closes this connection,
        logged with its traceback; the loop that called in, and every other client, go on."""
        try:
            self._step(value)
        except Exception:
            self.done = True
            log.exception("Kafka %s from %s failed", _api_name(self.slot.api_key),
                          self.conn.peer)
            self.runner.failed(self.conn, "a request failed")

    def _step(self, value: Any) -> None:
        while True:
            try:
                wanted = self.gen.send(value)
            except StopIteration as stop:
                self.done = True
                if isinstance(stop.value, CloseConnection):
                    log.info("closing Kafka connection from %s: %s", self.conn.peer,
                             stop.value.reason)
                    self.runner.failed(self.conn, stop.value.reason)
                    return
                self.conn.finish(self.slot, stop.value)
                return
            if isinstance(wanted, Park):
                self._parked = True
                self.runner.park(self, wanted)
                return
            if not isinstance(wanted, Calls):
                raise TypeError(f"a Kafka handler yielded {wanted!r}")
            value = self._call(wanted.calls)
            if value is None:
                return                     # waiting for deferred replies

    def _call(self, calls: Sequence[Call]) -> list[Response | None] | None:
        """Dispatch the calls; their replies if all came at once, else None (``reply``
        resumes the handler when the last one arrives). A call is awaited before it is
        dispatched: a component may send its reply from inside the call."""
        conn = self.conn
        self._replies = [None] * len(calls)
        self._missing = {}
        self._dispatching = True
        try:
            for i, call in enumerate(calls):
                rid = conn.request_id()
                self._missing[rid] = i
                conn.awaiting[rid] = self
                reply = self.runner.dispatch(conn, Request(call.api, rid, call.fields))
                if conn.closing:
                    return None
                if (reply is not None or call.one_way) and rid in self._missing:
                    del self._missing[rid]
                    conn.awaiting.pop(rid, None)
                    self._replies[i] = None if reply is None else Response.from_message(reply)
        finally:
            self._dispatching = False
        return None if self._missing else self._replies

    def reply(self, message: list) -> None:
        """A deferred native reply arrived (``KafkaConn.enqueue``)."""
        i = self._missing.pop(message[1], None)
        if i is None:
            return
        self._replies[i] = Response.from_message(message)
        if not self._missing and not self.done and not self._dispatching:
            self._advance(self._replies)

    def wake(self) -> None:
        """The parked handler's partitions moved, or its deadline passed."""
        if self._parked and not self.done and not self.conn.closing:
            self._parked = False
            self._advance(None)

    @property
    def parked(self) -> bool:
        return self._parked

    def abandon(self) -> None:
        """The connection closed: drop the handler."""
        self.done = True
        self.gen.close()


def _api_name(api_key: int) -> str:
    entry = APIS.get(api_key)
    return entry[0][0].removesuffix("Request") if entry else f"api {api_key}"
