"""A transactional producer in a child process, driven step by step by the test (fencing two
processes on one transactional id, SIGKILL inside a transaction).

Run as ``python txn_workers.py <json: socket, transactional_id, transaction_timeout_ms>``
(``TxnWorker`` does it): a fresh interpreter, never a fork of the test process. It reads one
command a line on stdin and answers each with one JSON line on stdout: ``{"ok": true,
"result": ...}`` or ``{"ok": false, "error": <exception class name>, "message": ...}``.
Commands: ``init``, ``begin``, ``send TOPIC PARTITION VALUE`` (waits for the record's
acknowledgement), ``send-nowait TOPIC PARTITION VALUE``, ``flush``, ``commit``, ``abort``,
``exit``.
"""

from __future__ import annotations

import json
import select
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).resolve()
WAIT = 60


class TxnWorker:
    """The test's side: a child process with a transactional producer."""

    def __init__(self, socket: str, transactional_id: str, **settings) -> None:
        args = {"socket": socket, "transactional_id": transactional_id, **settings}
        self.proc = subprocess.Popen([sys.executable, str(WORKER), json.dumps(args)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def do(self, command: str, timeout: float = WAIT) -> dict:
        """Run one command; returns the child's answer."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.close()
            raise AssertionError(f"worker gave no answer to {command!r} (exit "
                                 f"{self.proc.returncode})")
        return json.loads(line)

    def ok(self, command: str, timeout: float = WAIT):
        answer = self.do(command, timeout)
        assert answer["ok"], f"{command!r} failed: {answer}"
        return answer["result"]

    def kill(self) -> None:
        """SIGKILL: the producer vanishes mid-whatever."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(b"exit\n")
                self.proc.stdin.flush()
                self.proc.wait(WAIT)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def _main() -> None:
    import mq
    args = json.loads(sys.argv[1])
    producer = mq.Producer(socket=args.pop("socket"), linger_ms=0, **args)
    for line in sys.stdin:
        command, *rest = line.split()
        try:
            if command == "exit":
                break
            result = None
            if command == "init":
                producer.init_transactions()
            elif command == "begin":
                producer.begin_transaction()
            elif command in ("send", "send-nowait"):
                topic, partition, value = rest
                fut = producer.send(topic, value=value.encode(), partition=int(partition))
                if command == "send":
                    result = fut.get(timeout=WAIT).offset
            elif command == "flush":
                producer.flush(timeout=WAIT)
            elif command == "commit":
                producer.commit_transaction()
            elif command == "abort":
                producer.abort_transaction()
            else:
                raise ValueError(f"unknown command {command!r}")
            answer = {"ok": True, "result": result}
        except Exception as err:   # noqa: BLE001 -- reported to the test
            answer = {"ok": False, "error": type(err).__name__, "message": str(err)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    producer.close(timeout=5)


if __name__ == "__main__":
    _main()
