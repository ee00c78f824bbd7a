"""Usage errors of every ``mq`` command: an unknown option is the error reported, before
anything it made argparse miss (``mq consume --bogus`` used to say TOPIC was missing)."""

from __future__ import annotations

import argparse

import pytest
from cli_run import assert_one_error, mq_run

from mq.cli.main import build_parser, main


def _command_paths(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every command and subcommand of ``mq``, as argument tuples (``("topics", "create")``)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name)
                yield from _command_paths(sub, (*path, name))


COMMANDS = sorted(set(_command_paths(build_parser())))


def test_every_command_is_covered():
    assert {("consume",), ("topics", "create"), ("groups", "reset-offsets"), ("log", "check"),
            ("dump-log",), ("broker",), ("demo",)} <= set(COMMANDS)


def test_consume_names_the_unknown_flag_not_the_missing_topic():
    line = assert_one_error(mq_run("consume", "--bogus"), "unrecognized arguments: --bogus",
                            "'mq consume --help'", code=2)
    assert "TOPIC" not in line


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_unknown_flag_is_reported_first(command, capsys):
    assert main([*command, "--bogus"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"mq: error: unrecognized arguments: --bogus (see 'mq {' '.join(command)} "
                   "--help')\n")


@pytest.mark.parametrize("argv, unknown, where", [
    (["--bogus", "consume"], "--bogus", "mq"),                   # before the command
    (["consume", "--from-beginning", "-x", "--bogus=1"], "-x --bogus=1", "mq consume"),
    (["groups", "reset-offsets", "--shift-by", "-100", "--nope"], "--nope",
     "mq groups reset-offsets"),                                 # -100 is a value
    (["produce", "--key-separator", "-", "--nope"], "--nope", "mq produce"),
])
def test_unknown_flags_anywhere(argv, unknown, where, capsys):
    assert main(argv) == 2
    assert capsys.readouterr().err == (f"mq: error: unrecognized arguments: {unknown} "
                                       f"(see '{where} --help')\n")


@pytest.mark.parametrize("argv, message", [
    (["consume", "--from-beg"], "required: TOPIC"),              # an abbreviation is known
    (["consume", "--max-messages", "-5"], "must be at least 1, got -5"),   # a value
    (["consume", "--socket", "--bogus"], "--socket: expected one argument"),
    (["groups", "reset-offsets", "--shift-by", "-100"], "required: GROUP, --topic"),
])
def test_known_flags_keep_argparses_message(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "unrecognized" not in err and len(err.splitlines()) == 1
