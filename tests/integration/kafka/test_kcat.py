"""Debian's kcat 1.7.1 (librdkafka 2.0.2, an old client: ApiVersions negotiation must serve it)
against the Kafka listener: ``-L``, ``-P`` with each codec and acks setting, ``-C -o
beginning|end|s@<ts>|<offset> -e``, and two ``-G`` members rebalancing when one exits."""

from __future__ import annotations

import json
import re
import signal
import threading
import time

import pytest
from kclients import WAIT, create_topic, produce, read_partitions, segment_batches

from mq.testing import wait_for

CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}       # attributes bits 0-2


def test_metadata_list(kafka_mq, kcat):
    create_topic(kafka_mq.bootstrap, "listed", 3)
    meta = json.loads(kcat.run("-L", "-J").stdout)
    [broker] = meta["brokers"]
    assert broker["name"] == kafka_mq.bootstrap        # the address the client connected to
    topics = {t["topic"]: t for t in meta["topics"]}
    assert "error" not in topics["listed"]
    node = {"id": broker["id"]}
    assert topics["listed"]["partitions"] == [
        {"partition": p, "leader": broker["id"], "replicas": [node], "isrs": [node]}
        for p in range(3)]
    text = kcat.run("-L", "-t", "listed").stdout.decode()
    assert " 1 brokers:\n" in text and 'topic "listed" with 3 partitions:' in text


@pytest.mark.parametrize("acks", ["0", "1", "all"])
@pytest.mark.parametrize("codec", CODECS)
def test_produce_with_each_codec_and_acks(kafka_mq, kcat, codec, acks):
    """The topic does not exist: the producer's Metadata request creates it (one partition).
    librdkafka before 2.11 compresses with gzip, snappy and lz4 only for a broker that lists
    Produce version 0, which Kafka 4 and mq do not serve (README, "What differs from a Kafka
    cluster"): kcat sends those batches uncompressed, and zstd (gated on Produce 7)
    compressed. A newer kcat compressing them fails here: then the README changes too."""
    lines = b"".join(b"key-%d:value %d %s\n" % (i, i, b"abc" * 30) for i in range(10))
    kcat.run("-P", "-t", "fresh", "-K", ":", "-z", codec, "-X", f"acks={acks}",
             "-H", "via=kcat", input=lines)
    got = read_partitions(kafka_mq.bootstrap, "fresh", 10)
    assert [(m.offset(), m.key(), m.value(), m.headers()) for m in got] == [
        (i, b"key-%d" % i, b"value %d %s" % (i, b"abc" * 30), [("via", b"kcat")])
        for i in range(10)]
    if kafka_mq.data_dir is not None:
        stored = CODECS[codec] if codec == "zstd" else 0
        assert {c for _, _, c in segment_batches(kafka_mq.data_dir, "fresh")} == {stored}


def test_consume_from_beginning_end_offset_and_timestamp(kafka_mq, kcat):
    b = kafka_mq.bootstrap
    create_topic(b, "read", 1)
    ts0 = int(time.time() * 1000) - 60_000
    produce(b, "read", [{"value": b"v%d" % i, "key": b"k%d" % i, "timestamp": ts0 + 1000 * i,
                         "headers": [("h", b"%d" % i)]} for i in range(6)],
            {"linger.ms": 5000})                                # one batch: offsets inside it

    def consume(offset: str) -> list[str]:
        done = kcat.run("-C", "-t", "read", "-p", "0", "-o", offset, "-e",
                        "-f", "%o|%k|%s|%T|%h\n")
        return done.stdout.decode().splitlines()

    everything = [f"{i}|k{i}|v{i}|{ts0 + 1000 * i}|h={i}" for i in range(6)]
    assert consume("beginning") == everything
    assert consume("end") == []
    assert consume("4") == everything[4:]                       # in the middle of the batch
    assert consume(f"s@{ts0 + 2500}") == everything[3:]         # ListOffsets by timestamp
    assert consume(f"s@{ts0 + 2000}") == everything[2:]


class Member:
    """A running ``kcat -G`` whose stdout (records) and stderr (rebalances) two threads read."""

    ASSIGNMENT = re.compile(r"rebalanced (?:\(memberid [^)]*\): (assigned|revoked)|: incremental "
                            r"(assignment|revoke) of .*\)): (.*)$")

    def __init__(self, kcat, group: str, topic: str) -> None:
        self.proc = kcat.popen("-G", group, "-u", "-f", "%p %o %s\n",
                               "-X", "session.timeout.ms=6000",
                               "-X", "heartbeat.interval.ms=500",
                               "-X", "auto.offset.reset=earliest",
                               "-X", "fetch.wait.max.ms=100", topic)
        self.records: list[str] = []
        self.log: list[str] = []
        self.assignment: set[int] = set()
        self._threads = [threading.Thread(target=self._pump, args=(s, f), daemon=True)
                         for s, f in ((self.proc.stdout, self.records.append),
                                      (self.proc.stderr, self._stderr))]
        for t in self._threads:
            t.start()

    @staticmethod
    def _pump(stream, handle) -> None:
        for line in stream:
            handle(line.decode(errors="replace").rstrip("\n"))

    def _stderr(self, line: str) -> None:
        self.log.append(line)
        match = self.ASSIGNMENT.search(line)
        if match is None:
            return
        kind = match.group(1) or match.group(2)
        parts = {int(p) for p in re.findall(r"\[(\d+)\]", match.group(3))}
        if kind == "assigned":
            self.assignment = parts
        elif kind == "assignment":
            self.assignment = self.assignment | parts
        elif kind == "revoked":
            self.assignment = set()
        else:
            self.assignment = self.assignment - parts

    def stop(self) -> int:
        """SIGTERM: kcat closes its consumer (LeaveGroup, a last commit) and exits."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(WAIT)
        except BaseException:
            self.proc.kill()
            self.proc.wait()
            raise
        for t in self._threads:
            t.join(WAIT)
        return code

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc.stdout.close()
        self.proc.stderr.close()


def test_group_members_rebalance_when_one_exits(kafka_mq, kcat):
    b = kafka_mq.bootstrap
    create_topic(b, "shared", 4)
    first, second = Member(kcat, "kg", "shared"), Member(kcat, "kg", "shared")
    try:
        def split() -> bool:
            a, s = first.assignment, second.assignment
            return bool(a) and bool(s) and not a & s and a | s == {0, 1, 2, 3}
        wait_for(split, WAIT, 0.05, f"two members splitting 4 partitions: {first.log} "
                 f"{second.log}")
        produce(b, "shared", [{"value": b"old-%d-%d" % (p, i), "partition": p}
                              for p in range(4) for i in range(2)])
        wait_for(lambda: len(first.records) + len(second.records) >= 8, WAIT, 0.05,
                 "8 records across the two members")
        for m in (first, second):
            assert {int(r.split()[0]) for r in m.records} <= m.assignment
        assert sorted(first.records + second.records) == sorted(
            f"{p} {i} old-{p}-{i}" for p in range(4) for i in range(2))

        assert second.stop() == 0
        wait_for(lambda: first.assignment == {0, 1, 2, 3}, WAIT, 0.05,
                 f"the first member taking over: {first.log}")
        seen = len(first.records)
        produce(b, "shared", [{"value": b"new-%d" % p, "partition": p} for p in range(4)])
        new = {f"{p} 2 new-{p}" for p in range(4)}
        wait_for(lambda: new <= set(first.records[seen:]), WAIT, 0.05,
                 f"the 4 new records at offset 2 of each partition: {first.records}")
        # At least once: kcat commits every 5 s (auto.commit.interval.ms), so a record read
        # just before the hand-over may come again; nothing else may.
        assert set(first.records[seen:]) <= new | set(first.records[:seen] + second.records)
        assert first.stop() == 0
    finally:
        first.close()
        second.close()
