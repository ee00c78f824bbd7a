"""``mq users``: the Kafka listener's SASL users (SCRAM verifiers in the metadata log), over
the Unix socket — Kafka's ``kafka-configs --alter --add-config SCRAM-SHA-256=...``.

``add`` reads the password from standard input (its first line; never from argv, which every
local user can read in ``/proc``), salts it here and sends SCRAM-SHA-256 and SCRAM-SHA-512
verifiers; the broker never sees the password.
"""

from __future__ import annotations

import argparse
import getpass
import sys

from mq.cli.common import add_broker_arguments, add_command_group, client_options, formatter, table

__all__ = ["add_parser"]

DESCRIPTION = """\
Add, delete and list the users that Kafka clients authenticate as on a SASL_PLAINTEXT or
SASL_SSL listener (SCRAM-SHA-256, SCRAM-SHA-512, and PLAIN checked against the same
verifiers). Whoever can connect to the broker's Unix socket can manage them. With
--bootstrap-server: a Kafka cluster's SCRAM users (it needs Cluster Alter / Describe)."""

EPILOG = """\
examples:
  mq users add alice                  (type the password; or: printf '%s\\n' "$PW" | mq users add alice)
  mq users list
  mq users delete alice"""


def add_parser(subparsers) -> None:
    commands = add_command_group(subparsers, "users", "add, delete or list",
                                 help="SASL users of the Kafka listener (SCRAM)",
                                 description=DESCRIPTION, epilog=EPILOG, cluster=True)
    add = commands.add_parser("add", help="add a user, or set its password (from stdin)",
                              description="Add user NAME, or replace its password. The "
                              "password is read from standard input (its first line), or "
                              "asked for without echo on a terminal.",
                              formatter_class=formatter)
    add.add_argument("name", metavar="NAME")
    add.add_argument("--iterations", type=int, default=4096,
                     help="PBKDF2 iterations, 4096..16384 (default 4096)")
    add_broker_arguments(add)
    add.set_defaults(run=run_add)
    delete = commands.add_parser("delete", help="delete a user",
                                 description="Delete user NAME: it can no longer "
                                 "authenticate (connections already open stay).",
                                 formatter_class=formatter)
    delete.add_argument("name", metavar="NAME")
    add_broker_arguments(delete)
    delete.set_defaults(run=run_delete)
    lst = commands.add_parser("list", help="users and their SCRAM mechanisms",
                              description="Print one line per user: its name and "
                              "mechanisms with their iterations.", formatter_class=formatter)
    add_broker_arguments(lst)
    lst.set_defaults(run=run_list)


def _admin(args: argparse.Namespace):
    from mq.client.admin import Admin
    return Admin(**client_options(args))


def _read_password() -> str:
    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
    else:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise ValueError("no password given on standard input")
    return password


def run_add(args: argparse.Namespace) -> int:
    from mq.protocol.kafka.sasl import check_iterations
    check_iterations(args.iterations)
    if not args.name or len(args.name) > 255:
        raise ValueError("a user name must be 1 to 255 characters")
    password = _read_password()
    with _admin(args) as admin:
        admin.add_user(args.name, password, args.iterations)
    return 0


def run_delete(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        admin.delete_user(args.name)
    return 0


def run_list(args: argparse.Namespace) -> int:
    with _admin(args) as admin:
        users = admin.describe_user_scram_credentials()
    if users:
        sys.stdout.write(table(("User", "Mechanisms"), (
            (user, ",".join(f"{m}:{i}" for m, i in infos)) for user, infos in users.items())))
    return 0
