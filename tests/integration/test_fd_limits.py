"""The broker under an open-file limit (issue 19): a real broker subprocess started with
``RLIMIT_NOFILE`` set as a shell or a unit would set it.

- Soft limit 1,024 under a high hard limit (a shell's default): the broker raises its soft
  limit, serves 2,000 partitions and starts again on them. Before, topic creation failed with
  "Too many open files" at about 190 partitions (5 descriptors each, more per older segment).
- Soft = hard = 512: a topic change past the budget is refused with one line naming the limit
  and the number needed, creates nothing and the broker keeps serving; a data dir that needs
  more than the limit is refused at start with one line and exit status 1, and left as it was.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import pytest

import mq
import mq.testing
from cli_run import ENV, mq_run
from mq.broker.fd_budget import FDS_PER_PARTITION, RESERVED_FDS, FdBudget
from mq.log import files

INTERNAL = 3                      # __cluster_metadata, __consumer_offsets, __transaction_state
MANY = 2_000
LOW = 512                         # room for (512 - 320) / 4 = 48 partitions, 3 of them internal
HARD = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
SLOW = 180      # seconds: a bound for starting or stopping 2,000 partitions on a loaded box


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def read_back(socket: str, topic: str, partitions: list[int]) -> dict[int, list[bytes]]:
    with mq.Consumer(socket=socket) as consumer:
        consumer.assign([mq.TopicPartition(topic, p) for p in partitions])
        consumer.seek_to_beginning()
        seen: dict[int, list[bytes]] = {}
        while sum(map(len, seen.values())) < len(partitions):
            batch = consumer.poll(timeout_ms=10_000)
            assert batch, f"nothing more to read after {seen}"
            for tp, records in batch.items():
                seen.setdefault(tp.partition, []).extend(bytes(r.value) for r in records)
        return seen


def produce(socket: str, topic: str, partitions: list[int]) -> None:
    with mq.Producer(socket=socket, linger_ms=1) as producer:
        futures = [producer.send(topic, value=b"v%d" % p, partition=p) for p in partitions]
        producer.flush(timeout=60)
        assert all(f.get(timeout=60).offset >= 0 for f in futures)


def start_refused(data_dir, socket: str, limit: int) -> subprocess.CompletedProcess:
    """``mq broker`` run under soft = hard = ``limit``, expected to exit at once."""
    def lower() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))
    return subprocess.run([sys.executable, "-m", "mq", "broker", "--data-dir", str(data_dir),
                           "--socket", socket], capture_output=True, text=True, env=ENV,
                          timeout=60, preexec_fn=lower, check=False)


def dir_state(path) -> dict[str, tuple[int, int]]:
    """Every file and directory under ``path`` with its size and mtime."""
    state = {}
    for root, dirs, names in os.walk(path):
        for name in dirs + names:
            full = os.path.join(root, name)
            st = os.lstat(full)
            state[os.path.relpath(full, path)] = (st.st_size, st.st_mtime_ns)
    return state


def test_two_thousand_partitions_under_a_soft_limit_of_1024(tmp_path):
    assert HARD == resource.RLIM_INFINITY or HARD >= FdBudget.needed(MANY + INTERNAL), \
        f"this test needs a hard open-file limit of {FdBudget.needed(MANY + INTERNAL)}"
    limits = (1024, HARD)
    b = mq.testing.BrokerProcess(str(tmp_path / "data"), nofile=limits, log_level="INFO")
    b.start(timeout=SLOW)
    try:
        assert f"open files: limit {HARD} (raised from 1024)" in b.stderr()
        with mq.Admin(b.socket, timeout=SLOW) as admin:
            admin.create_topic("many", partitions=MANY, config={"segment.index.bytes": "4096"})
        # Three descriptors a partition (its active segment), not five.
        assert open_fds(b.pid) <= RESERVED_FDS + (MANY + INTERNAL) * (FDS_PER_PARTITION - 1)
        some = [0, 1, 999, MANY - 1]
        produce(b.socket, "many", some)
        assert read_back(b.socket, "many", some) == {p: [b"v%d" % p] for p in some}
        assert b.stop(timeout=SLOW) == 0
        b.start(timeout=SLOW)                       # the same limits: it starts again
        assert read_back(b.socket, "many", some) == {p: [b"v%d" % p] for p in some}
        with mq.Admin(b.socket) as admin:
            assert admin.describe_topic("many")["partitions"] == MANY
    finally:
        b.close()


def test_past_the_budget_topic_changes_and_starts_are_refused_with_one_line(tmp_path):
    room = (LOW - FdBudget.needed(INTERNAL)) // FDS_PER_PARTITION        # 45
    data = tmp_path / "data"
    b = mq.testing.BrokerProcess(str(data), nofile=(LOW, LOW))
    b.start()
    try:
        with mq.Admin(b.socket) as admin:
            admin.create_topic("a", partitions=room - 5)
        needed = FdBudget.needed(INTERNAL + room + 5)
        refused = mq_run("topics", "create", "b", "--partitions", 10, "--socket", b.socket)
        assert refused.code != 0, refused
        lines = refused.err.strip().splitlines()
        assert len(lines) == 1, refused
        assert f"limit (RLIMIT_NOFILE) is {LOW}" in lines[0] and str(needed) in lines[0]
        assert "room for 5 more" in lines[0] and "Traceback" not in refused.err
        grown = mq_run("topics", "alter", "a", "--partitions", room + 1, "--socket", b.socket)
        assert grown.code != 0 and len(grown.err.strip().splitlines()) == 1, grown
        assert f"is {LOW}" in grown.err
        # Nothing was created for them, and the broker serves on.
        assert not [n for n in os.listdir(data) if n.startswith("b-")]
        assert len([n for n in os.listdir(data) if n.startswith("a-")]) == room - 5
        with mq.Admin(b.socket) as admin:
            assert admin.list_topics() == ["a"]
            assert admin.describe_topic("a")["partitions"] == room - 5
            admin.create_topic("c", partitions=5)                   # what fits still does
        produce(b.socket, "a", [0, room - 6])
        last = room - 6
        assert read_back(b.socket, "a", [0, last]) == {0: [b"v0"], last: [b"v%d" % last]}
    finally:
        b.close()

    # Grown under a higher limit, the data dir no longer starts under the low one.
    b = mq.testing.BrokerProcess(str(data), nofile=(4 * LOW, 4 * LOW))
    b.start()
    try:
        with mq.Admin(b.socket) as admin:
            admin.create_partitions("a", 100)
    finally:
        b.close()
    before = dir_state(data)
    partitions = files.count_partition_dirs(str(data))
    refused = start_refused(data, b.socket, LOW)
    assert refused.returncode == 1, refused
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1, refused.stderr
    assert f"limit (RLIMIT_NOFILE) is {LOW}" in lines[0]
    assert f"{partitions} partitions need {FdBudget.needed(partitions)}" in lines[0]
    assert "ulimit -n" in lines[0] and "LimitNOFILE=" in lines[0]
    assert dir_state(data) == before          # not even the clean-shutdown marker went
    assert (data / files.CLEAN_SHUTDOWN_FILE).exists()
