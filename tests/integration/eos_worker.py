"""Processes of ``test_eos_pipeline.py`` — a consume-transform-produce worker and an input
feeder — and the parent's side of them.

Run as ``python eos_worker.py worker|feeder <json args>`` (``EosWorker``/``Feeder`` do it): a
fresh interpreter, never a fork of the test process.

``worker`` is what a real exactly-once pipeline stage is:

- a transactional producer with a stable ``transactional_id``, ``init_transactions()`` first:
  it fences a killed predecessor with the same id and aborts its open transaction, so the
  group's offsets are settled before this worker's consumer reads them;
- then a member of group ``eos`` on topic ``in``, ``read_committed``, no auto-commit;
- per poll batch, one transaction: begin, one output to ``out`` per input, whose value names
  the input and transforms it (``transform``; header ``writer``: the worker's name), the
  batch's positions with ``send_offsets_to_transaction(positions, consumer)``, commit.

It handles failures as a real worker does: a commit or abort that timed out is called again;
any other failure of the transaction aborts it and seeks the batch's partitions back to the
batch's first offsets, so the batch is processed again; ``ProducerFencedError`` (a newer
producer took the id, or the coordinator aborted a transaction past its timeout) ends the
process with status 3; anything else with status 4 (traceback on stderr). SIGTERM: finish the
current transaction, close, exit 0.

``feeder`` writes inputs ``b"f%06d" % seq`` to partition ``seq % partitions`` of ``in`` at
``rate`` records/s (idempotent, ``acks="all"``, retried through broker restarts) until SIGTERM;
then it flushes, writes the acknowledged sequence numbers to ``out`` (JSON) and exits 0.

Both log events to ``events``: one JSON line each, one ``write(2)`` on an ``O_APPEND``
descriptor, so a SIGKILL never leaves half a line in the middle of the file. A worker's:
``ready``; ``begin`` (its batch, ``[[partition, first offset, last offset], ...]``);
``committed``; ``aborted`` (the error); ``fenced``; ``crashed``; ``exit``; with ``stall: true``
its first transaction stops after its outputs are acknowledged (``stalled``) and waits to be
killed, which surely leaves aborted outputs behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

WORKER = Path(__file__).resolve()
GROUP = "eos"
IN, OUT = "in", "out"
_TRIES = 10             # commit/abort calls that time out (each after max_block_ms)


def transform(partition: int, offset: int, value: bytes) -> bytes:
    """The output for input ``value`` at ``in``-``partition``@``offset``."""
    return b"%d:%d:%s" % (partition, offset, value[::-1])


def parse_output(value: bytes) -> tuple[int, int, bytes]:
    """``(partition, offset, input value)`` named by an output."""
    partition, offset, reversed_value = value.split(b":", 2)
    return int(partition), int(offset), reversed_value[::-1]


# --- the parent's side --------------------------------------------------------------------------

def read_events(path) -> list[dict]:
    """The complete event lines written so far (a line being written is left out)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in data.split(b"\n")[:-1] if line]


class _Child:
    """A child process with an events file and a stderr file in ``directory``."""

    def __init__(self, mode: str, directory: Path, name: str, **args) -> None:
        self.name = name
        self.events = directory / f"{name}.jsonl"
        self.stderr = directory / f"{name}.stderr"
        args.update(name=name, events=str(self.events))
        with open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen([sys.executable, str(WORKER), mode, json.dumps(args)],
                                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=err)
        self.killed = False
        self.last_event_at_kill: str | None = None

    def read(self) -> list[dict]:
        return read_events(self.events)

    def kinds(self) -> list[str]:
        return [e["kind"] for e in self.read()]

    def last_kind(self) -> str | None:
        kinds = self.kinds()
        return kinds[-1] if kinds else None

    def kill(self) -> None:
        """SIGKILL, and wait for the process to be gone."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.killed = True
        self.proc.wait()
        self.last_event_at_kill = self.last_kind()

    def terminate(self, timeout: float) -> int:
        """SIGTERM and wait; returns the exit status (SIGKILL after ``timeout`` s, raising)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise

    def reap(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stderr_text(self) -> str:
        try:
            return self.stderr.read_text(errors="replace")
        except FileNotFoundError:
            return ""


class EosWorker(_Child):
    def __init__(self, directory: Path, name: str, socket: str, transactional_id: str,
                 **options) -> None:
        super().__init__("worker", directory, name, socket=socket,
                         transactional_id=transactional_id, **options)


class Feeder(_Child):
    def __init__(self, directory: Path, socket: str, partitions: int, rate: float) -> None:
        self.acked = directory / "fed.json"
        super().__init__("feeder", directory, "feeder", socket=socket, partitions=partitions,
                         rate=rate, out=str(self.acked))

    def values(self) -> list[bytes]:
        """The acknowledged inputs (after the feeder exited)."""
        return [b"f%06d" % seq for seq in json.loads(self.acked.read_text())]


# --- the children -------------------------------------------------------------------------------

class _EventLog:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.pid = os.getpid()

    def __call__(self, kind: str, **fields) -> None:
        line = json.dumps({"kind": kind, "pid": self.pid, "t": time.monotonic(), **fields})
        os.write(self.fd, line.encode() + b"\n")


def _worker(args: dict) -> int:
    import mq
    from mq.errors import MQError

    log = _EventLog(args["events"])
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    stall = bool(args.get("stall"))
    writer = [("writer", args["name"].encode())]

    producer = consumer = None
    try:
        producer = mq.Producer(socket=args["socket"],
                               transactional_id=args["transactional_id"],
                               transaction_timeout_ms=args.get("transaction_timeout_ms", 2000),
                               linger_ms=2)
        producer.init_transactions()
        consumer = mq.Consumer(IN, group_id=GROUP, socket=args["socket"],
                               isolation_level="read_committed", enable_auto_commit=False,
                               value_bytes=True)
        log("ready")
        while not stop:
            batch = consumer.poll(timeout_ms=100, max_records=args.get("max_records", 50))
            if not batch:
                continue
            log("begin", batch=[[tp.partition, records[0].offset, records[-1].offset]
                                for tp, records in batch.items()])
            producer.begin_transaction()
            try:
                for tp, records in batch.items():
                    for r in records:
                        producer.send(OUT, value=transform(tp.partition, r.offset, r.value),
                                      headers=writer)
                if stall:
                    producer.flush(timeout=30)
                    log("stalled")
                    while True:                 # until SIGKILL
                        signal.pause()
                producer.send_offsets_to_transaction(
                    {tp: records[-1].offset + 1 for tp, records in batch.items()}, consumer)
                _again_on_timeout(producer.commit_transaction)
            except mq.ProducerFencedError:
                raise
            except (MQError, TimeoutError) as err:
                _again_on_timeout(producer.abort_transaction)
                for tp, records in batch.items():        # process the batch again
                    if tp in consumer.assignment():
                        consumer.seek(tp, records[0].offset)
                log("aborted", error=f"{type(err).__name__}: {err}")
            else:
                log("committed")
    except mq.ProducerFencedError as err:
        log("fenced", error=str(err))
        return 3
    except BaseException as err:
        log("crashed", error=f"{type(err).__name__}: {err}")
        traceback.print_exc()
        return 4
    finally:
        if consumer is not None:
            consumer.close()
        if producer is not None:
            producer.close(timeout=5)
    log("exit")
    return 0


def _again_on_timeout(call) -> None:
    """``commit_transaction``/``abort_transaction``: a ``TimeoutError`` means 'still under
    way', and calling it again finishes it."""
    for attempt in range(_TRIES):
        try:
            call()
            return
        except TimeoutError:
            if attempt == _TRIES - 1:
                raise


def _feeder(args: dict) -> int:
    import mq

    log = _EventLog(args["events"])
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    acked: list[int] = []
    partitions, rate = args["partitions"], args["rate"]
    with mq.Producer(socket=args["socket"], linger_ms=0) as producer:
        log("ready")
        start, seq = time.monotonic(), 0
        while not stop:
            ahead = start + seq / rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)                # pacing, not waiting for a condition
            fut = producer.send(IN, value=b"f%06d" % seq, partition=seq % partitions)
            fut.add_callback(lambda _meta, seq=seq: acked.append(seq))
            seq += 1
        producer.flush(120)
    with open(args["out"], "w") as f:
        json.dump(sorted(acked), f)
    log("exit", sent=seq, acked=len(acked))
    return 0 if len(acked) == seq else 5


if __name__ == "__main__":
    mode, raw = sys.argv[1], json.loads(sys.argv[2])
    sys.exit({"worker": _worker, "feeder": _feeder}[mode](raw))
