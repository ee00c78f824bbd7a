"""The consumer's ``ConsumerDriver`` without a broker: a real state region (``StateWriter`` in
this process, as the broker publishes it) and sessions made by the test instead of connected
(the driver's ``connect``), whose connection answers Metadata from a dict.

Topic "t" has one partition in slot 3; ``T0`` names it.
"""

from __future__ import annotations

import os
import threading

import pytest

from mq.client.consumer_driver import ConsumerDriver, Session
from mq.client.types import TopicPartition
from mq.errors import BrokerUnavailableError, ClosedError, MQError, UnknownTopicOrPartitionError
from mq.protocol.messages import Api, Response, response
from mq.protocol.state import PartitionState, StateReader, StateWriter, futex
from mq.testing import wait_for

T0 = TopicPartition("t", 0)
TOPICS = {"t": {"id": "id-1", "partitions": 1, "slots": [3]}}


def state(hw: int, lso: int | None = None) -> PartitionState:
    return PartitionState(hw, hw if lso is None else lso, 0, 0, 0, 0, hw)


class MetadataConnection:
    """Metadata from ``broker.topics``; ``ready()`` fails once the broker is down."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.metadata_calls = 0

    def call(self, api, *fields) -> Response:
        assert api == Api.METADATA
        if not self.broker.up:
            raise BrokerUnavailableError("down")
        self.metadata_calls += 1
        return Response.from_message(response(api, 1, 0, None, dict(self.broker.topics)))

    def ready(self) -> list:
        if not self.broker.up:
            raise BrokerUnavailableError("down")
        return []

    def close(self) -> None:
        pass


class RegionSession(Session):
    """A session over the test's region: what ``Session`` holds, without a socket."""

    def __init__(self, broker: Broker) -> None:
        self.pid = os.getpid()
        self.conn = MetadataConnection(broker)
        self.state = StateReader(broker.data_dir)
        self.sem = None
        self.armed = None
        self.futex = futex is not None
        self.local = bytearray(4)
        self.seen, self.passed = {}, {}
        self.generation, self.data_dir = broker.generation, broker.data_dir


class Broker:
    """The region's writer and what a connection to it would answer."""

    def __init__(self, data_dir: str) -> None:
        self.data_dir = data_dir
        self.writer = StateWriter(data_dir, slots=8)
        self.topics = dict(TOPICS)
        self.generation = 1
        self.up = True
        self.sessions: list[RegionSession] = []

    def connect(self, socket_path, timeout) -> RegionSession:
        if not self.up:
            raise BrokerUnavailableError("no broker")
        session = RegionSession(self)
        self.sessions.append(session)
        return session

    def change_topics(self, topics: dict) -> None:
        self.topics = topics
        self.writer.bump_metadata_version()


def ignore(reply) -> None:
    """Replies that arrive during a wait (none here)."""


@pytest.fixture
def broker(tmp_path):
    b = Broker(str(tmp_path))
    b.writer.publish(3, state(5))
    yield b
    for session in b.sessions:
        session.close()
    b.writer.close()


def test_slot_snapshots_follow_the_metadata(broker):
    driver = ConsumerDriver(None, 1.0, read_committed=False, connect=broker.connect)
    driver.refresh_metadata()
    assert driver.state(T0).high_watermark == 5
    calls = driver.session.conn.metadata_calls
    driver.state(T0)
    assert driver.session.conn.metadata_calls == calls          # unchanged: not asked again
    topics = driver.topics
    broker.change_topics({"t": {"id": "id-2", "partitions": 1, "slots": [3]}})
    driver.state(T0)
    assert driver.topics is not topics and driver.topics["t"]["id"] == "id-2"
    with pytest.raises(UnknownTopicOrPartitionError):
        driver.state(TopicPartition("t", 1))
    broker.writer.publish(3, state(-1))                         # the broker deleted it
    with pytest.raises(UnknownTopicOrPartitionError, match="deleted"):
        driver.state(T0)
    driver.close()


def test_reconnects_with_backoff_and_follows_the_generation(broker):
    driver = ConsumerDriver(None, 1.0, read_committed=False, connect=broker.connect)
    first = driver.session
    broker.up = False
    driver.lost()
    assert driver.live() is None                                # backing off now
    with pytest.raises(BrokerUnavailableError):
        driver.require()
    broker.up, broker.generation = True, 2
    wait_for(lambda: driver.live() is not None, message="the reconnect after the backoff")
    second = driver.session
    assert second is not first and driver.generation == 2 and driver.meta_version == -1
    driver.close()
    with pytest.raises(ClosedError):
        driver.live()


def test_a_forked_child_opens_its_own_session(broker):
    driver = ConsumerDriver(None, 1.0, read_committed=False, connect=broker.connect)
    driver.session.pid = -1                                     # as seen from a child
    with pytest.raises(MQError, match="forked child"):
        driver.live(forbid_fork=True)
    parent = driver.session
    assert driver.live() is not parent
    driver.close()


@pytest.mark.skipif(futex is None, reason="mq.protocol._futex is not built")
def test_a_futex_wait_ends_at_a_publish_and_not_before(broker):
    driver = ConsumerDriver(None, 1.0, read_committed=False, connect=broker.connect)
    driver.refresh_metadata()
    session = driver.session
    never = (lambda: False)
    # Readable at a sequence never slept on: look again at once, without sleeping.
    driver.wait(session, [(T0, 0)], 5.0, never, ignore)
    assert session.seen
    publisher = threading.Timer(0.05, broker.writer.publish, (3, state(6)))
    publisher.start()
    driver.wait(session, [(T0, 5)], 30.0, never, ignore)        # caught up: sleeps until then
    publisher.join()
    assert driver.state(T0).high_watermark == 6
    driver.close()


@pytest.mark.skipif(futex is None, reason="mq.protocol._futex is not built")
def test_the_heartbeat_thread_interrupts_a_wait(broker):
    driver = ConsumerDriver(None, 1.0, read_committed=False, connect=broker.connect)
    driver.refresh_metadata()
    interrupter = threading.Timer(0.05, driver.interrupt)
    interrupter.start()
    driver.wait(driver.session, [(T0, 5)], 30.0, lambda: False, ignore)
    interrupter.join()
    driver.wait(driver.session, [(T0, 5)], 30.0, lambda: True, ignore)   # the group changed
    driver.close()


def test_a_wait_while_disconnected_only_backs_off(broker):
    driver = ConsumerDriver(None, 1.0, read_committed=False, connect=broker.connect)
    broker.up = False
    driver.lost()
    driver.wait(None, [(T0, 5)], 0.01, lambda: False, ignore)
    assert driver.session is None
    driver.close()
