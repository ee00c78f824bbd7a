"""``mq systemd install``: write mq's systemd units for the Python environment running it.

The units come from ``mq.cli.systemd_units`` (one source; ``systemd/`` in the repository is
the same text for ``/usr/bin/python3``). Installing only writes files and prints the commands
to run next: reloading systemd and enabling units stay the operator's call.
"""

from __future__ import annotations

import argparse
import os
import sys

from mq.cli.common import formatter
from mq.cli.systemd_units import SOCKET_PATHS, SYSUSERS_FILE, render

__all__ = ["add_parser"]

SYSTEM_UNIT_DIR = "/etc/systemd/system"
SYSUSERS_PATH = "/etc/sysusers.d/mq.conf"

DESCRIPTION = """\
Run mq under systemd: the broker as a Type=notify service with a watchdog, started by its
socket (clients that connect while it restarts wait instead of failing), and worker pools as
instances of mq-worker@.service, drained on stop."""

EPILOG = """\
examples:
  mq systemd install --user           then: systemctl --user daemon-reload
                                            systemctl --user enable --now mq-broker.socket
  sudo mq systemd install             system units, the mq user and group (sysusers.d)
  mq systemd install --print          show the units, write nothing"""

INSTALL_DESCRIPTION = """\
Write mq-broker.socket, mq-broker.service and mq-worker@.service running this Python
({python} -m mq), then print the commands that enable them.

--user: for your own systemd (no root): ~/.config/systemd/user; data and socket in
~/.local/state/mq, where mq's clients look by default.
Without --user: for the system manager (as root): /etc/systemd/system, plus the mq user and
group in /etc/sysusers.d/mq.conf; data in /var/lib/mq, socket /run/mq/mq.sock (clients:
MQ_SOCKET=/run/mq/mq.sock, and membership in group mq)."""

INSTALL_EPILOG = """\
The broker unit: Type=notify (READY=1 after recovery), WatchdogSec=30s, Restart=on-failure,
KillMode=mixed with TimeoutStopSec=120s to drain, SIGHUP reload, sandboxed. A worker pool
per instance: mq-worker@NAME reads its `mq workers run` arguments from
%E/mq/workers/NAME.env (MQ_WORKER_ARGS=...; %E is /etc, or ~/.config with --user).

exit status: 0 written (or printed); 1 when a file cannot be written; 2 for bad arguments.

examples:
  mq systemd install --user
  mq systemd install --dir /tmp/units
  mq systemd install --user --print | less"""


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("systemd", help="write systemd units for the broker and "
                                   "worker pools", description=DESCRIPTION, epilog=EPILOG,
                                   formatter_class=formatter)

    def no_command(args: argparse.Namespace) -> int:
        raise ValueError("no systemd command given: install (see 'mq systemd --help')")
    parser.set_defaults(run=no_command)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND",
                                     dest="systemd_command")
    install = commands.add_parser(
        "install", help="write the units for this Python environment",
        description=INSTALL_DESCRIPTION.format(python=sys.executable),
        epilog=INSTALL_EPILOG, formatter_class=formatter)
    install.add_argument("--user", action="store_true",
                         help="units for your user's systemd (systemctl --user)")
    where = install.add_mutually_exclusive_group()
    where.add_argument("--dir", metavar="DIR",
                       help="write every file into DIR instead (made if missing)")
    where.add_argument("--print", action="store_true", dest="print_only",
                       help="print the files to stdout, write nothing")
    install.add_argument("--python", metavar="PATH", default=sys.executable,
                         help="the Python that runs mq (default: this one, %(default)s)")
    install.set_defaults(run=run_install)


def user_unit_dir() -> str:
    config = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"),
                                                               ".config")
    return os.path.join(config, "systemd", "user")


def run_install(args: argparse.Namespace) -> int:
    python = args.python
    if not python:
        raise ValueError("cannot tell which Python runs mq (sys.executable is empty); "
                         "pass --python PATH")
    python = os.path.abspath(python)
    units = render(python, user=args.user)
    if args.print_only:
        for unit in units:
            sys.stdout.write(f"### {unit.name}\n{unit.text}\n")
        return 0
    if args.dir and os.path.exists(args.dir) and not os.path.isdir(args.dir):
        raise ValueError(f"--dir {args.dir}: not a directory")
    unit_dir = args.dir or (user_unit_dir() if args.user else SYSTEM_UNIT_DIR)
    written = []
    for unit in units:
        if unit.name == SYSUSERS_FILE and not args.dir:
            path = SYSUSERS_PATH
        else:
            path = os.path.join(unit_dir, unit.name)
        _write(path, unit.text)
        written.append(path)
    print("wrote " + ", ".join(written))
    print(_next_steps(args.user, bool(args.dir)))
    return 0


def _write(path: str, text: str) -> None:
    """Write ``path`` whole (temp file + rename: systemd never reads half a unit)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _next_steps(user: bool, elsewhere: bool) -> str:
    ctl = "systemctl --user" if user else "systemctl"
    lines = ["next:"]
    if elsewhere:
        lines.append(f"  copy them into {user_unit_dir() if user else SYSTEM_UNIT_DIR}"
                     + ("" if user else f" ({SYSUSERS_FILE} to {SYSUSERS_PATH})"))
    if not user:
        lines.append(f"  systemd-sysusers {SYSUSERS_PATH}       the mq and mq-worker users")
    lines += [f"  {ctl} daemon-reload",
              f"  {ctl} enable --now mq-broker.socket      the broker starts at the first "
              "client",
              f"  {ctl} status mq-broker                  its STATUS= line; logs: "
              f"journalctl {'--user ' if user else ''}-u mq-broker"]
    settings = "~/.config/mq/workers" if user else "/etc/mq/workers"
    lines += ["worker pools, one per name:",
              f"  mkdir -p {settings} && echo 'MQ_WORKER_ARGS=jobs:handle --topic jobs "
              f"--group billing' > {settings}/billing.env",
              f"  {ctl} enable --now mq-worker@billing"]
    if user:
        lines.append("  loginctl enable-linger $USER            keep them running after "
                     "you log out")
    else:
        lines.append(f"clients: MQ_SOCKET={SOCKET_PATHS['system']}, and membership in "
                     "group mq (usermod -aG mq NAME)")
    return "\n".join(lines)
