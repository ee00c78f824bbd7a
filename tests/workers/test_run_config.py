"""``workers.run(handler, config)`` and ``workers.run(handler, **options)``: one ``PoolConfig``
either way. The argument checks need no broker (they come before it is asked); the config form
then runs a real pool from a script, as the keyword form does in ``test_parts``."""

from __future__ import annotations

import os
import textwrap

import pytest
from wk_pool import produce, run_pool_script

import mq
import mq.testing
import workers
from workers.config import HandlerRef, PoolConfig
from workers.failures import error_text


def test_options_build_the_same_config_as_pool_config():
    """What users write (a list of topics, one topic, no processes) becomes the values a
    child receives: topics a tuple, processes the CPU count."""
    listed = PoolConfig(topics=["jobs", "more"], group_id="g")
    assert listed.topics == ("jobs", "more")
    assert listed.processes == (os.cpu_count() or 1)
    assert PoolConfig(topics="jobs", group_id="g", processes=None).topics == ("jobs",)
    assert PoolConfig(topics="jobs", group_id="g", processes=3).processes == 3
    full = PoolConfig(handler=HandlerRef("m", "f"), topics=["jobs"], group_id="g",
                      sys_path=["/x"], stats_path="/nowhere")
    assert PoolConfig.from_json(full.to_json()) == full
    with pytest.raises(TypeError):
        PoolConfig(HandlerRef("m", "f"), ("jobs",), "g")      # keywords only


@pytest.mark.parametrize("args, kwargs, message", [
    ((PoolConfig(topics=["jobs"], group_id="g"),), dict(processes=2),
     r"takes a PoolConfig or keyword options, not both: got a config and processes"),
    ((["jobs"],), dict(group_id="g"), r"config must be a workers.PoolConfig, got list"),
    ((), dict(topics=["jobs"], group_id="g", procesess=2), r"unknown options procesess"),
    ((), dict(topics=["jobs"], group_id="g", sys_path=()), r"unknown options sys_path"),
    ((), dict(topics=["jobs"]), r"needs group_id \(or a PoolConfig\)"),
    ((), {}, r"needs topics and group_id"),
])
def test_run_refuses_mixed_or_unknown_settings(args, kwargs, message):
    """Refused in one line before any broker is asked (there is none here)."""
    with pytest.raises(TypeError, match=message):
        workers.run(error_text, *args, **kwargs)


def test_run_checks_the_settings_built_from_options():
    with pytest.raises(ValueError, match="processes must be 1 to 1024"):
        workers.run(error_text, topics=["jobs"], group_id="g", processes=0)


def test_workers_run_with_a_pool_config(broker, tmp_path):
    """``workers.run(handle, PoolConfig(...))`` from a script: the pool handles every record
    and drains on SIGTERM, the same as the keyword form."""
    with mq.Admin(broker.socket) as admin:
        admin.create_topic("jobs", 2)
    produce(broker.socket, "jobs", [b"v%d" % i for i in range(20)], partition=lambda i: i % 2)
    events = tmp_path / "events.txt"
    script = tmp_path / "config_script.py"
    script.write_text(textwrap.dedent(f"""
        import workers

        def handle(record):
            with open({str(events)!r}, "a") as f:
                f.write(f"{{record.partition}} {{record.offset}}\\n")

        if __name__ == "__main__":
            config = workers.PoolConfig(topics=["jobs"], group_id="c", processes=2,
                                        socket={broker.socket!r},
                                        stats_path={str(tmp_path / 'c.stats')!r})
            raise SystemExit(workers.run(handle, config))
        """))
    run_pool_script(script, broker.socket, "c", "jobs", tmp_path)
    lines = events.read_text().split("\n")[:-1]
    assert sorted(lines) == sorted(f"{i % 2} {i // 2}" for i in range(20))
