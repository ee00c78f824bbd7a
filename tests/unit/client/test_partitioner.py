"""Kafka's partitioner: murmur2 against the Java client's published vectors and kafka-python's
implementation, ``to_positive``, keyed placement, stickiness and round-robin."""

from __future__ import annotations

import random
import warnings
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mq.client.partitioner import (DefaultPartitioner, RoundRobinPartitioner, keyed_partition,
                                   murmur2, to_positive)

with warnings.catch_warnings():
    # importing the kafka package loads protocol schemas through a deprecated importlib API
    warnings.simplefilter("ignore", DeprecationWarning)
    try:
        from kafka.partitioner.default import murmur2 as kafka_murmur2
    except ImportError:                               # older kafka-python layouts
        try:
            from kafka.partitioner import murmur2 as kafka_murmur2
        except ImportError:
            kafka_murmur2 = None


# Kafka's UtilsTest.testMurmur2 (signed int32 results).
JAVA_VECTORS = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"abc", 479470107),
]

# kafka-python's test_murmur2_java_compatibility: partition of each key among 1000.
PARTITION_VECTORS = [
    (b"", 681), (b"a", 524), (b"ab", 434), (b"abc", 107), (b"123456789", 566),
    (b"\x00 ", 742),
]


@pytest.mark.parametrize(("data", "expected"), JAVA_VECTORS)
def test_murmur2_matches_kafka_java(data, expected):
    assert murmur2(data) == expected


@pytest.mark.parametrize(("data", "expected"), PARTITION_VECTORS)
def test_keyed_partition_matches_kafka_among_1000(data, expected):
    assert keyed_partition(data, 1000) == expected
    assert to_positive(murmur2(data)) % 1000 == expected
    assert DefaultPartitioner().partition("t", data, list(range(1000)), []) == expected


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_murmur2_accepts_any_bytes_like(kind):
    for data, expected in JAVA_VECTORS:
        assert murmur2(kind(data)) == expected


def test_murmur2_every_tail_length():
    # 0..3 tail bytes and 0..2 whole words: every branch of the algorithm.
    data = bytes(range(1, 12))
    results = {murmur2(data[:n]) for n in range(len(data))}
    assert len(results) == len(data)
    assert all(-2**31 <= h < 2**31 for h in results)


def test_to_positive_clears_the_sign_bit_like_java():
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-2**31) == 0                   # not abs(): Java's abs overflows here
    assert to_positive(0) == 0
    assert to_positive(2**31 - 1) == 2**31 - 1
    assert to_positive(-973932308) == -973932308 & 0x7FFFFFFF


@pytest.mark.skipif(kafka_murmur2 is None, reason="kafka-python is not installed")
@given(st.binary(max_size=300))
def test_murmur2_agrees_with_kafka_python(data):
    # kafka-python returns the unsigned 32-bit value; ours is Java's signed int32.
    ours = murmur2(data)
    assert -2**31 <= ours < 2**31
    assert ours & 0xFFFFFFFF == kafka_murmur2(data)
    assert to_positive(ours) == kafka_murmur2(data) & 0x7FFFFFFF


def test_keyed_records_use_all_partitions_not_just_available():
    p = DefaultPartitioner()
    key = b"order-42"
    expected = to_positive(murmur2(key)) % 8
    assert p.partition("t", key, list(range(8)), [expected ^ 1]) == expected


def test_null_keys_stick_until_the_batch_closes():
    p = DefaultPartitioner(random.Random(7))
    parts = list(range(6))
    first = p.partition("t", None, parts, parts)
    assert all(p.partition("t", None, parts, parts) == first for _ in range(100))
    p.on_batch_closed("t", (first + 1) % 6, parts, parts)   # another partition's batch
    assert p.partition("t", None, parts, parts) == first
    p.on_batch_closed("t", first, parts, parts)
    second = p.partition("t", None, parts, parts)
    assert second != first
    # Per topic: another topic's stickiness is independent.
    other = p.partition("u", None, parts, parts)
    p.on_batch_closed("u", other, parts, parts)
    assert p.partition("t", None, parts, parts) == second


def test_sticky_switching_spreads_over_partitions():
    p = DefaultPartitioner(random.Random(1))
    parts = list(range(4))
    seen = Counter()
    for _ in range(400):
        chosen = p.partition("t", None, parts, parts)
        seen[chosen] += 1
        p.on_batch_closed("t", chosen, parts, parts)
    assert set(seen) == set(parts)
    assert min(seen.values()) > 50


def test_sticky_with_one_partition():
    p = DefaultPartitioner()
    for _ in range(3):
        assert p.partition("t", None, [0], [0]) == 0
        p.on_batch_closed("t", 0, [0], [0])
        assert p.sticky == {"t": 0}           # kept: no random draw at every batch


def test_the_only_partition_left_of_several_is_drawn_again():
    p = DefaultPartitioner(random.Random(5))
    assert p.partition("t", None, [0, 1], [1]) == 1
    p.on_batch_closed("t", 1, [0, 1], [1])
    assert p.partition("t", None, [0, 1], [1]) == 1
    p.on_batch_closed("t", 1, [0, 1], [0])    # its batch closed; only 0 available now
    assert p.partition("t", None, [0, 1], [0]) == 0


def test_sticky_prefers_available_partitions():
    p = DefaultPartitioner(random.Random(3))
    for _ in range(50):
        chosen = p.partition("t", None, list(range(10)), [3, 7])
        assert chosen in (3, 7)
        p.on_batch_closed("t", chosen, list(range(10)), [3, 7])


def test_round_robin_cycles_through_partitions_even_for_keys():
    p = RoundRobinPartitioner()
    parts = list(range(3))
    assert [p.partition("t", b"same", parts, parts) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert p("u", None, parts, parts) == 0          # callable, per topic
