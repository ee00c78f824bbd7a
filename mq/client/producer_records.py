"""What ``Producer.send()`` accepts, checked in the caller's thread before a record joins a
batch: keys and values that are bytes-like (a ``str`` is refused, not guessed at), headers as
``(str, bytes | None)`` pairs, timestamps that are ms since the epoch (or -1, none: negative
ones no ListOffsets by time could find, refused as Kafka's client refuses them), and one
record small enough to travel in a request alone. Pure functions; each raises ``TypeError``,
``ValueError`` or the size error naming the record.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mq.errors import MessageTooLargeError, RecordListTooLargeError
from mq.log.builder import BatchBuilder

__all__ = ["as_bytes", "check_headers", "check_record_size", "check_timestamp"]


def as_bytes(data: Any, what: str) -> bytes:
    """``data`` (bytes-like) as ``bytes``; ``what`` names it in the ``TypeError``."""
    if isinstance(data, str):
        raise TypeError(f"{what} must be bytes-like or None, got str; encode it "
                        f"({what}.encode()) or pass {what}_serializer= to the Producer")
    try:
        return memoryview(data).tobytes()
    except TypeError as err:
        raise TypeError(f"{what} must be bytes-like or None, got "
                        f"{type(data).__name__}") from err


_MAX_TIMESTAMP_MS = 2**63 - 1                # a batch's timestamps are int64


def check_timestamp(timestamp_ms: Any) -> None:
    """Raise ``TypeError`` unless ``timestamp_ms`` is an int, ``ValueError`` if it is
    negative other than -1 (no timestamp) or past what a batch's int64 can hold."""
    if type(timestamp_ms) is not int:
        raise TypeError(f"timestamp_ms must be an int (milliseconds), got "
                        f"{type(timestamp_ms).__name__}")
    if timestamp_ms < -1:
        raise ValueError(f"timestamp_ms {timestamp_ms} is negative: a record's timestamp is "
                         f"ms since the epoch, None for now, or -1 for none")
    if timestamp_ms > _MAX_TIMESTAMP_MS:
        raise ValueError(f"timestamp_ms {timestamp_ms} is past the largest a record can "
                         f"carry (2**63-1 ms)")


def check_headers(headers: Iterable) -> tuple[list, int]:
    """The headers as a list of ``(str, bytes | None)`` and an upper bound of their encoded
    size. Raises ``TypeError``."""
    out, size = [], 0
    for item in headers:
        try:
            hkey, hval = item
        except (TypeError, ValueError) as err:
            raise TypeError(f"headers must be (str, bytes | None) pairs, got {item!r:.60}") \
                from err
        if not isinstance(hkey, str):
            raise TypeError(f"header key must be str, got {type(hkey).__name__}")
        if hval is not None and type(hval) is not bytes:
            hval = as_bytes(hval, "header value")
        size += len(hkey.encode("utf-8")) + (len(hval) if hval is not None else 0) + 10
        out.append((hkey, hval))
    return out, size


def check_record_size(topic: str, partition: int, ts: int, key: bytes | None,
                      value: bytes | None, headers, max_request_size: int, request_cap: float,
                      broker_max_request: int | None) -> None:
    """Raise unless the record, alone in a batch, fits in ``max_request_size``:
    ``RecordListTooLargeError`` when that limit is the broker's (``request_cap``, its
    ``max_request_bytes`` less the request envelope), else ``MessageTooLargeError``."""
    probe = BatchBuilder()
    probe.append(ts, key, value, headers)
    if probe.size_in_bytes <= max_request_size:
        return
    record = (f"record for {topic}-{partition} is {probe.size_in_bytes} bytes as a batch "
              f"(key {len(key) if key is not None else 0} B, value "
              f"{len(value) if value is not None else 0} B)")
    if max_request_size == request_cap:
        raise RecordListTooLargeError(
            f"{record}: a request carrying it would be larger than the broker accepts "
            f"(max_request_bytes {broker_max_request} B, of which a batch may take "
            f"{request_cap} B)")
    raise MessageTooLargeError(f"{record}, over max_request_size {max_request_size} B")
