"""An ``async def`` handler's child awaits the broker through ``mq.aio``'s clients: its event
loop turns while a commit is under way, so a running handler's awaits complete meanwhile, and
the child runs no thread but the loop's."""

from __future__ import annotations

from wk_pool import Feeder, Pool, caught_up, read_events

import mq


def test_handlers_go_on_while_the_child_commits_and_it_has_no_thread(broker, tmp_path, pools):
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("in", 2)
        admin.create_topic("out", 1)
    with mq.Producer(socket=broker.socket) as p:
        p.send("in", value=b"watch", key=b"w", partition=0).get()
    # Records keep coming, so transactions keep committing while "watch" waits to see one.
    feeder = Feeder(broker.socket, "in", 2, rate=200)
    feeder.start()
    pools(feeder)
    pool = Pool(tmp_path, broker.socket, handler="wk_handlers:awatch", topics=("in",),
                processes=1, args=["--exactly-once", "--concurrency", "4"],
                env={"WK_OUTPUT": "out", "WK_SLEEP_MS": "5"})
    pools(pool)

    def watched() -> list[dict]:
        return [e for e in read_events(pool.events)
                if e["kind"] == "done" and e["value"] == "watch"]
    try:
        pool.wait_for(watched, "the watching record to finish")
    finally:
        feeder.stop()
    assert watched()[0]["committing"] in ("send_offsets", "commit_transaction")
    pool.wait_for(lambda: caught_up(broker.socket, "g", "in"), "the pool to catch up")
    done = [e for e in read_events(pool.events) if e["kind"] == "done"]
    assert done and {e["threads"] for e in done} == {1}
    assert pool.stop() == 0
