"""The idempotent producer's pure parts: when idempotence is on, sequence arithmetic (Kafka's
wrap after 2^31 - 1, matching the partition's ``RecordBatch.last_sequence``), and the sequence
numbers a partition's batches get."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mq.client.idempotence import (
    INT32_MAX,
    NO_PRODUCER_ID,
    ProducerIdentity,
    increment_sequence,
    resolve_idempotence,
)
from mq.log.batch import RecordBatch
from mq.log.builder import BatchBuilder

ALL = -1


# --- resolve_idempotence: Kafka 3.x's rules ---------------------------------------------------

@pytest.mark.parametrize("acks, max_in_flight, expected", [
    (ALL, 5, True), (ALL, 1, True), (1, 5, False), (0, 5, False), (ALL, 6, False)])
def test_unset_means_on_unless_a_setting_conflicts(acks, max_in_flight, expected):
    assert resolve_idempotence(None, acks, max_in_flight, None) is expected


def test_explicit_off_is_off():
    assert resolve_idempotence(False, ALL, 5, None) is False
    assert resolve_idempotence(False, 1, 50, None) is False


@pytest.mark.parametrize("acks", [0, 1])
def test_explicit_on_with_acks_other_than_all_names_both(acks):
    with pytest.raises(ValueError, match=r"enable_idempotence=True.*acks='all'.*acks=" +
                       str(acks)):
        resolve_idempotence(True, acks, 5, None)


def test_explicit_on_allows_at_most_5_in_flight():
    assert resolve_idempotence(True, ALL, 5, None) is True
    with pytest.raises(ValueError, match="max_in_flight up to 5.*got 6"):
        resolve_idempotence(True, ALL, 6, None)


def test_a_transactional_id_implies_idempotence_and_its_constraints():
    assert resolve_idempotence(None, ALL, 5, "billing-1") is True
    with pytest.raises(ValueError, match="transactional_id needs acks='all'"):
        resolve_idempotence(None, 1, 5, "billing-1")
    with pytest.raises(ValueError, match="transactional_id allows max_in_flight"):
        resolve_idempotence(None, ALL, 10, "billing-1")
    with pytest.raises(ValueError, match="needs enable_idempotence"):
        resolve_idempotence(False, ALL, 5, "billing-1")
    with pytest.raises(ValueError, match="non-empty string"):
        resolve_idempotence(None, ALL, 5, "")


# --- sequence arithmetic ----------------------------------------------------------------------

def test_increment_wraps_after_int32_max():
    assert increment_sequence(0, 1) == 1
    assert increment_sequence(INT32_MAX - 1, 1) == INT32_MAX
    assert increment_sequence(INT32_MAX, 1) == 0
    assert increment_sequence(INT32_MAX - 2, 5) == 2


@given(st.one_of(st.integers(0, INT32_MAX), st.integers(INT32_MAX - 60, INT32_MAX)),
       st.integers(1, 50))
def test_the_next_base_follows_the_last_sequence_the_partition_computes(base, count):
    """The partition checks ``next base == batch.last_sequence + 1`` (mod 2^31): the producer's
    arithmetic must agree with the batch header's for every base, wrapped or not."""
    builder = BatchBuilder(producer_id=7, producer_epoch=0, base_sequence=base)
    for i in range(count):
        builder.append(i, None, b"v")
    n = len(builder)
    batch = RecordBatch(builder.build())
    assert batch.last_sequence == (base + n - 1) % (INT32_MAX + 1)
    assert increment_sequence(base, n) == (batch.last_sequence + 1) % (INT32_MAX + 1)


# --- ProducerIdentity -------------------------------------------------------------------------

def test_consecutive_base_sequences_per_partition():
    ids = ProducerIdentity()
    assert not ids.known and ids.producer_id == NO_PRODUCER_ID
    ids.set(42, 0)
    assert ids.known
    assert ids.assign("t", 0, 10) == 0
    assert ids.assign("t", 0, 5) == 10
    assert ids.assign("t", 1, 3) == 0             # each partition has its own
    assert ids.assign("u", 0, 1) == 0
    assert ids.assign("t", 0, 1) == 15
    assert ids.next_sequence("t", 0) == 16 and ids.next_sequence("t", 1) == 3


def test_a_new_id_or_epoch_starts_every_partition_at_zero():
    ids = ProducerIdentity(transactional=True)
    ids.set(42, 0)
    ids.assign("t", 0, 10)
    ids.set(42, 1)                                # an epoch bump
    assert ids.assign("t", 0, 1) == 0
    ids.clear()
    assert not ids.known and ids.epoch == -1
    ids.set(43, 0)
    assert ids.next_sequence("t", 0) == 0


def test_sequences_wrap_per_partition():
    ids = ProducerIdentity()
    ids.set(1, 0)
    ids._next[("t", 0)] = INT32_MAX - 1
    assert ids.assign("t", 0, 3) == INT32_MAX - 1
    assert ids.assign("t", 0, 1) == 1


@pytest.mark.parametrize("pid, epoch", [(-1, 0), (5, -1), (5, 32768)])
def test_invalid_ids_are_refused(pid, epoch):
    with pytest.raises(ValueError):
        ProducerIdentity().set(pid, epoch)
