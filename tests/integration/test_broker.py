"""The broker as a real subprocess: bad input never crashes it, signals, locking, durability."""

import os
import signal
import socket
import stat
import struct
import subprocess
import sys

import msgpack
import psutil
import pytest
from brokers import broker_with, create_topic
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mq.testing
from mq.client.admin import Admin
from mq.client.connection import Connection
from mq.errors import (BrokerUnavailableError, CorruptMessageError, InvalidPartitionsError,
                       InvalidRequestError, MessageTooLargeError, UnknownTopicOrPartitionError)
from mq.log.builder import BatchBuilder
from mq.log.log import PartitionLog
from mq.protocol.frames import TAIL_FLAG, encode_frame, encode_tail_frame
from mq.protocol.messages import PROTOCOL_VERSION, Api


@pytest.fixture
def broker(broker):
    """The conftest broker with topic ``t`` of 2 partitions."""
    create_topic(broker, "t", 2)
    return broker


def batch(*values, key=None):
    builder = BatchBuilder()
    for v in values:
        builder.append(1000, key, v)
    return bytes(builder.build())


def raw_socket(b):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(b.socket)
    return s


def greet(s):
    s.sendall(encode_frame([int(Api.HANDSHAKE), 1, PROTOCOL_VERSION, "test", os.getpid()]))
    return read_reply(s)


def read_reply(s):
    head = b""
    while len(head) < 4:
        chunk = s.recv(4 - len(head))
        if not chunk:
            return None
        head += chunk
    (n,) = struct.unpack(">I", head)
    body = b""
    while len(body) < n:
        chunk = s.recv(n - len(body))
        if not chunk:
            return None
        body += chunk
    return msgpack.unpackb(body, raw=False)


def records_in(data_dir, topic, partition):
    with PartitionLog.open(os.path.join(data_dir, f"{topic}-{partition}")) as plog:
        return [bytes(r.value) for b in plog.batches() for r in b.records()]


def assert_alive(b):
    assert b.proc.poll() is None, b.stderr()
    with Connection(b.socket) as c:
        c.call(Api.METADATA, None)


def test_produce_then_list_offsets(broker):
    with Connection(broker.socket) as c:
        first = c.call(Api.PRODUCE, "t", 0, 1, batch(b"a", b"b"))["first_offset"]
        second = c.call(Api.PRODUCE, "t", 0, -1, batch(b"c"))["first_offset"]
        assert (first, second) == (0, 2)
        assert c.call(Api.LIST_OFFSETS, "t", 0, -1)["offset"] == 3
        assert c.call(Api.LIST_OFFSETS, "t", 0, -2)["offset"] == 0


def test_socket_mode_is_0660(broker):
    assert stat.S_IMODE(os.stat(broker.socket).st_mode) == 0o660


def _modes(root) -> dict[str, int]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            if not name.endswith((".sock", ".stderr.log")):
                out[os.path.relpath(path, root)] = stat.S_IMODE(os.lstat(path).st_mode)
    return out


def test_data_files_are_readable_by_the_owner_and_group_only(tmp_path):
    """Who may not connect to the 0660 socket may not read the logs either (file_mode)."""
    data = tmp_path / "data"
    with mq.testing.broker(data) as b:
        create_topic(b, "t", 2)
        with Admin(b.socket) as admin:
            admin.delete_records("t", 0, 0)
        b.stop()                        # checkpoints and the clean-shutdown marker too
    modes = _modes(data)
    assert {"t-0", "t-1", "__cluster_metadata-0", "meta.properties",
            "recovery-point-offset-checkpoint", "t-0/00000000000000000000.log",
            "t-0/00000000000000000000.index"} <= set(modes)
    wide = {name: oct(mode) for name, mode in modes.items() if mode & 0o027}
    assert not wide, wide


def test_file_mode_is_configurable(tmp_path):
    with broker_with(tmp_path, file_mode="0600") as b:
        create_topic(b, "t", 1)
        data = b.data_dir
    modes = _modes(data)
    assert modes["t-0"] == 0o700 and modes["t-0/00000000000000000000.log"] == 0o600


def test_second_broker_on_same_data_dir_exits_with_one_line(broker):
    proc = subprocess.run([sys.executable, "-m", "mq.broker", "--data-dir", broker.data_dir,
                           "--socket", broker.socket + "2"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "in use" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert_alive(broker)


def test_requests_before_handshake_are_refused(broker):
    with raw_socket(broker) as s:
        s.sendall(encode_frame([int(Api.METADATA), 5, None]))
        reply = read_reply(s)
        assert reply[1] == 5 and reply[2] == InvalidRequestError.code


def test_old_client_gets_a_clear_error(broker):
    with raw_socket(broker) as s:
        s.sendall(encode_frame([int(Api.HANDSHAKE), 1, 999, "future-client", os.getpid()]))
        reply = read_reply(s)
        assert reply[2] == 35 and "protocol version 999" in reply[3]
        assert read_reply(s) is None          # and the connection is closed


@pytest.mark.parametrize("frame", [
    b"\x00\x00\x00\x00",                                      # zero-length frame
    b"\xff\xff\xff\xff" + b"x" * 10,                          # oversized length
    struct.pack(">I", 3) + b"\xc1\xc1\xc1",                   # not msgpack
    encode_frame({"not": "an array"})[:4] + msgpack.packb({"not": "an array"}),
    struct.pack(">II", TAIL_FLAG | 10, 7) + b"\x92\x00\x01xxx",   # header past its frame
    struct.pack(">II", TAIL_FLAG | 8, 1) + b"\xc1xxx",             # tail frame, not msgpack
    struct.pack(">I", TAIL_FLAG | 0x7FFFFFFF),                      # oversized tail frame
])
def test_broken_frames_close_only_that_connection(broker, frame):
    with raw_socket(broker) as s:
        greet(s)
        s.sendall(frame)
        assert read_reply(s) is None
    assert_alive(broker)


@pytest.mark.parametrize("message, code", [
    ([9999, 7], InvalidRequestError.code),                                 # unknown api
    ([int(Api.PRODUCE), 7, "t", "zero", 1, b"x"], InvalidRequestError.code),   # wrong type
    ([int(Api.PRODUCE), 7, "t", 0], InvalidRequestError.code),             # missing fields
    ([int(Api.PRODUCE), 7, "t", 0, 1, b"garbage"], CorruptMessageError.code),
    ([int(Api.PRODUCE), 7, "nope", 0, 1, batch(b"x")], UnknownTopicOrPartitionError.code),
    ([int(Api.PRODUCE), 7, "t", 9, 1, batch(b"x")], UnknownTopicOrPartitionError.code),
    ([int(Api.PRODUCE), 7, "t", 0, 5, batch(b"x")], InvalidRequestError.code),
    # found below the handler (the log, the limits), still the client's error
    ([int(Api.PRODUCE), 7, "t", 0, 1, batch(b"x") + batch(b"y")], InvalidRequestError.code),
    ([int(Api.LIST_OFFSETS), 7, "t", 0, -7], InvalidRequestError.code),
    ([int(Api.DELETE_RECORDS), 7, "t", 0, -7], InvalidRequestError.code),
])
def test_bad_requests_get_error_responses(broker, message, code):
    with raw_socket(broker) as s:
        greet(s)
        s.sendall(encode_frame(message))
        reply = read_reply(s)
        assert reply[1] == 7 and reply[2] == code, reply
        s.sendall(encode_frame([int(Api.METADATA), 8, None]))     # the connection still works
        assert read_reply(s)[2] == 0
    assert records_in_broker(broker) == []
    assert "Traceback" not in broker.stderr()             # a client's error, not a bug


@pytest.mark.parametrize("suffix", ["\x00x", "/x", "x" * 300])
def test_a_wait_on_a_semaphore_name_posix_ipc_refuses_is_the_clients_error(broker, suffix):
    """posix_ipc crashes the process on a name with a NUL byte, and raises ValueError for one
    with a '/' inside or too long: the client's mistake, answered INVALID_REQUEST."""
    with raw_socket(broker) as s:
        prefix = greet(s)[5]["semaphore_prefix"]
        s.sendall(encode_frame([int(Api.WAIT), 7, prefix + suffix, [["t", 0, 0]]]))
        reply = read_reply(s)
        assert reply is not None and reply[1] == 7, reply
        assert reply[2] == InvalidRequestError.code, reply
    assert_alive(broker)
    assert "Traceback" not in broker.stderr()


def test_a_wait_without_a_semaphore_is_answered_by_a_push_once_per_arming(broker):
    """WAIT naming no semaphore: the wake-up is ``[1000, 0, 0, nil]`` on the connection (an
    event loop's consumer), pushed once when data passes the position, and again only after
    the next WAIT."""
    wake = [int(Api.WAIT), 0, 0, None]
    with raw_socket(broker) as s, Connection(broker.socket) as producer:
        greet(s)
        s.sendall(encode_frame([int(Api.WAIT), 2, "", [["t", 0, 0]]]))
        producer.call(Api.PRODUCE, "t", 0, 1, batch(b"a"))
        assert read_reply(s) == wake
        producer.call(Api.PRODUCE, "t", 0, 1, batch(b"b"))      # fired: nothing more
        s.sendall(encode_frame([int(Api.LIST_OFFSETS), 3, "t", 0, -1]))
        assert read_reply(s)[:5] == [int(Api.LIST_OFFSETS), 3, 0, None, 2]
        s.sendall(encode_frame([int(Api.WAIT), 4, "", [["t", 0, 2]]]))   # armed again
        producer.call(Api.PRODUCE, "t", 0, 1, batch(b"c"))
        assert read_reply(s) == wake
        s.sendall(encode_frame([int(Api.WAIT), 5, "", [["t", 0, 1]]]))   # data there: at once
        assert read_reply(s) == wake
    assert_alive(broker)


def records_in_broker(b):
    with Connection(b.socket) as c:
        return [c.call(Api.LIST_OFFSETS, "t", p, -1)["offset"] for p in (0, 1) if
                c.call(Api.LIST_OFFSETS, "t", p, -1)["offset"]]


def tail_frame(message):
    head, tail = encode_tail_frame(message)
    return head + bytes(tail)


def test_a_batch_sent_as_a_frame_tail_is_stored_as_sent(broker):
    with Connection(broker.socket) as c:
        assert c.broker_info["frame_tail"]                # so Produce goes out as tail frames
    with raw_socket(broker) as s:
        greet(s)
        for rid in (2, 3):
            s.sendall(tail_frame([int(Api.PRODUCE), rid, "t", 1, 1, batch(b"a", b"b")]))
        assert [read_reply(s)[4] for _ in range(2)] == [0, 2]
        s.sendall(tail_frame([int(Api.PRODUCE), 4, "t", 1, 1, batch(b"x")[:-1]]))
        assert read_reply(s)[2] == CorruptMessageError.code
    broker.stop()
    assert records_in(broker.data_dir, "t", 1) == [b"a", b"b", b"a", b"b"]


def test_bad_crc_never_reaches_the_log(broker):
    good = bytearray(batch(b"hello"))
    good[-1] ^= 0xFF
    with Connection(broker.socket) as c:
        with pytest.raises(CorruptMessageError):
            c.call(Api.PRODUCE, "t", 0, 1, bytes(good))
        assert c.call(Api.LIST_OFFSETS, "t", 0, -1)["offset"] == 0


def test_oversized_batch_is_refused(broker):
    create_topic(broker, "small", 1, {"max.message.bytes": "200"})
    with Connection(broker.socket) as c, pytest.raises(MessageTooLargeError):
        c.call(Api.PRODUCE, "small", 0, 1, batch(b"x" * 500))


def test_client_dying_mid_request_leaves_no_trace(broker):
    frame = encode_frame([int(Api.PRODUCE), 2, "t", 0, 1, batch(b"half")])
    with raw_socket(broker) as s:
        greet(s)
        s.sendall(frame[: len(frame) // 2])
    assert_alive(broker)
    with Connection(broker.socket) as c:
        assert c.call(Api.LIST_OFFSETS, "t", 0, -1)["offset"] == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(max_size=300), handshake=st.booleans())
def test_garbage_never_crashes_the_broker(broker, garbage, handshake):
    with raw_socket(broker) as s:
        if handshake:
            greet(s)
        try:
            s.sendall(garbage)
            s.shutdown(socket.SHUT_WR)
            while read_reply(s) is not None:
                pass
        except OSError:
            pass
    assert_alive(broker)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=st.lists(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1), st.text(max_size=20),
                                 st.binary(max_size=80),
                                 st.lists(st.integers(-2**63, 2**63 - 1), max_size=3),
                                 st.dictionaries(st.text(max_size=5), st.text(max_size=5),
                                                 max_size=3)), max_size=6),
       api=st.sampled_from([int(a) for a in Api] + [7, 10_000]),
       tail=st.none() | st.binary(max_size=120))
def test_well_framed_nonsense_gets_answers_not_crashes(broker, api, fields, tail):
    with raw_socket(broker) as s:
        greet(s)
        s.sendall(encode_frame([api, 3, *fields]) if tail is None
                  else tail_frame([api, 3, *fields, tail]))
        if api != Api.WAIT:
            reply = read_reply(s)
            assert reply is None or reply[1] == 3
    assert_alive(broker)


def test_sigterm_is_a_clean_shutdown(tmp_path):
    b = mq.testing.BrokerProcess(str(tmp_path / "data")).start()
    try:
        create_topic(b, "t", 1)
        with Connection(b.socket) as c:
            c.call(Api.PRODUCE, "t", 0, 1, batch(b"a"))
        assert b.stop() == 0
        assert os.path.exists(os.path.join(b.data_dir, ".kafka_cleanshutdown"))
        assert not os.path.exists(b.socket)
        assert records_in(b.data_dir, "t", 0) == [b"a"]
    finally:
        b.close()


def test_sighup_reloads_and_keeps_serving(tmp_path):
    conf = tmp_path / "mq.toml"
    conf.write_text('log_level = "WARNING"\n')
    with mq.testing.broker(tmp_path / "data", config_file=str(conf)) as b:
        conf.write_text('log_level = "INFO"\n[topic_defaults]\n"retention.ms" = "1234"\n')
        os.kill(b.pid, signal.SIGHUP)
        with Admin(b.socket) as admin:
            mq.testing.wait_for(lambda: "SIGHUP: configuration reloaded" in b.stderr(),
                                message="the reload log line")
            admin.create_topic("after", 1)
            assert admin.describe_topic("after")["config"]["retention.ms"] == "1234"


def test_partitions_beyond_the_state_slots_are_refused_before_anything_changes(tmp_path):
    with broker_with(tmp_path, state_slots=8) as b:
        with Admin(b.socket) as admin:
            admin.create_topic("t", 4)   # + __consumer_offsets, __transaction_state: 6 used
            with pytest.raises(InvalidPartitionsError, match="state slots"):
                admin.create_partitions("t", 7)
            assert admin.describe_topic("t")["partitions"] == 4
        b.kill()
        b.start()                                    # the metadata still matches the logs
        with Admin(b.socket) as admin:
            assert admin.describe_topic("t")["partitions"] == 4
            admin.create_partitions("t", 6)


def test_no_broker_gives_a_clear_error(tmp_path):
    with pytest.raises(BrokerUnavailableError, match="no broker at"):
        Connection(str(tmp_path / "nothing.sock"))


def test_idle_broker_uses_almost_no_cpu(broker):
    proc = psutil.Process(broker.pid)
    before = proc.cpu_times()
    # Block (not sleep-poll) for a second on a socket that never answers.
    with raw_socket(broker) as s:
        greet(s)
        s.settimeout(1.0)
        with pytest.raises(socket.timeout):
            s.recv(1)
    after = proc.cpu_times()
    used = (after.user - before.user) + (after.system - before.system)
    assert used < 0.1, f"idle broker used {used:.3f} s of CPU in 1 s"


def test_kill_9_under_acks_all_loses_nothing_acknowledged(tmp_path):
    """Producers in other processes send with acks=all while the broker is SIGKILLed; after
    a restart every acknowledged record is present exactly once and in order."""
    with mq.testing.broker(tmp_path / "data") as b:
        create_topic(b, "d", 1)
        acked_path = tmp_path / "acked.txt"
        with subprocess.Popen([sys.executable, "-c", _ACKS_ALL_PRODUCER, b.socket,
                               str(acked_path)], stdout=subprocess.PIPE) as child:
            assert child.stdout.readline() == b"started\n"
            mq.testing.wait_for(lambda: acked_path.exists() and acked_path.stat().st_size > 2000,
                                timeout=60, message="some acknowledged records")
            b.kill()
            child.wait(60)
        acked = [line for line in acked_path.read_bytes().split(b"\n") if line]
        b.start()
        with Connection(b.socket) as c:
            end = c.call(Api.LIST_OFFSETS, "d", 0, -1)["offset"]
        b.stop()
        stored = records_in(b.data_dir, "d", 0)
        assert len(stored) == end
        assert len(set(stored)) == len(stored), "a record is stored twice"
        assert stored[: len(acked)] == acked, "an acknowledged record is missing or reordered"


_ACKS_ALL_PRODUCER = r"""
import sys
from mq.client.connection import Connection
from mq.errors import BrokerUnavailableError
from mq.log.builder import BatchBuilder
from mq.protocol.messages import Api
sock, out = sys.argv[1], sys.argv[2]
c = Connection(sock)
print("started", flush=True)
with open(out, "ab", buffering=0) as f:
    i = 0
    while True:
        b = BatchBuilder()
        vals = [b"r%08d" % (i + j) for j in range(10)]
        for v in vals:
            b.append(None, None, v)
        try:
            c.call(Api.PRODUCE, "d", 0, -1, bytes(b.build()))
        except BrokerUnavailableError:
            break
        f.write(b"\n".join(vals) + b"\n")
        i += 10
"""
