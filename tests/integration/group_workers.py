"""Child processes for the consumer-group integration tests, and the parent's side of them.

Run as ``python group_workers.py <mode> <json args>`` (``spawn_worker`` does it): a fresh
interpreter, never a fork of the test process, whose consumers' heartbeat threads must not be
copied. Modes:

- ``consume``: a group member that polls until SIGTERM, then closes (which revokes and leaves).
  Every event is one JSON line appended to ``events`` with a single ``write(2)`` on an
  ``O_APPEND`` descriptor, so a SIGKILL loses at most the event being written and never leaves
  half a line in the middle of the file. Timestamps are ``time.monotonic()``: CLOCK_MONOTONIC is
  one clock for every process of the host, so intervals of different processes compare.

  ``assigned``/``revoked``/``lost``: taken inside the listener. ``assigned`` comes before any
  record of those partitions is returned; ``revoked`` is taken when the listener returns, after
  which the consumer reports the release to the broker — so if the broker is right, the next
  owner's ``assigned`` is later than this ``revoked``.
  ``batch``: one per partition and poll: ``t0`` when poll returned the records, ``t1`` after
  they were "processed" (logged), the offsets and the values.
  ``commit``: offsets acknowledged by the broker (``commit()`` returned), ``t`` after that.
- ``produce``: writes ``count`` numbered records (value ``str(seq)``, partition
  ``seq % partitions``) at about ``rate`` records/s with acks=all, retrying through broker
  restarts; writes the sequence numbers acknowledged to ``out`` (JSON) and exits 0.
- ``cycle``: joins the group, consumes exactly ``k`` records, commits their
  positions, writes ``{"records": [[partition, offset], ...], "committed": ...}`` to ``out`` and
  closes without committing again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

WORKER = Path(__file__).resolve()


# --- the parent's side --------------------------------------------------------------------------

def spawn_worker(mode: str, **args) -> subprocess.Popen:
    """Start a worker process; stdout is a pipe that says ``ready`` once it joined/started."""
    return subprocess.Popen([sys.executable, str(WORKER), mode, json.dumps(args)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)


def read_events(path) -> list[dict]:
    """The complete event lines written so far (a line being written is left out)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")
    return [json.loads(line) for line in lines[:-1] if line]


def wait_ready(proc: subprocess.Popen, timeout: float = 30.0) -> None:
    """Wait for the worker's ``ready`` line (raises if it exits or stays silent)."""
    import select
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else b""
    if line != b"ready\n":
        proc.kill()
        proc.wait()
        raise AssertionError(f"worker {proc.args[2]} did not get ready (exit {proc.returncode},"
                             f" said {line!r})")


def stop_worker(proc: subprocess.Popen, timeout: float = 30.0) -> int:
    """SIGTERM (the worker closes its consumer cleanly) and wait; returns the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    finally:
        reap(proc)


def reap(proc: subprocess.Popen) -> None:
    """SIGKILL if still running, wait, close the pipe: no process or fd outlives a test."""
    if proc.poll() is None:
        proc.kill()
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


# --- the children -------------------------------------------------------------------------------

class _EventLog:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.pid = os.getpid()

    def __call__(self, kind: str, **fields) -> None:
        fields.setdefault("t", time.monotonic())
        line = json.dumps({"kind": kind, "pid": self.pid, **fields}) + "\n"
        os.write(self.fd, line.encode())


def _tps(tps) -> list[list]:
    return sorted([tp.topic, tp.partition] for tp in tps)


def _consume(args: dict) -> None:
    import mq
    from mq.errors import MQError

    log = _EventLog(args["events"])
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))

    class Listener(mq.ConsumerRebalanceListener):
        def on_partitions_assigned(self, assigned):
            log("assigned", tps=_tps(assigned))

        def on_partitions_revoked(self, revoked):
            log("revoked", tps=_tps(revoked))

        def on_partitions_lost(self, lost):
            log("lost", tps=_tps(lost))

    commit = args.get("commit", "auto")            # "auto", "sync" (after every poll), "none"
    consumer = mq.Consumer(
        *args["topics"], group_id=args["group"], socket=args["socket"], listener=Listener(),
        enable_auto_commit=commit == "auto",
        auto_commit_interval_ms=args.get("auto_commit_interval_ms", 200),
        session_timeout_ms=args.get("session_timeout_ms", 45_000),
        max_poll_interval_ms=args.get("max_poll_interval_ms", 300_000),
        group_instance_id=args.get("instance_id"), assignor=args.get("assignor"))
    log("started")
    print("ready", flush=True)
    try:
        while not stop:
            batch = consumer.poll(timeout_ms=100, max_records=args.get("max_records", 50))
            t0 = time.monotonic()
            for tp, records in batch.items():
                log("batch", tp=[tp.topic, tp.partition], t0=t0,
                    offsets=[r.offset for r in records],
                    values=[bytes(r.value).decode() for r in records], t=time.monotonic())
            if batch and commit == "sync":
                offsets = {tp: records[-1].offset + 1 for tp, records in batch.items()}
                try:
                    consumer.commit(offsets)
                except MQError as err:      # the broker is restarting, or we were fenced
                    log("commit_failed", error=repr(err),
                        offsets=[[tp.topic, tp.partition, o] for tp, o in offsets.items()])
                else:
                    log("commit", offsets=[[tp.topic, tp.partition, o]
                                           for tp, o in offsets.items()])
    finally:
        consumer.close()
        log("closed")


def _produce(args: dict) -> None:
    import mq

    acked: list[int] = []
    count, partitions, rate = args["count"], args["partitions"], args.get("rate", 1000)
    with mq.Producer(socket=args["socket"], acks="all", linger_ms=0,
                     delivery_timeout_ms=120_000) as producer:
        print("ready", flush=True)
        start = time.monotonic()
        for seq in range(count):
            ahead = start + seq / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)                    # pacing, not waiting for a condition
            fut = producer.send(args["topic"], value=str(seq).encode(),
                                partition=seq % partitions)
            fut.add_callback(lambda _meta, seq=seq: acked.append(seq))
        producer.flush(120)
    with open(args["out"], "w") as f:
        json.dump(sorted(acked), f)


def _cycle(args: dict) -> None:
    import mq

    consumer = mq.Consumer(args["topic"], group_id=args["group"], socket=args["socket"],
                           enable_auto_commit=False)
    print("ready", flush=True)
    out, want = [], args["k"]
    deadline = time.monotonic() + 30
    while len(out) < want:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(out)} of {want} records in 30 s")
        for tp, records in consumer.poll(timeout_ms=100, max_records=want - len(out)).items():
            out += [[tp.partition, r.offset] for r in records]
    positions = {tp: consumer.position(tp) for tp in consumer.assignment()}
    consumer.commit(positions)
    committed = {f"{tp.topic}-{tp.partition}": consumer.committed(tp) for tp in positions}
    consumer.close()
    with open(args["out"], "w") as f:
        json.dump({"records": out, "committed": committed}, f)


if __name__ == "__main__":
    mode, raw = sys.argv[1], json.loads(sys.argv[2])
    {"consume": _consume, "produce": _produce, "cycle": _cycle}[mode](raw)
