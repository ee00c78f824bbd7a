"""Helpers of the ``mq`` Spark tests: a broker with config settings, topics, producing known
records, reading them back through Spark (test_source*.py) or a consumer (test_sink*.py)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable

import mq
import mq.testing

T0 = 1_700_000_000_000            # record timestamps of the tests (ms)


def broker_with(tmp_path, **settings):
    """``mq.testing.broker`` on ``tmp_path / "data"``, with these broker config keys."""
    conf = tmp_path / "mq.toml"
    conf.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items()))
    return mq.testing.broker(tmp_path / "data", config_file=str(conf))


def create_topic(b, name: str, partitions: int = 1, **config) -> None:
    with mq.Admin(b.socket) as admin:
        admin.create_topic(name, partitions, {k.replace("_", "."): v for k, v in config.items()})


def produce(b, topic: str, records: Iterable[tuple], **producer) -> list[tuple]:
    """Send ``(partition, key, value[, headers[, timestamp_ms]])`` records in this order and
    wait for them; returns ``(topic, partition, offset, key, value, headers, timestamp)`` of
    each."""
    out = []
    with mq.Producer(socket=b.socket, **{"linger_ms": 1, **producer}) as p:
        futures = []
        for rec in records:
            partition, key, value, *rest = rec
            headers = rest[0] if rest else None
            ts = rest[1] if len(rest) > 1 else T0
            futures.append((rec, p.send(topic, value=value, key=key, partition=partition,
                                        headers=headers, timestamp_ms=ts)))
        p.flush()
        for (partition, key, value, *rest), future in futures:
            meta = future.get(timeout=30)
            headers = list(rest[0]) if rest and rest[0] else []
            out.append((topic, partition, meta.offset, key, value, headers,
                        rest[1] if len(rest) > 1 else T0))
    return out


def produce_values(b, topic: str, values: Iterable[int], partition: int = 0,
                   **producer) -> None:
    """Values ``b"<n>"``, keys ``b"k<n>"``, into one partition."""
    produce(b, topic, [(partition, b"k%d" % v, b"%d" % v) for v in values], **producer)


def read_all(b, topic: str, isolation_level: str = "read_committed") -> list:
    """Every record of ``topic`` readable now (up to the high watermark, or the last stable
    offset with ``read_committed``), by partition and offset."""
    out = []
    with mq.Consumer(topic, socket=b.socket, value_bytes=True,
                     isolation_level=isolation_level) as consumer:
        consumer.seek_to_beginning()
        tps = sorted(consumer.assignment())
        ends = consumer.end_offsets(tps)
        while any(consumer.position(tp) < ends[tp] for tp in tps):
            for records in consumer.poll(timeout_ms=1000).values():
                out.extend(records)
    return sorted(out, key=lambda r: (r.partition, r.offset))


def reader(spark, b, **options):
    """``spark.read.format("mq")`` at broker ``b`` with ``options``."""
    r = spark.read.format("mq").option("socket", b.socket)
    for name, value in options.items():
        r = r.option(name, value)
    return r


def offsets_of(df) -> list[tuple[str, int, int]]:
    """``(topic, partition, offset)`` of every row, sorted."""
    return sorted((r.topic, r.partition, r.offset)
                  for r in df.select("topic", "partition", "offset").collect())


def stream(spark, b, checkpoint, *, available_now: bool = True, on_batch=None, **options):
    """Start a streaming query of the mq source whose micro-batches are collected:
    returns ``(query, batches)``, ``batches`` a list of ``(batch id, rows)`` filled as it runs
    (``foreachBatch`` runs in this process); ``on_batch(batch_id)`` is called after each."""
    batches: list[tuple[int, list]] = []

    def collect(df, batch_id):
        batches.append((batch_id, sorted(
            (r.topic, r.partition, r.offset, r.value)
            for r in df.select("topic", "partition", "offset", "value").collect())))
        if on_batch is not None:
            on_batch(batch_id)
    r = spark.readStream.format("mq").option("socket", b.socket)
    for name, value in options.items():
        r = r.option(name, value)
    w = r.load().writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
    w = w.trigger(availableNow=True) if available_now else w.trigger(processingTime="0 seconds")
    return w.start(), batches


def run(spark, b, checkpoint, **options) -> list[tuple[int, list]]:
    """An AvailableNow run to its end; its collected micro-batches (empty ones left out)."""
    query, batches = stream(spark, b, checkpoint, **options)
    query.awaitTermination(120)
    assert not query.isActive
    if query.exception() is not None:
        raise query.exception()
    return [(i, rows) for i, rows in batches if rows]


def checkpoint_offsets(checkpoint, batch_id: int) -> dict:
    """The source offsets Spark logged for ``batch_id`` (the last line of offsets/<id>)."""
    lines = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
    return json.loads(lines[-1])


def wait_gone(path, timeout: float = 10.0) -> None:
    mq.testing.wait_for(lambda: not os.path.exists(path), timeout, message=f"{path} gone")


def now_ms() -> int:
    return int(time.time() * 1000)
