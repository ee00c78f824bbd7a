"""The Kafka transaction apis' own logic: error codes as each version carries them, the
ListTransactions filters, DescribeTransactions per id."""

from __future__ import annotations

from mq.broker.kafka.transactions import fenced_error
from mq.protocol.messages import Response

INVALID_PRODUCER_EPOCH, PRODUCER_FENCED = 47, 90      # Kafka's numbers, pinned here


def test_producer_fenced_is_invalid_producer_epoch_before_kip_588():
    for api, first in ((22, 4), (24, 2), (25, 2), (26, 2), (28, 3)):
        assert fenced_error(api, first - 1, PRODUCER_FENCED) == INVALID_PRODUCER_EPOCH
        assert fenced_error(api, first, PRODUCER_FENCED) == PRODUCER_FENCED
    assert fenced_error(26, 0, 51) == 51          # CONCURRENT_TRANSACTIONS: as it is


def run(gen, *replies):
    """Drive a Kafka handler generator: each yield gets the next native replies."""
    wanted = next(gen)
    try:
        for reply in replies:
            wanted = gen.send([Response.from_message(r) for r in reply])
    except StopIteration as stop:
        return stop.value, wanted
    raise AssertionError(f"the handler wants more: {wanted}")


def _row(tid, pid, state, start_ms):
    return {"transactional_id": tid, "producer_id": pid, "producer_epoch": 0,
            "state": state, "timeout_ms": 60000, "start_ms": start_ms,
            "last_update_ms": start_ms, "partitions": [["t", 0], ["t", 1], ["u", 0]]}


def test_list_transactions_filters():
    from mq.broker.apis.groups import wall_ms
    from mq.broker.kafka.transactions import TransactionWireApis
    now = wall_ms()
    rows = [_row("old", 1, "Ongoing", now - 60_000), _row("new", 2, "Ongoing", now),
            _row("done", 3, "CompleteCommit", -1)]
    apis = TransactionWireApis(table=None)

    def listed(version, **filters):
        body = {"state_filters": [], "producer_id_filters": [], "duration_filter": -1,
                **filters}
        out, _ = run(apis.list_transactions(None, version, body), [[65, 1, 0, None, rows]])
        return [t["transactional_id"] for t in out["transaction_states"]], \
            out["unknown_state_filters"]

    assert listed(0) == (["old", "new", "done"], [])
    assert listed(0, state_filters=["Ongoing", "Bogus"]) == (["old", "new"], ["Bogus"])
    assert listed(0, producer_id_filters=[3]) == (["done"], [])
    assert listed(1, duration_filter=30_000) == (["old"], [])


def test_describe_transactions_answers_each_id():
    from mq.broker.kafka.transactions import TransactionWireApis
    apis = TransactionWireApis(table=None)
    out, _ = run(apis.describe_transactions(None, 0, {"transactional_ids": ["a", "b"]}),
                 [[65, 1, 0, None, [_row("a", 1, "Ongoing", 5)]],
                  [65, 2, 105, "unknown transactional id 'b'"]])
    a, b = out["transaction_states"]
    assert (a["error_code"], a["transaction_state"], a["transaction_start_time_ms"]) == \
        (0, "Ongoing", 5)
    assert a["topics"] == [{"topic": "t", "partitions": [0, 1]},
                           {"topic": "u", "partitions": [0]}]
    assert (b["transactional_id"], b["error_code"]) == ("b", 105)
