"""The Kafka backend's pure parts: which backend a client picks, librdkafka's configuration
from mq's options, client.properties files, and librdkafka's errors as mq's."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException
from hypothesis import given
from hypothesis import strategies as st

from mq import errors
from mq.client.kafka.config import ENV, backend_args, bootstrap, read_properties, with_overrides
from mq.client.kafka.errors import from_kafka, results


def test_bootstrap_picks_the_cluster_only_when_asked(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert bootstrap(None, None) is None
    assert bootstrap(None, " a:1 , b:2 ,") == "a:1,b:2"
    assert bootstrap(None, ["a:1", "b:2"]) == "a:1,b:2"
    monkeypatch.setenv(ENV, "env:9092")
    assert bootstrap(None, None) == "env:9092"
    assert bootstrap("/run/mq.sock", None) is None          # an explicit socket wins
    with pytest.raises(ValueError, match="not both"):
        bootstrap("/run/mq.sock", "a:1")
    with pytest.raises(ValueError, match="empty"):
        bootstrap(None, " , ")


def test_backend_args():
    backend_args(None, (), None)
    backend_args("a:1", (), {"security.protocol": "SSL"})
    with pytest.raises(ValueError, match="bootstrap_servers"):
        backend_args(None, (), {"security.protocol": "SSL"})
    with pytest.raises(TypeError, match="keyword"):
        backend_args("a:1", ("all",), None)


def test_the_users_properties_override_mqs_and_none_is_librdkafkas_default():
    conf = with_overrides("a:1", {"acks": -1, "group.instance.id": None},
                          {"acks": 1, "sasl.mechanism": "SCRAM-SHA-512"})
    assert conf["bootstrap.servers"] == "a:1" and conf["acks"] == 1
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512" and "group.instance.id" not in conf
    with pytest.raises(TypeError):
        with_overrides("a:1", {}, {1: "x"})


def test_read_properties(tmp_path):
    path = tmp_path / "client.properties"
    path.write_text("# a comment\n! another\n\nsecurity.protocol=SASL_SSL\n"
                    "sasl.username : alice\nsasl.password=p=ss:word\n")
    assert read_properties(path) == {"security.protocol": "SASL_SSL", "sasl.username": "alice",
                                     "sasl.password": "p=ss:word"}
    path.write_text("security.protocol\n")
    with pytest.raises(ValueError, match=":1: not a key=value line"):
        read_properties(path)


@given(st.dictionaries(st.from_regex(r"[a-z][a-z.]{0,20}", fullmatch=True),
                       st.from_regex(r"[!-~]([ -~]{0,30}[!-~])?", fullmatch=True)))
def test_read_properties_reads_what_a_properties_file_says(tmp_path_factory, props):
    path = tmp_path_factory.mktemp("p") / "client.properties"
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
    assert read_properties(path) == props


@pytest.mark.parametrize(("code", "cls"), [
    (KafkaError._TRANSPORT, errors.BrokerUnavailableError),
    (KafkaError._ALL_BROKERS_DOWN, errors.BrokerUnavailableError),
    (KafkaError._MSG_TIMED_OUT, errors.RequestTimedOutError),
    (KafkaError._UNKNOWN_TOPIC, errors.UnknownTopicOrPartitionError),
    (KafkaError._FENCED, errors.ProducerFencedError),
    (KafkaError._AUTO_OFFSET_RESET, errors.NoOffsetForPartitionError),
    (KafkaError._PURGE_QUEUE, errors.ClosedError),
    (KafkaError.UNKNOWN_TOPIC_OR_PART, errors.UnknownTopicOrPartitionError),
    (KafkaError.TOPIC_ALREADY_EXISTS, errors.TopicAlreadyExistsError),
    (KafkaError.PRODUCER_FENCED, errors.ProducerFencedError),
])
def test_librdkafkas_errors_are_mqs(code, cls):
    err = from_kafka(KafkaError(code), "send")
    assert type(err) is cls and str(err).startswith("send: ")
    assert type(from_kafka(KafkaException(KafkaError(code)))) is cls


def test_an_error_without_a_meaning_here_keeps_its_code():
    err = from_kafka(KafkaError(KafkaError._BAD_MSG))
    assert isinstance(err, errors.UnknownServerError) and err.code == KafkaError._BAD_MSG
    assert "_BAD_MSG" in str(err)


@pytest.mark.parametrize("code", [KafkaError.FENCED_LEADER_EPOCH,
                                  KafkaError.NOT_LEADER_FOR_PARTITION,
                                  KafkaError.OFFSET_NOT_AVAILABLE])
def test_an_admin_call_is_asked_again_while_a_leader_moves(code):
    """A list-offsets answered with a moving leader's error (seen in CI while another test
    killed a node) is asked again until it succeeds."""
    from concurrent.futures import Future
    answers = [KafkaException(KafkaError(code)), KafkaException(KafkaError(code)), 7]

    def call():
        fut: Future = Future()
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            fut.set_exception(answer)
        else:
            fut.set_result(answer)
        return {"tp": fut}
    assert results(call, "list offsets", timeout=5) == {"tp": 7}
