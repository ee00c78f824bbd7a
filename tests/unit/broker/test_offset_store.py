"""Committed offsets in __consumer_offsets: Kafka's record formats, replay, tombstones, expiry."""

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mq.broker.offsets import (CommittedOffset, OffsetStore, decode_group_key, decode_key,
                               decode_value, encode_assignment_key, encode_group_key,
                               encode_group_value, encode_key, encode_value, java_string_hash,
                               partition_for_group)
from mq.log.log import PartitionLog


def test_java_string_hash_matches_java():
    # Printed by Java 17's String.hashCode (UTF-16 code units, so a surrogate pair counts twice)
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("consumer-group") == -1738392088
    assert java_string_hash("é") == 233
    assert java_string_hash("\U0001F600x") == 54959989


def test_coordinator_partition_is_kafkas_formula():
    assert partition_for_group("hello", 50) == 99162322 % 50
    assert partition_for_group("consumer-group", 50) == 1738392088 % 50
    assert partition_for_group("anything", 1) == 0


def test_key_and_value_layout_is_kafkas():
    key = encode_key("g", "t", 3)
    assert key == b"\x00\x01" + b"\x00\x01g" + b"\x00\x01t" + b"\x00\x00\x00\x03"
    value = encode_value(CommittedOffset(42, 7, "meta", 1000))
    assert value[:2] == b"\x00\x03"
    assert value == (b"\x00\x03" + (42).to_bytes(8, "big") + (7).to_bytes(4, "big")
                     + b"\x00\x04meta" + (1000).to_bytes(8, "big"))


@given(group=st.text(max_size=50), topic=st.text(min_size=1, max_size=50),
       partition=st.integers(0, 2**31 - 1), offset=st.integers(-1, 2**63 - 1),
       epoch=st.integers(-1, 2**31 - 1), metadata=st.text(max_size=100),
       ts=st.integers(-1, 2**62))
def test_round_trip(group, topic, partition, offset, epoch, metadata, ts):
    assert decode_key(encode_key(group, topic, partition)) == (group, topic, partition)
    value = CommittedOffset(offset, epoch, metadata, ts)
    assert decode_value(encode_value(value)) == value


def test_group_metadata_keys_are_ignored():
    assert decode_key(b"\x00\x02\x00\x01g") is None


@pytest.mark.parametrize("data", [b"\x00\x01\x00\x05ab", b"\x00\x01\x00\x01g\x00\x01t\x00",
                                  b"\x00\x01\x00\x01g\x00\x01t\x00\x00\x00\x01extra"])
def test_malformed_keys_raise_value_error(data):
    with pytest.raises(Exception) as info:
        decode_key(data)
    assert isinstance(info.value, (ValueError, __import__("struct").error))


def open_store(tmp_path, partitions=3):
    logs = [PartitionLog.open(os.path.join(tmp_path, f"__consumer_offsets-{p}"))
            for p in range(partitions)]
    return OffsetStore(logs), logs


def test_commits_survive_a_replay_and_tombstones_delete(tmp_path):
    store, logs = open_store(tmp_path)
    store.commit("g1", [("t", 0, CommittedOffset(10, -1, "", 1)),
                        ("t", 1, CommittedOffset(20, -1, "", 1))], now_ms=1)
    store.commit("g1", [("t", 0, CommittedOffset(11, -1, "x", 2))], now_ms=2)
    store.commit("g2", [("t", 0, CommittedOffset(5, -1, "", 3))], now_ms=3)
    store.delete("g2")
    for plog in logs:
        plog.close()
    store, logs = open_store(tmp_path)
    assert store.committed("g1", "t", 0) == CommittedOffset(11, -1, "x", 2)
    assert store.committed("g1", "t", 1).offset == 20
    assert store.committed("g2", "t", 0) is None
    assert list(store.groups()) == ["g1"]
    for plog in logs:
        plog.close()


def test_a_commit_is_one_batch_in_the_groups_partition(tmp_path):
    store, logs = open_store(tmp_path)
    plog = store.commit("g1", [("t", p, CommittedOffset(p)) for p in range(5)], now_ms=1)
    assert plog is logs[partition_for_group("g1", 3)]
    assert len(list(plog.batches())) == 1
    for plog in logs:
        plog.close()


def test_expiry_only_for_empty_groups_past_retention(tmp_path):
    store, logs = open_store(tmp_path, partitions=1)
    store.commit("old", [("t", 0, CommittedOffset(1, commit_timestamp_ms=1000))], now_ms=1000)
    store.commit("live", [("t", 0, CommittedOffset(1, commit_timestamp_ms=1000))], now_ms=1000)
    store.commit("new", [("t", 0, CommittedOffset(1, commit_timestamp_ms=9000))], now_ms=9000)
    expired = store.expired(now_ms=10_000, retention_ms=5000, is_empty=lambda g: g != "live")
    assert expired == ["old"]
    logs[0].close()


def test_group_record_layout_is_kafkas_consumer_group_metadata():
    assert encode_group_key("g") == b"\x00\x03\x00\x01g"
    # version 0, epoch 7, no tagged fields (the value is flexible: Kafka cannot read it without)
    assert encode_group_value(7) == b"\x00\x00\x00\x00\x00\x07\x00"
    assert decode_group_key(b"\x00\x03\x00\x01g") == "g"
    assert decode_group_key(encode_key("g", "t", 0)) is None
    assert encode_assignment_key("g") == b"\x00\x06\x00\x01g"


def test_a_group_lives_and_is_deleted_as_kafka_records_one(tmp_path):
    """The group record (3) while the group exists, the target assignment (6) while it has
    members; deletion tombstones the assignment, then the group, in one batch (Kafka's
    coordinator loads a group's tombstone only after the other)."""
    store, logs = open_store(tmp_path, partitions=1)

    def last_batch() -> list:
        *_, batch = logs[0].batches()
        return [(bytes(r.key), None if r.value is None else bytes(r.value))
                for r in batch.records()]
    store.mark_group("g", True, 1, now_ms=1)
    assert last_batch() == [(encode_group_key("g"), encode_group_value(1)),
                            (encode_assignment_key("g"), encode_group_value(1))]
    store.mark_group("g", False, 1, now_ms=2)            # the last member left
    assert last_batch() == [(encode_assignment_key("g"), None)]
    store.mark_group("g", True, 2, now_ms=3)             # back: the group record stands
    assert last_batch() == [(encode_assignment_key("g"), encode_group_value(2))]
    store.mark_group("g", False, 2, now_ms=4)
    store.commit("g", [("t", 0, CommittedOffset(5))], now_ms=5)
    logs[0].close()
    store, logs = open_store(tmp_path, partitions=1)
    assert (store.known_groups, store.live_groups) == ({"g"}, set())
    assert store.expired(10, 1000, lambda g: True) == []
    assert store.expired(10_000, 1000, lambda g: True) == ["g"]
    store.delete("g", now_ms=6)
    assert last_batch() == [(encode_key("g", "t", 0), None),
                            (encode_assignment_key("g"), None), (encode_group_key("g"), None)]
    logs[0].close()
    store, logs = open_store(tmp_path, partitions=1)
    assert (store.known_groups, store.live_groups, store.offsets) == (set(), set(), {})
    logs[0].close()


def test_a_group_without_offsets_expires_once_empty(tmp_path):
    store, logs = open_store(tmp_path, partitions=1)
    store.mark_group("g", True, 1, now_ms=1)
    assert store.expired(10_000, 1000, lambda g: False) == []     # members: kept
    store.mark_group("g", False, 1, now_ms=2)
    assert store.expired(10_000, 1000, lambda g: True) == ["g"]
    logs[0].close()


def test_group_records_replay_and_are_written_only_on_change(tmp_path):
    store, logs = open_store(tmp_path)
    assert store.mark_group("a", True, 1, now_ms=1) is logs[partition_for_group("a", 3)]
    assert store.mark_group("a", True, 2, now_ms=2) is None          # unchanged: no write
    store.mark_group("b", True, 1, now_ms=3)
    store.mark_group("b", False, 1, now_ms=4)                          # tombstone
    store.commit("a", [("t", 0, CommittedOffset(3))], now_ms=5)
    for plog in logs:
        plog.close()
    store, logs = open_store(tmp_path)
    assert store.live_groups == {"a"} and store.known_groups == {"a", "b"}
    assert store.committed("a", "t", 0).offset == 3
    assert sum(len(list(plog.batches())) for plog in logs) == 4
    for plog in logs:
        plog.close()


def test_transactional_offsets_wait_for_their_marker_across_a_replay(tmp_path):
    store, logs = open_store(tmp_path)
    store.commit("g1", [("t", 0, CommittedOffset(1))], now_ms=1)
    plog = store.commit("g1", [("t", 0, CommittedOffset(7)), ("t", 1, CommittedOffset(8))],
                        now_ms=2, producer_id=5, producer_epoch=0)
    store.commit("g1", [("t", 0, CommittedOffset(9))], now_ms=3, producer_id=5,
                 producer_epoch=0)
    store.commit("g2", [("t", 0, CommittedOffset(3))], now_ms=3, producer_id=6,
                 producer_epoch=0)
    assert store.committed("g1", "t", 0).offset == 1
    assert store.pending_partitions("g1") == {("t", 0), ("t", 1)}
    for log in logs:
        log.close()
    store, logs = open_store(tmp_path)
    assert store.committed("g1", "t", 0).offset == 1
    assert store.pending_partitions("g1") == {("t", 0), ("t", 1)}
    assert store.pending_partitions("g2") == {("t", 0)}
    logs[plog.partition].append_marker(5, 0, commit=True)
    store.end_transaction(plog.partition, 5, commit=True)
    assert store.committed("g1", "t", 0).offset == 9
    assert store.committed("g1", "t", 1).offset == 8
    assert store.pending_partitions("g1") == set()
    g2_partition = store.log_for("g2").partition
    logs[g2_partition].append_marker(6, 0, commit=False)
    store.end_transaction(g2_partition, 6, commit=False)
    assert store.committed("g2", "t", 0) is None and not store.pending
    for log in logs:
        log.close()
    store, logs = open_store(tmp_path)
    assert store.committed("g1", "t", 0).offset == 9 and store.committed("g2", "t", 0) is None
    assert not store.pending_partitions("g1") and not store.pending_partitions("g2")
    for log in logs:
        log.close()
