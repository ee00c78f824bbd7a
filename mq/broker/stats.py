"""The broker's figures in one snapshot: what ``mq top`` shows and what ``/metrics`` exports.

``snapshot()`` runs on the loop thread — the BrokerStats api calls it directly, the metrics
endpoint through ``LoopCalls`` — so it reads the partition table, the groups and the
connections while nothing changes them, and hands back plain values (a dict msgpack can send)
that the caller formats off the loop. Its cost is a few attribute reads per partition, plus
one batch decoded per group partition with lag (the age of the oldest unconsumed record);
``bench/metrics.py`` measures what a scrape takes from the loop.

The snapshot::

    broker      pid, data_dir, socket, version, started_ms (wall clock), now_ms (wall clock of
                this snapshot), connections, metrics_url (None: no /metrics),
                kafka_listeners (the bound HOST:PORTs of the Kafka listeners, PROTOCOL:// before
                those not PLAINTEXT; [] : off)
    partitions  [{topic, partition, internal, log_start_offset, high_watermark,
                  last_stable_offset, log_end_offset, size_bytes, segments,
                  produced_records, produced_bytes}]      counters since the broker started;
                every partition with a slot, and the metadata log (__cluster_metadata-0,
                which has none); only Produce counts as produced
    groups      [{group, state, members, offsets: [{topic, partition, committed_offset,
                  end_offset, lag, lag_ms}]}]             lag_ms: age of the oldest unconsumed
                                                           record (None: unknown)
    fsync       {count, sum_seconds, buckets: [[upper bound s, cumulative count]]}
    cleaner     {passes, completed, failures, bytes_read, bytes_written, elapsed_seconds}

Consumers read the log through their own memory maps, so the broker never sees a read: how
fast a topic is consumed shows only in its groups' committed offsets.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping

from mq import __version__
from mq.broker.apis import Handler
from mq.broker.apis.groups import GroupApis
from mq.broker.cleaning import BackgroundCleaner
from mq.broker.conns import Conn, Connections
from mq.broker.flushing import GroupCommit
from mq.broker.internal_topics import METADATA_TOPIC, is_internal
from mq.broker.partitions import PartitionTable
from mq.log.log import PartitionLog
from mq.protocol.messages import Api, Request, response

__all__ = ["BrokerStats"]


class BrokerStats:
    """The BrokerStats api and the snapshot behind it and behind the metrics."""

    def __init__(self, table: PartitionTable, conns: Connections, groups: GroupApis,
                 commit: GroupCommit, cleaner: BackgroundCleaner, *, data_dir: str,
                 socket_path: Callable[[], str], metadata_log: PartitionLog | None = None
                 ) -> None:
        self._table = table
        self._metadata_log = metadata_log
        self._conns = conns
        self._groups = groups
        self._commit = commit
        self._cleaner = cleaner
        self._data_dir = data_dir
        self._socket_path = socket_path
        self.started_ms = int(time.time() * 1000)
        self.metrics_url: str | None = None           # set once /metrics is served
        self.kafka_listeners: list[str] = []          # bound Kafka listeners, HOST:PORT

    def handlers(self) -> Mapping[Api, Handler]:
        return {Api.BROKER_STATS: self.describe}

    def describe(self, conn: Conn, req: Request) -> list:
        return response(req.api, req.request_id, 0, None, self.snapshot())

    def snapshot(self) -> dict:
        """Every figure at once (loop thread only)."""
        logs = [(part.topic, part.partition, part.log, part.produced_records,
                 part.produced_bytes) for part in self._table]
        if self._metadata_log is not None:
            logs.append((METADATA_TOPIC, 0, self._metadata_log, 0, 0))
        partitions = []
        for topic, partition, plog, produced_records, produced_bytes in sorted(
                logs, key=lambda row: row[:2]):
            partitions.append({
                "topic": topic, "partition": partition, "internal": is_internal(topic),
                "log_start_offset": plog.log_start_offset,
                "high_watermark": plog.high_watermark,
                "last_stable_offset": plog.last_stable_offset,
                "log_end_offset": plog.log_end_offset,
                "size_bytes": plog.size_in_bytes, "segments": len(plog.segments),
                "produced_records": produced_records, "produced_bytes": produced_bytes})
        totals = self._cleaner.totals()
        return {
            "broker": {"pid": os.getpid(), "data_dir": self._data_dir,
                       "socket": self._socket_path(), "version": __version__,
                       "started_ms": self.started_ms, "now_ms": int(time.time() * 1000),
                       "connections": len(self._conns), "metrics_url": self.metrics_url,
                       "kafka_listeners": list(self.kafka_listeners)},
            "partitions": partitions,
            "groups": self._groups.summaries(),
            "fsync": self._commit.fsync_latency.snapshot(),
            "cleaner": {"passes": totals.passes, "completed": totals.completed,
                        "failures": totals.failures, "bytes_read": totals.bytes_read,
                        "bytes_written": totals.bytes_written,
                        "elapsed_seconds": totals.elapsed}}
