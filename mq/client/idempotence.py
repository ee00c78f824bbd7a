"""The idempotent producer's own state: its producer id and epoch, and the next sequence number
of each partition (pure; the producer's sender calls it under the producer's lock).

How idempotence works (Kafka's KIP-98; the partition's half is ``mq/log/producer_state.py``):
each batch carries (producer id, epoch, base sequence); a partition appends a batch only when
its base sequence follows the last sequence that producer wrote there, and answers a batch it
already holds (one of that producer's last 5 there) with the offsets it got the first time,
appending nothing. A batch re-sent after a lost reply or a broker restart is therefore never
written twice, provided that

- a batch's sequences are assigned once, when it is sealed (built), and its bytes never change
  afterwards: retries and reconnect re-sends send the very same batch;
- at most 5 batches per partition are unacknowledged at once (``max_in_flight <= 5``): the
  partition remembers the last 5;
- a partition's batches reach it in sequence order: one connection, and a partition whose
  batch is being retried sends nothing else until it is acknowledged (``sender.py``).

Sequence arithmetic wraps as Kafka's ``DefaultRecordBatch.incrementSequence``: after
2^31 - 1 comes 0. A producer id with a new epoch starts every partition at 0 again.

When idempotence is on (``resolve_idempotence``, Kafka 3.x's rules): ``enable_idempotence``
defaults to on when ``acks="all"`` and ``max_in_flight <= 5`` and to off otherwise; asking for
it explicitly with ``acks`` 0/1 or ``max_in_flight > 5`` is a ``ValueError``; a
``transactional_id`` implies it.
"""

from __future__ import annotations

from typing import Final

__all__ = ["INT32_MAX", "MAX_IN_FLIGHT_IDEMPOTENT", "NO_PRODUCER_ID", "ProducerIdentity",
           "increment_sequence", "resolve_idempotence"]

INT32_MAX: Final = (1 << 31) - 1
NO_PRODUCER_ID: Final = -1
MAX_IN_FLIGHT_IDEMPOTENT: Final = 5         # the partition's window (BATCHES_TO_RETAIN)


def increment_sequence(sequence: int, increment: int) -> int:
    """``sequence + increment`` modulo 2^31 (Kafka's wrap: after 2^31 - 1 comes 0)."""
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def resolve_idempotence(enable_idempotence: bool | None, acks: int, max_in_flight: int,
                        transactional_id: str | None) -> bool:
    """Whether a producer with these settings is idempotent (``acks`` as the wire value: 0,
    1 or -1 for "all"). Raises ``ValueError`` naming the settings that conflict."""
    if transactional_id is not None:
        if not isinstance(transactional_id, str) or not transactional_id:
            raise ValueError(f"transactional_id must be a non-empty string, got "
                             f"{transactional_id!r}")
        if enable_idempotence is False:
            raise ValueError("a transactional_id needs enable_idempotence (leave it unset or "
                             "True)")
        enable_idempotence = True
        why = "transactional_id"
    else:
        why = "enable_idempotence=True"
    if enable_idempotence is None:                 # Kafka 3.2+: on unless a setting conflicts
        return acks == -1 and max_in_flight <= MAX_IN_FLIGHT_IDEMPOTENT
    if not enable_idempotence:
        return False
    if acks != -1:
        raise ValueError(f"{why} needs acks='all', got acks={acks} (an idempotent producer "
                         "must know that each batch is durable before it moves on)")
    if max_in_flight > MAX_IN_FLIGHT_IDEMPOTENT:
        raise ValueError(f"{why} allows max_in_flight up to {MAX_IN_FLIGHT_IDEMPOTENT} (the "
                         f"partition remembers a producer's last 5 batches), got "
                         f"{max_in_flight}")
    return True


class ProducerIdentity:
    """The producer id and epoch batches are sealed with, and each partition's next base
    sequence. ``producer_id`` is ``NO_PRODUCER_ID`` while none is known (before
    InitProducerId, or while a new one is being fetched): batches sealed then carry none."""

    __slots__ = ("_next", "epoch", "producer_id", "transactional")

    def __init__(self, transactional: bool = False) -> None:
        self.producer_id = NO_PRODUCER_ID
        self.epoch = -1
        self.transactional = transactional
        self._next: dict[tuple[str, int], int] = {}

    def set(self, producer_id: int, epoch: int) -> None:
        """A new producer id or epoch: every partition starts at sequence 0 again."""
        if producer_id < 0 or not 0 <= epoch <= 32767:
            raise ValueError(f"invalid producer id {producer_id} / epoch {epoch}")
        self.producer_id = producer_id
        self.epoch = epoch
        self._next.clear()

    def clear(self) -> None:
        """Forget the id (a new one is wanted); nothing can be sealed until ``set``."""
        self.producer_id = NO_PRODUCER_ID
        self.epoch = -1
        self._next.clear()

    @property
    def known(self) -> bool:
        return self.producer_id >= 0

    def assign(self, topic: str, partition: int, count: int) -> int:
        """The base sequence of a batch of ``count`` records just sealed for this partition;
        the next batch there follows it."""
        key = (topic, partition)
        base = self._next.get(key, 0)
        self._next[key] = increment_sequence(base, count)
        return base

    def next_sequence(self, topic: str, partition: int) -> int:
        return self._next.get((topic, partition), 0)

    def __repr__(self) -> str:
        return f"<ProducerIdentity id={self.producer_id} epoch={self.epoch}>"
