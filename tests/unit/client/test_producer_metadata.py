"""What a producer knows of topics and the broker's limits (``mq.client.producer_metadata``),
without a broker: batch limits from ``max_request_size``, the broker's ``max_request_bytes``
and a topic's ``max.message.bytes``; entries going stale by age."""

from __future__ import annotations

import math

from mq.client.producer_metadata import REQUEST_ENVELOPE_BYTES, ProducerMetadata

T0 = 100.0


def test_without_a_broker_limit_the_producers_own_limits_hold():
    meta = ProducerMetadata(16384, 1 << 20, 300.0)
    assert meta.request_cap == math.inf and meta.broker_max_request is None
    assert meta.max_request_size == 1 << 20 and meta.batch_size == 16384
    assert 0 < meta.big_record < meta.max_request_size


def test_the_brokers_request_limit_caps_batches_and_drops_cached_topics():
    meta = ProducerMetadata(1 << 20, 4 << 20, 300.0)
    meta.store("t", 3, 10 << 20, T0)
    meta.limit_requests(65536)
    assert meta.request_cap == 65536 - REQUEST_ENVELOPE_BYTES
    assert meta.max_request_size == meta.request_cap
    assert meta.batch_size == meta.request_cap               # batch_size capped too
    assert meta.topics == {}                                 # their limits derived from it
    assert "t" in meta.all_topics                            # kept, updated in place later
    meta.limit_requests("garbage")                           # not an int: unknown
    assert meta.broker_max_request is None and meta.request_cap == math.inf


def test_a_topic_takes_the_lower_of_the_batch_limits_and_its_max_message_bytes():
    meta = ProducerMetadata(16384, 1 << 20, 300.0)
    info = meta.store("t", 2, 8192, T0)
    assert (info.num_partitions, info.batch_limit, info.grow_limit) == (2, 8192, 8192)
    again = meta.store("t", 4, 1 << 30, T0 + 1)
    assert again is info                                      # updated in place
    assert (info.num_partitions, info.batch_limit, info.grow_limit) == (4, 16384, 1 << 20)
    assert len(info.open) == 4 and meta.topics["t"] is info


def test_without_the_brokers_state_file_an_entry_goes_stale_by_age():
    meta = ProducerMetadata(16384, 1 << 20, 300.0)
    info = meta.store("t", 1, 1 << 20, T0)
    meta.refresh(info, T0 + 300)
    assert meta.topics["t"] is info
    meta.refresh(info, T0 + 300.5)
    assert "t" not in meta.topics


def test_attach_reads_the_handshake_and_copes_without_a_data_dir():
    meta = ProducerMetadata(16384, 1 << 20, 300.0)
    meta.attach({"max_request_bytes": 100_000})              # no data_dir: no state file
    assert meta.state is None and meta.request_cap == 100_000 - REQUEST_ENVELOPE_BYTES
    meta.close()
