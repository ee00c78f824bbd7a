"""Error codes of the Kafka transaction apis as each version carries them."""

from __future__ import annotations

from mq.broker.kafka.transactions import (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED,
                                          fenced_error)


def test_producer_fenced_is_invalid_producer_epoch_before_kip_588():
    for api, first in ((22, 4), (24, 2), (25, 2), (26, 2), (28, 3)):
        assert fenced_error(api, first - 1, PRODUCER_FENCED) == INVALID_PRODUCER_EPOCH
        assert fenced_error(api, first, PRODUCER_FENCED) == PRODUCER_FENCED
    assert fenced_error(26, 0, 51) == 51          # CONCURRENT_TRANSACTIONS: as it is
