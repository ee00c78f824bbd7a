"""mq.logformat: the JSON fields, the plain line, and journald detection by stderr's identity."""

import json
import logging
import os
import sys

from mq import logformat


def _record(msg="hello %s", args=("world",), level=logging.WARNING, exc_info=None):
    return logging.LogRecord("mq.broker", level, __file__, 1, msg, args, exc_info)


def test_json_has_the_stable_fields():
    line = logformat.formatter("json").format(_record())
    obj = json.loads(line)
    assert set(obj) == {"ts", "level", "logger", "msg", "pid"}
    assert obj["level"] == "WARNING" and obj["logger"] == "mq.broker"
    assert obj["msg"] == "hello world" and obj["pid"] == os.getpid()
    assert isinstance(obj["ts"], float)
    assert "\n" not in line


def test_json_traceback_in_exc_on_one_line():
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = _record("failed", (), logging.ERROR, sys.exc_info())
    line = logformat.JsonFormatter().format(record)
    assert "\n" not in line
    obj = json.loads(line)
    assert obj["msg"] == "failed" and "RuntimeError: boom" in obj["exc"]


def test_plain_has_a_time_outside_the_journal():
    line = logformat.PlainFormatter(journal=False).format(_record())
    stamp, rest = line[:23], line[24:]
    assert stamp[4] == "-" and stamp[13] == ":"
    assert rest == "WARNING mq.broker: hello world"


def test_plain_for_journald_has_priority_and_no_time():
    fmt = logformat.PlainFormatter(journal=True)
    assert fmt.format(_record()) == "<4>WARNING mq.broker: hello world"
    assert fmt.format(_record(level=logging.ERROR)).startswith("<3>ERROR ")
    assert fmt.format(_record(level=logging.INFO)).startswith("<6>INFO ")


def test_journal_stream_must_be_stderr_itself(tmp_path):
    with open(tmp_path / "err", "w") as stream, open(tmp_path / "other", "w") as other:
        st = os.fstat(stream.fileno())
        env = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert logformat.stderr_is_journal(env, stream)
        assert not logformat.stderr_is_journal(env, other)
        assert not logformat.stderr_is_journal({}, stream)
        assert not logformat.stderr_is_journal({"JOURNAL_STREAM": "garbage"}, stream)


def test_unknown_format():
    import pytest
    with pytest.raises(ValueError, match="plain or json"):
        logformat.formatter("xml")
