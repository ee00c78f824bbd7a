"""The data path's apis: Produce, ListOffsets and Wait.

Produce validates and appends one whole batch per request (never decoding a record), then
answers at once (``acks=1``), never (``acks=0``), or once an fsync covers the batch
(``acks="all"``, through group commit). Wait arms a consumer's wake-up: the partition table
remembers the waiter and the loop posts the consumer's semaphore once the high watermark
passes its position (``wakeups.py``; ``mq/client/consumer.py`` draws the protocol).

Produce is the broker's hot path: one table lookup, one append, one set insertion and the
response, with no per-record work.
"""

from __future__ import annotations

from collections.abc import Mapping

import posix_ipc

from mq import errors
from mq.broker.apis import Handler
from mq.broker.conns import Conn
from mq.broker.flushing import GroupCommit
from mq.broker.internal_topics import is_internal
from mq.broker.partitions import PartitionTable
from mq.broker.space import FreeSpaceGuard
from mq.broker.wakeups import post
from mq.errors import InvalidRequestError
from mq.protocol.messages import ACKS_ALL, Api, Request, response

__all__ = ["ProduceApis"]


class ProduceApis:
    """Produce, ListOffsets and Wait over the partition table."""

    def __init__(self, table: PartitionTable, commit: GroupCommit, space: FreeSpaceGuard,
                 semaphore_prefix: str) -> None:
        self._table = table
        self._space = space
        self._semaphore_prefix = semaphore_prefix
        # Bound once: the produce path uses them per request.
        self._lookup = table.partition
        self._touched = table.touched
        self._hold = commit.tracker.hold

    def handlers(self) -> Mapping[Api, Handler]:
        return {Api.PRODUCE: self.produce, Api.LIST_OFFSETS: self.list_offsets,
                Api.WAIT: self.wait}

    def produce(self, conn: Conn, req: Request) -> list | None:
        topic, acks = req["topic"], req["acks"]
        if is_internal(topic):
            raise InvalidRequestError(f"cannot produce to internal topic {topic!r}")
        if acks not in (0, 1, ACKS_ALL):
            raise InvalidRequestError(f"acks must be 0, 1 or -1 (all), got {acks}")
        part = self._lookup(topic, req["partition"])
        plog = part.log
        batch = req["batch"]
        if len(batch) > plog.config.max_message_bytes:
            raise errors.MessageTooLargeError(
                f"batch of {len(batch)} bytes exceeds max.message.bytes "
                f"{plog.config.max_message_bytes} of topic {topic!r}")
        self._space.admit(len(batch))
        info = plog.append(batch if isinstance(batch, bytearray) else bytearray(batch),
                           leader_epoch=0)
        self._touched.add(part)
        reply = response(req.api, req.request_id, 0, None, info.first_offset,
                         info.log_append_time, plog.log_start_offset)
        if acks == ACKS_ALL:
            self._hold(part, plog.log_end_offset, conn, reply)
            return None
        if not plog.high_watermark_follows_log_end:
            self._hold(part, plog.log_end_offset)       # visible once durable
        return reply if acks == 1 else None

    def list_offsets(self, conn: Conn, req: Request) -> list:
        part = self._lookup(req["topic"], req["partition"])
        found = part.log.offset_for_timestamp(req["timestamp"])
        offset, ts = found if found is not None else (-1, -1)
        return response(req.api, req.request_id, 0, None, offset, ts)

    def wait(self, conn: Conn, req: Request) -> None:
        """Post the named semaphore once one of the positions has data (at once if one has
        already). The semaphore is opened once per connection and closed with it."""
        name = req["semaphore"]
        if not name.startswith(self._semaphore_prefix):
            raise InvalidRequestError(f"semaphore {name!r} is not one of this broker's")
        sem = conn.semaphores.get(name)
        if sem is None:
            try:
                sem = posix_ipc.Semaphore(name)
            except posix_ipc.Error as err:
                raise InvalidRequestError(f"cannot open semaphore {name!r}: {err}") from err
            conn.semaphores[name] = sem
        if self._table.arm(conn, sem, req["positions"]):
            post(sem)
