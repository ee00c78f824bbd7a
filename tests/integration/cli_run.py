"""Running ``python -m mq`` as a real process in the CLI tests, and checking its output."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import subprocess
import sys
import time

WAIT = 60              # seconds: a generous bound for one command on a loaded 2-core box
ENV = {k: v for k, v in os.environ.items()
       if k not in ("MQ_SOCKET", "MQ_DATA_DIR", "XDG_STATE_HOME")}
ENV["PYTHONIOENCODING"] = "utf-8"


class Result:
    def __init__(self, proc: subprocess.CompletedProcess) -> None:
        self.code = proc.returncode
        self.raw = proc.stdout
        self.out = proc.stdout.decode("utf-8", "replace")
        self.err = proc.stderr.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"exit {self.code}\nstdout: {self.out[-2000:]}\nstderr: {self.err[-2000:]}"


def mq_run(*args, stdin: bytes = b"", env: dict | None = None, timeout: float = WAIT) -> Result:
    proc = subprocess.run([sys.executable, "-m", "mq", *map(str, args)], input=stdin,
                          capture_output=True, env=env or ENV, timeout=timeout, check=False)
    return Result(proc)


@contextlib.contextmanager
def mq_process(*args):
    """``python -m mq ARGS`` running with stdout and stderr piped; killed on the way out if
    the test did not end it (a failed assertion must not leave it running)."""
    proc = subprocess.Popen([sys.executable, "-m", "mq", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            stream.close()


def json_lines(result: Result) -> list[dict]:
    """stdout as JSON Lines: one object a line."""
    return [json.loads(line) for line in result.out.splitlines()]


def json_value(data) -> str | dict | None:
    """A key, value or header value as the CLI's ``--json`` shows it: the text if it is UTF-8,
    else ``{"base64": ...}``; None for null."""
    if data is None:
        return None
    raw = bytes(data)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(raw).decode()}


def ok(result: Result) -> Result:
    assert result.code == 0, result
    assert "Traceback" not in result.err, result
    return result


def assert_help(command: tuple[str, ...], socket: bool = True) -> None:
    """``mq COMMAND --help`` exits 0 and prints usage, a description, examples (and the
    ``--socket`` option where the command talks to a broker)."""
    result = ok(mq_run(*command, "--help"))
    assert result.err == ""
    assert result.out.startswith("usage: mq " + " ".join(command))
    assert "examples:" in result.out
    if socket:
        assert "--socket" in result.out
    body = result.out.split("\n\n", 2)
    assert len(body) == 3 and len(body[1].split()) >= 5, "a description follows the usage"


def assert_one_error(result: Result, *fragments: str, code: int | None = None) -> str:
    """Non-zero exit (``code`` if given), exactly one ``mq: error:`` line, no traceback."""
    assert result.code != 0, result
    if code is not None:
        assert result.code == code, result
    assert "Traceback" not in result.out + result.err, result
    lines = result.err.splitlines()
    assert len(lines) == 1, result
    assert lines[0].startswith("mq: error: "), result
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


class Lines:
    """Lines of a child's stdout read through ``select`` + ``os.read`` (a buffered reader
    would hide lines it already holds from ``select``)."""

    def __init__(self, stream) -> None:
        self.fd = stream.fileno()
        self.buf = b""

    def next(self, timeout: float) -> bytes | None:
        """The next line, or None if none is complete within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line + b"\n"
