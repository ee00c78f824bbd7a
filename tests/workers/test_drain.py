"""Drain: SIGTERM under load ends the pool with exit 0 after its children finished the records
in hand and committed exactly what they handled (lag 0 for everything handled); a pool
started again goes on from there and handles nothing twice. A second signal forces the exit.
An ``async def`` handler keeps each key's order with several records in flight."""

from __future__ import annotations

import collections
import signal

from wk_pool import Feeder, Pool, calls, caught_up, committed, read_all, read_events

import mq


def test_sigterm_under_load_drains_and_a_restart_repeats_nothing(broker, tmp_path, pools):
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("jobs", 4)
    feeder = Feeder(broker.socket, "jobs", 4, rate=1000)
    feeder.start()
    pools(feeder)
    first = Pool(tmp_path, broker.socket, processes=2, env={"WK_SLEEP_MS": "1"})
    pools(first)
    first.wait_ready()
    first.wait_for(lambda: len(calls(read_events(first.events), "done")) > 300, "some work")
    assert first.stop() == 0, first.stderr()
    events = read_events(first.events)
    started, done = calls(events), calls(events, "done")
    assert set(started) == set(done), "a record was left half-done"
    handled: dict[int, list[int]] = collections.defaultdict(list)
    for p, o in done:
        handled[p].append(o)
    offsets = committed(broker.socket, "g")
    for tp, offset in offsets.items():
        assert sorted(handled[tp.partition]) == list(range(offset)), \
            f"{tp}: committed {offset} is not right after what was handled"
    assert {tp.partition for tp in offsets} == set(handled)

    second = Pool(tmp_path, broker.socket, processes=2, events=first.events)
    pools(second)
    feeder.stop()
    second.wait_for(lambda: caught_up(broker.socket, "g", "jobs"), "the rest")
    assert second.stop() == 0
    done = calls(read_events(first.events), "done")
    assert [k for k, n in done.items() if n > 1] == [], "a record ran twice"
    assert set(done) == {(r.partition, r.offset) for r in read_all(broker.socket, "jobs")}


def test_a_second_signal_forces_the_exit(broker, tmp_path, pools):
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("jobs", 1)
    with mq.Producer(socket=broker.socket) as p:
        p.send("jobs", value=b"hang")
    pool = Pool(tmp_path, broker.socket, processes=1, args=["--drain-timeout-s", "60"])
    pools(pool)
    pool.wait_for(lambda: calls(read_events(pool.events)), "the handler to start")
    pool.send_signal(signal.SIGINT)
    pool.wait_for(lambda: "SIGINT: draining" in pool.stderr(), "the drain")
    pool.send_signal(signal.SIGINT)
    assert pool.wait() == 128 + signal.SIGINT
    assert "second SIGINT: killing the children now" in pool.stderr()


def test_async_handler_keeps_key_order_with_records_in_flight(broker, tmp_path, pools):
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("jobs", 2)
    keys = [b"a", b"b", b"c", b"d", None]
    with mq.Producer(socket=broker.socket) as p:
        for i in range(400):
            p.send("jobs", partition=i % 2, key=keys[(i // 2) % 5], value=b"v%d" % i)
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("out", 1)
    pool = Pool(tmp_path, broker.socket, handler="wk_handlers:ahandle", processes=1,
                env={"WK_SLEEP_MS": "2", "WK_OUTPUT": "out"}, args=["--concurrency", "8"])
    pools(pool)
    pool.wait_for(lambda: caught_up(broker.socket, "g", "jobs"), "the group to catch up")
    assert pool.stop() == 0
    events = read_events(pool.events)
    assert len(calls(events, "done")) == 400 and max(calls(events).values()) == 1
    assert len(read_all(broker.socket, "out")) == 400       # each output sent once
    running, most = set(), 0
    last_of: dict[tuple, int] = {}
    for e in events:
        k = (e["partition"], e["offset"])
        if e["kind"] == "call":
            running.add(k)
            most = max(most, len(running))
            if e["key"] is not None:
                ident = (e["partition"], e["key"])
                assert last_of.get(ident, -1) < e["offset"], f"key {ident} out of order"
                last_of[ident] = e["offset"]
        else:
            running.discard(k)
    assert most > 4, f"at most {most} records ran at once"
    # one record of a key at a time: a key's next call comes after its previous done
    open_keys: set = set()
    for e in events:
        if e["key"] is None:
            continue
        ident = (e["partition"], e["key"])
        if e["kind"] == "call":
            assert ident not in open_keys, f"two records of key {ident} at once"
            open_keys.add(ident)
        else:
            open_keys.discard(ident)


def test_systemd_hears_ready_once_every_child_joined_then_stopping(broker, tmp_path, pools):
    import socket as sockets
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("jobs", 2)
    with sockets.socket(sockets.AF_UNIX, sockets.SOCK_DGRAM) as listener:
        listener.bind(str(tmp_path / "notify.sock"))
        listener.settimeout(30)
        pool = Pool(tmp_path, broker.socket, processes=2,
                    env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock")})
        pools(pool)
        ready = listener.recv(4096).decode()
        assert ready.startswith("READY=1\nSTATUS=2 children in group g"), ready
        assert [s["state"] for s in pool.slots()] == ["running", "running"]
        pool.send_signal(signal.SIGTERM)
        assert listener.recv(4096) == b"STOPPING=1"
        assert pool.wait() == 0
