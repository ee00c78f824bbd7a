"""Producers and a consumer in their own processes while the broker is SIGKILLed twice:
every acknowledged record survives, a record is stored twice only if its batch was re-sent,
order per producer and partition holds, and the consumer resumes without gaps."""

import json
import os
import subprocess
import sys

import mq.testing
from mq.client.admin import Admin
from mq.log.log import PartitionLog

TOPIC = "e2e"
PARTITIONS = 3
RECORDS = 6000

PRODUCER = r"""
import json, sys, threading
import mq
sock, name, count, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
acked, retried, lock = [], [], threading.Lock()
def done(value, fut):
    def cb(meta):
        with lock:
            acked.append(value)
            if fut.attempts > 1:
                retried.append(value)
    return cb
with mq.Producer(socket=sock, acks="all", linger_ms=0, batch_size=512,
                 delivery_timeout_ms=60000) as p:
    print("ready", flush=True)
    for i in range(count):
        value = f"{name}-{i:06d}"
        fut = p.send("e2e", value=value.encode(), key=f"k{i % 7}".encode())
        fut.add_callback(done(value, fut))
    p.flush(60)
with open(out, "w") as f:
    json.dump({"acked": acked, "retried": retried}, f)
"""

CONSUMER = r"""
import sys
import mq
sock, partitions, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tps = [mq.TopicPartition("e2e", p) for p in range(partitions)]
with open(out, "w", buffering=1) as f, mq.Consumer(socket=sock) as c:
    c.assign(tps)
    c.seek_to_beginning(*tps)
    print("ready", flush=True)
    for record in c:
        f.write(f"{record.partition} {record.offset} {bytes(record.value).decode()}\n")
"""


def _lines(path):
    try:
        with open(path) as f:
            return [line.split() for line in f.read().splitlines() if line.count(" ") == 2]
    except FileNotFoundError:
        return []


def test_broker_killed_twice_under_traffic(tmp_path):
    with mq.testing.broker(tmp_path / "data") as b:
        with Admin(b.socket) as admin:
            admin.create_topic(TOPIC, PARTITIONS)
        consumed = tmp_path / "consumed.txt"
        outs = [tmp_path / f"producer{i}.json" for i in range(2)]
        with subprocess.Popen([sys.executable, "-c", CONSUMER, b.socket, str(PARTITIONS),
                               str(consumed)], stdout=subprocess.PIPE) as consumer:
            assert consumer.stdout.readline() == b"ready\n"
            producers = [subprocess.Popen([sys.executable, "-c", PRODUCER, b.socket, f"p{i}",
                                           str(RECORDS), str(out)], stdout=subprocess.PIPE)
                         for i, out in enumerate(outs)]
            try:
                for p in producers:      # both connected before the first kill
                    assert p.stdout.readline() == b"ready\n"
                for seen in (1000, 4000):
                    mq.testing.wait_for(lambda: len(_lines(consumed)) >= seen, timeout=120,
                                        message=f"the consumer to see {seen} records")
                    b.kill()
                    b.start()
                for p in producers:
                    assert p.wait(180) == 0
                results = [json.loads(out.read_text()) for out in outs]
                acked = [v for r in results for v in r["acked"]]
                retried = {v for r in results for v in r["retried"]}
                assert len(acked) == 2 * RECORDS, "a send failed for good"
                mq.testing.wait_for(lambda: len({line[2] for line in _lines(consumed)})
                                    >= len(acked), timeout=120,
                                    message="the consumer to see every acknowledged record")
            finally:
                for p in producers:
                    p.kill()
                    p.wait()
                    p.stdout.close()
                consumer.kill()
                consumer.wait()
    stored = {}
    for p in range(PARTITIONS):
        with PartitionLog.open(os.path.join(b.data_dir, f"{TOPIC}-{p}")) as plog:
            stored[p] = [(r.offset, bytes(r.value).decode())
                         for batch in plog.batches() for r in batch.records()]
    values = [v for p in stored for _, v in stored[p]]
    assert set(acked) <= set(values), "an acknowledged record is missing"
    duplicates = {v for v in values if values.count(v) > 1} if len(values) != len(set(values)) \
        else set()
    assert duplicates <= retried, "a record was stored twice without being re-sent"
    for p, recs in stored.items():
        first_seen = []
        for _, v in recs:
            if v not in first_seen:
                first_seen.append(v)
        for name in ("p0", "p1"):
            mine = [v for v in first_seen if v.startswith(name + "-")]
            assert mine == sorted(mine), f"records of {name} are out of order in partition {p}"
    by_partition = {}
    for part, offset, value in _lines(consumed):
        by_partition.setdefault(int(part), []).append((int(offset), value))
    for p, recs in by_partition.items():
        offsets = [o for o, _ in recs]
        assert offsets == sorted(set(offsets)), f"partition {p}: offsets repeat or go back"
        assert recs == stored[p][: len(recs)], f"partition {p}: consumer diverges from the log"
