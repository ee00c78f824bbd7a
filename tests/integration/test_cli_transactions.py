"""``mq transactions`` (list, describe) and ``mq consume --isolation-level`` run as real processes
(``python -m mq``) against a real broker subprocess on each test's own data dir and socket.
What the CLI prints is compared with what ``mq.Admin`` reads; every expected error is one
``mq: error:`` line on stderr with a non-zero exit and never a traceback.
"""

from __future__ import annotations

import pytest
from brokers import create_topic
from cli_run import assert_help, assert_one_error, json_lines, mq_run, ok

from mq.cli.transactions import describe_json, describe_row
from mq.client.admin import Admin
from mq.client.producer import Producer

WAIT = 30


def table(text: str) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of a whitespace-aligned table (cells hold no spaces)."""
    lines = text.splitlines()
    return lines[0].split(), [line.split() for line in lines[1:]]


# --- help and errors --------------------------------------------------------------------------

@pytest.mark.parametrize("command", [("transactions",), ("transactions", "list"),
                                     ("transactions", "describe")])
def test_help(command):
    assert_help(command)


def test_top_level_help_lists_transactions():
    assert "transactions" in ok(mq_run("--help")).out


def test_usage_errors(tmp_path):
    assert_one_error(mq_run("transactions"), "no transactions command given", code=2)
    assert_one_error(mq_run("transactions", "describe"), "TXN_ID", code=2)
    assert_one_error(mq_run("transactions", "list", "--bogus"), "--bogus", code=2)
    assert_one_error(mq_run("consume", "t", "--isolation-level", "serializable"),
                     "--isolation-level", code=2)
    assert_one_error(mq_run("transactions", "list", "--socket", tmp_path / "none.sock"),
                     "no broker", code=1)


def test_unknown_transactional_id(broker):
    assert_one_error(mq_run("transactions", "describe", "nope", "--socket", broker.socket),
                     "nope", code=1)


# --- list and describe ------------------------------------------------------------------------

def test_list_and_describe_text_and_json(broker):
    create_topic(broker, "pay", 2)
    sock = broker.socket
    assert ok(mq_run("transactions", "list", "--socket", sock)).out == ""
    with Producer(socket=sock, transactional_id="billing-1",
                  transaction_timeout_ms=45000) as p1, \
            Producer(socket=sock, transactional_id="billing-2") as p2:
        p1.init_transactions()
        p2.init_transactions()
        p1.begin_transaction()
        p1.send("pay", value=b"a", partition=0)
        p1.send("pay", value=b"b", partition=1)
        p1.flush(timeout=WAIT)
        with Admin(sock) as admin:
            expected = {row["transactional_id"]: row for row in admin.list_transactions()}
        header, rows = table(ok(mq_run("transactions", "list", "--socket", sock)).out)
        assert header == ["TransactionalId", "ProducerId", "TransactionState"]
        assert rows == [["billing-1", str(expected["billing-1"]["producer_id"]), "Ongoing"],
                        ["billing-2", str(expected["billing-2"]["producer_id"]), "Empty"]]
        assert json_lines(ok(mq_run("transactions", "list", "--json", "--socket", sock))) == [
            {"transactionalId": t, "producerId": expected[t]["producer_id"],
             "transactionState": expected[t]["state"]} for t in ("billing-1", "billing-2")]

        # --socket before the subcommand works too.
        result = ok(mq_run("transactions", "--socket", sock, "describe", "billing-1"))
        header, rows = table(result.out)
        assert header == ["TransactionalId", "ProducerId", "ProducerEpoch", "TransactionState",
                          "TransactionTimeoutMs", "CurrentTransactionStartTimeMs",
                          "TransactionDurationMs", "TopicPartitions"]
        (row,) = rows
        assert row[0] == "billing-1" and row[3] == "Ongoing" and row[4] == "45000"
        assert int(row[5]) > 0 and int(row[6]) >= 0 and row[7] == "pay-0,pay-1"
        (obj,) = json_lines(ok(mq_run("transactions", "describe", "billing-1", "--json",
                                      "--socket", sock)))
        assert obj["transactionalId"] == "billing-1" and obj["transactionState"] == "Ongoing"
        assert obj["producerId"] == expected["billing-1"]["producer_id"]
        assert obj["topicPartitions"] == [{"topic": "pay", "partition": 0},
                                          {"topic": "pay", "partition": 1}]
        assert obj["transactionStartTimeMs"] > 0 and obj["transactionDurationMs"] >= 0
        p1.commit_transaction()
    (row,) = table(ok(mq_run("transactions", "describe", "billing-1", "--socket", sock)).out)[1]
    assert row[3] == "CompleteCommit" and row[5:] == ["-", "-", "-"]


def test_describe_formatting_pure():
    desc = {"transactional_id": "t", "state": "CompleteAbort", "producer_id": 7,
            "producer_epoch": 2, "timeout_ms": 1000, "start_ms": 500, "last_update_ms": 900,
            "partitions": []}
    assert describe_row(desc, 2000) == ("t", 7, 2, "CompleteAbort", 1000, None, None, None)
    assert describe_json(desc, 2000)["transactionStartTimeMs"] is None
    desc.update(state="Ongoing", partitions=[["b", 1], ["a", 0]])
    assert describe_row(desc, 2000)[5:] == (500, 1500, "a-0,b-1")
    assert describe_json(desc, 2000)["transactionDurationMs"] == 1500


# --- consume --isolation-level ----------------------------------------------------------------

def test_consume_isolation_level(broker):
    create_topic(broker, "iso", 1)
    sock = broker.socket
    with Producer(socket=sock, transactional_id="iso") as producer:
        producer.init_transactions()
        for value, commit in ((b"kept-1", True), (b"dropped", False), (b"kept-2", True)):
            producer.begin_transaction()
            producer.send("iso", value=value)
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    base = ["consume", "iso", "--from-beginning", "--timeout-ms", "1000", "--socket", sock]
    committed = ok(mq_run(*base, "--isolation-level", "read_committed"))
    assert committed.out.splitlines() == ["kept-1", "kept-2"]
    assert "consumed 2 records" in committed.err
    everything = ok(mq_run(*base))                         # read_uncommitted by default
    assert everything.out.splitlines() == ["kept-1", "dropped", "kept-2"]
    group = ok(mq_run(*base[:2], "--group", "g", "--from-beginning", "--timeout-ms", "1000",
                      "--isolation-level", "read_committed", "--socket", sock))
    assert group.out.splitlines() == ["kept-1", "kept-2"]
