"""``mq demo``: the README's "run" command — a real broker, producer and consumer processes.

It uses the broker already listening on the default socket (``docs/api.md``, "Finding the
broker") or starts one (``mq.testing.BrokerProcess``) on the default data dir, (re)creates the
topic ``demo``, then runs two producer processes (``acks="all"`` and ``acks=1``) and two
consumer processes (members of the consumer group ``mq-demo``: the broker gives each half of the
partitions) at the same time, and reports what moved and how fast. A broker it started is
stopped cleanly (SIGTERM) and its partitions checked with ``mq log check``; a broker that was
already running is left alone. Processes are forked (``multiprocessing``); the workers ignore
SIGINT so that Ctrl-C reaches only this process, which stops them and the broker.

The progress line counts what can be compared: "produced" is the records in the log (the
partitions' end offsets, read from the broker), "consumed" the distinct records the consumers
read (per partition, the offset after the last one read: a partition is read in order from
offset 0), read *before* the end offsets. A consumer never reads past the end, so consumed
never exceeds produced; records delivered again (to a new owner after a rebalance) are counted
once, and shown apart.

Consumers learn when they are done from the parent: once both producers have flushed, the
parent reads each partition's end offset and sends every consumer the targets; a consumer is
done when it reached them on the partitions the group gave it. Production starts only once the
group is stable (each member owns its share), so no partition changes hands mid-run.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import multiprocessing
import os
import queue
import signal
import sys
import time

from mq.cli.common import formatter, start_broker
from mq.protocol.paths import path_argument

__all__ = ["DistinctCount", "add_parser", "run"]

TOPIC = "demo"
GROUP = "mq-demo"
VALUE_BYTES = 100
KEYS = 1000                       # distinct keys ("customer-0" .. "customer-999")
SEGMENT_BYTES = 4 << 20           # small, so that 200k records roll a few segments
HEADERS = [("source", b"mq-demo")]
STALL_S = 60.0                    # no progress this long: something is wrong, give up
PROGRESS_S = (0.2, 2.0)           # seconds between progress lines: on a terminal, otherwise
_ITEMS = ("keyboard", "monitor", "mouse", "laptop", "headset", "webcam", "dock")

DESCRIPTION = """\
Show mq at work: start a broker (or use the one already running), create the topic 'demo',
run 2 producer processes (one with acks=all, one with acks=1) and 2 consumer processes (members
of the consumer group 'mq-demo', so the broker gives each half of the partitions) at the same
time, and print records/s and MB/s per process,
end-to-end totals and latency, and a few records. A broker the demo started is then stopped
cleanly and its partition logs checked; the data stays in the data directory.

The topic 'demo' is deleted and created afresh on every run (so the counts are exact), with
segment.bytes=4 MiB so that its logs roll segments. Progress goes to stderr, the report to
stdout."""

EPILOG = """\
where: the broker at --socket, else $MQ_SOCKET, else <data dir>/mq.sock; when none answers
there, a broker is started on the data dir (--data-dir, else $MQ_DATA_DIR, else
$XDG_STATE_HOME/mq, else ~/.local/state/mq), logging to <data dir>/broker.stderr.log.

examples:
  mq demo
  mq demo --records 1000000 --partitions 8
  mq demo --data-dir /tmp/mq-demo --records 2000
  mq demo --spark                     the Spark pipeline (see above)
  mq demo --spark --records 50000 --rate 5000 --output /tmp/totals
  mq demo --spark --bootstrap-server kafka-1:9092,kafka-2:9092 --command-config client.properties
afterwards (with a broker running, e.g. 'mq broker &'):
  mq topics describe demo
  mq consume demo --from-beginning --max-messages 5 --print-key
  mq groups describe mq-demo
  mq dump-log --print-data ~/.local/state/mq/demo-0/00000000000000000000.log | head"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "demo", help="a broker, producers and consumers at work (the README's first command)",
        description=DESCRIPTION, epilog=EPILOG, formatter_class=formatter)
    parser.add_argument("--data-dir", metavar="DIR", type=path_argument,
                        help="data directory of the broker to start (default: as 'mq broker')")
    parser.add_argument("--socket", metavar="PATH", type=path_argument,
                        help="broker socket (default: $MQ_SOCKET, else <data dir>/mq.sock)")
    parser.add_argument("--partitions", type=int, default=4, metavar="N",
                        help="partitions of the topic 'demo' (default 4)")
    parser.add_argument("--records", type=int, default=200_000, metavar="N",
                        help=f"records to produce in all, split between the two producers "
                             f"(default 200000, {VALUE_BYTES} B values)")
    from mq.cli.demo_spark import add_arguments
    add_arguments(parser)
    parser.set_defaults(run=run)


# --- worker processes -------------------------------------------------------------------------

def _worker_signals() -> None:
    """Ctrl-C reaches only the parent, which stops the workers; and a worker dies with the
    parent (Linux's PR_SET_PDEATHSIG), so a demo killed with SIGKILL leaves none behind."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)    # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass                                                         # not Linux
    if os.getppid() == 1:
        os._exit(1)                     # the parent died before the line above


def _value(producer: int, seq: int) -> bytes:
    text = (f'{{"producer": {producer}, "seq": {seq}, "item": "{_ITEMS[seq % len(_ITEMS)]}", '
            f'"qty": {1 + seq % 5}}}')
    return text.encode().ljust(VALUE_BYTES)


def _produce(index: int, socket: str, acks, count: int, go, progress, results) -> None:
    _worker_signals()
    try:
        from mq.client.producer import Producer
        failed: list = []
        payload = 0
        with Producer(socket=socket, acks=acks) as producer:
            results.put(("ready", "producer", index, None))
            go.wait()
            start = time.monotonic()
            send = producer.send
            for seq in range(count):
                key = b"customer-%d" % (seq * 7919 % KEYS)
                value = _value(index, seq)
                payload += len(key) + len(value)
                send(TOPIC, value, key=key, headers=HEADERS).add_errback(failed.append)
                if not seq & 1023:
                    progress.value = seq
            producer.flush()
            end = time.monotonic()
            progress.value = count
        if failed:
            raise failed[0]
        results.put(("done", "producer", index, {"records": count, "bytes": payload,
                                                 "start": start, "end": end}))
    except BaseException as err:  # noqa: BLE001 -- reported to the parent, which prints it
        results.put(("error", "producer", index, f"{type(err).__name__}: {err}"))


class DistinctCount:
    """Counts each consumed (partition, offset) once. A partition is read in offset order, so
    a record below the partition's next offset is a re-delivery (a new owner after a
    rebalance starts at the last committed offset). ``shared``: every consumer's view of the
    next offset per partition, which the parent sums for the progress line."""

    def __init__(self, shared) -> None:
        self.shared = shared
        self.next: dict[int, int] = {}
        self.count = 0
        self.redelivered = 0

    def add(self, partition: int, records: list) -> list:
        """Count ``records`` (of one partition, in order); return the new ones."""
        start = max(self.next.get(partition, 0), self.shared[partition])
        first = 0
        while first < len(records) and records[first].offset < start:
            first += 1
        self.redelivered += first
        new = records[first:]
        if new:
            self.count += len(new)
            self.next[partition] = new[-1].offset + 1
            self.shared[partition] = max(self.shared[partition], new[-1].offset + 1)
        return new


def _consume(index: int, socket: str, go, progress, next_offsets, targets_conn, results
             ) -> None:
    _worker_signals()
    try:
        from mq.client.consumer import Consumer
        distinct = DistinctCount(next_offsets)
        payload = 0
        latencies: list[int] = []
        samples: list[tuple] = []
        with Consumer(TOPIC, group_id=GROUP, socket=socket,
                      auto_offset_reset="earliest") as consumer:
            results.put(("ready", "consumer", index, None))
            # The parent sends the partitions the broker gave this member once the group is
            # stable; poll (which reconciles; nothing is produced yet) until they are ours.
            while not targets_conn.poll(0.01):
                consumer.poll(timeout_ms=0)
            expected = sorted(targets_conn.recv())
            while sorted(tp.partition for tp in consumer.assignment()) != expected:
                consumer.poll(timeout_ms=10)
            results.put(("ready", "consumer", index, None))
            go.wait()
            tps = sorted(consumer.assignment())
            start = time.monotonic()
            targets = None
            while True:
                batch = consumer.poll(timeout_ms=20, max_records=5000)
                now_ms = int(time.time() * 1000)
                for tp, records in batch.items():
                    records = distinct.add(tp.partition, records)
                    for r in records:
                        payload += len(r.key) + len(r.value)
                        latencies.append(now_ms - r.timestamp_ms)
                    if records and len(samples) < 2:
                        r = records[0]
                        samples.append((r.partition, r.offset, r.timestamp_ms, bytes(r.key),
                                        bytes(r.value).rstrip(), [(k, bytes(v))
                                                                  for k, v in r.headers]))
                progress.value = distinct.redelivered
                if targets is None and targets_conn.poll():
                    targets = targets_conn.recv()
                if targets is not None and all(consumer.position(tp) >= targets[tp.partition]
                                               for tp in tps):
                    break
            end = time.monotonic()
        latencies.sort()
        results.put(("done", "consumer", index, {
            "partitions": [tp.partition for tp in tps],
            "records": distinct.count, "redelivered": distinct.redelivered,
            "bytes": payload, "start": start, "end": end,
            "latency": [latencies[int(q * (len(latencies) - 1))] for q in (0.5, 0.99, 1.0)]
            if latencies else None, "samples": samples}))
    except BaseException as err:  # noqa: BLE001 -- reported to the parent, which prints it
        results.put(("error", "consumer", index, f"{type(err).__name__}: {err}"))


# --- the run ----------------------------------------------------------------------------------

class _Progress:
    """Progress on stderr: a line rewritten in place on a terminal, plain lines otherwise."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def due(self) -> bool:
        """Whether a progress line is due (``counters`` would print now)."""
        return time.monotonic() - self.last >= PROGRESS_S[0 if self.tty else 1]

    def step(self, text: str) -> None:
        if self.tty:
            sys.stderr.write("\r\x1b[K")
        sys.stderr.write(f"mq demo: {text}\n")
        sys.stderr.flush()

    def counters(self, text: str) -> None:
        if not self.due():
            return
        self.last = time.monotonic()
        sys.stderr.write(f"\r\x1b[Kmq demo: {text}" if self.tty else f"mq demo: {text}\n")
        sys.stderr.flush()

    def done(self) -> None:
        if self.tty:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


def _default_socket() -> str:
    from mq.protocol.paths import default_socket_path
    return default_socket_path()


def _start_broker(args: argparse.Namespace, progress: _Progress):
    """(socket, broker process or None, data dir). Uses a broker already listening."""
    from mq.client.admin import Admin
    from mq.errors import BrokerUnavailableError
    from mq.protocol.paths import default_data_dir

    data_dir = os.path.abspath(os.path.expanduser(args.data_dir or default_data_dir()))
    explicit = args.socket or (None if args.data_dir else os.environ.get("MQ_SOCKET") or None)
    probe = explicit or os.path.join(data_dir, "mq.sock")
    try:
        with Admin(probe, timeout=10) as admin:
            info = admin.broker_info
        progress.step(f"using the broker already running at {probe} (pid {info.get('pid')})")
        return probe, None, info.get("data_dir", data_dir)
    except BrokerUnavailableError:
        pass
    progress.step(f"starting a broker on {data_dir}")
    broker = start_broker(data_dir, explicit)
    return broker.socket, broker, data_dir


def run(args: argparse.Namespace) -> int:
    from mq.cli.demo_spark import run as run_spark
    from mq.cli.demo_spark import wants_spark
    if wants_spark(args):
        return run_spark(args)
    if not 1 <= args.partitions <= 1000:
        raise ValueError(f"--partitions must be between 1 and 1000, got {args.partitions}")
    if not 2 <= args.records <= 100_000_000:
        raise ValueError(f"--records must be between 2 and 100000000, got {args.records}")
    progress = _Progress()
    socket, broker, data_dir = _start_broker(args, progress)
    procs: list = []
    try:
        report = _run_demo(args, socket, progress, procs)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
            p.join(10)
        if broker is not None:
            progress.step("stopping the broker")
            code = broker.stop()
            broker.close()
    out = sys.stdout.write
    out(report)
    if broker is None:
        out(f"\nThe broker at {socket} keeps running (the demo did not start it).\n")
    else:
        out(f"\nBroker stopped cleanly (exit {code}); data kept in {data_dir}.\n")
        from mq.log.check import check_partition
        results = [check_partition(os.path.join(data_dir, f"{TOPIC}-{p}"))
                   for p in range(args.partitions)]
        for p, result in enumerate(results):
            verdict = "OK" if result.clean else "PROBLEMS: " + "; ".join(
                problem.message for problem in result.problems[:3])
            out(f"  mq log check {data_dir}/{TOPIC}-{p}: {verdict}: {result.summary()}\n")
        if code != 0 or not all(r.clean for r in results):
            return 1
    out("\nTry next:\n")
    if broker is not None:
        out(f"  export MQ_DATA_DIR={data_dir}\n" if args.data_dir else "")
        out("  mq broker &\n")
    elif socket != _default_socket():
        out(f"  export MQ_SOCKET={socket}\n")
    out(f"  mq topics describe {TOPIC}\n"
        f"  mq consume {TOPIC} --from-beginning --max-messages 5 --print-key --print-offset\n"
        f"  mq offsets {TOPIC} --time earliest\n"
        f"  mq groups describe {GROUP}\n")
    return 0


def _run_demo(args: argparse.Namespace, socket: str, progress: _Progress, procs: list) -> str:
    from mq.client.admin import Admin
    from mq.errors import MQError

    with Admin(socket) as admin:
        if TOPIC in admin.list_topics():
            admin.delete_topic(TOPIC)
        admin.create_topic(TOPIC, args.partitions, {"segment.bytes": str(SEGMENT_BYTES)})
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    go = ctx.Event()
    n_producers = 2
    n_consumers = min(2, args.partitions)
    counts = [args.records // n_producers + (i < args.records % n_producers)
              for i in range(n_producers)]
    acks = ["all", 1]
    produced = [ctx.RawValue("q", 0) for _ in range(n_producers)]     # records sent
    redelivered = [ctx.RawValue("q", 0) for _ in range(n_consumers)]
    next_offsets = ctx.RawArray("q", args.partitions)    # per partition: after the last read
    pipes = [ctx.Pipe(duplex=False) for _ in range(n_consumers)]
    for i in range(n_producers):
        procs.append(ctx.Process(target=_produce, name=f"mq-demo-producer-{i}", daemon=True,
                                 args=(i, socket, acks[i], counts[i], go, produced[i], results)))
    for c in range(n_consumers):
        procs.append(ctx.Process(target=_consume, name=f"mq-demo-consumer-{c}", daemon=True,
                                 args=(c, socket, go, redelivered[c], next_offsets, pipes[c][0],
                                       results)))
    progress.step(f"topic '{TOPIC}' with {args.partitions} partitions; starting "
                  f"{n_producers} producers and {n_consumers} consumers (group '{GROUP}')")
    for p in procs:
        p.start()

    done: dict[tuple[str, int], dict] = {}
    ready = 0
    last_total, last_change = -1, time.monotonic()
    targets_sent = False

    def collect(timeout: float) -> bool:
        nonlocal ready
        try:
            kind, role, index, payload = results.get(timeout=timeout)
        except queue.Empty:
            return False
        if kind == "error":
            raise MQError(f"demo {role} {index} failed: {payload}")
        if kind == "ready":
            ready += 1
        else:
            done[(role, index)] = payload
        return True

    def check_alive() -> None:
        if not _dead(procs, done):
            return
        while collect(1.0):                     # a worker's last report may be in the pipe
            pass
        for role, index, status in _dead(procs, done):
            raise MQError(f"demo {role} {index} exited with status {status} before "
                          "reporting")

    def wait_ready(count: int, what: str) -> None:
        while ready < count:
            collect(0.5)
            check_alive()
            if time.monotonic() - last_change > STALL_S:
                raise MQError(f"demo workers did not {what} within {STALL_S:.0f} s")

    wait_ready(len(procs), "start")
    shares = _stable_shares(socket, args.partitions, [p.pid for p in procs[n_producers:]],
                            check_alive)
    for c in range(n_consumers):
        pipes[c][1].send(shares[c])
    wait_ready(len(procs) + n_consumers, "take their partitions")
    admin = Admin(socket)
    go.set()
    progress.step(f"producing {args.records:,} records of {VALUE_BYTES} B and consuming them")
    with admin:
        while len(done) < len(procs):
            collect(0.1)
            check_alive()
            if not targets_sent and all(("producer", i) in done for i in range(n_producers)):
                ends = [end for _, end in admin.describe_topic(TOPIC)["offsets"]]
                for c in range(n_consumers):
                    pipes[c][1].send(dict(enumerate(ends)))
                targets_sent = True
            sent, c_total = sum(v.value for v in produced), sum(next_offsets)
            if progress.due():
                progress.counters(_progress_line(admin, c_total, args.records,
                                                 sum(v.value for v in redelivered)))
            if sent + c_total != last_total:
                last_total, last_change = sent + c_total, time.monotonic()
            elif time.monotonic() - last_change > STALL_S:
                raise MQError(f"no progress for {STALL_S:.0f} s (sent {sent:,}, "
                              f"consumed {c_total:,})")
    progress.done()
    return _report(args, done, acks, sum(next_offsets))


def _progress_line(admin, consumed: int, records: int, redelivered: int) -> str:
    """``consumed`` must be read before this is called: the log end offsets read here are at
    least as far as any consumer got then, so consumed never shows more than produced."""
    in_log = sum(end for _, end in admin.describe_topic(TOPIC)["offsets"])
    again = f" ({redelivered:,} re-delivered after a rebalance, counted once)" \
        if redelivered else ""
    return f"produced {in_log:,} / {records:,}, consumed {consumed:,}{again}"


def _stable_shares(socket: str, partitions: int, pids: list[int], check_alive
                   ) -> list[list[int]]:
    """Wait until the group is stable with every consumer owning a share; return the shares
    (partition numbers) in the order of ``pids``."""
    from mq.client.admin import Admin
    from mq.errors import GroupIdNotFoundError, MQError
    deadline = time.monotonic() + STALL_S
    with Admin(socket) as admin:
        while time.monotonic() < deadline:
            check_alive()
            try:
                desc = admin.describe_group(GROUP)
            except GroupIdNotFoundError:
                desc = {"state": "Dead", "members": []}
            by_pid = {m["pid"]: [p for _, p in m["assignment"]] for m in desc["members"]}
            if desc["state"] == "Stable" and sorted(by_pid) == sorted(pids) and \
                    all(by_pid.values()) and sum(map(len, by_pid.values())) == partitions:
                return [sorted(by_pid[pid]) for pid in pids]
            time.sleep(0.01)
    raise MQError(f"consumer group {GROUP!r} did not settle within {STALL_S:.0f} s")


def _dead(procs: list, done: dict) -> list[tuple[str, int, int]]:
    """Workers that exited without a "done" report: (role, index, exit status)."""
    out = []
    for p in procs:
        role, _, index = p.name.rpartition("-")
        key = (role.rsplit("-", 1)[-1], int(index))
        if p.exitcode is not None and key not in done:
            out.append((*key, p.exitcode))
    return out


def _rate(stats: dict) -> str:
    seconds = max(stats["end"] - stats["start"], 1e-6)
    return (f"{stats['records']:>11,} records {stats['bytes'] / 1e6:8.1f} MB "
            f"{seconds:7.2f} s {stats['records'] / seconds:>11,.0f} records/s "
            f"{stats['bytes'] / 1e6 / seconds:7.1f} MB/s")


def _total(stats: list[dict], start: float) -> dict:
    """``_rate``'s input for several processes together, timed from ``start``."""
    return {"records": sum(s["records"] for s in stats), "bytes": sum(s["bytes"] for s in stats),
            "start": start, "end": max(s["end"] for s in stats)}


def _report(args, done: dict, acks: list, consumed: int) -> str:
    """``consumed``: distinct records consumed (each partition's offset after the last one
    read, summed)."""
    producers = [done[k] for k in sorted(done) if k[0] == "producer"]
    consumers = [done[k] for k in sorted(done) if k[0] == "consumer"]
    lines = [(f"mq demo: {args.records:,} records ({VALUE_BYTES} B values, {KEYS} keys) "
              f"through topic '{TOPIC}' ({args.partitions} partitions)"), ""]
    for i, stats in enumerate(producers):
        label = f"producer {i} (acks={acks[i]})"
        lines.append(f"  {label:<30}{_rate(stats)}")
    for c, stats in enumerate(consumers):
        parts = ",".join(map(str, stats["partitions"]))
        label = f"consumer {c} (partitions {parts})"
        lines.append(f"  {label:<30}{_rate(stats)}")
    start = min(s["start"] for s in producers + consumers)
    total_p, total_c = _total(producers, start), _total(consumers, start)
    lines.append(f"  {'all producers':<30}{_rate(total_p)}")
    lines.append(f"  {'end to end (all consumed)':<30}{_rate(total_c)}")
    lat = [s["latency"] for s in consumers if s["latency"]]
    if lat:
        lines.append(f"  latency from send() to consumed: p50 {max(x[0] for x in lat)} ms, "
                     f"p99 {max(x[1] for x in lat)} ms, max {max(x[2] for x in lat)} ms "
                     "(worst consumer)")
    ok = consumed == total_p["records"]
    again = sum(s["redelivered"] for s in consumers)
    again_text = f", {again:,} re-delivered after a rebalance" if again else ""
    lines.append(f"  total: {total_p['records']:,} records produced, {consumed:,} "
                 f"consumed{' (all of them)' if ok else ' (MISMATCH)'}{again_text}; "
                 "MB are keys + values")
    lines.append("")
    lines.append("sample records:")
    for s in consumers:
        for partition, offset, ts, key, value, headers in s["samples"][:2]:
            hdrs = ",".join(f"{k}={v.decode(errors='replace')}" for k, v in headers)
            when = datetime.datetime.fromtimestamp(ts / 1000, datetime.UTC)
            lines.append(f"  {TOPIC}-{partition} offset {offset} "
                         f"{when.isoformat(timespec='milliseconds')} "
                         f"key={key.decode(errors='replace')} headers=[{hdrs}] "
                         f"value={value.decode(errors='replace')}")
    if not ok:
        from mq.errors import MQError
        raise MQError(f"consumed {consumed:,} records but produced "
                      f"{total_p['records']:,}")
    return "".join(line + "\n" for line in lines)
