"""A Kafka client's Produce takes the broker's C paths where they apply, as mq's own do.

The broker runs in this process (a thread), so the test can count the calls of its C Produce
(``native.produce_plain``, which appends in C), its C append (``native.append_plain``) and its
C publication (``native.publish_slot``) while librdkafka produces through the Kafka listener:
a plain batch (``enable.idempotence=false``) is appended in C, an idempotent one by the Python
append (its producer state), and each is published in C. The records read back are the ones sent.
"""

from __future__ import annotations

import collections
import os
import threading

import pytest

import mq
from mq.broker import server
from mq.broker.config import BrokerConfig
from mq.log import native

pytest.importorskip("mq.log._crecords")
confluent_kafka = pytest.importorskip("confluent_kafka")

WAIT_S = 30
COUNT = 20


@pytest.fixture
def broker(tmp_path, monkeypatch):
    """An in-process broker with a Kafka listener; yields (bootstrap, socket, call counts)."""
    calls: collections.Counter = collections.Counter()
    for name in ("produce_plain", "append_plain", "publish_slot"):
        fn = getattr(native, name)

        def counted(*args, _fn=fn, _name=name):
            done = _fn(*args)
            topic = args[3] if _name == "produce_plain" else \
                (args[0] if _name == "append_plain" else args[2]).topic
            if topic == "t":                        # not the broker's own logs
                calls[_name, done is not None and done is not False] += 1
            return done
        monkeypatch.setattr(native, name, counted)
    sock = os.path.join(tmp_path, "mq.sock")
    b = server.Broker(BrokerConfig(data_dir=str(tmp_path / "data"), socket=sock,
                                   kafka_listeners=("127.0.0.1:0",)))
    b.start()
    serving = threading.Thread(target=b.serve_forever, daemon=True)
    serving.start()
    try:
        with mq.Admin(socket=sock) as admin:
            admin.create_topic("t", 1)
            [listener] = admin.broker_stats()["broker"]["kafka_listeners"]
        yield listener.rpartition("://")[2], sock, calls
    finally:
        b.request_stop()
        serving.join(WAIT_S)


@pytest.mark.parametrize("idempotent", [False, True])
def test_a_kafka_clients_produce_is_appended_and_published_in_c_where_it_applies(
        broker, idempotent):
    bootstrap, sock, calls = broker
    p = confluent_kafka.Producer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                                  "enable.idempotence": idempotent,
                                  "acks": "all" if idempotent else "1"})
    values = [b"v%d" % i for i in range(COUNT)]
    for value in values:
        p.produce("t", value)
        assert p.flush(WAIT_S) == 0                 # one batch a record
    # The whole Produce in C (its append within it), or the append alone in C.
    in_c = calls["produce_plain", True] + calls["append_plain", True]
    if idempotent:
        assert in_c == 0                            # its producer state: the Python append
    else:
        assert in_c >= COUNT - 3                    # now and then an index entry is due
    assert calls["publish_slot", True] >= COUNT
    with mq.Consumer(socket=sock) as c:
        c.assign([mq.TopicPartition("t", 0)])
        got: list[bytes] = []
        mq.testing.wait_for(lambda: got.extend(r.value for rs in c.poll(100).values()
                                               for r in rs) or len(got) >= COUNT,
                            timeout=WAIT_S, message="the records")
    assert [bytes(v) for v in got] == values
