"""The README's examples, run as written against a real broker. "Using it": the shell lines,
then the Python snippet, in that order (both used to create ``orders``, so the second failed
with TopicAlreadyExistsError), and the ``--from-datetime`` line ends by itself. "Exactly
once": the consume-transform-produce loop. "Worker pools": the pool script and command."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

from cli_run import ENV, WAIT, Lines

from mq.client.admin import Admin
from mq.client.consumer import Consumer
from mq.client.producer import Producer
from mq.client.types import TopicPartition
from mq.testing import wait_for

README = Path(__file__).resolve().parents[2] / "README.md"


def _using_it() -> tuple[str, str]:
    section = README.read_text().split("\n## Using it\n", 1)[1].split("\n## ", 1)[0]
    shell = re.search(r"```sh\n(.*?)```", section, re.DOTALL).group(1)
    python = re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)
    return shell, python


def test_using_it_runs_in_order(broker):
    shell, python = _using_it()
    lines = shell.splitlines()
    assert lines[0].startswith("mq broker &")        # the test's broker stands in for it
    script = "\n".join(['set -e', 'mq() { "$PYTHON" -m mq "$@"; }', *lines[1:]])
    env = {**ENV, "MQ_SOCKET": broker.socket, "PYTHON": sys.executable,
           "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=WAIT, check=False)   # no line waits for Ctrl-C
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert "order-1\t{\"qty\": 2}" in done.stdout      # --from-datetime with --print-key

    # The Python snippet ends in a consumer loop that blocks when caught up, by design: read
    # until it has printed the 2 shell records and its own 2, then stop it.
    proc = subprocess.Popen([sys.executable, "-c", python], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        out = Lines(proc.stdout)
        records, metadata = [], []
        while len(records) < 4:
            line = out.next(WAIT)
            assert line is not None, (records, metadata, proc.poll(), proc.stderr.read1())
            text = line.decode()
            if text.startswith("RecordMetadata("):      # add_callback(print): fn(metadata)
                metadata.append(text)
            else:
                records.append(text)
        assert sorted(r.split(" ", 2)[2] for r in records) == [
            "b'...'\n", "b'{\"qty\": 2}'\n", "b'{\"qty\": 2}'\n", "b'{\"qty\": 5}'\n"]
        assert len(metadata) == 1 and "topic='orders'" in metadata[0]
        assert proc.poll() is None                      # still consuming, as documented
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def _section_block(title: str, lang: str) -> str:
    """The first ``lang`` code block of the README section whose title starts ``title``."""
    section = README.read_text().split(f"\n## {title}", 1)[1].split("\n## ", 1)[0]
    return re.search(rf"```{lang}\n(.*?)```", section, re.DOTALL).group(1)


def test_the_exactly_once_example_runs(broker):
    """The consume-transform-produce loop, as written: every order becomes one invoice,
    visible to read_committed readers, and the group's offsets move with them."""
    with Admin(broker.socket) as admin:
        admin.create_topic("orders", 2)
        admin.create_topic("invoices", 1)
    with Producer(socket=broker.socket) as p:
        for i in range(6):
            p.send("orders", value=b"order-%d" % i, key=b"k%d" % i)
    env = {**ENV, "MQ_SOCKET": broker.socket}
    proc = subprocess.Popen([sys.executable, "-c", _section_block("Exactly once", "python")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tp = TopicPartition("invoices", 0)
    try:
        with Consumer(socket=broker.socket, isolation_level="read_committed") as c:
            c.assign([tp])

            def six_invoices() -> bool:
                assert proc.poll() is None, proc.stderr.read().decode()
                return c.end_offsets([tp])[tp] >= 6 + 1          # 6 records and a marker
            wait_for(six_invoices, timeout=WAIT, message="the invoices")
            c.seek_to_beginning()
            got = sorted(bytes(r.value) for rs in c.poll(timeout_ms=2000).values() for r in rs)
        assert got == sorted(b"order-%d" % i for i in range(6))
        with Consumer(socket=broker.socket, group_id="billing") as c:
            ends = c.end_offsets([TopicPartition("orders", p) for p in (0, 1)])
            assert {tp: c.committed(tp) for tp in ends} == ends
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_the_worker_pool_example_runs(broker, tmp_path):
    """"Worker pools", as written, on a broker with "orders" (from "Using it") and nothing
    else: the shell block's `mq topics create` lines, then the Python block as jobs.py, then
    its `mq workers run` line, each pool until every order has its invoice, the rest of the
    shell block (stats, redrive) while the last pool runs, and SIGTERM drains each. No record
    is dead-lettered (the example used to fail: no dead-letter topic, then every record
    dead-lettered for want of "invoices")."""
    (tmp_path / "jobs.py").write_text(_section_block("Worker pools", "python"))
    lines = [re.sub(r"\s+#.*$", "", line) for line in
             _section_block("Worker pools", "sh").splitlines()]
    lines = [line for line in lines if line.strip()]
    pools = ["python3 jobs.py", *(line for line in lines if line.startswith("mq workers run"))]
    setup = [line for line in lines if line.startswith("mq topics create")]
    rest = [line for line in lines if line not in setup and not
            line.startswith(("python3 jobs.py", "mq workers run"))]
    with Admin(broker.socket) as admin:
        admin.create_topic("orders", 6)
    env = {**ENV, "MQ_SOCKET": broker.socket, "PYTHON": sys.executable}
    # ``mq`` and ``python3`` are this interpreter's, exec'd: a signal reaches the command.
    prelude = 'mq() { exec "$PYTHON" -m mq "$@"; }\npython3() { exec "$PYTHON" "$@"; }\n'

    def run(line: str) -> None:
        done = subprocess.run(["bash", "-c", prelude + line], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=WAIT, check=False)
        assert done.returncode == 0, (line, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr

    def count(topic: str) -> int:
        with Admin(broker.socket) as admin:
            if topic not in admin.list_topics():
                return 0
            return sum(end for _, end in admin.describe_topic(topic)["offsets"])

    for line in setup:
        run(line)
    orders = 0
    for n, line in enumerate(pools):
        with Producer(socket=broker.socket) as p:
            for i in range(12):
                p.send("orders", value=b'{"qty": %d}' % i, key=b"order-%d" % (orders + i))
        orders += 12
        log = tmp_path / f"pool{n}.stderr"
        with open(log, "wb") as err:
            proc = subprocess.Popen(["bash", "-c", prelude + line], env=env, cwd=tmp_path,
                                    stdout=subprocess.DEVNULL, stderr=err)
        try:
            def all_invoiced() -> bool:
                assert proc.poll() is None, (line, log.read_text())
                return count("invoices") >= orders
            wait_for(all_invoiced, timeout=WAIT, message=f"{line}: the invoices")
            if n == len(pools) - 1:
                for other in rest:                     # `mq workers stats` needs a pool
                    run(other)
            proc.send_signal(signal.SIGTERM)           # drains, commits, exits 0
            assert proc.wait(WAIT) == 0, (line, log.read_text())
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert count("invoices") == orders
    assert count("orders.dlq") == 0
