"""``BrokerMetadata``: the driver's view of the broker, for planning ``mq`` source reads.

Spark calls a streaming source's ``latestOffset`` on every trigger, up to ~60 times a second
when idle, so a look must be cheap. This uses the state ``mq.Consumer`` reads:

- offsets come from the broker's shared-memory state region (``mq.protocol.state``): per
  partition the log start offset, the high watermark and the last stable offset, read under
  its seqlock. No round trip: a trigger with no topic change costs a poll of the socket (is
  the broker still there?) and one slot read per partition.
- topics and partition counts come from a Metadata request, made again only when the region's
  metadata version moved (a topic created, deleted or grown), as the consumer does.
- timestamps are resolved by ListOffsets requests, pipelined: one round trip in all.

"Latest" is what readers may see: the high watermark (the durable offset when the broker's
``high_watermark = "durable"``), or the last stable offset under ``read_committed``. So a
planned range never ends beyond what a consumer could read. A lost connection (the broker
restarted) is reopened, with a fresh state region, retrying for about 3 s.

Not picklable and not meant to be: it lives in the driver's stream-reader process (or one
batch planning call) and is opened lazily.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

from mq.client.connection import Connection
from mq.errors import BrokerUnavailableError
from mq.protocol.messages import Api
from mq.protocol.state import PartitionState, StateReader
from mq.spark.options import TP

__all__ = ["BrokerMetadata"]

log = logging.getLogger("mq.spark")

RETRY_PAUSES_S = (0.2, 0.5, 1.0, 1.0)     # ~3 s: Kafka's fetchOffset.numRetries x interval


class BrokerMetadata:
    """Implements ``offsets.MetadataView`` against a live broker (module doc). Raises
    ``BrokerUnavailableError`` when no broker answers at ``socket``."""

    def __init__(self, socket: str | None, read_committed: bool, timeout: float = 30.0) -> None:
        self._socket = socket
        self._read_committed = read_committed
        self._timeout = timeout
        self._conn: Connection | None = None
        self._state: StateReader | None = None
        self._topics: dict[str, dict] = {}
        self._version = -1
        self.data_dir = ""
        self._connect()

    # --- connection -----------------------------------------------------------------------------
    def _connect(self) -> None:
        self.close()
        conn = Connection(self._socket, "mq-spark", self._timeout)
        try:
            self.data_dir = conn.broker_info["data_dir"]
            self._state = StateReader(self.data_dir)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._version = -1

    def _live(self) -> tuple[Connection, StateReader]:
        """The connection and state map, reopened if the broker went away since the last
        call (a restarted broker has a new state region)."""
        if self._conn is None or self._state is None:
            self._connect()
        else:
            try:
                self._conn.ready()                # raises when the broker closed the socket
            except (BrokerUnavailableError, OSError):
                log.info("mq source: lost the broker connection; reconnecting")
                self._connect()
        assert self._conn is not None and self._state is not None
        return self._conn, self._state

    def _call(self, fn):
        """``fn(conn, state)``, again on a fresh connection if the broker went away: a broker
        restarting (a few seconds) is waited for with Kafka's source's retries, then
        ``BrokerUnavailableError`` is raised."""
        for pause in RETRY_PAUSES_S:
            try:
                return fn(*self._live())
            except BrokerUnavailableError as err:
                log.warning("mq source: broker unavailable (%s); retrying in %.1f s", err,
                            pause)
                self.close()
                time.sleep(pause)
        return fn(*self._live())

    # --- MetadataView ---------------------------------------------------------------------------
    def partition_counts(self) -> dict[str, int]:
        return self._call(lambda conn, state: {
            name: info["partitions"] for name, info in self._metadata(conn, state).items()})

    def earliest(self, tps: Iterable[TP]) -> dict[TP, int]:
        return {tp: st.log_start_offset for tp, st in self.states(tps).items()}

    def latest(self, tps: Iterable[TP]) -> dict[TP, int]:
        if self._read_committed:
            return {tp: st.last_stable_offset for tp, st in self.states(tps).items()}
        return {tp: st.high_watermark for tp, st in self.states(tps).items()}

    def offsets_for_times(self, timestamps: Mapping[TP, int]) -> dict[TP, int | None]:
        def ask(conn: Connection, state: StateReader) -> dict[TP, int | None]:
            # Pipelined: every request first, then every answer (matched by request id).
            ids = {tp: conn.send(Api.LIST_OFFSETS, tp[0], tp[1], int(ts))
                   for tp, ts in timestamps.items()}
            out: dict[TP, int | None] = {}
            for tp, rid in ids.items():
                offset = conn.wait(rid)["offset"]
                out[tp] = None if offset < 0 else offset
            return out
        if not timestamps:
            return {}
        found = self._call(ask)
        if self._read_committed:
            # Kafka's ListOffsets under read_committed never answers past the LSO.
            bound = self.latest(found)
            found = {tp: (None if off is None or off >= bound.get(tp, off + 1) else off)
                     for tp, off in found.items()}
        return found

    # --- state ----------------------------------------------------------------------------------
    def states(self, tps: Iterable[TP]) -> dict[TP, PartitionState]:
        """A consistent slot snapshot of each partition that exists (others are left out)."""
        wanted = list(tps)
        if not wanted:
            return {}

        def read(conn: Connection, state: StateReader) -> dict[TP, PartitionState]:
            while True:
                topics = self._metadata(conn, state)
                out = {}
                for topic, partition in wanted:
                    info = topics.get(topic)
                    if info is None or not 0 <= partition < info["partitions"]:
                        continue
                    st = state.read(info["slots"][partition])
                    if st.high_watermark >= 0:            # < 0: a deleted topic's slot
                        out[(topic, partition)] = st
                # A deleted topic's slot is reused by the next topic created: the snapshot
                # counts only if the topics did not change while it was taken.
                if state.metadata_version == self._version:
                    return out
        return self._call(read)

    def _metadata(self, conn: Connection, state: StateReader) -> dict[str, dict]:
        version = state.metadata_version         # read first: never miss a change
        if version != self._version:
            self._topics = conn.call(Api.METADATA, None)["topics"]
            self._version = version
        return self._topics

    # --- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the connection and unmap the state region. Idempotent."""
        if self._state is not None:
            self._state.close()
            self._state = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> BrokerMetadata:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
