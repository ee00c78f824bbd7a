"""Transactions over Kafka's wire protocol with real clients: confluent-kafka (librdkafka) and
kafka-python 3 transactional producers, read_committed consumers of both protocols, offsets
sent to a transaction, fencing, and the transaction admin apis."""

from __future__ import annotations

import os
import time

import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka import TopicPartition as KafkaTP
from wire_calls import call

import mq
import mq.testing

TIMEOUT_S = 30.0

# kafka-python 3 loads its schemas with importlib.resources' legacy functions (Python 3.11).
pytestmark = pytest.mark.filterwarnings(
    r"ignore:(open|read)_text is deprecated:DeprecationWarning")


@pytest.fixture
def kafka(tmp_path):
    """A broker with a Kafka listener on a free port: ``(broker, "127.0.0.1:PORT")``."""
    conf = tmp_path / "mq.toml"
    conf.write_text('kafka_listeners = ["127.0.0.1:0"]\n')
    with mq.testing.broker(tmp_path / "data", config_file=str(conf)) as b:
        with mq.Admin(b.socket) as admin:
            address = admin.broker_stats()["broker"]["kafka_listeners"][0]
        yield b, address


def create(b, name: str, partitions: int = 1, config: dict | None = None) -> None:
    with mq.Admin(b.socket) as admin:
        admin.create_topic(name, partitions, config)


def txn_producer(address: str, tid: str, **extra) -> KafkaProducer:
    p = KafkaProducer({"bootstrap.servers": address, "transactional.id": tid,
                       "transaction.timeout.ms": 60_000, **extra})
    p.init_transactions(TIMEOUT_S)
    return p


def open_transaction(address: str, tid: str, topic: str, value: bytes, partition: int = 0
                     ) -> KafkaProducer:
    """A transactional producer with a transaction open: ``value`` sent to ``topic`` and
    acknowledged, not committed."""
    p = txn_producer(address, tid)
    p.begin_transaction()
    p.produce(topic, value=value, partition=partition)
    p.flush(TIMEOUT_S)
    return p


def consume(address: str, topic: str, partitions: int, want: int, *,
            isolation: str = "read_committed", **settings) -> list[bytes]:
    """The values of ``topic`` (assign mode, from the start) once ``want`` are there, and
    then until the log end: a record beyond ``want`` shows up too."""
    c = KafkaConsumer({"bootstrap.servers": address, "group.id": "reader",
                       "isolation.level": isolation, "enable.auto.commit": False,
                       "enable.partition.eof": True, **settings})
    c.assign([KafkaTP(topic, p, 0) for p in range(partitions)])
    got: list[bytes] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(m.error())
                at_end.add(m.partition())
                if len(got) >= want and len(at_end) == partitions:
                    return got
                continue
            at_end.discard(m.partition())
            got.append(m.value())
        raise AssertionError(f"{topic}: {len(got)} of {want} records after {TIMEOUT_S} s: "
                             f"{got}")
    finally:
        c.close()


def test_commit_and_abort_read_committed(kafka):
    """Committed records reach read_committed consumers; aborted ones never do (they are in
    the log: read_uncommitted sees them)."""
    b, address = kafka
    create(b, "t", 2)
    p = txn_producer(address, "tx-a")
    p.begin_transaction()
    for i in range(4):
        p.produce("t", value=b"c1-%d" % i, partition=i % 2)
    p.commit_transaction(TIMEOUT_S)
    p.begin_transaction()
    for i in range(4):
        p.produce("t", value=b"aborted-%d" % i, partition=i % 2)
    p.flush(TIMEOUT_S)
    p.abort_transaction(TIMEOUT_S)
    p.begin_transaction()
    p.produce("t", value=b"c2", partition=1)
    p.commit_transaction(TIMEOUT_S)
    committed = consume(address, "t", 2, 5)
    assert sorted(committed) == sorted([b"c1-0", b"c1-1", b"c1-2", b"c1-3", b"c2"])
    everything = consume(address, "t", 2, 9, isolation="read_uncommitted")
    assert sorted(everything) == sorted(committed + [b"aborted-%d" % i for i in range(4)])


def test_interleaved_transactions_across_segments_and_small_fetches(kafka):
    """Aborted and committed transactions interleaved with plain records on one partition,
    over many 2,000-byte segments: every client's read_committed consumer, fetching 100 bytes
    at a time, gets exactly the committed and plain records (the aborted list of each fetch
    covers transactions that began before it and end in a later segment)."""
    from kafka import KafkaConsumer as KPConsumer
    from kafka import TopicPartition as KPTopicPartition
    b, address = kafka
    create(b, "t", config={"segment.bytes": "2000"})
    aborting = txn_producer(address, "tx-aborts", **{"linger.ms": 0})
    committing = txn_producer(address, "tx-commits", **{"linger.ms": 0})
    plain = KafkaProducer({"bootstrap.servers": address, "linger.ms": 0})
    expected = []
    for round_ in range(6):
        aborting.begin_transaction()
        committing.begin_transaction()
        for i in range(3):
            for producer, value in ((aborting, b"aborted-%d-%d" % (round_, i)),
                                    (plain, b"plain-%d-%d" % (round_, i)),
                                    (committing, b"committed-%d-%d" % (round_, i))):
                producer.produce("t", value=value)
                producer.flush(TIMEOUT_S)
            expected += [b"plain-%d-%d" % (round_, i), b"committed-%d-%d" % (round_, i)]
        aborting.abort_transaction(TIMEOUT_S)
        committing.commit_transaction(TIMEOUT_S)
    segments = [f for f in os.listdir(os.path.join(b.data_dir, "t-0")) if f.endswith(".log")]
    assert len(segments) >= 3
    assert sorted(consume(address, "t", 1, len(expected),
                          **{"max.partition.fetch.bytes": 100})) == sorted(expected)
    kp = KPConsumer(bootstrap_servers=address, isolation_level="read_committed",
                    enable_auto_commit=False, max_partition_fetch_bytes=100,
                    consumer_timeout_ms=2000)
    try:
        kp.assign([KPTopicPartition("t", 0)])
        kp.seek(KPTopicPartition("t", 0), 0)
        got = []
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < len(expected) and time.monotonic() < deadline:
            got += [m.value for m in kp]        # stops after 2 s without a record
    finally:
        kp.close()
    assert sorted(got) == sorted(expected)


def test_open_transaction_holds_back_read_committed(kafka):
    """A record produced after an open transaction's first one waits for its end (the last
    stable offset), and arrives once the transaction commits."""
    b, address = kafka
    create(b, "t")
    p = open_transaction(address, "tx-open", "t", b"in-txn")
    plain = KafkaProducer({"bootstrap.servers": address})
    plain.produce("t", value=b"after")
    plain.flush(TIMEOUT_S)
    assert consume(address, "t", 1, 0) == []
    p.commit_transaction(TIMEOUT_S)
    assert consume(address, "t", 1, 2) == [b"in-txn", b"after"]


def test_abort_after_failed_send(kafka):
    """A send the broker refuses (the topic's max.message.bytes) makes the transaction
    abortable; abort_transaction (EndTxn) succeeds, and the records sent after it commit.

    librdkafka finds the sequence numbers the refused batch used up only at the next
    transaction's first send, aborts that one too, and bumps its epoch (InitProducerId with
    its producer id and epoch, KIP-360): so the application retries, as librdkafka's
    transactional example does, and its second try commits."""
    b, address = kafka
    create(b, "small", config={"max.message.bytes": "200"})
    p = txn_producer(address, "tx-fail")
    p.begin_transaction()
    failures = []
    p.produce("small", value=b"ok-before")
    p.produce("small", value=b"x" * 1000, on_delivery=lambda err, msg: failures.append(err))
    with pytest.raises(KafkaException) as info:
        p.commit_transaction(TIMEOUT_S)
    assert info.value.args[0].txn_requires_abort()
    assert [e.code() for e in failures if e is not None] == [KafkaError.MSG_SIZE_TOO_LARGE]
    p.abort_transaction(TIMEOUT_S)
    for attempt in range(3):
        p.begin_transaction()
        p.produce("small", value=b"ok-after")
        try:
            p.commit_transaction(TIMEOUT_S)
            break
        except KafkaException as err:
            assert err.args[0].txn_requires_abort(), err
            p.abort_transaction(TIMEOUT_S)
    else:
        raise AssertionError("three transactions after the failed send did not commit")
    assert consume(address, "small", 1, 1) == [b"ok-after"]


def test_send_offsets_to_transaction(kafka):
    """Offsets sent to a committed transaction are the group's; those of an aborted one are
    not (read here by mq's own Admin)."""
    b, address = kafka
    create(b, "in")
    create(b, "out")
    c = KafkaConsumer({"bootstrap.servers": address, "group.id": "pipeline",
                       "enable.auto.commit": False})
    c.assign([KafkaTP("in", 0, 0)])
    metadata = c.consumer_group_metadata()
    p = txn_producer(address, "tx-offsets")
    p.begin_transaction()
    p.produce("out", value=b"derived")
    p.send_offsets_to_transaction([KafkaTP("in", 0, 7)], metadata, TIMEOUT_S)
    p.commit_transaction(TIMEOUT_S)
    with mq.Admin(b.socket) as admin:
        assert admin.list_group_offsets("pipeline") == {mq.TopicPartition("in", 0): 7}
    p.begin_transaction()
    p.send_offsets_to_transaction([KafkaTP("in", 0, 9)], metadata, TIMEOUT_S)
    p.abort_transaction(TIMEOUT_S)
    with mq.Admin(b.socket) as admin:
        assert admin.list_group_offsets("pipeline") == {mq.TopicPartition("in", 0): 7}
    c.close()


def test_new_producer_fences_the_old_one(kafka):
    """init_transactions by a second producer with the same transactional id aborts the
    first one's open transaction and fences it: its commit fails fatally."""
    b, address = kafka
    create(b, "t")
    old = open_transaction(address, "tx-fence", "t", b"zombie")
    new = txn_producer(address, "tx-fence")
    with pytest.raises(KafkaException) as info:
        old.commit_transaction(TIMEOUT_S)
    assert info.value.args[0].fatal() or \
        info.value.args[0].code() == KafkaError._FENCED
    new.begin_transaction()
    new.produce("t", value=b"survivor")
    new.commit_transaction(TIMEOUT_S)
    assert consume(address, "t", 1, 1) == [b"survivor"]


def test_kafka_python_transactional_producer(kafka):
    """kafka-python 3's transactional producer: a committed and an aborted transaction."""
    from kafka import KafkaProducer as KPProducer
    b, address = kafka
    create(b, "t")
    p = KPProducer(bootstrap_servers=address, transactional_id="tx-kp")
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send("t", b"kp-1")
        p.send("t", b"kp-2")
        p.commit_transaction()
        p.begin_transaction()
        p.send("t", b"kp-aborted")
        p.flush()
        p.abort_transaction()
        p.begin_transaction()
        p.send("t", b"kp-3")
        p.commit_transaction()
    finally:
        p.close()
    assert consume(address, "t", 1, 3) == [b"kp-1", b"kp-2", b"kp-3"]


def test_mq_consumer_reads_a_kafka_transaction(kafka):
    """A transaction committed by confluent-kafka, read by mq's own read_committed consumer:
    the same records, none of the aborted ones."""
    b, address = kafka
    create(b, "t")
    p = open_transaction(address, "tx-mixed", "t", b"aborted")
    p.abort_transaction(TIMEOUT_S)
    p.begin_transaction()
    for i in range(3):
        p.produce("t", key=b"k%d" % i, value=b"v%d" % i)
    p.commit_transaction(TIMEOUT_S)
    got = []
    with mq.Consumer(socket=b.socket, isolation_level="read_committed") as c:
        c.assign([mq.TopicPartition("t", 0)])
        deadline = time.monotonic() + TIMEOUT_S
        while len(got) < 3 and time.monotonic() < deadline:
            for records in c.poll(200).values():
                got += [(bytes(r.key), bytes(r.value)) for r in records]
    assert got == [(b"k0", b"v0"), (b"k1", b"v1"), (b"k2", b"v2")]


def test_transaction_admin_apis(kafka):
    """DescribeTransactions, ListTransactions and DescribeProducers (kafka-python's admin)
    see an open transaction, then its commit."""
    from kafka import KafkaAdminClient
    from kafka import TopicPartition as KPTopicPartition
    b, address = kafka
    create(b, "t", 2)
    p = open_transaction(address, "tx-admin", "t", b"open", partition=1)
    admin = KafkaAdminClient(bootstrap_servers=address)
    try:
        desc = admin.describe_transactions(["tx-admin"])["tx-admin"]
        assert desc.state == "Ongoing"
        assert set(desc.topic_partitions) == {KPTopicPartition("t", 1)}
        listed = admin.list_transactions(state_filters=["Ongoing"])     # by broker id
        assert [(t.transactional_id, t.state) for t in listed[0]] == [("tx-admin", "Ongoing")]
        producers = admin.describe_producers([KPTopicPartition("t", 1)])
        (state,) = producers[KPTopicPartition("t", 1)].active_producers
        assert state.producer_id == desc.producer_id
        assert state.current_transaction_start_offset == 0
        p.commit_transaction(TIMEOUT_S)        # answered once the Complete record is durable
        assert admin.describe_transactions(["tx-admin"])["tx-admin"].state == "CompleteCommit"
        assert admin.list_transactions(state_filters=["Ongoing"]) == {0: []}
        (state,) = admin.describe_producers(
            [KPTopicPartition("t", 1)])[KPTopicPartition("t", 1)].active_producers
        assert state.current_transaction_start_offset == -1
        with pytest.raises(Exception, match="TransactionalIdNotFound"):
            admin.describe_transactions(["nobody"])
    finally:
        admin.close()


def init_producer_id(address: str, version: int, tid: str | None, pid: int = -1,
                     epoch: int = -1) -> dict:
    return call(address, 22, version, {"transactional_id": tid,
                                       "transaction_timeout_ms": 60_000,
                                       "producer_id": pid, "producer_epoch": epoch})


def test_init_producer_id_bumps_and_fences(kafka):
    """InitProducerId as Kafka answers it: an idempotent producer always gets a new id at
    epoch 0; a transactional id's holder may bump its epoch by naming its id and epoch (or the
    one before: KIP-360); any other pair is fenced, as INVALID_PRODUCER_EPOCH before v4; an
    empty transactional id is an invalid request."""
    _, address = kafka
    first = init_producer_id(address, 4, None)
    again = init_producer_id(address, 4, None, first["producer_id"], 0)
    assert first["error_code"] == again["error_code"] == 0
    assert again["producer_id"] != first["producer_id"] and again["producer_epoch"] == 0
    held = init_producer_id(address, 4, "tx-init")
    pid = held["producer_id"]
    assert (held["error_code"], held["producer_epoch"]) == (0, 0)
    bumped = init_producer_id(address, 4, "tx-init", pid, 0)
    assert (bumped["error_code"], bumped["producer_id"], bumped["producer_epoch"]) == \
        (0, pid, 1)
    retried = init_producer_id(address, 4, "tx-init", pid, 0)       # the epoch before
    assert (retried["error_code"], retried["producer_epoch"]) == (0, 2)
    assert init_producer_id(address, 4, "tx-init", pid, 0)["error_code"] == 90
    assert init_producer_id(address, 3, "tx-init", pid, 0)["error_code"] == 47
    assert init_producer_id(address, 4, "tx-init", pid + 1, 2)["error_code"] == 90
    assert init_producer_id(address, 4, "tx-init")["producer_epoch"] == 3
    assert init_producer_id(address, 4, "")["error_code"] == 42
    assert init_producer_id(address, 1, "tx-init")["producer_epoch"] == 4


def test_add_partitions_answers_per_partition(kafka):
    """AddPartitionsToTxn with a partition that does not exist: that one is
    UNKNOWN_TOPIC_OR_PARTITION, the others OPERATION_NOT_ATTEMPTED (nothing added); an
    unknown transactional id is INVALID_PRODUCER_ID_MAPPING, as Kafka's coordinator says."""
    b, address = kafka
    create(b, "t")
    held = init_producer_id(address, 4, "tx-add")

    def add(tid: str, partitions: list[int]) -> dict:
        body = call(address, 24, 3, {"v3_and_below_transactional_id": tid,
                                     "v3_and_below_producer_id": held["producer_id"],
                                     "v3_and_below_producer_epoch": held["producer_epoch"],
                                     "v3_and_below_topics": [{"name": "t",
                                                              "partitions": partitions}]})
        (topic,) = body["results_by_topic_v3_and_below"]
        return {r["partition_index"]: r["partition_error_code"]
                for r in topic["results_by_partition"]}

    assert add("tx-add", [0, 5]) == {0: 55, 5: 3}
    assert add("nobody", [0]) == {0: 49}
    assert add("tx-add", [0]) == {0: 0}


def test_aiokafka_transactions(kafka):
    """aiokafka (version 0 of every transaction api): a commit with offsets, an abort, and a
    read_committed consumer."""
    import asyncio

    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as AIOTopicPartition
    b, address = kafka
    create(b, "t")
    create(b, "in")

    async def run() -> list[bytes]:
        p = AIOKafkaProducer(bootstrap_servers=address, transactional_id="tx-aio")
        await p.start()
        try:
            async with p.transaction():
                await p.send_and_wait("t", b"aio-1")
                await p.send_offsets_to_transaction({AIOTopicPartition("in", 0): 3}, "aio")
            with pytest.raises(RuntimeError):
                async with p.transaction():
                    await p.send_and_wait("t", b"aio-aborted")
                    raise RuntimeError("abort")
            async with p.transaction():
                await p.send_and_wait("t", b"aio-2")
        finally:
            await p.stop()
        c = AIOKafkaConsumer(bootstrap_servers=address, isolation_level="read_committed",
                             enable_auto_commit=False, auto_offset_reset="earliest")
        await c.start()
        got: list[bytes] = []

        async def collect() -> None:
            while len(got) < 2:
                batches = await c.getmany(timeout_ms=200)
                got.extend(m.value for records in batches.values() for m in records)

        try:
            c.assign([AIOTopicPartition("t", 0)])
            await asyncio.wait_for(collect(), TIMEOUT_S)
        finally:
            await c.stop()
        return got

    assert asyncio.run(run()) == [b"aio-1", b"aio-2"]
    with mq.Admin(b.socket) as admin:
        assert admin.list_group_offsets("aio") == {mq.TopicPartition("in", 0): 3}
