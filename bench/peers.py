"""The peers bench/e2e.py measures mq against, on the same box in the same run: Redis Streams
(redis-server over a Unix socket, AOF ``everysec``), NATS JetStream (file storage, loopback),
``multiprocessing.Queue``, a ZeroMQ PUSH/PULL pipe over ``ipc://`` (no persistence: the
ceiling for one socket hop) and a SQLite table in WAL mode (``synchronous=NORMAL``: the commit
is in the WAL in the page cache, fsynced at checkpoints, like mq's acks=1). This module
installs what is missing, starts and always stops the servers, and holds the peers' producer
and consumer worker functions.

Every worker has the signature of ``bench.harness.run_workers`` jobs: ``fn(start, **kw)``; it
sets itself up, calls ``start()`` (the shared barrier), runs, and returns a dict with
``t_first``/``t_end``/``t_last`` in ``perf_counter_ns``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import os
import shutil
import signal
import socket
import sqlite3
import struct
import subprocess
import tempfile
import time
from collections.abc import Iterator

from bench.harness import new_hist, pip_install_missing, progress, quiet_gc

REDIS_PIPELINE = 100          # XADD commands per round trip (throughput)
REDIS_READ_COUNT = 500        # XREADGROUP COUNT
NATS_GATHER = 100             # js.publish calls gathered per await (throughput)
NATS_FETCH = 500              # pull consumer fetch(batch)
SQLITE_BATCH = 100            # INSERTs per transaction (one commit per batch, as Redis' pipeline)
SQLITE_READ = 500             # rows per SELECT of the polling reader
SQLITE_SYNCHRONOUS = "NORMAL"  # WAL + NORMAL: no fsync per commit, like mq acks=1
SQLITE_IDLE_S = 0.0002        # the reader's sleep when it found no new row

_PIP = {"redis": "redis", "hiredis": "hiredis", "nats": "nats-py", "hdrh": "hdrhistogram",
        "zmq": "pyzmq", "matplotlib": "matplotlib"}
_APT = {"redis-server": "redis-server", "nats-server": "nats-server"}


# --- installation ---------------------------------------------------------------------------

def ensure_installed() -> dict:
    """apt-get install redis-server / nats-server and pip install redis, hiredis, nats-py,
    hdrhistogram, pyzmq, matplotlib if missing (the `bench` extra). Returns the versions
    found."""
    missing_bin = [b for b in _APT if shutil.which(b) is None and not os.path.exists(
        f"/usr/sbin/{b}")]
    if missing_bin:
        pkgs = [_APT[b] for b in missing_bin]
        progress(f"installing {' '.join(pkgs)} with apt-get")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        r = subprocess.run(["apt-get", "install", "-y", *pkgs], env=env, capture_output=True,
                           check=False)
        if r.returncode != 0:
            subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=True)
            subprocess.run(["apt-get", "install", "-y", *pkgs], env=env, capture_output=True,
                           check=True)
        # Debian's postinst may start redis-server as a service; we run our own instance and
        # leave any system service as the package left it.
    pip_install_missing(_PIP, progress)
    versions = {}
    for pkg in ("redis", "hiredis", "nats-py", "hdrhistogram", "pyzmq", "matplotlib",
                "posix_ipc", "psutil"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    for b in _APT:
        path = shutil.which(b) or f"/usr/sbin/{b}"
        try:
            out = subprocess.run([path, "--version"], capture_output=True, text=True,
                                 timeout=10, check=False).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            out = None
        versions[b] = out
    versions["sqlite"] = sqlite3.sqlite_version
    with contextlib.suppress(ImportError):
        import zmq
        versions["libzmq"] = zmq.zmq_version()
    return versions


# --- servers --------------------------------------------------------------------------------

def _kill_group(proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM the server's process group, then SIGKILL it if it lingers."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def redis_server(base: str) -> Iterator[dict]:
    """redis-server on a Unix socket in a temp dir: ``appendonly yes``, ``appendfsync
    everysec``, no TCP (``port 0``), no RDB snapshots (``save ""``: AOF is the durability);
    everything else default. Yields {"socket", "pid", "dir"}; stopped on exit."""
    import redis
    d = tempfile.mkdtemp(prefix="redis-", dir=base)
    sock = os.path.join(d, "redis.sock")
    cmd = [shutil.which("redis-server") or "/usr/bin/redis-server", "--port", "0",
           "--unixsocket", sock, "--unixsocketperm", "700", "--dir", d,
           "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
           "--daemonize", "no", "--logfile", os.path.join(d, "redis.log")]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                r = redis.Redis(unix_socket_path=sock)
                r.ping()
                r.close()
                break
            except (redis.ConnectionError, FileNotFoundError):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start: "
                                       + _tail(os.path.join(d, "redis.log"))) from None
                time.sleep(0.05)
        yield {"socket": sock, "pid": proc.pid, "dir": d}
    finally:
        _kill_group(proc)
        shutil.rmtree(d, ignore_errors=True)


def _tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:]
    except OSError:
        return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def nats_server(base: str) -> Iterator[dict]:
    """nats-server -js -sd <tmpdir> on 127.0.0.1 and a free port. Yields {"url", "pid",
    "dir"}; stopped on exit."""
    d = tempfile.mkdtemp(prefix="nats-", dir=base)
    port = _free_port()
    cmd = [shutil.which("nats-server") or "/usr/sbin/nats-server", "-js", "-sd", d,
           "-a", "127.0.0.1", "-p", str(port)]
    with open(os.path.join(d, "nats.log"), "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                    if s.recv(4096).startswith(b"INFO"):
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("nats-server did not start: "
                                   + _tail(os.path.join(d, "nats.log")))
            time.sleep(0.05)
        yield {"url": f"nats://127.0.0.1:{port}", "pid": proc.pid, "dir": d}
    finally:
        _kill_group(proc)
        shutil.rmtree(d, ignore_errors=True)


# --- multiprocessing.Queue ------------------------------------------------------------------

def _send_all(start, send, values: list[bytes], n: int) -> tuple[int, int]:
    """The timed loop of a one-call-per-record producer: ``send(values[i % len(values)])``
    ``n`` times after ``start()``; returns (first send, end) in ``perf_counter_ns``."""
    k = len(values)
    quiet_gc()
    start()
    t0 = time.perf_counter_ns()
    for i in range(n):
        send(values[i % k])
    return t0, time.perf_counter_ns()


def mpq_producer(start, queue, values: list[bytes], n: int) -> dict:
    t0, t1 = _send_all(start, queue.put, values, n)
    queue.close()
    queue.join_thread()                       # every item handed to the pipe
    return {"t_first": t0, "t_end": t1, "n": n}


def _recv_all(start, recv, n: int) -> dict:
    """The timed loop of a one-call-per-record consumer: ``len(recv())`` ``n`` times after
    ``start()`` (blocking; ``run_workers``' timeout ends a run that stalls)."""
    nbytes = 0
    quiet_gc()
    start()
    for _ in range(n):
        nbytes += len(recv())
    return {"t_last": time.perf_counter_ns(), "n": n, "bytes": nbytes}


def mpq_consumer(start, queue, n: int) -> dict:
    return _recv_all(start, queue.get, n)


def mpq_lat_producer(start, queue, size: int, rate: float, n: int) -> dict:
    """Open loop: ``put`` one message per call (the queue's feeder thread writes it to the
    pipe), 8-byte intended send time first in the payload."""
    res = _paced(start, queue.put, size, rate, n)
    queue.close()
    queue.join_thread()
    return res


def mpq_lat_consumer(start, queue, n: int, warm: int) -> dict:
    """Blocking ``get`` ``n`` times (the producer puts exactly ``n``; ``run_workers``'
    timeout ends a run that stalls)."""
    return _recv_latencies(start, queue.get, n, warm)


def _paced(start, send, size: int, rate: float, n: int) -> dict:
    """``paced_loop`` from the barrier on (``start()``), each call sending a ``size``-byte
    value that carries its intended send time (``_stamped``). A loop that gave up early
    sends the end marker, an empty value, so a consumer blocked in ``recv()`` stops."""
    stamped = _stamped(send, size)
    quiet_gc()
    start()
    res = paced_loop(stamped, rate, n)
    if res["sent"] < n:
        send(b"")
    return res


def _stamped(send, size: int):
    """``send`` of a ``size``-byte value whose first 8 bytes are the intended send time
    ``t_i`` it is called with (``paced_loop``'s ``send``)."""
    buf = bytearray(b"x" * size)
    pack = struct.Struct("<q").pack_into

    def one(t_i: int) -> None:
        pack(buf, 0, t_i)
        send(bytes(buf))
    return one


def _recv_latencies(start, recv, n: int, warm: int) -> dict:
    """The consumer side of a latency run over a blocking ``recv()``: ``n`` messages, each
    timed by a ``LatencyRecorder`` (``warm`` of them discarded), and the CPU it took."""
    rec = LatencyRecorder(n, warm)
    add, clock = rec.add, time.perf_counter_ns
    quiet_gc()
    start()
    cpu0 = time.process_time()
    for _ in range(n):
        value = recv()
        add(clock(), value)                   # the clock read after the receive
        if rec.ended:
            break                             # the end marker: the producer gave up
    res = rec.result()
    res["cpu_s"] = time.process_time() - cpu0
    return res


# --- ZeroMQ PUSH/PULL over ipc:// ----------------------------------------------------------
#
# The PUSH side closes only once the PULL side says it has every message (``received``, an
# event of the run's, which the consumer sets): closing with LINGER -1 does not wait for them.
# libzmq (4.3.5 here; libzmq#4660) drops what its ipc engine has taken from the socket's queue
# and not yet written when the socket closes, which happens when the consumer lags behind the
# producer; that consumer then waits in ``recv()`` for messages that never come. Seen on a
# loaded box at 50 k/s: the consumer had 24,520 of 25,000 when the producer had exited, and
# the run timed out.

def zmq_address(base: str, name: str) -> str:
    return f"ipc://{os.path.join(base, name)}.zmq"


def zmq_producer(start, address: str, values: list[bytes], n: int, received,
                 timeout_s: float = 120.0) -> dict:
    """PUSH, connected to the consumer's PULL; ``send(bytes)`` with pyzmq's defaults (copy,
    high-water mark 1000 messages); closed once the consumer has them all
    (``_zmq_close_received``)."""
    ctx, s = _zmq_push(address)
    t0, t1 = _send_all(start, s.send, values, n)
    _zmq_close_received(ctx, s, received, n, timeout_s)
    return {"t_first": t0, "t_end": t1, "n": n}


def zmq_consumer(start, address: str, n: int, received) -> dict:
    """PULL, bound before the barrier; blocking ``recv()`` (bytes) ``n`` times, then
    ``received`` set (the producer may close)."""
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.PULL)
    s.bind(address)
    res = _recv_all(start, s.recv, n)
    received.set()
    s.close(linger=0)
    ctx.term()
    return res


def _zmq_push(address: str):
    """A PUSH socket (linger -1) connected to the PULL side's ``address`` once that is bound,
    and its context."""
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, -1)
    deadline = time.monotonic() + 20
    while not os.path.exists(address[len("ipc://"):]):    # the PULL side binds it
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing bound {address}")
        time.sleep(0.001)
    s.connect(address)
    return ctx, s


def _zmq_close_received(ctx, s, received, n: int, timeout_s: float) -> None:
    """Close the PUSH socket and its context once the consumer set ``received`` (it has all
    ``n`` messages), waiting ``timeout_s`` at most: closing earlier may lose the last ones
    (see above). Raises ``RuntimeError`` when the consumer does not say so in time."""
    if not received.wait(timeout_s):
        raise RuntimeError(f"the ZeroMQ consumer did not receive all {n} messages within "
                           f"{timeout_s:g} s of the last send")
    s.close()
    ctx.term()


def zmq_lat_producer(start, address: str, size: int, rate: float, n: int, received,
                     timeout_s: float) -> dict:
    """Open loop: ``send`` one message per call, 8-byte intended send time first; closed once
    the consumer has them all, or ``timeout_s`` after the last send (``_zmq_close_received``)."""
    ctx, s = _zmq_push(address)
    res = _paced(start, s.send, size, rate, n)
    _zmq_close_received(ctx, s, received, n, timeout_s)
    return res


def zmq_lat_consumer(start, address: str, n: int, warm: int, received) -> dict:
    """PULL, bound before the barrier; blocking ``recv()`` ``n`` times, then ``received``
    set."""
    import zmq
    ctx = zmq.Context()
    s = ctx.socket(zmq.PULL)
    s.bind(address)
    res = _recv_latencies(start, s.recv, n, warm)
    received.set()
    s.close(linger=0)
    ctx.term()
    return res


# --- SQLite in WAL mode: a table as a queue ---------------------------------------------------

def _sqlite_connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)      # explicit BEGIN / COMMIT
    db.execute(f"PRAGMA synchronous={SQLITE_SYNCHRONOUS}")
    return db


def sqlite_setup(path: str) -> None:
    """A fresh database file in WAL mode with ``q(id INTEGER PRIMARY KEY, v BLOB)``."""
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE q (id INTEGER PRIMARY KEY, v BLOB NOT NULL)")
    db.close()


def sqlite_teardown(path: str) -> None:
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path + suffix)


def sqlite_producer(start, path: str, values: list[bytes], n: int) -> dict:
    """One writer: ``executemany(INSERT)`` of ``SQLITE_BATCH`` rows per transaction; the
    default WAL auto-checkpoint (1000 pages) runs in this process."""
    db = _sqlite_connect(path)
    k = len(values)
    sql = "INSERT INTO q (v) VALUES (?)"
    quiet_gc()
    start()
    t0 = time.perf_counter_ns()
    for i in range(0, n, SQLITE_BATCH):
        db.execute("BEGIN")
        db.executemany(sql, [(values[j % k],) for j in range(i, min(n, i + SQLITE_BATCH))])
        db.execute("COMMIT")
    t1 = time.perf_counter_ns()
    db.close()
    return {"t_first": t0, "t_end": t1, "n": n}


def sqlite_consumer(start, path: str, n: int, timeout_s: float = 120.0) -> dict:
    """One reader polling by rowid: ``SELECT id, v ... WHERE id > last ORDER BY id LIMIT
    SQLITE_READ``, sleeping ``SQLITE_IDLE_S`` when nothing is new (SQLite has no wake-up)."""
    db = _sqlite_connect(path)
    sql = "SELECT id, v FROM q WHERE id > ? ORDER BY id LIMIT ?"
    got = nbytes = last = 0
    quiet_gc()
    start()
    deadline = time.monotonic() + timeout_s
    while got < n and time.monotonic() < deadline:
        rows = db.execute(sql, (last, SQLITE_READ)).fetchall()
        if not rows:
            time.sleep(SQLITE_IDLE_S)
            continue
        for _, v in rows:
            nbytes += len(v)
        got += len(rows)
        last = rows[-1][0]
    t_last = time.perf_counter_ns()
    db.close()
    return {"t_last": t_last, "n": got, "bytes": nbytes}


# --- Redis Streams --------------------------------------------------------------------------

def redis_setup(sock: str, key: str) -> None:
    import redis
    r = redis.Redis(unix_socket_path=sock)
    r.delete(key)
    r.xgroup_create(key, "g", id="0", mkstream=True)
    r.close()


def redis_teardown(sock: str, key: str) -> None:
    import redis
    r = redis.Redis(unix_socket_path=sock)
    r.delete(key)
    r.close()


def _redis_ack_and_read(r, key: str, streams: dict, ids: list):
    """XACK the previous read's ids and XREADGROUP the next ones in one round trip."""
    if not ids:
        return r.xreadgroup("g", "c", streams, count=REDIS_READ_COUNT, block=100)
    pipe = r.pipeline(transaction=False)
    pipe.xack(key, "g", *ids)
    pipe.xreadgroup("g", "c", streams, count=REDIS_READ_COUNT, block=100)
    return pipe.execute()[1]


def redis_producer(start, sock: str, key: str, values: list[bytes], n: int) -> dict:
    """XADD pipelined ``REDIS_PIPELINE`` per round trip (redis-py + hiredis)."""
    import redis
    r = redis.Redis(unix_socket_path=sock)
    r.ping()
    pipe = r.pipeline(transaction=False)
    k = len(values)
    quiet_gc()
    start()
    t0 = time.perf_counter_ns()
    for i in range(n):
        pipe.xadd(key, {b"v": values[i % k]})
        if i % REDIS_PIPELINE == REDIS_PIPELINE - 1:
            pipe.execute()
    pipe.execute()
    t1 = time.perf_counter_ns()
    r.close()
    return {"t_first": t0, "t_end": t1, "n": n}


def redis_consumer(start, sock: str, key: str, n: int, timeout_s: float = 120.0) -> dict:
    """XREADGROUP COUNT ``REDIS_READ_COUNT`` BLOCK 100 in group "g"; each batch's XACK goes in
    one pipeline with the next XREADGROUP (one round trip per batch)."""
    import redis
    r = redis.Redis(unix_socket_path=sock)
    r.ping()
    got = nbytes = 0
    streams = {key: ">"}
    quiet_gc()
    start()
    deadline = time.monotonic() + timeout_s
    ids: list = []
    while got < n and time.monotonic() < deadline:
        resp = _redis_ack_and_read(r, key, streams, ids)
        ids = []
        for _, entries in resp or ():
            for eid, fields in entries:
                nbytes += len(fields[b"v"])
                ids.append(eid)
            got += len(entries)
    t_last = time.perf_counter_ns()
    if ids:
        r.xack(key, "g", *ids)
    r.close()
    return {"t_last": t_last, "n": got, "bytes": nbytes}


def redis_lat_producer(start, sock: str, key: str, size: int, rate: float, n: int) -> dict:
    """Open loop: XADD one message per call (waits for each reply), 8-byte intended send
    time first in the payload."""
    import redis
    r = redis.Redis(unix_socket_path=sock)
    r.ping()
    xadd = r.xadd
    res = _paced(start, lambda value: xadd(key, {b"v": value}), size, rate, n)
    r.close()
    return res


def redis_lat_consumer(start, sock: str, key: str, n: int, warm: int,
                       timeout_s: float) -> dict:
    import redis
    r = redis.Redis(unix_socket_path=sock)
    r.ping()
    rec = LatencyRecorder(n, warm)
    streams = {key: ">"}
    quiet_gc()
    start()
    cpu0 = time.process_time()
    deadline = time.monotonic() + timeout_s
    ids: list = []
    clock = time.perf_counter_ns
    while rec.got < n and not rec.ended and time.monotonic() < deadline:
        resp = _redis_ack_and_read(r, key, streams, ids)
        now = clock()
        ids = []
        for _, entries in resp or ():
            for eid, fields in entries:
                rec.add(now, fields[b"v"])
                ids.append(eid)
    res = rec.result()
    res["cpu_s"] = time.process_time() - cpu0
    r.close()
    return res


# --- NATS JetStream -------------------------------------------------------------------------

def nats_setup(url: str, stream: str) -> None:
    async def main() -> None:
        import nats
        from nats.js.api import StorageType
        nc = await nats.connect(url)
        js = nc.jetstream()
        with contextlib.suppress(Exception):
            await js.delete_stream(stream)
        await js.add_stream(name=stream, subjects=[f"{stream}.x"], storage=StorageType.FILE)
        await nc.close()
    asyncio.run(main())


def nats_teardown(url: str, stream: str) -> None:
    async def main() -> None:
        import nats
        nc = await nats.connect(url)
        with contextlib.suppress(Exception):
            await nc.jetstream().delete_stream(stream)
        await nc.close()
    asyncio.run(main())


def nats_producer(start, url: str, stream: str, values: list[bytes], n: int) -> dict:
    """``js.publish`` (waits for the PubAck) gathered ``NATS_GATHER`` at a time (nats-py)."""
    async def main() -> dict:
        import nats
        nc = await nats.connect(url)
        js = nc.jetstream()
        subject = f"{stream}.x"
        k = len(values)
        quiet_gc()
        start()
        t0 = time.perf_counter_ns()
        for i in range(0, n, NATS_GATHER):
            await asyncio.gather(*[js.publish(subject, values[j % k])
                                   for j in range(i, min(n, i + NATS_GATHER))])
        t1 = time.perf_counter_ns()
        await nc.close()
        return {"t_first": t0, "t_end": t1, "n": n}
    return asyncio.run(main())


def nats_consumer(start, url: str, stream: str, n: int, timeout_s: float = 120.0) -> dict:
    """Durable pull consumer, ``fetch(NATS_FETCH)``, AckAll policy: the last message of each
    fetched batch is acked (which acks the batch)."""
    async def main() -> dict:
        import nats
        from nats.errors import TimeoutError as NatsTimeout
        from nats.js.api import AckPolicy, ConsumerConfig
        nc = await nats.connect(url)
        js = nc.jetstream()
        sub = await js.pull_subscribe(f"{stream}.x", durable="c", stream=stream,
                                      config=ConsumerConfig(ack_policy=AckPolicy.ALL))
        got = nbytes = 0
        quiet_gc()
        start()
        deadline = time.monotonic() + timeout_s
        while got < n and time.monotonic() < deadline:
            try:
                msgs = await sub.fetch(NATS_FETCH, timeout=1.0)
            except NatsTimeout:
                continue
            for m in msgs:
                nbytes += len(m.data)
            got += len(msgs)
            if msgs:
                await msgs[-1].ack()
        t_last = time.perf_counter_ns()
        await nc.close()
        return {"t_last": t_last, "n": got, "bytes": nbytes}
    return asyncio.run(main())


# --- open-loop pacing and latency recording (shared with the mq workers) --------------------

SPIN_NS = 200_000             # sleep until ~200 us before the intended time, then spin
SEND_SLACK_S = 10.0           # paced_loop gives up this long after the last intended send


def paced_loop(send, rate: float, n: int) -> dict:
    """Call ``send(t_i)`` at t_i = t0 + i/rate (open loop). ``t_i`` is the *intended* time,
    which the payload carries, so a stall delays the receive time but not the intended time
    and shows up in the histogram (no coordinated omission). Besides the clock readings it
    returns the process's CPU over the loop (``cpu_s_loop``) and the CPU this thread spent
    pacing (``pace_cpu_s``: the sleeps and spins to the intended times, read from the thread's
    CPU clock between sends; the spin ends early by the reading's cost): the client's own CPU,
    its send calls and threads, is the difference.

    A system far slower than ``rate`` (saturated) would keep the loop for many times the
    run's length: it stops sending ``SEND_SLACK_S`` after the last intended time, and
    ``sent`` says how many went out (the consumers end at their deadline, or at the end
    marker ``_paced`` sends)."""
    clock, sleep, thread_ns = time.perf_counter_ns, time.sleep, time.thread_time_ns
    interval = 1e9 / rate
    send_hist = new_hist()                    # how long each send() call took, µs
    record = send_hist.record_value
    lead = _reading_ns(thread_ns, clock)
    cpu0 = time.process_time()                # ns resolution: os.times() counts 10 ms ticks
    t0 = clock() + 2_000_000
    give_up = t0 + int(n * interval + SEND_SLACK_S * 1e9)
    late = paced = 0
    sent = n
    for i in range(n):
        t_i = t0 + int(i * interval)
        pace0 = thread_ns()
        now = clock()
        if now > give_up:
            sent = i
            break
        if t_i - now > SPIN_NS:
            sleep((t_i - now - SPIN_NS) / 1e9)
            now = clock()
        while now < t_i - lead:
            now = clock()
        paced += thread_ns() - pace0
        now = clock()
        send(t_i)
        done = clock()
        record((done - now) // 1000 or 1)
        if done - t_i > interval:
            late += 1
    t_end = clock()
    return {"t_first": t0, "t_end": t_end, "n": n, "sent": sent, "late_sends": late,
            "send_rate": sent / ((t_end - t0) / 1e9), "send_call_hist": send_hist.encode(),
            "cpu_s_loop": time.process_time() - cpu0, "pace_cpu_s": paced / 1e9}


def _reading_ns(thread_ns, clock) -> int:
    """The least time (of 1000 tries) a ``thread_ns()`` and a ``clock()`` call take, ns:
    ``paced_loop``'s spin ends that much before the intended time so the send starts on it."""
    best = 1 << 62
    for _ in range(1000):
        t = clock()
        thread_ns()
        clock()
        best = min(best, clock() - t)
    return best


class LatencyRecorder:
    """receive time - intended send time (first 8 bytes of the value) into an HdrHistogram in
    µs; the first ``warm`` messages are left out (warm-up). An empty value is the end marker
    of a producer that gave up (``_paced``): ``ended``, and nothing recorded."""

    __slots__ = ("ended", "first_recv", "got", "hist", "n", "slices", "t_last", "warm")

    def __init__(self, n: int, warm: int) -> None:
        self.n, self.warm, self.got = n, warm, 0
        self.ended = False
        self.hist = new_hist()
        self.t_last = 0
        self.first_recv = 0
        self.slices = [[0, 0] for _ in range(10)]     # (sum us, count) per tenth: lag trend

    def add(self, now: int, value) -> None:
        if not value:
            self.ended = True
            return
        i = self.got
        self.got = i + 1
        if i < self.warm:
            return
        if not self.first_recv:
            self.first_recv = now
        us = (now - _unpack_q(value)[0]) // 1000
        self.hist.record_value(max(us, 1))
        s = self.slices[min(9, (i * 10) // self.n)]
        s[0] += us
        s[1] += 1
        self.t_last = now

    def result(self) -> dict:
        return {"hist": self.hist.encode(), "n": self.got, "t_last": self.t_last,
                "first_recv": self.first_recv,
                "trend_mean_us": [s[0] / s[1] if s[1] else None for s in self.slices]}


_unpack_q = struct.Struct("<q").unpack_from
