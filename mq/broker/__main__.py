"""``python -m mq.broker`` / ``mq broker``: run the broker in the foreground."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from mq import logformat
from mq.broker.config import BrokerConfig, ConfigError
from mq.broker.service import inherited_listener
from mq.errors import MQError
from mq.logformat import LOG_FORMATS
from mq.protocol.paths import path_argument

__all__ = ["add_arguments", "run", "main"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", type=path_argument, help="data directory (default: $MQ_DATA_DIR, else "
                        "$XDG_STATE_HOME/mq, else ~/.local/state/mq)")
    parser.add_argument("--socket", type=path_argument, help="Unix socket path (default: $MQ_SOCKET, else "
                        "<data-dir>/mq.sock)")
    parser.add_argument("--config", metavar="FILE.toml", help="broker config file (TOML)")
    parser.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="logging level (default INFO)")
    parser.add_argument("--log-format", choices=LOG_FORMATS,
                        help="stderr lines: plain (default; without the time and with the "
                        "syslog priority when stderr is journald's) or json (one object a "
                        "line: ts, level, logger, msg, pid, exc)")
    parser.add_argument("--metrics", metavar="HOST:PORT", dest="metrics_address",
                        help="serve OpenMetrics at http://HOST:PORT/metrics (port 0: any free "
                        "port, logged at start; default: off, or metrics_address in the "
                        "config file)")
    parser.add_argument("--kafka-listener", metavar="[PROTOCOL://]HOST:PORT", action="append",
                        dest="kafka_listeners",
                        help="serve Kafka's wire protocol on HOST:PORT; PROTOCOL is PLAINTEXT "
                        "(default; loopback only unless kafka_allow_anonymous), "
                        "SASL_PLAINTEXT, SSL or SASL_SSL (TLS, with kafka_ssl_certfile and "
                        "kafka_ssl_keyfile in the config file); repeatable; port 0: any free "
                        "port, logged at start; default: off, or kafka_listeners in the config "
                        "file")
    parser.add_argument("--spin-us", type=int, metavar="US", dest="spin_us",
                        help="wait strategy of the broker's loop: before each sleep, watch the "
                        "connections for up to US microseconds without sleeping (a CPU kept "
                        "busy meanwhile; a request that comes then costs no scheduler "
                        "wake-up). Default 0: sleep at once")
    parser.add_argument("--ready-fd", type=int, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from mq.broker.server import run_broker
    config = BrokerConfig.load(args.config, data_dir=args.data_dir, socket=args.socket,
                               log_level=args.log_level,
                               log_format=getattr(args, "log_format", None),
                               metrics_address=getattr(args, "metrics_address", None),
                               kafka_listeners=getattr(args, "kafka_listeners", None),
                               spin_us=getattr(args, "spin_us", None))
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logformat.formatter(config.log_format))
    logging.basicConfig(level=config.log_level, handlers=[handler])
    # Socket activation: systemd's listening socket instead of binding one (mq.systemd).
    listener = inherited_listener()

    def ready(broker) -> None:
        if args.ready_fd is not None:
            os.write(args.ready_fd, b"ready\n")
            os.close(args.ready_fd)
    return run_broker(config, ready, listener)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mq broker", description="Run the mq broker.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (MQError, ConfigError, OSError) as err:
        print(f"mq broker: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
