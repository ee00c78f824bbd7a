"""``.txnindex`` (``mq.log.txnindex``): Kafka's 34-byte entries, created by the first abort,
the read_committed query, truncation and validation."""

from __future__ import annotations

import errno
import struct

import pytest

from mq.errors import CorruptIndexError
from mq.log import diskio
from mq.log.diskio import Fault, FaultyDiskIO
from mq.log.txnindex import ENTRY_SIZE, AbortedTxn, TransactionIndex, read_entries


def test_entries_are_kafkas_34_bytes_and_the_file_appears_with_the_first(tmp_path):
    path = str(tmp_path / "00000000000000000000.txnindex")
    index = TransactionIndex(path)
    assert not (tmp_path / "00000000000000000000.txnindex").exists()
    index.append(AbortedTxn(7, 10, 15, 16))
    index.append(AbortedTxn(8, 12, 20, 21))
    index.close()
    data = (tmp_path / "00000000000000000000.txnindex").read_bytes()
    assert ENTRY_SIZE == 34 and len(data) == 68
    assert struct.unpack_from(">hqqqq", data) == (0, 7, 10, 15, 16)
    assert read_entries(path) == TransactionIndex(path).entries == [
        AbortedTxn(7, 10, 15, 16), AbortedTxn(8, 12, 20, 21)]
    assert read_entries(str(tmp_path / "missing.txnindex")) == []


def test_collect_for_a_fetch_range_and_the_stop_rule(tmp_path):
    index = TransactionIndex(str(tmp_path / "t.txnindex"))
    for txn in (AbortedTxn(1, 0, 5, 6), AbortedTxn(2, 3, 9, 4), AbortedTxn(3, 10, 12, 30)):
        index.append(txn)
    found, stop = index.collect(6, 11)
    assert [t.producer_id for t in found] == [2, 3] and stop      # 3's LSO 30 >= 11
    found, stop = index.collect(0, 3)
    assert [t.producer_id for t in found] == [1] and stop is True  # 1's LSO 6 >= 3
    found, stop = index.collect(13, 40)
    assert found == [] and not stop


def test_truncate_and_order(tmp_path):
    index = TransactionIndex(str(tmp_path / "t.txnindex"))
    index.append(AbortedTxn(1, 0, 5, 6))
    index.append(AbortedTxn(2, 6, 8, 9))
    with pytest.raises(ValueError, match="does not follow"):
        index.append(AbortedTxn(3, 1, 8, 9))
    index.truncate(8)
    assert index.entries == [AbortedTxn(1, 0, 5, 6)]
    assert (tmp_path / "t.txnindex").stat().st_size == ENTRY_SIZE
    index.validate(0, 6)
    with pytest.raises(CorruptIndexError, match="outside the segment"):
        index.validate(6, 10)
    (tmp_path / "bad.txnindex").write_bytes(struct.pack(">hqqqq", 1, 1, 0, 5, 6))
    with pytest.raises(CorruptIndexError, match="version 1"):
        read_entries(str(tmp_path / "bad.txnindex"))


def test_a_failed_write_keeps_the_count_and_the_next_entry_overwrites_it(tmp_path):
    seam = FaultyDiskIO()
    with diskio.installed(seam):
        index = TransactionIndex(str(tmp_path / "t.txnindex"))
        index.append(AbortedTxn(1, 0, 5, 6))
        seam.add(Fault(errno.ENOSPC, ops=frozenset({"pwrite"}), short=0.5))
        seam.add(Fault(errno.ENOSPC, ops=frozenset({"pwrite"})))
        with pytest.raises(OSError):
            index.append(AbortedTxn(2, 6, 8, 9))
        assert len(index.entries) == 1
        index.append(AbortedTxn(3, 6, 9, 10))
        index.close()
    assert read_entries(str(tmp_path / "t.txnindex")) == [AbortedTxn(1, 0, 5, 6),
                                                          AbortedTxn(3, 6, 9, 10)]
