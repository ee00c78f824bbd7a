"""``mq offsets``: Kafka's GetOffsetShell — one ``TOPIC:PARTITION:OFFSET`` line per partition."""

from __future__ import annotations

import argparse
import sys

from mq.cli.common import (
    DATETIME_HELP,
    add_broker_arguments,
    client_options,
    formatter,
    non_negative_int,
    parse_datetime,
    topic_partitions,
)

__all__ = ["add_parser", "parse_time", "run"]

DESCRIPTION = """\
Print an offset of every partition of TOPIC as TOPIC:PARTITION:OFFSET lines (Kafka's
GetOffsetShell): the latest offset (the high watermark: the offset the next record gets), the
earliest (the log start offset), or the first offset whose record timestamp is at or after a
given time (-1 when no record is that recent). With --bootstrap-server: a Kafka cluster's."""

EPILOG = f"""\
--time takes earliest (or -2), latest (or -1, the default), a timestamp in milliseconds since
the epoch (digits; exactly eight digits read as the date YYYYMMDD), or an ISO 8601 datetime.
{DATETIME_HELP}

examples:
  mq offsets orders                        orders:0:1200  orders:1:1185 (one per line)
  mq offsets orders --time earliest
  mq offsets orders --time 2024-05-01T12:00:00Z
  mq offsets orders --time 1714564800000 --partition 3"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("offsets", help="print earliest, latest or by-time offsets",
                                   description=DESCRIPTION, epilog=EPILOG,
                                   formatter_class=formatter)
    parser.add_argument("topic", metavar="TOPIC", help="topic")
    parser.add_argument("--time", default="latest", metavar="TIME",
                        help="earliest | latest | ISO-8601 | epoch milliseconds "
                             "(default latest)")
    parser.add_argument("--partition", type=non_negative_int, metavar="P",
                        help="only partition P (default: every partition)")
    add_broker_arguments(parser)
    parser.set_defaults(run=run)


def parse_time(text: str) -> int | str:
    """``"earliest"``, ``"latest"`` or milliseconds since the epoch (>= 0). Raises
    ``ValueError`` for anything else."""
    word = text.strip().lower()
    if word in ("earliest", "-2"):
        return "earliest"
    if word in ("latest", "-1"):
        return "latest"
    if word.isdigit() and len(word) != 8:      # eight digits read as ISO 8601's YYYYMMDD
        return int(word)
    return parse_datetime(text)


def run(args: argparse.Namespace) -> int:
    from mq.client.consumer import Consumer

    when = parse_time(args.time)
    with Consumer(**client_options(args)) as consumer:
        tps = topic_partitions(consumer, args.topic,
                               None if args.partition is None else [args.partition])
        consumer.assign(tps)
        if when == "earliest":
            offsets = consumer.beginning_offsets(tps)
        elif when == "latest":
            offsets = consumer.end_offsets(tps)
        else:
            found = consumer.offsets_for_times({tp: when for tp in tps})
            offsets = {tp: -1 if hit is None else hit[0] for tp, hit in found.items()}
    sys.stdout.write("".join(f"{tp.topic}:{tp.partition}:{offsets[tp]}\n" for tp in tps))
    return 0
