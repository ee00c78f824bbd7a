"""``mq broker``: run the broker in the foreground (the same code as ``python -m mq.broker``).

It logs to stderr and stops cleanly on SIGTERM or SIGINT (Ctrl-C) with exit status 0: in-flight
``acks=all`` produces are answered, logs flushed and the data dir marked cleanly shut down.
Under systemd it speaks the notify protocol and takes a socket-activated listener
(``mq.broker.service``); ``mq systemd install`` writes the units.
"""

from __future__ import annotations

import argparse

from mq.broker import __main__ as broker_main
from mq.cli.common import formatter

__all__ = ["add_parser", "run"]

DESCRIPTION = """\
Run the mq broker in the foreground: it owns the data directory (one broker per directory) and
serves producers, consumers and admin commands on a Unix socket. It logs to stderr. SIGTERM or
Ctrl-C stops it cleanly (exit status 0); SIGHUP reloads the config file.

Under systemd (NOTIFY_SOCKET set) it reports READY=1 once recovered and serving, STATUS=,
WATCHDOG=1 from its loop every half WATCHDOG_USEC, RELOADING=1/READY=1 around SIGHUP and
STOPPING=1 on SIGTERM, and extends the start timeout while a long recovery makes progress.
With LISTEN_FDS (socket activation) it serves the passed Unix socket instead of binding
--socket, and never removes it. 'mq systemd install' writes the units.

Settings come from defaults, then --config FILE.toml, then $MQ_DATA_DIR / $MQ_SOCKET /
$MQ_LOG_LEVEL, then the flags. A config file looks like:

  data_dir = "/var/lib/mq"
  socket = "/run/mq/mq.sock"
  high_watermark = "written"        # or "durable": consumers only see fsync'd data
  [topic_defaults]
  "retention.ms" = "604800000"
  "segment.bytes" = "1073741824\""""

EPILOG = """\
exit status: 0 after a clean stop; 1 when it cannot start (the data directory or socket is in
use by another broker, permissions); 2 for bad flags or a bad config file.

examples:
  mq broker                           data dir ~/.local/state/mq, socket <data dir>/mq.sock
  mq broker --data-dir /tmp/mq &      then: MQ_DATA_DIR=/tmp/mq mq topics list
  mq broker --config /etc/mq/mq.toml --log-level DEBUG
  mq broker --log-format json 2>>broker.log      one JSON object a line
  systemd-socket-activate -l /tmp/mq.sock mq broker --data-dir /tmp/mq   socket activation"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "broker", help="run the broker in the foreground", description=DESCRIPTION,
        epilog=EPILOG, formatter_class=formatter)
    broker_main.add_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    return broker_main.run(args)
