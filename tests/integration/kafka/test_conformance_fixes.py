"""Behaviour Kafka clients' own integration suites expect of a broker, found by running those
suites against mq (kafka-python 3.0.12's ``test/integration``; Tansu's method), each checked
here with a real client so it stays fixed."""

from __future__ import annotations

import pytest

import mq
import mq.testing

# kafka-python 3 loads its schemas with importlib.resources' legacy functions (Python 3.11), so
# it is imported inside the tests, under this filter.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:(open|read)_text is deprecated:DeprecationWarning")


@pytest.fixture
def kbroker(tmp_path):
    config = tmp_path / "mq.toml"
    config.write_text('kafka_listeners = ["127.0.0.1:0"]\n')
    with mq.testing.broker(tmp_path / "data", config_file=str(config)) as b:
        with mq.Admin(socket=b.socket) as admin:
            b.bootstrap = admin.broker_stats()["broker"]["kafka_listeners"][0]
        yield b


def test_broker_configs_name_the_listeners(kbroker):
    """kafka-python's test_describe_configs_broker_resource_returns_configs reads
    ``advertised.listeners`` of the broker resource; Kafka 4 lists it, read-only, from the
    broker's static config."""
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType
    with KafkaAdminClient(bootstrap_servers=kbroker.bootstrap) as admin:
        configs = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, 0)],
                                         config_filter="all")["broker"]["0"]
    advertised = configs["advertised.listeners"]
    assert advertised["value"] == f"PLAINTEXT://{kbroker.bootstrap}"
    assert (advertised["config_source"], advertised["read_only"], advertised["is_sensitive"]) \
        == ("STATIC_BROKER_CONFIG", True, False)
    assert configs["listeners"]["value"] == "PLAINTEXT://127.0.0.1:0"
