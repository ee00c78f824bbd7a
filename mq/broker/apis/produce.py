"""The data path's apis: Produce, ProduceShared and ShareMemory, ListOffsets, Wait.

Produce validates and appends one whole batch per request (never decoding a record), then
answers at once (``acks=1``), never (``acks=0``), or once an fsync covers the batch
(``acks="all"``, through group commit). The batch comes inside the request, or as the frame's
raw tail, stamped in the receive buffer. ShareMemory maps a producer's batch arena (a memfd,
``mq/client/arena.py``) once per connection, and ProduceShared is Produce for a batch in it:
the log is written straight from the producer's memory. Wait arms a consumer's wake-up: the
partition table remembers the waiter and the loop posts the consumer's semaphore once the
high watermark passes its position (``wakeups.py``; ``mq/client/consumer.py`` draws the
protocol). The Kafka listener's Produce comes here too (``mq/broker/kafka/data.py``).

Produce is the broker's hot path: one table lookup, one append, one set insertion and the
response, with no per-record work. The partition log checks an idempotent producer's
sequence and answers its retries with their first offsets (``PartitionLog.append``); a
transactional batch is first checked against its producer's open transaction (``verify``, one
byte of the header tells). Batches are stamped with this broker start's leader epoch.

Invariants: nothing a client wrote is trusted. Internal topics and control batches are
refused; the free-space guard admits a batch before it is written (``space.py``); an arena
is mapped only if it is a memfd sealed against shrinking and growing (so the broker's map
cannot fault), and a shared batch's header is read once, from a private copy, with its CRC
checked on the bytes that reached the file, so a producer that rewrites it in flight only
gets its own batch refused.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import time
from collections.abc import Callable, Mapping

import posix_ipc

from mq import errors
from mq.broker.apis import Handler
from mq.broker.conns import Conn, SocketWake
from mq.broker.flushing import GroupCommit
from mq.broker.internal_topics import is_internal
from mq.broker.partitions import PartitionTable
from mq.broker.space import FreeSpaceGuard
from mq.broker.wakeups import post
from mq.errors import InvalidRequestError
from mq.log import diskio, native
from mq.log.layout import (
    ATTRIBUTES_OFFSET,
    CONTROL_MASK,
    PRODUCER_EPOCH_OFFSET,
    PRODUCER_ID_OFFSET,
    RECORD_BATCH_OVERHEAD,
    TRANSACTIONAL_MASK,
    field,
)
from mq.protocol.messages import ACKS_ALL, ARENA_SEALS, Api, Request, response

__all__ = ["ProduceApis"]

# Where a batch header says it is transactional and whose it is (mq.log.layout).
_ATTRIBUTES_LOW = ATTRIBUTES_OFFSET + 1     # the low byte of the big-endian int16
_PRODUCER_ID = field("producerId")
_PRODUCER_EPOCH = field("producerEpoch")
_PRODUCER_EPOCH_END = PRODUCER_EPOCH_OFFSET + _PRODUCER_EPOCH.size
_MAX_ARENA_BYTES = 1 << 30


class ProduceApis:
    """Produce, ListOffsets and Wait over the partition table."""

    def __init__(self, table: PartitionTable, commit: GroupCommit, space: FreeSpaceGuard,
                 semaphore_prefix: str, push: Callable[[Conn, list], None], *,
                 leader_epoch: int = 0,
                 verify_transaction: Callable[[str, int, int, int], None] | None = None
                 ) -> None:
        self._table = table
        self._push = push
        self._space = space
        self._semaphore_prefix = semaphore_prefix
        self._epoch = leader_epoch
        self._verify_transaction = verify_transaction
        # Bound once: the produce path uses them per request.
        self._lookup = table.partition
        self._by_key = table.by_key
        self._touched = table.touched
        self._hold = commit.tracker.hold

    def handlers(self) -> Mapping[Api, Handler]:
        return {Api.PRODUCE: self.produce, Api.LIST_OFFSETS: self.list_offsets,
                Api.WAIT: self.wait, Api.SHARE_MEMORY: self.share_memory,
                Api.PRODUCE_SHARED: self.produce_shared}

    def produce(self, conn: Conn, req: Request) -> list | None:
        return self.append(conn, req.request_id, req["topic"], req["partition"], req["acks"],
                           req["batch"])

    def share_memory(self, conn: Conn, req: Request) -> list:
        """Map the producer's batch arena, the fd passed with this request (``arena.py``):
        only a memfd sealed against shrinking and growing, so the map can never fault."""
        if not conn.fds:
            raise InvalidRequestError("ShareMemory needs a memfd passed with it (SCM_RIGHTS)")
        fd = conn.fds.pop(0)
        try:
            size = req["size"]
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
                actual = os.fstat(fd).st_size
            except OSError as err:
                raise InvalidRequestError(f"the shared descriptor is not a memfd: "
                                          f"{err.strerror}") from err
            if seals & ARENA_SEALS != ARENA_SEALS:
                raise InvalidRequestError("the shared memfd must be sealed against shrinking "
                                          "and growing (F_SEAL_SHRINK | F_SEAL_GROW | "
                                          "F_SEAL_SEAL)")
            if not 0 < size == actual <= _MAX_ARENA_BYTES:
                raise InvalidRequestError(f"arena of {actual} bytes, {size} announced (at most "
                                          f"{_MAX_ARENA_BYTES})")
            arena = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        conn.set_arena(arena)
        return response(req.api, req.request_id)

    def produce_shared(self, conn: Conn, req: Request) -> list | None:
        """Produce for the batch at ``[offset, offset + length)`` of the connection's arena.
        The producer can still write there, so the log appends it as ``shared``: header
        checked from a private copy, CRC checked on the bytes written (``PartitionLog``)."""
        arena = conn.arena
        if arena is None:
            raise InvalidRequestError("ProduceShared before ShareMemory")
        offset, length = req["offset"], req["length"]
        if not (0 <= offset and 0 < length <= len(arena) - offset):
            raise InvalidRequestError(f"batch at [{offset}, {offset + length}) is outside the "
                                      f"arena of {len(arena)} bytes")
        if req["acks"] == 0:
            raise InvalidRequestError("ProduceShared needs acks: the reply frees the slot")
        with memoryview(arena) as whole, whole[offset:offset + length] as batch:
            return self.append(conn, req.request_id, req["topic"], req["partition"],
                               req["acks"], batch, req.api, True)

    def append(self, conn: Conn, request_id: int, topic: str, partition: int, acks: int,
               batch, api: Api = Api.PRODUCE, shared: bool = False) -> list | None:
        """A produce request's append and its reply (None: later, or none with acks=0). The
        loop calls this directly for a plain Produce (``Broker._handle``)."""
        fast = native.produce_plain
        if fast is not None and acks == 1 and not shared and type(diskio.ops) is diskio.DiskIO:
            # The common case in one C call, from the checks to the reply; None: it declined
            # with nothing touched, and the Python path below does it all.
            try:
                reply = fast(self._by_key, self._space, self._touched, topic, partition, batch,
                             self._epoch, int(time.time() * 1000), request_id, api)
            except OSError as err:
                raise self._lookup(topic, partition).log._write_failed("append", err) from err
            if reply is not None:
                return reply
        if is_internal(topic):
            raise InvalidRequestError(f"cannot produce to internal topic {topic!r}")
        if acks not in (0, 1, ACKS_ALL):
            raise InvalidRequestError(f"acks must be 0, 1 or -1 (all), got {acks}")
        part = self._lookup(topic, partition)
        plog = part.log
        if len(batch) > plog.config.max_message_bytes:
            raise errors.MessageTooLargeError(
                f"batch of {len(batch)} bytes exceeds max.message.bytes "
                f"{plog.config.max_message_bytes} of topic {topic!r}")
        self._space.admit(len(batch))
        # A shared batch's header is read once, from a private copy: the producer can still
        # write the arena, so what is checked here must be what the log appends.
        head = bytes(batch[:RECORD_BATCH_OVERHEAD]) if shared else batch
        attributes = head[_ATTRIBUTES_LOW] if len(head) > _PRODUCER_EPOCH_END else 0
        if attributes & CONTROL_MASK:
            raise errors.InvalidRecordError("clients may not produce control batches "
                                            "(transaction markers come from the coordinator)")
        if attributes & TRANSACTIONAL_MASK and self._verify_transaction is not None:
            self._verify_transaction(topic, partition,
                                     _PRODUCER_ID.unpack_from(head, PRODUCER_ID_OFFSET)[0],
                                     _PRODUCER_EPOCH.unpack_from(head, PRODUCER_EPOCH_OFFSET)[0])
        end = plog.log_end_offset
        # A tail frame's batch is a writable view of the receive buffer: stamped and written
        # from there. One inside msgpack arrived as bytes, so it is copied to be stamped.
        if shared:
            info = plog.append(batch, leader_epoch=self._epoch, shared_head=head)
        else:
            info = plog.append(batch if isinstance(batch, (bytearray, memoryview))
                               else bytearray(batch), leader_epoch=self._epoch)
        if plog.log_end_offset != end:              # not a retry the log already had
            part.produced_records += plog.log_end_offset - end
            part.produced_bytes += len(batch)
        self._touched.add(part)
        reply = response(api, request_id, 0, None, info.first_offset,
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
        already). The semaphore is opened once per connection and closed with it. The name
        ``""`` asks for the wake-up as a push on this connection (``conns.SocketWake``)."""
        name = req["semaphore"]
        if not name:
            sem = conn.semaphores.get(name)
            if sem is None:
                sem = conn.semaphores[name] = SocketWake(conn, self._push)
            sem.value = 0                       # armed again: the next advance pushes
        elif not name.startswith(self._semaphore_prefix) or "\0" in name:
            # posix_ipc crashes the process on a name with a NUL byte (posix_ipc 1.3.2)
            raise InvalidRequestError(f"semaphore {name!r} is not one of this broker's")
        else:
            sem = conn.semaphores.get(name)
            if sem is None:
                try:
                    sem = posix_ipc.Semaphore(name)
                except (posix_ipc.Error, ValueError) as err:   # ValueError: '/' inside, too long
                    raise InvalidRequestError(f"cannot open semaphore {name!r}: {err}") from err
                conn.semaphores[name] = sem
        if self._table.arm(conn, sem, req["positions"]):
            post(sem)
