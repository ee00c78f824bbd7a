"""The producer's sender (``mq.client.sender``) against a model partition, under random
interleavings of sends, replies, retriable errors and lost connections: every batch ends
exactly once, in every partition's log exactly once and in the order it was closed, and a
batch re-sent is byte for byte what was sent first.

The model is the broker's side of idempotence, reduced: one connection answers its requests
in order; a partition appends a batch whose base sequence is the next it expects, answers a
batch it already holds with ``DuplicateSequenceError`` and any other with
``OutOfOrderSequenceError``. A lost connection may have appended any prefix of the requests
in flight before their replies were lost. Retries and the delivery timeout are unbounded, so
no batch may fail.
"""

from __future__ import annotations

import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from mq.client.idempotence import ProducerIdentity
from mq.client.producer_batches import Batch, TopicState
from mq.client.sender import Sender
from mq.errors import (
    BrokerUnavailableError,
    DuplicateSequenceError,
    KafkaStorageError,
    OutOfOrderSequenceError,
)
from mq.log.batch import RecordBatch
from mq.protocol.messages import Api, Response

PARTITIONS = 2


class Partition:
    """The model partition: its log of batches and the next sequence it expects."""

    def __init__(self) -> None:
        self.log: list[Batch] = []
        self.next_sequence = 0
        self.held: list[tuple[int, int]] = []      # (base, count) of the batches it holds

    def produce(self, batch: Batch, data: bytes) -> int:
        """The error code the partition answers (appending the batch if 0)."""
        header = RecordBatch(data)
        count = header.last_sequence - header.base_sequence + 1
        if (header.base_sequence, count) in self.held:
            return DuplicateSequenceError.code
        if header.base_sequence != self.next_sequence:
            return OutOfOrderSequenceError.code
        self.log.append(batch)
        self.held.append((header.base_sequence, count))
        self.next_sequence += count
        return 0


class World:
    def __init__(self, max_in_flight: int) -> None:
        ids = ProducerIdentity()
        ids.set(1, 0)
        self.sender = Sender(-1, max_in_flight, 10**9, 0.01, 1e9, 1e9, ids)
        self.info = TopicState("t")
        self.info.update(PARTITIONS, 16384, 16384, 0.0)
        self.partitions = [Partition() for _ in range(PARTITIONS)]
        self.now = 0.0
        self.rid = 0
        self.wire: list[tuple[int, Batch, bytes]] = []   # requests in flight, in order
        self.first_bytes: dict[Batch, bytes] = {}
        self.batches: list[Batch] = []
        self.outcomes: dict[Batch, list] = {}

    def finish(self, finished: list) -> None:
        for batch, _, _, error in finished:
            self.outcomes.setdefault(batch, []).append(error)
        finished.clear()

    def close_batch(self, partition: int) -> None:
        batch = Batch(self.info, partition, 0, self.now, 0.0, threading.Lock(), [])
        batch.add(None, None, b"%d" % len(self.batches), ())
        self.batches.append(batch)
        self.sender.enqueue(batch)

    def pump(self) -> None:
        finished: list = []
        for batch in self.sender.requests(self.now, finished):
            self.rid += 1
            data = bytes(batch.data)
            assert self.first_bytes.setdefault(batch, data) == data, "re-sent different bytes"
            self.wire.append((self.rid, batch, data))
            self.sender.sent(batch, self.rid, self.now, finished)
        assert len(self.sender.in_flight) <= self.sender.max_in_flight
        self.finish(finished)

    def answer(self, fail_retriably: bool) -> None:
        rid, batch, data = self.wire.pop(0)
        if fail_retriably:
            code = KafkaStorageError.code
        else:
            code = self.partitions[batch.partition].produce(batch, data)
        offset = len(self.partitions[batch.partition].log) - 1 if code == 0 else -1
        fields = [offset, -1] if code == 0 else []
        finished: list = []
        self.sender.received([Response(Api.PRODUCE, rid, code, None, fields)], self.now,
                             finished)
        self.finish(finished)

    def lose_connection(self, applied: int) -> None:
        for _, batch, data in self.wire[:applied]:
            self.partitions[batch.partition].produce(batch, data)   # replies lost
        self.wire.clear()
        finished: list = []
        self.sender.connection_lost(BrokerUnavailableError("gone"), self.now, finished)
        self.finish(finished)


steps = st.lists(st.one_of(
    st.tuples(st.just("close"), st.integers(0, PARTITIONS - 1)),
    st.tuples(st.just("answer"), st.booleans()),
    st.tuples(st.just("lose"), st.integers(0, 5)),
    st.tuples(st.just("tick"), st.just(0))), min_size=10, max_size=80)


@settings(max_examples=300, deadline=None)
@given(steps, st.integers(1, 5))
def test_every_batch_lands_exactly_once_in_order(script, max_in_flight):
    world = World(max_in_flight)
    for action, arg in script:
        if action == "close":
            world.close_batch(arg)
        elif action == "answer" and world.wire:
            world.answer(fail_retriably=arg)
        elif action == "lose":
            world.lose_connection(arg)
        elif action == "tick":
            world.now += 0.5                      # past some backoffs (0.01 s doubling)
        world.pump()                              # as the driver does after every event
    for _ in range(10_000):                       # drain: every reply a good one
        if not world.sender.incomplete:
            break
        world.now += 1.0
        world.pump()
        while world.wire:
            world.answer(fail_retriably=False)
    assert not world.sender.incomplete
    for batch in world.batches:
        assert world.outcomes.get(batch) == [None], f"batch {batch.seq}: {world.outcomes}"
    for p, partition in enumerate(world.partitions):
        assert [b.seq for b in partition.log] == \
            [b.seq for b in world.batches if b.partition == p]
