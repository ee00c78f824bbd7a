"""``mq produce``: Kafka's console producer — one record per stdin line, through ``mq.Producer``.

Lines are read as bytes and sent as they are, without their line ending (``\\n`` or ``\\r\\n``);
an empty line is an empty value. Records are sent in line order (per partition, in the log in
that order). At EOF the producer flushes, so every record is acknowledged (per ``--acks``)
before ``produced N records to TOPIC`` is printed on stderr. A line that cannot be sent (too
large, no key separator) stops reading: the records before it are flushed, and the error line
says how many went out.
"""

from __future__ import annotations

import argparse
import sys

from mq.cli.common import (
    add_broker_arguments,
    client_options,
    formatter,
    non_negative_int,
    parse_key_values,
    plural,
)

__all__ = ["add_parser", "run"]

DESCRIPTION = """\
Read records from stdin, one per line, and produce them to TOPIC (Kafka's
kafka-console-producer). Without --key-separator each line is a value with a null key;
with it, each line is KEY<SEP>VALUE, split at the first SEP. Without --partition, keyed
records go to murmur2(key) % partitions (as in Kafka) and unkeyed ones are spread in batches.
With --bootstrap-server the records go to a Kafka cluster (through librdkafka)."""

EPILOG = """\
At EOF every record is flushed and acknowledged (--acks all: fsync'd to disk; 1: written by
the broker; 0: sent, not acknowledged), then 'produced N records to TOPIC' goes to stderr.

exit status: 0 when every line was produced; 1 when the broker refused a record or a line
could not be sent (too large for the topic's max.message.bytes, no key separator): reading
stops there, the records before it are flushed, and one 'mq: error:' line says how many were
produced; 130 on Ctrl-C (after flushing what was read); 2 for bad flags.

examples:
  echo 'hello' | mq produce orders
  printf 'order-1:{"qty": 2}\\norder-2:{"qty": 1}\\n' | mq produce orders --key-separator :
  mq produce orders --partition 0 --acks 1 --header source=cli --compression zstd < lines.txt
  seq 1000000 | mq produce numbers --acks 0"""

_CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("produce", help="produce stdin lines as records to a topic",
                                   description=DESCRIPTION, epilog=EPILOG,
                                   formatter_class=formatter)
    parser.add_argument("topic", metavar="TOPIC", help="topic to produce to")
    parser.add_argument("--key-separator", metavar="SEP",
                        help="split each line into KEY and VALUE at the first SEP")
    parser.add_argument("--partition", type=non_negative_int, metavar="P",
                        help="send every record to partition P (default: by key, as Kafka)")
    parser.add_argument("--acks", choices=("0", "1", "all", "-1"), default="all",
                        help="0: fire and forget; 1: written by the broker; all (= -1, the "
                             "default): fsync'd before the acknowledgement")
    parser.add_argument("--header", action="append", metavar="KEY=VALUE",
                        help="add this header to every record (repeatable)")
    parser.add_argument("--compression", choices=_CODECS, default="none",
                        help="batch compression codec (default none)")
    parser.add_argument("--linger-ms", type=non_negative_int, default=5, metavar="MS",
                        help="wait up to MS for a batch to fill before sending (default 5)")
    add_broker_arguments(parser)
    parser.set_defaults(run=run)


def _lines(stream):
    """Lines of a binary stream without their line ending (``\\n`` or ``\\r\\n``)."""
    for line in stream:
        if line.endswith(b"\n"):
            line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
        yield line


def run(args: argparse.Namespace) -> int:
    from mq.client.admin import Admin
    from mq.client.producer import Producer
    from mq.errors import (
        MessageTooLargeError,
        MQError,
        RecordListTooLargeError,
        UnknownTopicOrPartitionError,
    )

    headers = [(k, v.encode()) for k, v in parse_key_values(args.header, "--header").items()]
    separator = args.key_separator.encode() if args.key_separator is not None else None
    if separator == b"":
        raise ValueError("--key-separator must not be empty")
    topic = args.topic
    options = client_options(args)
    # Check the topic and partition before reading stdin, and size the producer's largest
    # request to the topic's max.message.bytes so that a too-large line fails at its send().
    with Admin(**options) as admin:
        info = admin.describe_topic(topic)
    partitions = info["partitions"]
    if args.partition is not None and args.partition >= partitions:
        raise UnknownTopicOrPartitionError(f"topic {topic!r} has no partition {args.partition} "
                                           f"(it has {partitions})")
    try:
        max_message = int(info["config"]["max.message.bytes"])
    except (KeyError, TypeError, ValueError):
        max_message = 1048588
    acks = "all" if args.acks in ("all", "-1") else int(args.acks)
    compression = None if args.compression == "none" else args.compression

    failed = [0, None]                        # count, first error

    def on_error(err: BaseException) -> None:
        failed[0] += 1
        if failed[1] is None:
            failed[1] = err

    sent = 0
    stop: str | None = None
    interrupted = False
    producer = Producer(**options, acks=acks, linger_ms=args.linger_ms,
                        batch_size=65536, compression_type=compression,
                        max_request_size=max(max_message, 128))
    try:
        try:
            for number, line in enumerate(_lines(sys.stdin.buffer), 1):
                key = None
                if separator is not None:
                    key, sep, line = line.partition(separator)
                    if not sep:
                        stop = (f"line {number} has no key separator {args.key_separator!r}")
                        break
                try:
                    future = producer.send(topic, value=line, key=key, partition=args.partition,
                                           headers=headers)
                except MessageTooLargeError as err:
                    stop = (f"line {number} is too large for topic {topic!r} "
                            f"(max.message.bytes {max_message}): {err}")
                    break
                except RecordListTooLargeError as err:     # the broker's request limit
                    stop = f"line {number} is too large for the broker: {err}"
                    break
                future.add_errback(on_error)
                sent += 1
        except KeyboardInterrupt:
            interrupted = True
        producer.flush()
    finally:
        producer.close(timeout=10)        # after flush(): at once; on an error: bounded
    produced = sent - failed[0]
    records = plural(produced, "record")
    if failed[1] is not None:
        raise MQError(f"{failed[0]} of {sent} records to {topic} failed "
                      f"({type(failed[1]).__name__}: {failed[1]})"
                      + (f"; then {stop}" if stop else ""))
    if stop is not None:
        raise MQError(f"{stop}; produced the {records} before it to {topic}")
    sys.stderr.write(f"produced {records} to {topic}"
                     f"{' (interrupted)' if interrupted else ''}\n")
    return 130 if interrupted else 0
