"""The open-file budget (``mq.broker.fd_budget``): pure arithmetic, no process touched."""

from __future__ import annotations

import pytest

from mq.broker.fd_budget import CONNECTION_FDS, FDS_PER_PARTITION, RESERVED_FDS, FdBudget
from mq.errors import FileLimitError, InvalidPartitionsError

KEPT = RESERVED_FDS + CONNECTION_FDS


def test_needed_counts_partitions_and_the_reserve():
    assert FdBudget.needed(0) == KEPT
    assert FdBudget.needed(2000) == KEPT + 2000 * FDS_PER_PARTITION
    assert FDS_PER_PARTITION == 4          # 3 held by the active segment, 1 while fsynced


def test_room_is_what_is_left_after_the_reserve():
    assert FdBudget(KEPT + 10 * FDS_PER_PARTITION).room(0) == 10
    assert FdBudget(KEPT + 10 * FDS_PER_PARTITION + FDS_PER_PARTITION - 1).room(3) == 7
    assert FdBudget(256).room(0) < 0
    assert FdBudget(None).room(10 ** 9) is None


def test_a_start_that_fits_passes_and_one_that_does_not_names_the_numbers():
    FdBudget(FdBudget.needed(100)).check_start(100)
    FdBudget(None).check_start(10 ** 9)
    with pytest.raises(FileLimitError) as err:
        FdBudget(1024).check_start(300)
    message = str(err.value)
    assert "\n" not in message
    assert "1024" in message and str(FdBudget.needed(300)) in message
    assert "300 partitions" in message
    assert "ulimit -n" in message and "LimitNOFILE=" in message


def test_a_topic_change_past_the_budget_is_refused_with_the_room_left():
    budget = FdBudget(FdBudget.needed(50))
    budget.check_create(40, 10)                   # exactly the limit
    with pytest.raises(InvalidPartitionsError) as err:
        budget.check_create(40, 11)
    message = str(err.value)
    assert "\n" not in message
    assert str(FdBudget.needed(51)) in message and str(budget.limit) in message
    assert "room for 10 more" in message
    assert "ulimit -n" in message
    with pytest.raises(InvalidPartitionsError, match="room for 0 more"):
        FdBudget(100).check_create(0, 1)          # below the reserve already: no room
    FdBudget(None).check_create(10 ** 6, 10 ** 6)
