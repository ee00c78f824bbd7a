"""``mq top``'s drawing and loop parts without a broker: the rich frame fits the width it is
given (80 columns included), the plain tables carry no escape codes, keystrokes come from a
pseudo-terminal in cbreak mode and the terminal's mode is put back, and the command's
argument checks and ``--once`` output from fixed snapshots (``Source.snapshot`` replaced)."""

from __future__ import annotations

import io
import json
import os
import termios
import time

import pytest
from rich.console import Console
from top_snapshots import fsync, group, offset, partition, snapshot

from mq.cli import top
from mq.cli.main import main
from mq.cli.top_model import build_view

LONG_TOPIC = "clickstream-events-from-the-web-frontend-and-mobile-apps-2024"
LONG_GROUP = "analytics-sessionizer-with-a-name-longer-than-any-terminal-wants"


def busy_pair():
    """Two snapshots a second apart with long names, big numbers and an internal topic."""
    def parts(k):
        return [partition(LONG_TOPIC, p, 123_456_789 * k, 9_876_543_210 * k, size=7 << 30)
                for p in range(12)] + [partition("orders", 0, 1000 * k, size=1 << 20),
                                       partition("__consumer_offsets", 0, 4, internal=True)]

    def groups(k):
        return [group(LONG_GROUP, [offset(LONG_TOPIC, p, 100_000_000 * k, 123_456_789 * k,
                                          lag_ms=86_400_000) for p in range(12)],
                      members=128, state="Reconciling"),
                group("billing", [offset("orders", 0, 900 * k, 1000 * k, lag_ms=1500)])]

    before = snapshot(0, parts(1), groups(1), fsync([5, 0, 0, 0, 0], 0.001))
    after = snapshot(1_000, parts(2), groups(2), fsync([500, 20, 3, 1, 0], 0.9))
    return before, after


def draw(view, width, error=None) -> list[str]:
    console = Console(width=width, file=io.StringIO(), force_terminal=False, color_system=None)
    console.print(top.render(view, 1.0, error))
    return console.file.getvalue().splitlines()


@pytest.mark.parametrize("width", [80, 100, 132, 60])
def test_the_frame_fits_its_width(width):
    before, after = busy_pair()
    lines = draw(build_view(after, before), width)
    assert all(len(line) <= width for line in lines), "\n".join(lines)
    text = "\n".join(lines)
    assert "__consumer_offsets" not in text
    if width >= 80:                                     # narrower: headers are cut too
        assert "TOPIC" in text and "GROUP" in text and "orders" in text and "billing" in text
        assert "1 internal topic(s) hidden (--all)" in text


def test_at_80_columns_names_give_way_and_numbers_stay_whole():
    before, after = busy_pair()
    view = build_view(after, before)
    lines = draw(view, 80)
    row = next(line for line in lines if line.startswith("clickstream"))
    assert "…" in row                                   # the name is cut
    assert row.split()[1:] == ["12", "84.0GiB", "3.0G", "1.5G", "118518.52", "1.2G"]
    billing = next(line for line in lines if line.startswith("billing"))
    assert billing.split() == ["billing", "Stable", "1", "200", "1.5s", "900", "orders"]
    member_row = next(line for line in lines if line.startswith("analytics"))
    assert "Reconciling" in member_row and "1d00h" in member_row


def test_an_unreachable_broker_is_a_line_over_the_last_tables():
    view = build_view(snapshot(partitions=[partition("orders", 0, 5)]))
    lines = draw(view, 80, "no broker at /tmp/x/mq.sock (Connection refused)")
    assert lines[0].startswith("broker unreachable, retrying: no broker at /tmp/x/mq.sock")
    assert any(line.startswith("orders") for line in lines)


def test_plain_tables_have_no_escape_codes_and_split_on_spaces():
    before, after = busy_pair()
    text = top.plain(build_view(after, before, show_internal=True))
    assert "\x1b" not in text and "─" not in text
    blocks = text.split("\n\n")
    assert len(blocks) == 3
    assert blocks[0].splitlines() == [
        "broker pid 42  up 1.0s  connections 3  fsync 519/s mean 1.7ms p99 9.5ms",
        "cleaner 2 passes, 0 failed, 2.0KiB read  data /var/lib/mq"]
    topics = [line.split() for line in blocks[1].splitlines()]
    assert topics[0] == ["TOPIC", "PARTS", "SIZE", "RECORDS", "IN-REC/S", "IN-MB/S",
                         "OUT-REC/S"]
    assert [row[0] for row in topics[1:]] == ["__consumer_offsets", LONG_TOPIC, "orders"]
    assert all(len(row) == 7 for row in topics)
    groups = [line.split() for line in blocks[2].splitlines()]
    assert groups[0] == ["GROUP", "STATE", "MEMBERS", "LAG", "LAG-AGE", "OUT-REC/S", "TOPICS"]
    assert groups[1] == ["analytics-sessionizer-with-a-name-longer-than-any-terminal-wants",
                         "Reconciling", "128", str(12 * 23_456_789 * 2), "1d00h", "1.2G",
                         LONG_TOPIC]


# --- keys -------------------------------------------------------------------------------------

def test_keys_read_q_from_a_terminal_and_put_its_mode_back():
    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "rb", buffering=0, closefd=False) as stream:
            before = termios.tcgetattr(slave)
            with top.Keys(stream) as keys:
                assert not termios.tcgetattr(slave)[3] & termios.ICANON    # cbreak
                assert keys.wait_quit(time.monotonic() + 0.01) is False
                os.write(master, b"x")                 # any other key: keep waiting
                assert keys.wait_quit(time.monotonic() + 0.05) is False
                os.write(master, b"q")
                started = time.monotonic()
                assert keys.wait_quit(started + 30) is True
                assert time.monotonic() - started < 10
            assert termios.tcgetattr(slave) == before
    finally:
        os.close(master)
        os.close(slave)


def test_keys_without_a_terminal_just_wait():
    r, w = os.pipe()
    try:
        with os.fdopen(r, "rb", closefd=False) as stream, top.Keys(stream) as keys:
            started = time.monotonic()
            assert keys.wait_quit(started + 0.05) is False
            assert time.monotonic() - started >= 0.05
    finally:
        os.close(r)
        os.close(w)


# --- the command ------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["top", "--json"], "--json needs --once"),
    (["top", "--interval", "0"], "the live view needs an --interval above 0"),
    (["top", "--once", "--interval", "-1"], "must be 0 to 86400 seconds (a day), got -1"),
    (["top", "--once", "--interval", "nan"], "must be 0 to 86400 seconds (a day), got nan"),
    (["top", "--once", "--interval", "1e300"], "argument --interval: must be 0 to 86400 "
                                               "seconds (a day), got 1e300"),
    (["top", "--once", "--interval", "soon"], "invalid number of seconds 'soon'"),
])
def test_bad_arguments_are_one_line_and_status_2(argv, message, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("mq: error: ") and message in err and err.count("\n") == 1


@pytest.fixture
def snapshots(monkeypatch):
    """``Source.snapshot`` returns the busy pair, in order, then fails."""
    pending = list(busy_pair())

    def fake(self):
        return pending.pop(0)
    monkeypatch.setattr(top.Source, "snapshot", fake)
    return pending


def test_once_takes_two_snapshots_and_prints_plain_tables(snapshots, capsys):
    assert main(["top", "--once", "--interval", "0.01", "--socket", "/nowhere"]) == 0
    assert snapshots == []
    out = capsys.readouterr().out
    orders = next(line.split() for line in out.splitlines() if line.startswith("orders"))
    # 1000 records over the broker clock's 1 s, not the 0.01 s slept here
    assert orders == ["orders", "1", "1.0MiB", "2.0k", "1.0k", "0.00", "900"]


def test_once_json_is_one_object(snapshots, capsys):
    assert main(["top", "--once", "--json", "--interval", "0.01"]) == 0
    out = capsys.readouterr().out
    assert out.count("\n") == 1
    data = json.loads(out)
    assert data["intervalSeconds"] == 1.0 and data["hiddenTopics"] == 1
    billing = next(g for g in data["groups"] if g["group"] == "billing")
    assert billing == {"group": "billing", "state": "Stable", "members": 1, "topics": ["orders"],
                       "lag": 200, "lagSeconds": 1.5, "outRecordsPerSecond": 900.0}


def test_once_with_interval_0_takes_one_snapshot(snapshots, capsys):
    assert main(["top", "--once", "--interval", "0", "--all"]) == 0
    assert len(snapshots) == 1
    out = capsys.readouterr().out
    assert "fsync 5 since start, mean 200us" in out and "__consumer_offsets" in out
