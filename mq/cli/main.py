"""Entry point of the ``mq`` command (``mq = "mq.cli.main:main"``; also ``python -m mq``).

Subcommands are modules listed in ``COMMAND_MODULES``; each exposes ``add_parser(subparsers)``,
which adds its parser with a ``run(args) -> int`` default. Adding a command means writing
``mq/cli/<name>.py`` and listing it here.

Exit status: what ``run`` returns; 2 for usage errors (bad flags, bad values: ``ValueError``);
1 for expected errors (``MQError``, ``OSError``: missing file, permission denied, ...), each
printed as one ``mq: error: ...`` line on stderr; 130 on Ctrl-C; 141 (128 + SIGPIPE), silently,
when stdout is a pipe whose reader went away (``mq dump-log ... | head``). Anything else is a bug
in mq and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import sys
from collections.abc import Sequence

from mq import __version__
from mq.cli import PROG, print_error
from mq.errors import ConfigError, MQError

__all__ = ["COMMAND_MODULES", "UsageError", "build_parser", "main"]

# In the order ``mq --help`` lists them (the API's order: broker and demo, topics, produce,
# consume, offsets, groups, transactions, ACLs, worker pools, systemd units, the move to Kafka, then the offline
# storage tools).
COMMAND_MODULES: tuple[str, ...] = (
    "mq.cli.broker",
    "mq.cli.demo",
    "mq.cli.topics",
    "mq.cli.produce",
    "mq.cli.consume",
    "mq.cli.offsets",
    "mq.cli.groups",
    "mq.cli.transactions",
    "mq.cli.acls",
    "mq.cli.users",
    "mq.cli.top",
    "mq.cli.workers",
    "mq.cli.systemd",
    "mq.cli.migrate",
    "mq.cli.dump_log",
    "mq.cli.log_check",
)

DESCRIPTION = """\
mq: a single-host persistent message queue with Apache Kafka's data model and on-disk log
format. Client commands find the broker at --socket, else $MQ_SOCKET, else <data dir>/mq.sock
(data dir: $MQ_DATA_DIR, else $XDG_STATE_HOME/mq, else ~/.local/state/mq); with
--bootstrap-server HOST:PORT (or $MQ_BOOTSTRAP_SERVERS, without --socket) they talk to an
Apache Kafka cluster instead, --command-config FILE holding its client properties (SASL, TLS).
dump-log and log check work on a data directory without a broker."""

EPILOG = """\
examples:
  mq demo                                       broker, producers and consumers at work
  mq broker &                                   run a broker on the default data dir
  mq topics create orders --partitions 4
  seq 10 | mq produce orders && mq consume orders --from-beginning --max-messages 10
  mq groups describe billing                    committed offsets, lag and members of a group
  mq transactions describe billing-1            state and partitions of a transactional id
  mq acls add --allow-principal User:alice --operation Read --topic orders
  mq top                                        live view: topics, rates, groups, lag
  mq topics list --bootstrap-server k1:9092     the same commands on a Kafka cluster
  mq workers run jobs:handle --topic jobs --group billing --processes 4
  mq migrate --to kafka1:9092                   topics, records, group offsets into Kafka
  mq dump-log --print-data DIR/orders-0/00000000000000000000.log
  mq log check DIR/orders-0 DIR/orders-1        verify partition directories offline

Run 'mq COMMAND --help' for the options and output of each command."""


class UsageError(Exception):
    """Bad command-line usage; printed as one line, exit status 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a usage error is one ``mq: error:`` line instead of usage + message."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(f"{message} (see '{self.prog} --help')")


_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")     # argparse's negative numbers: values


def unknown_options(parser: argparse.ArgumentParser, argv: Sequence[str]
                    ) -> tuple[argparse.ArgumentParser, list[str]]:
    """The options in ``argv`` that the parser of their (sub)command does not know, and that
    parser (its prog names the command in the message). argparse checks required arguments
    before it reports unknown ones, so ``mq consume --bogus`` would complain about TOPIC;
    ``main`` asks this first. Abbreviations of long options count as known (argparse takes
    them, or calls them ambiguous)."""
    unknown: list[str] = []
    where = parser
    args = list(argv)
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if arg == "--":
            break
        if not arg.startswith("-") or arg == "-" or _NUMBER.match(arg) or " " in arg:
            sub = _subcommand(parser, arg)
            if sub is not None:
                parser = sub
            continue
        action = _option(parser, arg)
        if action is None:
            if not unknown:
                where = parser
            unknown.append(arg)
        elif action.nargs is None and "=" not in arg and arg == _name_of(action, arg):
            i += 1                                  # its value, whatever it looks like
    return where, unknown


def _name_of(action: argparse.Action, arg: str) -> str:
    """``arg`` if it is the whole option (``-n``, ``--max-messages`` or an abbreviation),
    else the option it starts (``-n5``: its value is attached)."""
    return arg if arg.startswith("--") or arg in action.option_strings else arg[:2]


def _subcommand(parser: argparse.ArgumentParser, name: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None


def _option(parser: argparse.ArgumentParser, arg: str):
    """The action ``arg`` names in ``parser`` (``--opt=value``, ``-xVALUE`` and unambiguous
    ``--op`` abbreviations included), or None."""
    options = parser._option_string_actions
    if arg.startswith("--"):
        name = arg.split("=", 1)[0]
        if name in options:
            return options[name]
        matches = [options[o] for o in options if o.startswith(name)]
        return matches[0] if matches else None      # several: argparse calls it ambiguous
    return options.get(arg) or options.get(arg[:2])


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(prog=PROG, description=DESCRIPTION, epilog=EPILOG,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
    return parser


def _silence_stdout() -> None:
    """After EPIPE: point stdout at /dev/null so that the interpreter's final flush of the
    buffered rest cannot raise again ("Exception ignored ... BrokenPipeError")."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``mq`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    try:
        sys.stdout.reconfigure(errors="backslashreplace")  # type: ignore[union-attr]
    except (AttributeError, ValueError):
        pass
    # The storage layer logs what recovery does (warnings); the commands report it themselves,
    # so keep Python's last-resort handler from adding stray stderr lines.
    mq_logger = logging.getLogger("mq")
    if not mq_logger.handlers:
        mq_logger.addHandler(logging.NullHandler())
    try:
        parser = build_parser()
        argv = sys.argv[1:] if argv is None else list(argv)
        try:
            args = parser.parse_args(argv)
        except SystemExit as exc:            # --help, --version
            return exc.code if isinstance(exc.code, int) else 0
        except UsageError as err:
            # An unknown option is the error to report, not what it made argparse miss.
            command, unknown = unknown_options(parser, argv)
            if unknown:
                raise UsageError(f"unrecognized arguments: {' '.join(unknown)} (see "
                                 f"'{command.prog} --help')") from err
            raise
        run = getattr(args, "run", None)
        if run is None:
            raise UsageError(f"no command given (see '{PROG} --help')")
        code = run(args)
        sys.stdout.flush()
        return code
    except UsageError as err:
        print_error(str(err))
        return 2
    except BrokenPipeError:
        _silence_stdout()
        return 141
    except KeyboardInterrupt:
        print_error("interrupted")
        return 130
    except ConfigError as err:              # a bad config file or value: like a bad flag
        print_error(err)
        return 2
    except MQError as err:
        print_error(err)
        return 1
    except ValueError as err:
        print_error(err)
        return 2
    except OSError as err:
        print_error(err)
        return 1


if __name__ == "__main__":
    sys.exit(main())
