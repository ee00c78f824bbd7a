"""A reply that a ``wait`` claimed is never taken by another thread's ``poll_any``: a
producer's ``send()`` reads replies itself while its I/O thread may be in a ``call``
(InitProducerId), which would otherwise wait for its stolen reply until it timed out."""

import threading

from mq.client.connection import Connection
from mq.protocol.messages import Api


def test_poll_any_leaves_claimed_replies_to_their_wait(broker):
    with Connection(broker.socket) as c:
        claimed = c.send(Api.METADATA, None, claim=True)
        free = c.send(Api.METADATA, None)
        got = []
        while not any(r.request_id == free for r in got):
            got += c.poll_any(10.0)
        assert [r.request_id for r in got] == [free]
        assert c.wait(claimed, timeout=0).request_id == claimed   # already here: no wait
        assert c.poll_any(0.0) == []


def test_a_call_gets_its_reply_while_another_thread_polls(broker):
    with Connection(broker.socket) as c:
        stop = threading.Event()
        stolen = []

        def poller():
            while not stop.is_set():
                stolen.extend(c.poll_any(0.0))

        t = threading.Thread(target=poller)
        t.start()
        try:
            for _ in range(200):
                assert c.call(Api.METADATA, None, timeout=10).error_code == 0
        finally:
            stop.set()
            t.join()
        assert stolen == []
