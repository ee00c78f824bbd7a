"""The optional C codec, ``mq/log/_crecords.c``, loaded once for every module that uses it.

setup.py builds it when a C compiler is available. It decodes the records section ~7-10x
faster (``decode_records``, and ``decode_columns`` for column buffers) and accumulates records
(``RecordAccumulator``, ``RecordFuture``: ``BatchBuilder.append``, the producer's add) several
times faster. ``take_batches`` is a tailing consumer's whole read of plain batches
(``mq.client.fetcher``), ``tail_take`` a caught-up consumer's poll of one partition from the
published state to its records (``mq.client.consumer``), ``tail_wait_take`` its sleep and
that take after the wake-up in one call (``mq.client.consumer_driver``), and ``check_batch``
the broker's checks and stamps of a client's batch at its append
(``mq.log.log.PartitionLog.append``), ``append_plain`` that whole append for a plain batch
in the common case (the same method), ``send_open`` a producer's ``send()`` of a record into
its partition's open batch (``mq.client.producer.Producer.send``), ``produce_frame`` the
Produce request of one record
that ``send()`` writes with ``linger_ms=0`` and ``produce_send`` that request built and
written in one call (``mq.client.producer_io.ProducerIO.send_whole``),
``take_produce`` the broker's parse of such a frame (``mq.broker.server.Broker._read``,
through ``mq.protocol.frames.FrameReader.take_with``), and ``publish_slot`` the broker's
publication of a partition's state in the common case (``mq.broker.wakeups.StatePublisher``),
``produce_plain`` the broker's Produce of a plain batch with acks=1 from its checks to its reply
(``mq.broker.apis.produce.ProduceApis.append``).
Each name here is the extension's function or type, or ``None`` when the extension is not
built, is too old to have it, or ``MQ_PURE_PYTHON`` is set to anything but "" or "0" — then
its users run their pure-Python references, which the C code mirrors byte for byte
(``RecordBatch._records_py``, ``mq.log.builder.RecordEncoder``,
``mq.client.accumulator.RecordAccumulator``; for ``take_batches``, ``tail_take`` and
``tail_wait_take`` the reader, ``RecordBatch`` and the fetcher's Python path; for ``check_batch``
``RecordBatch.validate`` and the append's own checks; for ``append_plain`` the append's
Python path; for ``send_open`` ``send()``'s Python path; for ``produce_frame`` and
``produce_send`` the producer's
batch, sender and ``encode_tail_frame``; for ``take_produce`` ``FrameReader.messages``;
for ``publish_slot`` ``PartitionTable.state_of`` and ``StateWriter.publish``; for
``produce_plain`` ``ProduceApis.append``'s Python path;
tests/unit/log/test_crecords.py,
test_take_batches.py, test_tail_take.py, test_check_batch.py, test_append_plain.py,
test_produce_frame.py, tests/unit/protocol/test_frames.py,
tests/unit/broker/test_publish_slot.py, test_produce_plain.py).

Users read these names as attributes of this module at call time (``native.decode_records``),
so a test can switch one off.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import Any

__all__ = ["decode_records", "decode_columns", "take_batches", "tail_take", "tail_wait_take",
           "check_batch", "append_plain", "send_open", "produce_frame", "produce_send",
           "take_produce", "publish_slot", "produce_plain", "RecordAccumulator", "RecordFuture"]

decode_records: Callable[..., list] | None = None
decode_columns: Callable[..., int] | None = None
take_batches: Callable[..., tuple] | None = None
tail_take: Callable[..., tuple] | None = None
tail_wait_take: Callable[..., tuple] | None = None
check_batch: Callable[..., tuple | None] | None = None
append_plain: Callable[..., tuple | None] | None = None
send_open: Callable[..., Any] | None = None
produce_frame: Callable[..., tuple] | None = None
produce_send: Callable[..., tuple | None] | None = None
take_produce: Callable[..., tuple | None] | None = None
publish_slot: Callable[..., bool] | None = None
produce_plain: Callable[..., list | None] | None = None
RecordAccumulator: Any = None
RecordFuture: Any = None
if os.environ.get("MQ_PURE_PYTHON", "") in ("", "0"):
    try:
        # importlib: the extension is a private module of this package, loaded only here
        _crecords = importlib.import_module("mq.log._crecords")
    except ImportError:
        pass
    else:
        decode_records = _crecords.decode_records
        # getattr: an extension built before these existed still serves the rest.
        decode_columns = getattr(_crecords, "decode_columns", None)
        take_batches = getattr(_crecords, "take_batches", None)
        tail_take = getattr(_crecords, "tail_take", None)
        tail_wait_take = getattr(_crecords, "tail_wait_take", None)
        check_batch = getattr(_crecords, "check_batch", None)
        append_plain = getattr(_crecords, "append_plain", None)
        send_open = getattr(_crecords, "send_open", None)
        produce_frame = getattr(_crecords, "produce_frame", None)
        produce_send = getattr(_crecords, "produce_send", None)
        take_produce = getattr(_crecords, "take_produce", None)
        publish_slot = getattr(_crecords, "publish_slot", None)
        produce_plain = getattr(_crecords, "produce_plain", None)
        if hasattr(_crecords, "RecordAccumulator"):
            RecordAccumulator, RecordFuture = _crecords.RecordAccumulator, _crecords.RecordFuture
