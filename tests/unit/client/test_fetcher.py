"""The consumer's ``Fetcher`` without a broker: real partition logs written with
``PartitionLog`` in the test's directory, and a driver that serves their state the way the
broker publishes it (high watermark, last stable offset, readable end).

Topic "t" has partitions 0 and 1; ``T0``/``T1`` name them.
"""

from __future__ import annotations

import pytest

from mq.client.fetcher import Fetcher, Record
from mq.client.types import TopicPartition
from mq.errors import NoOffsetForPartitionError, OffsetOutOfRangeError, UnknownTopicOrPartitionError
from mq.log.log import PartitionLog
from mq.log.builder import BatchBuilder
from mq.protocol.state import PartitionState

T0, T1 = TopicPartition("t", 0), TopicPartition("t", 1)


class LogDriver:
    """What the fetcher asks of its ``ConsumerDriver``, over logs in ``data_dir``: the state is
    each log's own (the broker's high watermark is its log end)."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.generation = 1
        self.topics = {"t": {"id": "id-1", "partitions": 2, "slots": [0, 1]}}
        self.logs = {tp: PartitionLog.open(f"{data_dir}/t-{tp.partition}", now_ms=0)
                     for tp in (T0, T1)}
        self.held_back: dict[TopicPartition, int] = {}     # tp -> high watermark to publish

    def check_metadata(self, session) -> None:
        pass

    def state(self, tp: TopicPartition, session=None) -> PartitionState:
        if tp.topic not in self.topics:
            raise UnknownTopicOrPartitionError(f"unknown topic {tp.topic!r}")
        plog = self.logs[tp]
        active = plog.active_segment
        hw = self.held_back.get(tp, plog.log_end_offset)
        return PartitionState(hw, min(hw, plog.last_stable_offset), plog.log_start_offset,
                              active.base_offset, active.size, 0, plog.log_end_offset)

    def close(self) -> None:
        for plog in self.logs.values():
            plog.close()


def produce(driver: LogDriver, tp: TopicPartition, *values: bytes, pid: int = -1,
            sequence: int = -1) -> None:
    """One batch of ``values``; with ``pid``, a transactional batch at ``sequence``."""
    builder = BatchBuilder(producer_id=pid, producer_epoch=0 if pid >= 0 else -1,
                           base_sequence=sequence, is_transactional=pid >= 0)
    for v in values:
        builder.append(1_000, None, v)
    driver.logs[tp].append(builder.build(), now_ms=0)


@pytest.fixture
def driver(tmp_path):
    d = LogDriver(str(tmp_path))
    yield d
    d.close()


def fetcher_of(driver: LogDriver, **options) -> Fetcher:
    config = dict(read_committed=False, auto_offset_reset="earliest",
                  max_partition_fetch_bytes=1 << 20, check_crcs=True, value_bytes=False,
                  key_deserializer=None, value_deserializer=None)
    config.update(options)
    return Fetcher(driver, **config)


def values(out: dict, tp: TopicPartition) -> list[bytes]:
    return [bytes(r.value) for r in out.get(tp, [])]


def test_records_come_in_offset_order_up_to_the_high_watermark(driver):
    produce(driver, T0, b"a", b"b")
    produce(driver, T0, b"c")
    f = fetcher_of(driver)
    f.assign([T0])
    driver.held_back[T0] = 2
    out = f.take(None, 10, in_group=False)
    assert values(out, T0) == [b"a", b"b"]
    assert isinstance(out[T0][0], Record) and out[T0][0].offset == 0
    assert f.take(None, 10, in_group=False) == {}
    del driver.held_back[T0]
    assert values(f.take(None, 10, in_group=False), T0) == [b"c"]
    assert f.positions([T0]) == {T0: 3}
    f.close()


def test_max_records_and_fairness_between_partitions(driver):
    produce(driver, T0, *[b"0-%d" % i for i in range(5)])
    produce(driver, T1, *[b"1-%d" % i for i in range(5)])
    f = fetcher_of(driver)
    f.assign([T0, T1])
    first = f.take(None, 3, in_group=False)
    assert values(first, T0) == [b"0-0", b"0-1", b"0-2"] and T1 not in first
    second = f.take(None, 3, in_group=False)       # the partition after the one that filled
    assert values(second, T1) == [b"1-0", b"1-1", b"1-2"]
    assert f.positions([T0, T1]) == {T0: 3, T1: 3}
    f.close()


def test_paused_partitions_are_not_taken_until_resumed(driver):
    produce(driver, T0, b"a")
    produce(driver, T1, b"b")
    f = fetcher_of(driver)
    f.assign([T0, T1])
    f.pause([T0])
    assert f.paused() == {T0}
    assert values(f.take(None, 10, in_group=False), T1) == [b"b"]
    assert f.take(None, 10, in_group=False) == {}
    assert f.watched() == [(T1, 1)]                  # a wait is not for a paused partition
    f.resume([T0])
    assert f.paused() == set()
    assert values(f.take(None, 10, in_group=False), T0) == [b"a"]
    with pytest.raises(ValueError, match="not assigned"):
        f.pause([TopicPartition("t", 7)])
    f.close()


def test_a_position_is_chosen_by_auto_offset_reset(driver):
    produce(driver, T0, b"a", b"b")
    latest = fetcher_of(driver, auto_offset_reset="latest")
    latest.assign([T0])
    assert latest.take(None, 10, in_group=False) == {}
    assert latest.positions([T0]) == {T0: 2}
    latest.close()
    none = fetcher_of(driver, auto_offset_reset="none")
    none.assign([T0])
    with pytest.raises(NoOffsetForPartitionError):
        none.take(None, 10, in_group=False)
    none.cursor(T0).seek(7)
    with pytest.raises(OffsetOutOfRangeError):
        none.take(None, 10, in_group=False)
    none.close()


def test_a_held_partition_is_not_read_until_started(driver):
    produce(driver, T0, b"a", b"b", b"c")
    f = fetcher_of(driver)
    f.assign([T0, T1])
    f.hold(T0)
    assert f.held() == {T0}
    assert f.take(None, 10, in_group=False) == {}
    f.start(T0, 1)
    assert f.held() == set()
    assert values(f.take(None, 10, in_group=False), T0) == [b"b", b"c"]
    f.close()


def test_read_committed_skips_markers_and_aborted_transactions(driver):
    plog = driver.logs[T0]
    produce(driver, T0, b"plain")
    produce(driver, T0, b"aborted", pid=7, sequence=0)
    plog.append_marker(7, 0, commit=False, now_ms=0)
    produce(driver, T0, b"committed", pid=7, sequence=1)
    open_end = plog.log_end_offset
    uncommitted = fetcher_of(driver)
    uncommitted.assign([T0])
    assert values(uncommitted.take(None, 10, in_group=False), T0) == [b"plain", b"aborted",
                                                                        b"committed"]
    uncommitted.close()
    committed = fetcher_of(driver, read_committed=True)
    committed.assign([T0])
    assert values(committed.take(None, 10, in_group=False), T0) == [b"plain"]
    assert committed.positions([T0]) == {T0: open_end - 1}   # at the open transaction
    plog.append_marker(7, 0, commit=True, now_ms=0)
    assert values(committed.take(None, 10, in_group=False), T0) == [b"committed"]
    assert committed.take(None, 10, in_group=False) == {}
    assert committed.positions([T0]) == {T0: plog.log_end_offset}   # past the marker too
    committed.close()


def test_records_handed_out_but_not_yielded_are_given_back(driver):
    produce(driver, T0, b"a", b"b", b"c")
    produce(driver, T1, b"x")
    f = fetcher_of(driver)
    f.assign([T0, T1])
    out = f.take(None, 10, in_group=False)
    it = f.hand_out([r for records in out.values() for r in records])
    assert bytes(next(it).value) == b"a"
    assert f.positions([T0, T1]) == {T0: 1, T1: 0}
    f.rewind([T1])                          # T0's records stay handed out
    assert f.positions([T0, T1]) == {T0: 1, T1: 0}
    assert f.take(None, 10, in_group=False) == {T1: out[T1]}
    f.rewind()
    assert list(f.handed) == []
    assert values(f.take(None, 10, in_group=False), T0) == [b"b", b"c"]
    f.close()


def test_a_deleted_partition_raises_outside_a_group_and_is_skipped_in_one(driver):
    produce(driver, T1, b"x")
    f = fetcher_of(driver)
    f.assign([T0, T1])
    driver.topics = {}
    assert f.take(None, 10, in_group=True) == {}
    with pytest.raises(UnknownTopicOrPartitionError):
        f.take(None, 10, in_group=False)
    f.close()


def test_a_topic_created_again_is_read_from_its_new_files(driver, tmp_path):
    produce(driver, T0, b"old")
    f = fetcher_of(driver)
    f.assign([T0])
    assert values(f.take(None, 10, in_group=False), T0) == [b"old"]
    driver.logs[T0].close()
    for path in (tmp_path / "t-0").iterdir():
        path.unlink()
    driver.logs[T0] = PartitionLog.open(str(tmp_path / "t-0"), now_ms=0)
    driver.topics = {"t": {"id": "id-2", "partitions": 2, "slots": [0, 1]}}
    produce(driver, T0, b"new-0", b"new-1")
    f.cursor(T0).seek(0)
    assert values(f.take(None, 10, in_group=False), T0) == [b"new-0", b"new-1"]
    f.close()


def test_value_bytes_and_deserializers(driver):
    produce(driver, T0, b"7")
    f = fetcher_of(driver, value_deserializer=lambda v: int(bytes(v)))
    f.assign([T0])
    assert [r.value for r in f.take(None, 10, in_group=False)[T0]] == [7]
    f.close()
    g = fetcher_of(driver, value_bytes=True)
    g.assign([T0])
    assert [type(r.value) for r in g.take(None, 10, in_group=False)[T0]] == [bytes]
    g.close()
