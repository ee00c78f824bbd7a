"""Clear errors where issue 19's attack found unclear ones: each bad input through every door
it enters — the CLI's flags (``python -m mq`` as a real process), ``mq.Admin`` (which checks
before sending) and the broker's own request checks (for a client that skips them) — is one
``mq: error:`` line naming the value, the limit and the flag or setting to change, a non-zero
exit and no traceback. Each test has its own broker, data dir, socket and group names.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid

import pytest
from brokers import broker_with, create_topic
from cli_run import ENV, assert_one_error, mq_run, ok

from mq.client.admin import Admin
from mq.client.connection import Connection
from mq.client.types import TopicPartition
from mq.errors import (
    ConfigError,
    InvalidPartitionsError,
    InvalidRequestError,
    LocalProtocolError,
)
from mq.protocol.messages import Api

HUGE = "100000000000000000000000"


# --- partition counts -----------------------------------------------------------------------

@pytest.mark.parametrize("args, value", [
    (("topics", "create", "x", "--partitions", HUGE), HUGE),
    (("topics", "create", "x", "--partitions", "10001"), "10001"),
    (("topics", "create", "x", "--partitions", "0"), "0"),
    (("topics", "create", "x", "--partitions", "-3"), "-3"),
    (("topics", "alter", "t", "--partitions", "999999"), "999999"),
    (("topics", "alter", "t", "--partitions", HUGE), HUGE),
])
def test_a_partition_count_out_of_range_names_the_flag_and_the_limit(broker, args, value):
    result = mq_run(*args, "--socket", broker.socket)
    assert_one_error(result, "argument --partitions: a topic has 1 to 10000 partitions, "
                             f"got {value}", code=2)


def test_a_partition_count_that_does_not_grow_says_how_it_may_change(broker):
    create_topic(broker, "t", 2)
    for extra in ((), ("--config", "retention.ms=5")):
        result = mq_run("topics", "alter", "t", "--partitions", "2", *extra,
                        "--socket", broker.socket)
        assert_one_error(result, "--partitions 2: topic 't' has 2 partitions and partitions can "
                                 "only be added: the new total must be 3 to 10000, got 2",
                         code=1)
    with Admin(broker.socket) as admin:
        assert admin.describe_topic("t")["overrides"] == {}, "nothing was half applied"


def test_admin_checks_a_partition_count_before_sending(broker):
    create_topic(broker, "t")
    with Admin(broker.socket) as admin:
        for bad in (10 ** 23, 0, 1.5, "3"):
            with pytest.raises(InvalidPartitionsError, match="partition"):
                admin.create_topic("x", bad)
        with pytest.raises(InvalidPartitionsError, match=f"1 to 10000 partitions, got {HUGE}"):
            admin.create_partitions("t", 10 ** 23)
        assert admin.list_topics() == ["t"]


def test_the_broker_checks_a_count_another_client_sends(broker):
    """A client that skips the checks gets INVALID_PARTITIONS or INVALID_REQUEST with the
    message, for any count msgpack can carry (up to 2**64 - 1)."""
    create_topic(broker, "t")
    conn = Connection(broker.socket)
    try:
        for count in (0, 10_001, (1 << 64) - 1, -(1 << 63)):
            with pytest.raises(InvalidPartitionsError,
                               match=f"^a topic has 1 to 10000 partitions, got {count}$"):
                conn.call(Api.CREATE_TOPICS, "x", count, {})
        with pytest.raises(InvalidPartitionsError,
                           match="^topic 't' has 1 partition and partitions can only be added"):
            conn.call(Api.CREATE_PARTITIONS, "t", 1)
        with pytest.raises(InvalidPartitionsError, match="got 18446744073709551615$"):
            conn.call(Api.CREATE_PARTITIONS, "t", (1 << 64) - 1)
        with pytest.raises(InvalidRequestError, match="field 'partitions' has the wrong type"):
            conn.call(Api.CREATE_TOPICS, "x", "3", {})
    finally:
        conn.close()
    with Admin(broker.socket) as admin:
        assert admin.list_topics() == ["t"]


def test_kafkas_replication_factor_takes_only_1(broker):
    result = mq_run("topics", "create", "x", "--replication-factor", "3", "--socket",
                    broker.socket)
    assert_one_error(result, "--replication-factor 3: mq keeps one copy of each partition "
                             "(on one host), so only 1 is possible", code=2)
    ok(mq_run("topics", "create", "x", "--replication-factor", "1", "--socket", broker.socket))


def test_too_few_state_slots_names_the_setting(tmp_path):
    # 8 slots, two of them the internal topics' (__consumer_offsets, __transaction_state).
    with broker_with(tmp_path, state_slots=8) as b:
        for args in (("topics", "create", "big", "--partitions", "9"),
                     ("topics", "alter", "small", "--partitions", "8")):
            if args[1] == "alter":
                create_topic(b, "small")
            free = 6 if args[1] == "create" else 5
            result = mq_run(*args, "--socket", b.socket)
            assert_one_error(result, f"--partitions {args[-1]}: not enough state slots for ",
                             f"{free} of the broker's 8 are free; raise state_slots in its "
                             "config file (at most 1048576) and restart it", code=1)


# --- offsets --------------------------------------------------------------------------------

def test_offsets_out_of_kafkas_int64_are_refused_before_sending_and_by_the_broker(broker):
    """Was ``cannot encode message`` from Admin, and an UnknownServerError with a traceback
    in the broker's log for a committed offset of 2**64 - 1 from another client."""
    create_topic(broker, "t")
    int64 = "must be 0 to 9223372036854775807 (Kafka's int64)"
    with Admin(broker.socket) as admin:
        with pytest.raises(ValueError, match=re.escape(f"before_offset {int64}, got {HUGE}")):
            admin.delete_records("t", 0, 10 ** 23)
        with pytest.raises(ValueError, match=re.escape(f"the offset of t-0 {int64}, got -1")):
            admin.alter_group_offsets("g", {TopicPartition("t", 0): -1})
        with pytest.raises(ValueError, match=re.escape(f"the offset of t-0 {int64}, got {HUGE}")):
            admin.alter_group_offsets("g", {TopicPartition("t", 0): 10 ** 23})
    conn = Connection(broker.socket)
    try:
        with pytest.raises(InvalidRequestError, match=re.escape(
                f"the offset of t-0 {int64}, got {(1 << 64) - 1}")):
            conn.call(Api.OFFSET_COMMIT, "g", "", -1, [["t", 0, (1 << 64) - 1, -1, ""]])
        with pytest.raises(InvalidRequestError, match="the leader epoch of t-0 must be -1 to "
                                                      "2147483647, got 1099511627776"):
            conn.call(Api.OFFSET_COMMIT, "g", "", -1, [["t", 0, 1, 1 << 40, ""]])
        with pytest.raises(InvalidRequestError, match=re.escape(
                f"the offset to delete records before {int64}, got -7")):
            conn.call(Api.DELETE_RECORDS, "t", 0, -7)
        # A door nothing checks: the frame encoder names the api and the integer.
        with pytest.raises(LocalProtocolError, match=re.escape(
                f"LIST_OFFSETS request: cannot encode message: integer {HUGE} is outside "
                "msgpack's -2**63..2**64-1")):
            conn.call(Api.LIST_OFFSETS, "t", 0, 10 ** 23)
        assert conn.call(Api.LIST_OFFSETS, "t", 0, -1)["offset"] == 0, "the connection works"
    finally:
        conn.close()
    with Admin(broker.socket) as admin:
        assert admin.list_group_offsets("g") == {}
    assert "Traceback" not in broker.stderr()


# --- socket paths ---------------------------------------------------------------------------

def test_a_socket_path_too_long_for_unix_sockets_says_so(tmp_path):
    long_path = str(tmp_path / ("s" * (120 - len(str(tmp_path)))))
    size = len(long_path.encode())
    why = f"is {size} bytes, more than the 107 a Unix socket path can have"
    result = mq_run("topics", "list", "--socket", long_path)
    assert_one_error(result, f"cannot connect to the broker: socket path {long_path} {why}",
                     "--socket", code=2)
    result = mq_run("topics", "list", env=dict(ENV, MQ_SOCKET=long_path))
    assert_one_error(result, why, "$MQ_SOCKET", code=2)
    with pytest.raises(ConfigError, match=why):
        Admin(long_path)

    data = tmp_path / "data"
    result = mq_run("broker", "--data-dir", data, "--socket", long_path)
    assert_one_error(result, f"--socket: socket path {long_path} {why}", code=2)
    result = mq_run("broker", "--data-dir", data, env=dict(ENV, MQ_SOCKET=long_path))
    assert_one_error(result, f"$MQ_SOCKET: socket path {long_path} {why}", code=2)
    # The default socket, <data dir>/mq.sock, is checked before the data dir is touched.
    deep = os.path.dirname(long_path)
    deep = os.path.join(deep, "d" * (110 - len(deep)))
    result = mq_run("broker", "--data-dir", deep)
    assert_one_error(result, f"socket path {deep}/mq.sock is ", "set socket (--socket, "
                     "$MQ_SOCKET) to a shorter path", code=2)
    assert not os.path.exists(deep)


# --- the broker's config --------------------------------------------------------------------

@pytest.mark.parametrize("line, message", [
    ("state_slots = 100000000000", "state_slots must be an integer from 1 to 1048576 (64 MiB "
                                   "of shared memory at 64 bytes a slot), got 100000000000"),
    ("state_slots = 1e11", "state_slots must be an integer from 1 to 1048576"),
    ("max_request_bytes = 4294967296", "max_request_bytes must be an integer from 1 to "
                                       "2147483647"),
    ('socket = 5', "socket must be a string, got 5"),
    ('[topic_defaults]\n"segment.bytes" = 4294967296', "topic_defaults: segment.bytes must be "
                                                        "at most 2147483647"),
])
def test_a_bad_config_value_is_one_line_naming_the_file_and_the_range(tmp_path, line, message):
    conf = tmp_path / "mq.toml"
    conf.write_text(line + "\n")
    result = mq_run("broker", "--data-dir", tmp_path / "data", "--config", conf)
    assert_one_error(result, f"config file {conf}: {message}", code=2)
    assert not os.path.exists(tmp_path / "data" / "meta.properties"), "refused before start"


# --- mq workers stats -----------------------------------------------------------------------

def test_workers_stats_of_a_group_without_a_running_pool_says_so(tmp_path):
    group = f"errors-{uuid.uuid4().hex}"
    result = mq_run("workers", "stats", group)
    assert_one_error(result, f"no worker pool of group {group!r} is running (none has a "
                             "counter table in ", code=1)
    # A pool killed with SIGKILL leaves its table behind: that pool has ended.
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                            capture_output=True, text=True, check=True)
    pid = int(exited.stdout)
    from workers.stats import stats_dir
    stale = os.path.join(stats_dir(), f"mq-workers-{group}-{pid}.stats")
    with open(stale, "wb"):
        pass
    try:
        result = mq_run("workers", "stats", group, "--json")
        assert_one_error(result, f"no worker pool of group {group!r} is running: its pool "
                                 f"(pid {pid}) has ended", code=1)
    finally:
        os.unlink(stale)
