"""``mq log export-kafka`` and ``mq log import-kafka``: copy a topic's partitions between mq's
data dir and a stopped Apache Kafka broker's log dir, without re-producing it.

The checks and the copy live in ``mq.log.transfer``; this module parses arguments and prints:
one line per partition and a summary on stdout; on stderr, the partition being checked and
the bytes copied (a line that rewrites itself on a terminal; off a terminal, a line every few
seconds, and large partitions only); a refusal as one ``mq: error:`` line (exit status 1,
nothing changed).
"""

from __future__ import annotations

import argparse
import sys

from mq.broker.space import format_bytes
from mq.cli.common import ProgressLine, formatter, plural
from mq.log.transfer import LogDir, TopicCopy, copy_topic, held, plan
from mq.protocol.paths import default_data_dir, path_argument

__all__ = ["add_commands"]

LARGE = 1 << 30                 # bytes: a partition whose check is announced off a terminal

COMMON = """\
Both brokers must be stopped: a broker's .lock (mq's flock, Kafka's fcntl lock) held means a
live broker, and the command refuses. Neither broker adopts a partition directory its own
metadata does not name (Kafka renames one "-stray"), so first create the topic on the
destination, with the same partition count (and the same topic configs: cleanup.policy,
message.timestamp.type, ...), then stop that broker cleanly. The destination's partitions
must be empty; they keep their partition.metadata (their broker's topic id), and receive the
source's .log, .index, .timeindex, .txnindex and .snapshot files, and a
leader-epoch-checkpoint rebuilt from the batches. The source is only read.

Refused with one line, nothing changed (exit status 1): a live broker on either side; a
source stopped without its clean-shutdown marker (.kafka_cleanshutdown), or with a partition
that 'mq log check' finds fault with; partition directories of one side naming different
topic ids (or none); partition counts that differ; a destination partition holding data or
files neither broker writes.

Each partition is written whole into a temporary directory beside its destination
(<topic>-<p>.<uuid>-delete, fsynced), and swapped in by one atomic rename once every
partition is written; a crash leaves only the temporary directory, which either broker
removes at its next start."""

EXPORT_DESCRIPTION = f"""\
Copy an mq topic into a stopped Kafka broker's log dir, where Kafka then serves it: every
record at its offset, transactions, producer state and indexes as mq wrote them.

{COMMON}

Kafka's consumers check a partition's leader epochs when they resume from a committed offset;
mq counts one epoch per broker start, usually above a new Kafka topic's, so batches of a
higher epoch than the destination's leader-epoch-checkpoint names get that epoch (a header
field outside the batch CRC, which Kafka's leader stamps the same way on every append)."""

EXPORT_EPILOG = """\
steps:
  kafka-topics.sh --create --topic orders --partitions 3 ...   then stop Kafka (SIGTERM)
  mq log export-kafka orders --kafka-log-dir /var/lib/kafka/data
  start Kafka: it serves orders-0 .. orders-2 with mq's records

output: one line per partition (segments, batches, records, offsets, bytes), then a summary.
exit status: 0 when copied; 1 when refused (one 'mq: error:' line; nothing changed);
2 for bad arguments."""

IMPORT_DESCRIPTION = f"""\
Copy a topic from a stopped Kafka broker's log dir into mq's data dir, where mq's broker then
serves it: every record at its offset, transactions, producer state and indexes as Kafka
wrote them.

{COMMON}"""

IMPORT_EPILOG = """\
steps:
  mq topics create orders --partitions 3 [--config ...]        then stop mq's broker
  stop Kafka cleanly (SIGTERM: a kill -9 leaves no clean-shutdown marker, and the import
  refuses until Kafka has been started and stopped cleanly again)
  mq log import-kafka orders --kafka-log-dir /var/lib/kafka/data
  mq broker                                                      serves orders with Kafka's records

output: one line per partition (segments, batches, records, offsets, bytes), then a summary.
exit status: 0 when copied; 1 when refused (one 'mq: error:' line; nothing changed);
2 for bad arguments."""

KAFKA_HINT = ("start Kafka on it and stop it cleanly (SIGTERM), so that it recovers its logs "
              "and leaves the marker, then try again")
MQ_HINT = ("start 'mq broker' on it and stop it cleanly, so that it recovers its logs and "
           "leaves the marker ('mq log check DIR/TOPIC-0' shows what a crash left), then try "
           "again")


def add_commands(log_commands) -> None:
    """Add ``export-kafka`` and ``import-kafka`` to the ``mq log`` parser's subcommands."""
    for name, run, summary, description, epilog in (
            ("export-kafka", run_export, "copy an mq topic into a stopped Kafka's log dir",
             EXPORT_DESCRIPTION, EXPORT_EPILOG),
            ("import-kafka", run_import, "copy a topic of a stopped Kafka's log dir into mq",
             IMPORT_DESCRIPTION, IMPORT_EPILOG)):
        parser = log_commands.add_parser(name, help=summary, description=description,
                                         epilog=epilog, formatter_class=formatter)
        parser.add_argument("topic", metavar="TOPIC", help="the topic, existing on both sides "
                            "with the same partition count")
        parser.add_argument("--kafka-log-dir", metavar="DIR", type=path_argument,
                            required=True, help="the Kafka broker's log dir (its log.dirs) "
                            "holding <TOPIC>-<p> directories")
        parser.add_argument("--data-dir", metavar="DIR", type=path_argument,
                            help="mq's data dir (default: $MQ_DATA_DIR, else "
                                 "$XDG_STATE_HOME/mq, else ~/.local/state/mq)")
        parser.add_argument("--dry-run", action="store_true",
                            help="check everything and print what would be copied; change "
                                 "nothing")
        parser.set_defaults(run=run)


def run_export(args: argparse.Namespace) -> int:
    mq_dir = LogDir(args.data_dir or default_data_dir(), "mq")
    return _run(args, mq_dir, LogDir(args.kafka_log_dir, "Kafka"), MQ_HINT, stamp_epochs=True)


def run_import(args: argparse.Namespace) -> int:
    mq_dir = LogDir(args.data_dir or default_data_dir(), "mq")
    return _run(args, LogDir(args.kafka_log_dir, "Kafka"), mq_dir, KAFKA_HINT,
                stamp_epochs=False)


def _run(args: argparse.Namespace, source: LogDir, destination: LogDir, hint: str, *,
         stamp_epochs: bool) -> int:
    with held(source, destination):
        topic = plan(args.topic, source, destination, stamp_epochs=stamp_epochs,
                     source_hint=hint, checking=_checking)
        if not args.dry_run:
            progress = _Progress()
            try:
                copy_topic(topic, progress)
            finally:
                progress.done()
    _report(topic, args.dry_run)
    return 0


def _report(topic: TopicCopy, dry_run: bool) -> None:
    write = sys.stdout.write
    verb = "would copy" if dry_run else "copied"
    for part in topic.partitions:
        write(f"{topic.topic}-{part.partition}: {part.summary}: {verb} to "
              f"{part.destination}\n")
    line = (f"{verb} {topic.topic} ({plural(len(topic.partitions), 'partition')}, "
            f"{format_bytes(topic.size)}) from {topic.source} to {topic.destination}")
    write(line + ("\n" if dry_run else f"; start {topic.destination.broker} to serve it\n"))


def _checking(directory: str, size: int) -> None:
    """Say which partition is being read whole (CRCs, indexes) before the copy: on a
    terminal, and for a large one otherwise."""
    if sys.stderr.isatty() or size >= LARGE:
        sys.stderr.write(f"checking {directory} ({format_bytes(size)})\n")
        sys.stderr.flush()


class _Progress(ProgressLine):
    """``progress(done, total)`` for ``copy_topic``: bytes copied on stderr, now and then."""

    def __call__(self, done: int, total: int) -> None:
        if self.due():
            rate = done / max(self.last - self.start, 1e-3)
            self.show(f"copying: {format_bytes(done)} of {format_bytes(total)} "
                      f"({100 * done // max(total, 1)}%, {format_bytes(int(rate))}/s)")
