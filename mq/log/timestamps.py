"""Which CreateTime timestamps a topic accepts from a client (Kafka's ``LogValidator``, KIP-937).

Retention by time deletes a segment once ``now - largest_timestamp > retention.ms``, and
segments go oldest first, stopping at the first that stays: one record dated ten years ahead
holds its segment, and every later one, for ten years. So a client's batch is refused with
``InvalidTimestampError`` (Kafka's ``INVALID_TIMESTAMP``, code 32) when

- its largest timestamp is more than ``message.timestamp.after.max.ms`` ahead of the broker's
  clock (default 1 hour, Kafka 4.0's: a clock an hour fast still produces, and no record can
  hold retention more than an hour past its due);
- a record's timestamp is more than ``message.timestamp.before.max.ms`` behind it (default
  unlimited, Kafka's: replaying old data keeps its times);
- its first or largest timestamp is negative other than -1 (``NO_TIMESTAMP``), which no
  ListOffsets by time could find; Kafka's client refuses them at ``send()``, as mq's does.

Only CreateTime topics are checked: LogAppendTime stamps the broker's clock over the batch.
The checks read the 61-byte header (first and largest timestamps); only a topic with a
``before`` limit decodes the records, for their smallest timestamp. Pure: ``now_ms`` is passed
in.
"""

from __future__ import annotations

from typing import Final

from mq.errors import InvalidTimestampError
from mq.log.batch import RecordBatch
from mq.log.config import LogConfig
from mq.log.layout import NO_TIMESTAMP

__all__ = ["UNLIMITED", "check_timestamps"]

UNLIMITED: Final = (1 << 63) - 1          # a limit's value when it has none


def check_timestamps(batch: RecordBatch, now_ms: int, config: LogConfig,
                     where: str = "") -> None:
    """Raise ``InvalidTimestampError`` unless ``config`` accepts ``batch``'s timestamps at
    ``now_ms`` (see the module doc). ``where`` prefixes the message (``"orders-0: "``)."""
    if config.message_timestamp_type != "CreateTime":
        return
    first, largest = batch.base_timestamp, batch.max_timestamp
    _check_sign(min(first, largest), where)
    after = config.message_timestamp_after_max_ms
    if after != UNLIMITED and largest - now_ms > after:
        raise InvalidTimestampError(
            f"{where}timestamp {largest} is {largest - now_ms} ms ahead of the broker's clock "
            f"({now_ms}); message.timestamp.after.max.ms is {after}")
    before = config.message_timestamp_before_max_ms
    if before != UNLIMITED:
        oldest = min((r.timestamp for r in batch.records() if r.timestamp != NO_TIMESTAMP),
                     default=NO_TIMESTAMP)
        _check_sign(oldest, where)
        if oldest != NO_TIMESTAMP and now_ms - oldest > before:
            raise InvalidTimestampError(
                f"{where}timestamp {oldest} is {now_ms - oldest} ms behind the broker's clock "
                f"({now_ms}); message.timestamp.before.max.ms is {before}")


def _check_sign(ts: int, where: str) -> None:
    if ts < NO_TIMESTAMP:
        raise InvalidTimestampError(f"{where}timestamp {ts} is negative; a record's timestamp "
                                    f"is ms since the epoch, or -1 for none")
