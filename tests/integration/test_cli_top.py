"""``mq top`` as a real process against a real broker subprocess (each test's own data dir and
socket): ``--once`` and ``--json`` show the topic, the group and its lag, with rates measured
while a producer and a committer run; without a terminal the live mode prints plain tables
until Ctrl-C; and in a real terminal (a tmux session of its own, read with ``capture-pane``)
the screen shows the topic, follows new records, says the broker is unreachable when it is
killed and comes back with the restarted broker, and q or Ctrl-C leaves with status 0 and the
screen as it was. Nothing sleeps to wait: every wait polls its condition with a timeout.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import uuid

import pytest
from brokers import create_topic
from cli_run import WAIT, Lines, assert_help, assert_one_error, mq_process, mq_run, ok

from mq.client.admin import Admin
from mq.client.producer import Producer
from mq.client.types import TopicPartition as TP
from mq.testing import wait_for


def produce(b, topic: str, count: int, partition: int = 0) -> None:
    with Producer(socket=b.socket, linger_ms=0) as producer:
        futures = [producer.send(topic, b"x" * 100, partition=partition) for _ in range(count)]
        for f in futures:
            f.get(WAIT)


def commit(b, group: str, offsets: dict[TP, int]) -> None:
    with Admin(b.socket) as admin:
        admin.alter_group_offsets(group, offsets)


@pytest.fixture
def broker(broker):
    """The broker with ``orders`` (2 partitions): 10 records in partition 0, 4 in 1, and
    group ``billing`` committed at 3 and 4 (lag 7)."""
    create_topic(broker, "orders", 2)
    produce(broker, "orders", 10, 0)
    produce(broker, "orders", 4, 1)
    commit(broker, "billing", {TP("orders", 0): 3, TP("orders", 1): 4})
    return broker


@contextlib.contextmanager
def traffic(b):
    """A producer to ``orders`` and ``billing`` committing behind it, until the block ends."""
    stop = threading.Event()

    def run():
        with Producer(socket=b.socket, linger_ms=0) as producer, Admin(b.socket) as admin:
            sent = 10
            while not stop.is_set():
                producer.send("orders", b"y" * 100, partition=0).get(WAIT)
                sent += 1
                admin.alter_group_offsets("billing", {TP("orders", 0): sent - 5})
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(WAIT)


def rows(text: str, first: str) -> list[list[str]]:
    """The rows of the plain table whose header starts with ``first``, split on spaces."""
    block = next(b for b in text.split("\n\n") if b.startswith(first))
    return [line.split() for line in block.splitlines()]


# --- --once -----------------------------------------------------------------------------------

def test_help():
    assert_help(("top",))
    assert "through committed offsets" in mq_run("top", "--help").out


def test_no_broker_is_one_line_and_status_1(tmp_path):
    for args in (["--once"], []):
        assert_one_error(mq_run("top", *args, "--socket", tmp_path / "none.sock"),
                         "no broker at", code=1)


def test_once_shows_the_topic_the_group_and_its_lag(broker):
    out = ok(mq_run("top", "--once", "--interval", "0", "--socket", broker.socket)).out
    assert "\x1b" not in out
    assert out.startswith(f"broker pid {broker.pid}  up ")
    assert " since start, mean " in out
    topics = rows(out, "TOPIC")
    assert topics[1:] == [["orders", "2", topics[1][2], "14", "-", "-", "-"]]
    groups = rows(out, "GROUP")
    assert groups[1][:4] == ["billing", "Empty", "0", "7"]
    assert groups[1][-1] == "orders"
    assert "__consumer_offsets" not in out
    every = ok(mq_run("top", "--once", "--interval", "0", "--all", "--socket", broker.socket))
    shown = [row[0] for row in rows(every.out, "TOPIC")[1:]]
    assert shown == ["__cluster_metadata", "__consumer_offsets", "__transaction_state", "orders"]
    assert int(rows(every.out, "TOPIC")[1][3]) >= 1, "the metadata log holds orders' record"


def test_once_json_measures_rates_in_and_out(broker):
    with traffic(broker):
        result = ok(mq_run("top", "--once", "--json", "--interval", "0.5",
                           "--socket", broker.socket))
    data = json.loads(result.out)
    assert 0.3 < data["intervalSeconds"] < 30
    assert data["broker"]["pid"] == broker.pid
    assert data["broker"]["fsyncCount"] >= 0
    (orders,) = data["topics"]
    assert orders["topic"] == "orders" and orders["partitions"] == 2
    assert orders["inRecordsPerSecond"] > 0 and orders["inBytesPerSecond"] > 0
    assert orders["outRecordsPerSecond"] > 0
    (billing,) = data["groups"]
    assert billing["group"] == "billing" and billing["topics"] == ["orders"]
    assert billing["outRecordsPerSecond"] > 0
    assert billing["lag"] >= 5


def test_live_without_a_terminal_prints_tables_until_ctrl_c(broker):
    with mq_process("top", "--interval", "0.2", "--socket", broker.socket) as proc:
        lines = Lines(proc.stdout)
        seen = 0
        while seen < 2:                             # two frames
            line = lines.next(WAIT)
            assert line is not None, proc.stderr.read()
            seen += line.startswith(b"orders ")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(WAIT) == 0
        assert b"Traceback" not in proc.stderr.read()


# --- in a terminal ----------------------------------------------------------------------------

class Tmux:
    """A tmux server of its own (``-L``) running one command in a 100x30 pane. The command's
    exit status goes to a file: tmux's ``pane_dead_status`` is sometimes never set when the
    terminal closes before tmux reaps the process. The shell around it traps SIGINT (a trap,
    not an ignore, so the command still gets Ctrl-C) to outlive a Ctrl-C and write it."""

    def __init__(self, tmp_path, command: list[str]) -> None:
        self.name = f"mq-top-{uuid.uuid4().hex[:12]}"
        self.status_path = tmp_path / "tmux-status"
        conf = tmp_path / "tmux.conf"
        conf.write_text("set -g remain-on-exit on\nset -g history-limit 100\n")
        self.base = ["tmux", "-L", self.name, "-f", str(conf)]
        script = (f"trap true INT; {shlex.join(command)}; "
                  f"echo $? > {shlex.quote(str(self.status_path))}")
        self.run("new-session", "-d", "-x", "100", "-y", "30", shlex.join(["bash", "-c", script]))

    def run(self, *args: str) -> str:
        return subprocess.run([*self.base, *args], capture_output=True, text=True, check=True,
                              timeout=WAIT).stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p")

    def wait_screen(self, condition, message: str) -> str:
        seen = [""]

        def check():
            seen[0] = self.screen()
            return condition(seen[0])
        try:
            wait_for(check, WAIT, 0.05, message)
        except TimeoutError as err:
            raise AssertionError(f"{err}; the screen:\n{seen[0]}") from None
        return seen[0]

    def wait_exit(self) -> int:
        """The command's exit status, once it has one."""
        def written():
            return self.status_path.exists() and self.status_path.read_text().endswith("\n")
        try:
            wait_for(written, WAIT, 0.05, "mq top to exit")
        except TimeoutError as err:
            raise AssertionError(f"{err}; the screen:\n{self.screen()}") from None
        return int(self.status_path.read_text())

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, check=False,
                       timeout=WAIT)


@pytest.fixture
def terminal(tmp_path, broker):
    if shutil.which("tmux") is None or shutil.which("bash") is None:
        pytest.skip("tmux (or bash) is not installed")
    tmux = Tmux(tmp_path, [sys.executable, "-m", "mq", "top", "--interval", "0.2",
                           "--socket", broker.socket])
    try:
        yield tmux
    finally:
        tmux.close()


def orders_row(screen: str) -> list[str] | None:
    return next((line.split() for line in screen.splitlines() if line.startswith("orders ")),
                None)


def test_terminal_view_follows_the_broker_and_q_quits(terminal, broker):
    screen = terminal.wait_screen(lambda s: orders_row(s) is not None, "the topic on screen")
    assert "TOPIC" in screen and "GROUP" in screen and "q quit" in screen
    assert orders_row(screen)[3] == "14"
    assert any(line.split()[:4] == ["billing", "Empty", "0", "7"]
               for line in screen.splitlines())
    assert all(len(line) <= 100 for line in screen.splitlines())

    produce(broker, "orders", 1000, 1)
    terminal.wait_screen(lambda s: (orders_row(s) or [None] * 4)[3] == "1.0k",
                         "the new records counted")

    broker.kill()
    terminal.wait_screen(lambda s: "broker unreachable, retrying" in s, "the broker gone")
    broker.start()
    screen = terminal.wait_screen(
        lambda s: "unreachable" not in s and f"broker pid {broker.pid} " in s,
        "the view back with the new broker")
    assert orders_row(screen)[3] == "1.0k"

    terminal.run("send-keys", "q")
    assert terminal.wait_exit() == 0
    assert "q quit" not in terminal.screen()          # the alternate screen is gone


def test_ctrl_c_quits_with_status_0(terminal):
    terminal.wait_screen(lambda s: orders_row(s) is not None, "the topic on screen")
    terminal.run("send-keys", "C-c")
    assert terminal.wait_exit() == 0
    screen = terminal.screen()
    assert "Traceback" not in screen and "interrupted" not in screen
