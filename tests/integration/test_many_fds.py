"""Clients in a process with more than 1,024 open files: ``select()`` cannot watch a descriptor
at or above FD_SETSIZE (1024) and failed with "filedescriptor out of range in select()"; the
clients wait with ``poll`` instead.

The check runs in a child process that first opens 1,100 files, so that every socket, pipe
and semaphore the clients open afterwards gets a descriptor above 1024. It starts its own
broker (``mq.testing.broker``, whose readiness pipe is then such a descriptor too), creates a
topic, produces, consumes with ``assign`` and as a consumer-group member (the heartbeat
thread's wait), commits, and writes through ``mq consume``'s non-blocking-stdout path.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SKIP = 77            # the child's exit status when it cannot raise RLIMIT_NOFILE

CHILD = textwrap.dedent("""\
    import io, os, resource, sys, threading
    import mq, mq.testing
    from mq.cli.consume import emit

    OPEN = 1100
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = OPEN + 512
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            sys.exit(77)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        except (ValueError, OSError):
            sys.exit(77)
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(OPEN)]
    probe = os.dup(0)
    assert probe > 1024, probe            # what the clients open from here on is above 1024
    os.close(probe)

    # Heartbeats every 50 ms: the member's heartbeat thread waits (polls) many times.
    conf = sys.argv[1] + ".toml"
    with open(conf, "w") as f:
        f.write("group_heartbeat_interval_ms = 50\\n")
    with mq.testing.broker(sys.argv[1], config_file=conf) as b:
        with mq.Admin(b.socket) as admin:
            admin.create_topic("t", partitions=2)
        with mq.Producer(socket=b.socket, linger_ms=1) as producer:
            futures = [producer.send("t", value=b"v%d" % i, key=b"k%d" % (i % 7))
                       for i in range(200)]
            producer.flush(timeout=60)
            assert all(f.get(timeout=60).offset >= 0 for f in futures)

        tps = [mq.TopicPartition("t", p) for p in range(2)]
        with mq.Consumer(socket=b.socket) as consumer:
            consumer.assign(tps)
            consumer.seek_to_beginning()
            seen = []
            while len(seen) < 200:
                for records in consumer.poll(timeout_ms=10_000).values():
                    seen += [bytes(r.value) for r in records]
            assert sorted(seen) == sorted(b"v%d" % i for i in range(200)), seen
            ends = consumer.end_offsets(tps)

        with mq.Consumer("t", group_id="g", socket=b.socket,
                         auto_offset_reset="earliest") as member:
            got = 0
            while got < 200:
                got += sum(map(len, member.poll(timeout_ms=10_000).values()))
            assert sorted(member.assignment()) == tps
            # Idle, the member costs almost no CPU: its heartbeat thread blocks in poll
            # between heartbeats (the broken wait returned at once and spun).
            before = sum(os.times()[:2])
            assert member.poll(timeout_ms=1000) == {}
            idle_cpu = sum(os.times()[:2]) - before
            assert idle_cpu < 0.25, f"{idle_cpu:.2f} s of CPU in 1 s idle"
            member.commit()
            assert {tp: member.committed(tp) for tp in tps} == ends
        with mq.Admin(b.socket) as admin:
            assert admin.list_group_offsets("g") == ends

    # mq consume's wait for a full non-blocking stdout
    r, w = os.pipe()
    assert min(r, w) > 1024
    os.set_blocking(w, False)
    try:
        while True:
            os.write(w, b"x" * 65536)
    except BlockingIOError:
        pass
    drained = []
    reader = threading.Thread(target=lambda: drained.append(
        sum(len(c) for c in iter(lambda: os.read(r, 1 << 20), b""))))
    reader.start()
    printed = [0]
    with io.FileIO(w, "wb", closefd=True) as out:
        emit(out, b"y" * (1 << 20), 5, printed)
    reader.join(60)
    assert printed == [5] and drained and drained[0] > 1 << 20
    print("ok")
""")


def test_clients_work_with_descriptors_above_1024(tmp_path):
    proc = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=180, check=False)
    if proc.returncode == SKIP:
        pytest.skip("cannot raise RLIMIT_NOFILE above 1,612 here")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == "ok\n"
    assert "Traceback" not in proc.stderr
