"""Reading a partition to its end with ``mq.Consumer``, as the judge's tests compare it with
what Kafka's clients read: each record as a tuple of plain values."""

from __future__ import annotations

import time

from kclients import WAIT

import mq


def plain(data) -> bytes | None:
    return None if data is None else bytes(data)


def mq_rows(socket: str, topic: str, partition: int = 0, isolation: str = "read_uncommitted",
            *, timestamp_type: bool = False) -> list[tuple]:
    """Every record of ``topic``-``partition`` from its start to its end offset: (offset,
    [timestamp type,] timestamp, key, value, headers)."""
    with mq.Consumer(socket=socket, isolation_level=isolation, value_bytes=True) as c:
        tp = mq.TopicPartition(topic, partition)
        c.assign([tp])
        c.seek_to_beginning()
        end = c.end_offsets([tp])[tp]
        rows: list[tuple] = []
        deadline = time.monotonic() + WAIT
        while c.position(tp) < end:
            assert time.monotonic() < deadline, f"mq read {len(rows)} records of {topic}"
            for records in c.poll(timeout_ms=200).values():
                rows += [(r.offset, *((r.timestamp_type,) if timestamp_type else ()),
                          r.timestamp_ms, plain(r.key), plain(r.value),
                          [(k, plain(v)) for k, v in r.headers]) for r in records]
        return rows
