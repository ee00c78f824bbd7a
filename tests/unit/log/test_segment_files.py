"""``SegmentFiles`` on its own: the ``.log`` descriptor open for a call or while pinned, the
indexes opened lazily, ``dup_fd`` and ``close`` (the segment-level behaviour is in
test_open_files.py). Counted in ``/proc/self/fd``."""

from __future__ import annotations

import errno
import os

import pytest

from mq.log import files
from mq.log.segment_files import SegmentFiles
from test_open_files import held


@pytest.fixture
def seg_files(tmp_path):
    def path(kind: str) -> str:
        return str(tmp_path / files.segment_name(0, kind))
    sf = SegmentFiles(path, 0, 4096, read_only=False)
    yield sf
    for index in sf.loaded_indexes():
        if index is not None:
            index.close()
    sf.close()


LOG = files.segment_name(0, files.LOG_SUFFIX)


def test_a_writable_log_is_created_and_closed_at_once(seg_files, tmp_path):
    assert (tmp_path / LOG).exists()
    assert seg_files.size_at_open == 0 and seg_files.fd < 0 and not seg_files.pinned
    assert held(tmp_path) == []


def test_in_use_opens_the_log_for_the_outermost_call_only(seg_files, tmp_path):
    with seg_files.in_use():
        with seg_files.in_use():
            assert held(tmp_path) == [LOG]
        assert held(tmp_path) == [LOG]
    assert held(tmp_path) == [] and seg_files.fd < 0


def test_pinned_files_stay_open_until_unpinned(seg_files, tmp_path):
    seg_files.pin()
    with seg_files.in_use():
        pass
    assert held(tmp_path) == [LOG]
    seg_files.unpin()
    assert held(tmp_path) == []


def test_an_untrimmed_index_keeps_the_files_open_past_the_call(seg_files, tmp_path):
    with seg_files.in_use():
        assert seg_files.existing_index(files.INDEX_SUFFIX) is None   # a read creates none
        index = seg_files.index(files.INDEX_SUFFIX)                  # preallocated
        assert seg_files.loaded(files.INDEX_SUFFIX) is index
        assert seg_files.loaded(files.LOG_SUFFIX) is None
    assert seg_files.loaded(files.INDEX_SUFFIX) is index
    with seg_files.in_use():
        index.trim_to_valid_size()
    assert seg_files.loaded_indexes() == (None, None) and held(tmp_path) == []


def test_dup_fd_is_the_callers_own(seg_files, tmp_path):
    fd = seg_files.dup_fd()                 # opened: the files are closed
    try:
        assert held(tmp_path) == [LOG]
    finally:
        os.close(fd)
    seg_files.pin()
    fd = seg_files.dup_fd()                 # a duplicate of the pinned one
    try:
        assert fd != seg_files.fd and held(tmp_path) == [LOG, LOG]
    finally:
        os.close(fd)


def test_closed_files_refuse_a_call(seg_files, tmp_path):
    seg_files.pin()
    seg_files.closed = True
    seg_files.close()
    seg_files.close()                       # idempotent
    assert held(tmp_path) == []
    with pytest.raises(OSError) as err, seg_files.in_use():
        pass
    assert err.value.errno == errno.EBADF
