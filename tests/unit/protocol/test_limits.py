"""The limits both ends of the protocol check: partition counts, offsets and socket path
lengths."""

from __future__ import annotations

import pytest

from mq.errors import InvalidPartitionsError
from mq.protocol.limits import (
    MAX_OFFSET,
    MAX_PARTITIONS_PER_TOPIC,
    check_offset,
    check_partition_count,
)
from mq.protocol.paths import MAX_SOCKET_PATH_BYTES, check_socket_path


@pytest.mark.parametrize("count", [1, 7, MAX_PARTITIONS_PER_TOPIC])
def test_counts_a_topic_may_have_pass(count):
    assert check_partition_count(count) == count


@pytest.mark.parametrize("count", [0, -1, MAX_PARTITIONS_PER_TOPIC + 1, 999_999, 10 ** 23])
def test_a_count_out_of_range_names_it_and_the_limit(count):
    with pytest.raises(InvalidPartitionsError,
                       match=f"a topic has 1 to 10000 partitions, got {count}$"):
        check_partition_count(count)


@pytest.mark.parametrize("count", [1.5, "3", True, None])
def test_a_count_must_be_an_integer(count):
    with pytest.raises(InvalidPartitionsError, match="must be an integer"):
        check_partition_count(count)


def test_a_count_only_grows():
    assert check_partition_count(4, current=3, topic="t") == 4
    with pytest.raises(InvalidPartitionsError,
                       match="topic 't' has 3 partitions and partitions can only be added: "
                             "the new total must be 4 to 10000, got 3"):
        check_partition_count(3, current=3, topic="t")
    with pytest.raises(InvalidPartitionsError, match="has 1 partition and"):
        check_partition_count(1, current=1, topic="t")


def test_a_socket_path_longer_than_sun_path_names_its_length():
    fits = "/" + "s" * (MAX_SOCKET_PATH_BYTES - 1)
    assert check_socket_path(fits) == fits
    with pytest.raises(ValueError, match=f"is 108 bytes, more than the 107 a Unix socket "
                                         f"path can have"):
        check_socket_path(fits + "s")
    with pytest.raises(ValueError, match="is 108 bytes"):      # bytes, not characters
        check_socket_path("/" + "é" * 53 + "s")


def test_an_offset_is_a_64_bit_integer_from_0():
    assert check_offset(0) == 0 and check_offset(MAX_OFFSET) == MAX_OFFSET
    for bad in (-1, MAX_OFFSET + 1, 10 ** 23):
        with pytest.raises(ValueError, match=rf"^the offset of t-0 must be 0 to "
                                             rf"9223372036854775807 \(Kafka's int64\), "
                                             rf"got {bad}$"):
            check_offset(bad, "the offset of t-0")
    for bad in (1.0, "3", True, None):
        with pytest.raises(ValueError, match="^offset must be an integer"):
            check_offset(bad)
