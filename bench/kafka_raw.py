"""A Kafka producer that costs next to nothing per record, to find what a broker itself can
take: ``bench.kafka_vs``'s "broker ingest" rows.

librdkafka driven from Python spends about a microsecond of its own CPU on each record
(``rdk_producer``'s loop), so with 100 B records a single producer process is the limit long
before either broker is, and the figure compares clients, not brokers. This worker builds one
RecordBatch v2 once (``records`` records of ``size`` bytes, CreateTime, no producer id, as
librdkafka sends them with idempotence off), wraps it in a Produce v9 request, and sends that
frame again and again on one TCP connection with ``in_flight`` requests outstanding
(librdkafka's ``max.in.flight`` is 5), only patching the correlation id. A broker must append
every batch as it would any client's: it assigns offsets (the batch's base offset is not
covered by its CRC), validates the batch and its CRC, and writes it. Each response is read
whole and its error code checked.

::

    raw_producer(start, bootstrap="127.0.0.1:9092", topic="t", records=10_000, size=100,
                 requests=200, acks=1)
"""

from __future__ import annotations

import socket
import struct
import time

from bench.harness import WorkerError
from mq.log.builder import BatchBuilder
from mq.protocol.kafka.codec import decode_response, encode_request

__all__ = ["produce_frame", "raw_producer"]

PRODUCE, VERSION = 0, 9
_SIZE = struct.Struct(">i")
_CORRELATION_AT = 8            # size (4), api key (2), api version (2), then correlation id


def produce_frame(topic: str, records: int, size: int, acks) -> bytearray:
    """One Produce v9 request frame (size prefix included) holding one batch of ``records``
    values of ``size`` bytes to partition 0 of ``topic``."""
    builder = BatchBuilder()
    value = bytes(range(256)) * (size // 256) + bytes(size % 256)
    now = int(time.time() * 1000)
    for _ in range(records):
        builder.append(now, None, value)
    batch = bytes(builder.build())
    return bytearray(encode_request(PRODUCE, VERSION, 0, {
        "transactional_id": None, "acks": -1 if acks == "all" else int(acks),
        "timeout_ms": 30_000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]},
        client_id="mq-bench-raw"))


def _read_exactly(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise WorkerError("the broker closed the connection")
        got += k
    return buf


def _check(frame: bytearray) -> None:
    _, body = decode_response(PRODUCE, VERSION, frame)
    for topic in body["responses"]:
        for part in topic["partition_responses"]:
            if part["error_code"]:
                raise WorkerError(f"Produce failed with error {part['error_code']}: "
                                  f"{part.get('error_message')}")


def raw_producer(start, bootstrap: str, topic: str, records: int, size: int, requests: int,
                 acks=1, in_flight: int = 5) -> dict:
    frame = produce_frame(topic, records, size, acks)
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        start()
        cpu0 = time.process_time()
        t0 = time.perf_counter_ns()
        sent = answered = 0
        while answered < requests:
            while sent < requests and sent - answered < in_flight:
                struct.pack_into(">i", frame, _CORRELATION_AT, sent)
                sock.sendall(frame)
                sent += 1
            (length,) = _SIZE.unpack(_read_exactly(sock, 4))
            _check(_read_exactly(sock, length))
            answered += 1
        t1 = time.perf_counter_ns()
    return {"t_first": t0, "t_end": t1, "n": requests * records,
            "bytes": requests * len(frame), "cpu_s_loop": time.process_time() - cpu0}
