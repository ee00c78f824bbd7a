"""Topic and broker configs over Kafka's wire protocol: DescribeConfigs lists every Kafka
topic config with its value, default and source; IncrementalAlterConfigs sets, deletes,
appends and subtracts overrides, which mq's own Admin sees and the broker enforces; the older
AlterConfigs replaces them. And DescribeLogDirs: the data dir and its partitions' sizes."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import Producer as KafkaProducer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from confluent_kafka.admin import ConfigSource

import mq
import mq.testing

TIMEOUT_S = 30.0

# Kafka 4's topic configs (``TopicConfig``) and their defaults: what clients and tools read.
KAFKA_TOPIC_DEFAULTS = {
    "cleanup.policy": "delete", "compression.type": "producer",
    "compression.gzip.level": "-1", "compression.lz4.level": "9",
    "compression.zstd.level": "3", "delete.retention.ms": "86400000",
    "file.delete.delay.ms": "60000", "flush.messages": "9223372036854775807",
    "flush.ms": "9223372036854775807", "follower.replication.throttled.replicas": "",
    "index.interval.bytes": "4096", "leader.replication.throttled.replicas": "",
    "local.retention.bytes": "-2", "local.retention.ms": "-2",
    "max.compaction.lag.ms": "9223372036854775807", "max.message.bytes": "1048588",
    "message.timestamp.after.max.ms": "3600000",
    "message.timestamp.before.max.ms": "9223372036854775807",
    "message.timestamp.type": "CreateTime", "min.cleanable.dirty.ratio": "0.5",
    "min.compaction.lag.ms": "0", "min.insync.replicas": "1", "preallocate": "false",
    "remote.storage.enable": "false", "retention.bytes": "-1", "retention.ms": "604800000",
    "segment.bytes": "1073741824", "segment.index.bytes": "10485760",
    "segment.jitter.ms": "0", "segment.ms": "604800000",
    "unclean.leader.election.enable": "false",
}


@pytest.fixture
def kafka(tmp_path):
    """A broker with a Kafka listener on a free port and one topic default set in its config
    file (Kafka's static broker config): ``(broker, "127.0.0.1:PORT", AdminClient)``."""
    conf = tmp_path / "mq.toml"
    conf.write_text('kafka_listeners = ["127.0.0.1:0"]\n'
                    '[topic_defaults]\n"retention.ms" = "3600000"\n')
    with mq.testing.broker(tmp_path / "data", config_file=str(conf)) as b:
        with mq.Admin(b.socket) as admin:
            address = admin.broker_stats()["broker"]["kafka_listeners"][0]
            admin.create_topic("t", 1, {"segment.bytes": "1000000"})
        yield b, address, AdminClient({"bootstrap.servers": address})


def describe(client: AdminClient, kind: str = "topic", name: str = "t") -> dict:
    (future,) = client.describe_configs([ConfigResource(kind, name)]).values()
    return future.result(TIMEOUT_S)


def alter(client: AdminClient, *entries: tuple[str, str | None, AlterConfigOpType],
          validate_only: bool = False) -> None:
    resource = ConfigResource("topic", "t", incremental_configs=[
        ConfigEntry(name, value, incremental_operation=op) for name, value, op in entries])
    (future,) = client.incremental_alter_configs([resource],
                                                 validate_only=validate_only).values()
    future.result(TIMEOUT_S)


def overrides(b) -> dict:
    with mq.Admin(b.socket) as admin:
        return admin.describe_topic("t")["overrides"]


def test_describe_lists_every_config_with_its_default(kafka):
    b, _, client = kafka
    configs = describe(client)
    assert set(KAFKA_TOPIC_DEFAULTS) <= set(configs)
    for name, default in KAFKA_TOPIC_DEFAULTS.items():
        entry = configs[name]
        assert not entry.is_sensitive, name
        if name == "segment.bytes":            # the topic's override
            assert (entry.value, entry.source) == \
                ("1000000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
            assert entry.synonyms["log.segment.bytes"].value == default
        elif name == "retention.ms":           # the broker's [topic_defaults]
            assert (entry.value, entry.source) == \
                ("3600000", ConfigSource.STATIC_BROKER_CONFIG.value)
        else:
            assert (entry.value, entry.source) == \
                (default, ConfigSource.DEFAULT_CONFIG.value), name
    assert configs["min.insync.replicas"].is_read_only
    assert not configs["retention.ms"].is_read_only
    only = client.describe_configs([ConfigResource("topic", "t", set_config=None)])
    assert len(next(iter(only.values())).result(TIMEOUT_S)) == len(configs)


def test_describe_broker(kafka):
    _, _, client = kafka
    configs = describe(client, "broker", "0")
    assert configs["node.id"].value == "0"
    assert (configs["log.retention.ms"].value, configs["log.retention.ms"].source) == \
        ("3600000", ConfigSource.STATIC_BROKER_CONFIG.value)
    assert (configs["message.max.bytes"].value, configs["message.max.bytes"].source) == \
        ("1048588", ConfigSource.DEFAULT_CONFIG.value)
    assert all(entry.is_read_only for entry in configs.values())


def test_incremental_alter_round_trip(kafka):
    """SET, DELETE and APPEND in one request, then SUBTRACT: the overrides mq keeps, and what
    DescribeConfigs reports back. validate_only changes nothing."""
    b, _, client = kafka
    alter(client, ("retention.ms", "1000", AlterConfigOpType.SET),
          ("segment.bytes", None, AlterConfigOpType.DELETE),
          ("cleanup.policy", "compact", AlterConfigOpType.APPEND))
    assert overrides(b) == {"retention.ms": "1000", "cleanup.policy": "delete,compact"}
    configs = describe(client)
    assert (configs["segment.bytes"].value, configs["segment.bytes"].source) == \
        ("1073741824", ConfigSource.DEFAULT_CONFIG.value)
    assert (configs["retention.ms"].value, configs["retention.ms"].source) == \
        ("1000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    alter(client, ("cleanup.policy", "delete", AlterConfigOpType.SUBTRACT))
    assert describe(client)["cleanup.policy"].value == "compact"
    alter(client, ("retention.ms", "5", AlterConfigOpType.SET),
          ("cleanup.policy", None, AlterConfigOpType.DELETE), validate_only=True)
    assert overrides(b) == {"retention.ms": "1000", "cleanup.policy": "compact"}
    alter(client, ("retention.ms", None, AlterConfigOpType.DELETE),
          ("cleanup.policy", None, AlterConfigOpType.DELETE))
    assert overrides(b) == {}
    assert describe(client)["retention.ms"].source == ConfigSource.STATIC_BROKER_CONFIG.value


def test_incremental_alter_refusals(kafka):
    """Configs mq holds at one value take only that value; unknown names and bad values are
    INVALID_CONFIG; nothing is changed by a refused request."""
    b, _, client = kafka
    alter(client, ("min.insync.replicas", "1", AlterConfigOpType.SET))
    for entries in ([("min.insync.replicas", "2", AlterConfigOpType.SET)],
                    [("compression.type", "zstd", AlterConfigOpType.SET)],
                    [("no.such.config", "1", AlterConfigOpType.SET)],
                    [("retention.ms", "soon", AlterConfigOpType.SET)],
                    [("retention.ms", "1", AlterConfigOpType.APPEND)]):
        with pytest.raises(KafkaException) as info:
            alter(client, *entries)
        assert info.value.args[0].code() == KafkaError.INVALID_CONFIG, entries
    with pytest.raises(KafkaException, match="one broker holds the only replica"):
        alter(client, ("min.insync.replicas", "2", AlterConfigOpType.SET))
    assert overrides(b) == {"segment.bytes": "1000000"}


def test_max_message_bytes_enforced_after_alter(kafka):
    """max.message.bytes set over the Kafka protocol applies to the next produce at once."""
    b, address, client = kafka
    producer = KafkaProducer({"bootstrap.servers": address, "linger.ms": 0})
    results: list = []

    def send(size: int):
        results.clear()
        producer.produce("t", value=b"x" * size, on_delivery=lambda e, m: results.append(e))
        assert producer.flush(TIMEOUT_S) == 0
        (error,) = results
        return error

    assert send(2000) is None
    alter(client, ("max.message.bytes", "1000", AlterConfigOpType.SET))
    assert send(2000).code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert send(100) is None


@pytest.mark.filterwarnings(r"ignore:(open|read)_text is deprecated:DeprecationWarning")
def test_kafka_python_describe_with_synonyms(kafka):
    """kafka-python 3 (DescribeConfigs v4, flexible): all configs with synonyms, and its
    "modified" filter, which keeps the topic's overrides."""
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource as KPConfigResource
    from kafka.admin import ConfigResourceType
    _, address, _ = kafka
    admin = KafkaAdminClient(bootstrap_servers=address)
    try:
        result = admin.describe_configs(
            [KPConfigResource(ConfigResourceType.TOPIC, "t")], include_synonyms=True,
            config_filter="all")
        modified = admin.describe_configs([KPConfigResource(ConfigResourceType.TOPIC, "t")])
    finally:
        admin.close()
    configs = result["topic"]["t"]
    assert set(KAFKA_TOPIC_DEFAULTS) <= set(configs)
    assert "log.segment.bytes" in repr(configs["segment.bytes"])
    assert set(modified["topic"]["t"]) == {"segment.bytes"}       # the topic's overrides


def test_create_topics_takes_fixed_configs_at_their_value(kafka):
    """CreateTopics with min.insync.replicas=1 (what tools send) creates the topic; =2 is
    INVALID_CONFIG naming why; the configs mq implements become the topic's overrides."""
    from confluent_kafka.admin import NewTopic
    b, _, client = kafka
    ok = NewTopic("made", 1, 1, config={"min.insync.replicas": "1", "retention.ms": "9000"})
    refused = NewTopic("refused", 1, 1, config={"min.insync.replicas": "2"})
    futures = client.create_topics([ok, refused])
    futures["made"].result(TIMEOUT_S)
    with pytest.raises(KafkaException, match="one broker holds the only replica") as info:
        futures["refused"].result(TIMEOUT_S)
    assert info.value.args[0].code() == KafkaError.INVALID_CONFIG
    with mq.Admin(b.socket) as admin:
        assert admin.describe_topic("made")["overrides"] == {"retention.ms": "9000"}
        assert "refused" not in admin.list_topics()


def test_create_topics_answers_the_new_topics_configs(kafka):
    """CreateTopics v5+ answers each created (or validated) topic's configs, as Kafka does:
    Kafka's Java admin client (TopicCommand --create) read them and failed on null."""
    from wire_calls import call
    _, address, _ = kafka
    topics = [{"name": name, "num_partitions": 1, "replication_factor": 1, "assignments": [],
               "configs": [{"name": "retention.ms", "value": "9000"}]}
              for name in ("created", "checked")]
    for topic, validate_only in zip(topics, (False, True), strict=True):
        body = {"topics": [topic], "timeout_ms": 30000, "validate_only": validate_only}
        [row] = call(address, 19, 5, body)["topics"]     # mq answers v2-v5
        configs = {c["name"]: (c["value"], c["config_source"]) for c in row["configs"]}
        assert row["error_code"] == 0 and configs["retention.ms"] == ("9000", 1)
        assert configs["retention.bytes"] == ("-1", 5)    # 1 DYNAMIC_TOPIC, 5 DEFAULT
        assert configs["segment.bytes"][0] == KAFKA_TOPIC_DEFAULTS["segment.bytes"]


def test_alter_configs_replaces_the_overrides(kafka):
    """The older AlterConfigs (confluent-kafka's and kafka-python's ``alter_configs``): the
    topic's overrides become the ones listed; those left out go back to their defaults."""
    b, address, client = kafka
    resource = ConfigResource("topic", "t", set_config={"retention.ms": "1000",
                                                        "cleanup.policy": "compact"})
    with pytest.warns(DeprecationWarning):        # confluent-kafka prefers the incremental api
        (future,) = client.alter_configs([resource]).values()
    future.result(TIMEOUT_S)
    assert overrides(b) == {"retention.ms": "1000", "cleanup.policy": "compact"}  # segment.bytes
    # kafka-python, made to use AlterConfigs, lists the topic's other overrides itself (it
    # reads them first: what is left out is reset).
    from kafka.admin import ConfigResource as KpResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient
    kp = KafkaAdminClient(bootstrap_servers=address)
    try:
        kp.alter_configs([KpResource(ConfigResourceType.TOPIC, "t",
                                     configs={"max.message.bytes": "2000000"})],
                         incremental=False)
        assert overrides(b) == {"retention.ms": "1000", "cleanup.policy": "compact",
                                "max.message.bytes": "2000000"}
        bad = KpResource(ConfigResourceType.TOPIC, "t", configs={"retention.ms": "soon"})
        answer = kp.alter_configs([bad], incremental=False)
        assert "InvalidConfigurationError: retention.ms must be an integer" in \
            str(answer["topic"]["t"])
        assert overrides(b)["retention.ms"] == "1000"                 # nothing changed
    finally:
        kp.close()


def test_describe_log_dirs_reports_the_data_dir_and_partition_sizes(kafka):
    """DescribeLogDirs (kafka-python's ``describe_log_dirs``): the data dir is the one log dir,
    each partition's size is its segment files' bytes, the disk's size and free space are
    given."""
    b, address, _ = kafka
    with KafkaProducer({"bootstrap.servers": address, "log.connection.close": False}) as p:
        for _ in range(100):
            p.produce("t", b"x" * 100, partition=0)
        p.flush(TIMEOUT_S)
    from kafka.admin import KafkaAdminClient
    kp = KafkaAdminClient(bootstrap_servers=address)
    try:
        [answer] = kp.describe_log_dirs(topic_partitions={"t": [0]})
    finally:
        kp.close()
    [log_dir] = answer["log_dirs"]
    assert log_dir["error_code"] == 0 and log_dir["log_dir"] == b.data_dir
    [topic] = log_dir["topics"]
    segments = sum(f.stat().st_size for f in (Path(b.data_dir) / "t-0").glob("*.log"))
    assert topic == {"name": "t", "partitions": [{
        "partition_index": 0, "partition_size": segments, "offset_lag": 0,
        "is_future_key": False}]}
    assert segments > 100 * 100
    assert 0 < log_dir["usable_bytes"] <= log_dir["total_bytes"]
