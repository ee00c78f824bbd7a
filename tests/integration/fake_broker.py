"""A small scripted broker on a Unix socket, for producer tests of what the real broker never
does on purpose: retriable errors, lost replies, sequence errors. It speaks the same sans-I/O
protocol module as the real one.

It answers Handshake, Metadata, DescribeConfigs and InitProducerId (``init_error``: answer that
error code instead, or a callable ``init_error(call_number)`` giving it; without a transactional
id each call hands out the next producer id at epoch 0, with one the id's producer id at the
next epoch). AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit and EndTxn are answered by
``txn_script(api, fields)`` (default: success). ``events`` lists every request but the first
three kinds in arrival order: ``(api name, fields)``, ``("PRODUCE", partition, values)``. Produce replies come
from ``script(partition, values, attempt)``: an error code (0 appends), ``None`` to never
answer, or ``"lost"`` to append and never answer (a reply lost with the connection). With ``sequences=True`` an appended batch also goes through the partition's rules for
idempotent producers (``mq/log/producer_state.py``): a batch equal to one of the producer's
last 5 on the partition is answered with its first offset and not appended again; a base
sequence that does not follow the last one is ``OutOfOrderSequenceError``.
"""

from __future__ import annotations

import os
import socket as _socket
import tempfile
import threading
from collections import Counter, defaultdict, deque

import pytest

from mq.log.batch import RecordBatch
from mq.protocol.frames import FrameReader, encode_frame
from mq.protocol.messages import PROTOCOL_VERSION, Api, response

__all__ = ["FakeBroker", "fake_broker"]

OUT_OF_ORDER_SEQUENCE = 45


class FakeBroker:
    def __init__(self, path: str, partitions: int, script, sequences: bool = False,
                 init_error=0, txn_script=None) -> None:
        self.path = path
        self.partitions = partitions
        self.script = script
        self.sequences = sequences
        self.init_error = init_error
        self.log: dict[int, list[bytes]] = defaultdict(list)
        self.requests: list[tuple[int, list[bytes]]] = []
        # (partition, producer id, epoch, base sequence, is_transactional, values) per Produce
        self.batches: list[tuple] = []
        self.attempts: Counter = Counter()          # first value of a batch -> times seen
        self.connections = 0
        self.init_requests: list[list] = []
        self.txn_script = txn_script or (lambda api, fields: 0)
        self.events: list[tuple] = []
        self._txn_ids: dict[str, list[int]] = {}     # transactional id -> [pid, epoch]
        self._next_pid = 1000
        self._windows: dict[tuple, deque] = {}     # (partition, pid, epoch) -> last 5
        self._lock = threading.Lock()
        self._listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        self._listener.bind(path)
        self._listener.listen(8)
        self._socks: list = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
                self._socks.append(sock)
            threading.Thread(target=self._serve, args=(sock,), daemon=True).start()

    def _serve(self, sock) -> None:
        reader = FrameReader()
        while True:
            try:
                data = sock.recv(1 << 20)
            except OSError:
                return
            if not data:
                return
            reader.feed(data)
            for msg in reader.messages():
                api, rid, fields = msg[0], msg[1], msg[2:]
                if api == Api.HANDSHAKE:
                    reply = response(api, rid, 0, None, PROTOCOL_VERSION,
                                     {"data_dir": os.path.dirname(self.path)})
                elif api == Api.METADATA:
                    reply = response(api, rid, 0, None,
                                     {t: {"partitions": self.partitions} for t in fields[0]})
                elif api == Api.DESCRIBE_CONFIGS:
                    reply = response(api, rid, 0, None, {"max.message.bytes": "1048588"}, {})
                elif api == Api.INIT_PRODUCER_ID:
                    reply = self._init_producer_id(api, rid, fields)
                elif api in (Api.ADD_PARTITIONS_TO_TXN, Api.ADD_OFFSETS_TO_TXN,
                             Api.TXN_OFFSET_COMMIT, Api.END_TXN):
                    with self._lock:
                        self.events.append((Api(api).name, fields))
                        code = self.txn_script(Api(api), fields)
                    reply = response(api, rid, code, "scripted" if code else None)
                elif api == Api.PRODUCE:
                    reply = self._produce(api, rid, fields)
                    if reply is None:
                        continue
                else:
                    reply = response(api, rid, 42, f"the fake broker does not serve {api}")
                try:
                    sock.sendall(encode_frame(reply))
                except OSError:
                    return

    def _init_producer_id(self, api, rid, fields):
        with self._lock:
            self.events.append(("INIT_PRODUCER_ID", fields))
            self.init_requests.append(fields)
            code = self.init_error(len(self.init_requests)) if callable(self.init_error) \
                else self.init_error
            if code:
                return response(api, rid, code, "scripted")
            tid = fields[0]
            if tid is not None and tid in self._txn_ids:
                self._txn_ids[tid][1] += 1
                pid, epoch = self._txn_ids[tid]
            else:
                pid, epoch = self._next_pid, 0
                self._next_pid += 1
                if tid is not None:
                    self._txn_ids[tid] = [pid, epoch]
        return response(api, rid, 0, None, pid, epoch)

    def _produce(self, api, rid, fields):
        _, partition, _, data = fields
        batch = RecordBatch(data)
        values = [bytes(r.value) for r in batch.records()]
        with self._lock:
            self.attempts[values[0]] += 1
            attempt = self.attempts[values[0]]
            self.requests.append((partition, values))
            self.events.append(("PRODUCE", partition, values))
            self.batches.append((partition, batch.producer_id, batch.producer_epoch,
                                 batch.base_sequence, batch.is_transactional, values))
            code = self.script(partition, values, attempt)
            if code is None:
                return None
            lost = code == "lost"
            code = 0 if lost else code
            base = len(self.log[partition])
            if code == 0 and self.sequences and batch.producer_id >= 0:
                key = (partition, batch.producer_id, batch.producer_epoch)
                window = self._windows.setdefault(key, deque(maxlen=5))
                for first, last, offset in window:
                    if (first, last) == (batch.base_sequence, batch.last_sequence):
                        return response(api, rid, 0, None, offset, -1, 0)    # a duplicate
                expected = (window[-1][1] + 1) & 0x7FFFFFFF if window else 0
                if batch.base_sequence != expected:
                    code = OUT_OF_ORDER_SEQUENCE
                else:
                    window.append((batch.base_sequence, batch.last_sequence, base))
            if code == 0:
                self.log[partition].extend(values)
            if lost:
                return None
        return response(api, rid, code, "scripted" if code else None, base, -1, 0)

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for sock in self._socks:
                sock.close()


@pytest.fixture
def fake_broker(tmp_path):
    """``fake_broker(partitions, script, **kwargs)`` makes a ``FakeBroker`` (closed after the
    test)."""
    brokers = []

    def make(partitions: int, script, **kwargs) -> FakeBroker:
        path = str(tmp_path / f"fake{len(brokers)}.sock")
        if len(path) > 100:                            # sun_path holds 108 bytes
            path = os.path.join(tempfile.mkdtemp(prefix="mq-fake-"), "fake.sock")
        b = FakeBroker(path, partitions, script, **kwargs)
        brokers.append(b)
        return b

    yield make
    for b in brokers:
        b.close()
