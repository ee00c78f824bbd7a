"""The systemd units of mq, rendered from this one source: ``mq systemd install`` writes them
for the running Python, and ``systemd/`` holds them rendered for ``/usr/bin/python3`` (system
variant; a test checks the files equal ``render(CHECKED_IN_PYTHON)``).

Two variants of each unit, because a system manager and a user manager differ in what they
can do and where things live:

- system (``/etc/systemd/system``): a dedicated ``mq`` user and group (``mq-sysusers.conf``,
  for ``/etc/sysusers.d/mq.conf``), data in ``/var/lib/mq`` (``%S/mq``), the socket at
  ``/run/mq/mq.sock`` (runtime files belong in /run; clients set ``MQ_SOCKET``), full
  sandboxing;
- user (``~/.config/systemd/user``): data in ``~/.local/state/mq`` and the socket at
  ``~/.local/state/mq/mq.sock`` (``%S/mq/mq.sock``), exactly where clients look by default
  (``docs/api.md``, "Finding the broker"), so they need no settings; only the sandboxing that works
  without a user namespace (a user manager may not be allowed one).

What no variant may do: give the broker a private ``/dev/shm`` or remove its IPC objects at
stop (``PrivateIPC=``, ``RemoveIPC=``, ``DynamicUser=`` which implies it). The state region
and the wake-up semaphores live in ``/dev/shm`` and are shared with clients outside the unit.
"""

from __future__ import annotations

import dataclasses

__all__ = ["CHECKED_IN_PYTHON", "SOCKET_PATHS", "SYSUSERS_FILE", "Unit", "render"]

CHECKED_IN_PYTHON = "/usr/bin/python3"
SYSUSERS_FILE = "mq-sysusers.conf"
# Where clients find the broker, per variant (ListenStream= of mq-broker.socket).
SOCKET_PATHS = {"system": "/run/mq/mq.sock", "user": "%S/mq/mq.sock"}
DRAIN_TIMEOUT_S = 30                     # mq workers run --drain-timeout-s default


@dataclasses.dataclass(frozen=True)
class Unit:
    """One file: its name (in the unit directory) and text."""

    name: str
    text: str


def exec_quote(path: str) -> str:
    """``path`` as the first word of an ``ExecStart=`` line: ``%``, ``$``, ``\\`` and ``"``
    escaped (systemd.service(5), "Command lines"), quoted if it has blanks."""
    escaped = path.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%") \
        .replace("$", "$$")
    return f'"{escaped}"' if any(c.isspace() for c in path) or escaped != path else escaped


def render(python: str, user: bool = False) -> list[Unit]:
    """The units (and, for the system variant, the sysusers.d snippet) running ``python``.
    Raises ``ValueError`` for a Python path that is not absolute."""
    if not python.startswith("/"):
        raise ValueError(f"the Python of the units must be an absolute path, got {python!r}")
    if "\n" in python:
        raise ValueError("the Python path has a newline in it")
    exe = exec_quote(python)
    units = [Unit("mq-broker.socket", _socket(user)),
             Unit("mq-broker.service", _broker(exe, user)),
             Unit("mq-worker@.service", _worker(exe, user))]
    if not user:
        units.append(Unit(SYSUSERS_FILE, _SYSUSERS))
    return units


_HEADER = """\
# {name}: {what}
# Written by `mq systemd install{flag}` (mq/cli/systemd_units.py); change it with
# `systemctl{ctl} edit {name}` rather than here, so a new install does not undo it.
"""


def _header(name: str, what: str, user: bool) -> str:
    flag = " --user" if user else ""
    return _HEADER.format(name=name, what=what, flag=flag, ctl=flag)


def _socket(user: bool) -> str:
    owner = "" if user else """\
# Who may connect: group mq (add client users with `usermod -aG mq NAME`). The same group
# reads the data files, which clients map read-only (file_mode 0640).
SocketUser=mq
SocketGroup=mq
"""
    return _header("mq-broker.socket", "the broker's Unix socket, held by systemd", user) + f"""\
#
# systemd creates the socket before the broker runs and keeps it while the broker restarts:
# a client that connects meanwhile waits in the backlog, and its handshake completes when the
# next broker accepts (within the client's 30 s request timeout). The broker never removes
# it. Clients find it {'by default (no settings)' if user else 'with MQ_SOCKET=/run/mq/mq.sock'}.

[Unit]
Description=mq message broker socket

[Socket]
ListenStream={SOCKET_PATHS['user' if user else 'system']}
{owner}SocketMode=0660
# The directory above the socket: clients must be able to traverse it.
DirectoryMode={'0750' if user else '0755'}
# Room for clients queued during a restart (the kernel caps it at net.core.somaxconn).
Backlog=4096
RemoveOnStop=yes

[Install]
WantedBy=sockets.target
"""


# Sandboxing that needs no namespaces (seccomp and prctl only): fine for user managers too.
_HARDENING_ALWAYS = """\
NoNewPrivileges=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallErrorNumber=EPERM
"""

# Worker pools run the application's handlers: no syscall filter or address-family limits.
_HARDENING_WORKER = """\
NoNewPrivileges=yes
RestrictSUIDSGID=yes
LockPersonality=yes
"""

# Namespace-based sandboxing: system units only.
_HARDENING_SYSTEM = """\
# Read-only /usr, /etc, /boot and the rest; StateDirectory= stays writable, and so do the
# API file systems, /dev/shm included (the shared state region and semaphores).
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes
# A private /dev with the pseudo devices only; systemd bind-mounts the host's /dev/shm into
# it, so clients still share the broker's shared memory and semaphores.
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
RestrictNamespaces=yes
CapabilityBoundingSet=
# Unix sockets for clients and systemd; IPv4/6 only for --metrics HOST:PORT.
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
"""


def _broker(exe: str, user: bool) -> str:
    account = "" if user else """\
User=mq
Group=mq
"""
    sandbox = _HARDENING_ALWAYS + ("" if user else _HARDENING_SYSTEM)
    namespaces = """\
# ProtectSystem=, PrivateTmp= and the other namespace options are left out: a user manager
# may not be allowed the user namespace they need, and the unit would not start.
""" if user else ""
    return _header("mq-broker.service", "the mq broker", user) + f"""\
#
# Type=notify: the broker says READY=1 once recovery is done and the socket is served, sends
# WATCHDOG=1 from its event loop (a wedged loop stops them and systemd restarts it), STATUS=
# lines for `systemctl status`, RELOADING=1/READY=1 around a reload and STOPPING=1 on stop,
# and extends the start timeout while a long recovery makes progress.

[Unit]
Description=mq message broker
# The socket is always passed (socket activation): the broker never binds one itself here.
Requires=mq-broker.socket
After=mq-broker.socket

[Service]
Type=notify
# Only the broker process itself may notify (it has no children).
NotifyAccess=main
# Optional settings in %E/mq/broker.env (/etc/mq, or ~/.config/mq for --user), e.g.
#   MQ_BROKER_ARGS=--config /etc/mq/mq.toml --metrics 127.0.0.1:9400
# (arguments of `mq broker`, split at blanks, no quoting).
EnvironmentFile=-%E/mq/broker.env
ExecStart={exe} -m mq broker --data-dir %S/mq $MQ_BROKER_ARGS
# SIGHUP reloads the log level and topic defaults of --config (the broker tells systemd).
ExecReload=/bin/kill -HUP $MAINPID
{account}# %S/mq: /var/lib/mq (system) or ~/.local/state/mq (user). 0750: group mq may read the
# logs, which clients map read-only; the broker writes files 0640 (file_mode).
StateDirectory=mq
StateDirectoryMode=0750
UMask=0027
# The loop pings every 15 s; it never blocks on fsync (a thread does that), so 30 s without
# a ping means it is stuck.
WatchdogSec=30s
Restart=on-failure
RestartSec=1s
# SIGTERM to the broker only; it answers in-flight acks=all produces, fsyncs every log and
# writes the clean-shutdown marker (a clean stop skips recovery at the next start). 120 s
# covers flushing a page cache full of acks=1 data on a slow disk; SIGKILL only after that.
KillMode=mixed
TimeoutStopSec=120s
# A partition holds 3 open files (its active segment; 4 while fsynced), older segments none,
# and a client connection 1-2: 65536 holds about 16,000 partitions beside 128 clients. The
# broker raises its soft limit to this hard one and refuses, with one line, a start or a topic
# change that would not fit (`journalctl -u mq-broker` shows the limit at every start).
LimitNOFILE=65536
# Sandboxing. Not used: PrivateIPC=, RemoveIPC=, DynamicUser= (/dev/shm is shared with
# clients outside the unit) and MemoryDenyWriteExecute= (Python extensions may need it).
{namespaces}{sandbox}
[Install]
WantedBy={'default.target' if user else 'multi-user.target'}
Also=mq-broker.socket
"""


def _worker(exe: str, user: bool) -> str:
    settings = "%E/mq/workers/%i.env"      # /etc/mq/workers (system), ~/.config/mq/workers
    account = "" if user else """\
# Its own user (handler code gets no write access to the broker's data), in group mq as its
# primary group: it may connect to the socket and read the logs, and the wake-up semaphores
# its consumers create in /dev/shm are group mq, rw (UMask), so the broker can post them.
# Not DynamicUser=: its group could not be mq.
User=mq-worker
Group=mq
UMask=0007
Environment=MQ_SOCKET=/run/mq/mq.sock
"""
    return _header("mq-worker@.service", "a worker pool per instance name", user) + f"""\
#
# `systemctl{' --user' if user else ''} enable --now mq-worker@billing` runs the pool whose
# settings are in {settings.replace('%i', 'billing')} (%E: /etc, or ~/.config for --user):
#
#   MQ_WORKER_ARGS=jobs:handle --topic jobs --group billing --processes 4
#   PYTHONPATH=/srv/billing              # where the handler's module is
#
# MQ_WORKER_ARGS are the arguments of `mq workers run` (split at blanks, no quoting).
# Type=notify: the supervisor sends READY=1 once every child joined its group, WATCHDOG=1
# and STOPPING=1 when it drains.

[Unit]
Description=mq worker pool %i
# The broker first (ready, not merely started), and stopped after the pool drained.
Wants=mq-broker.service
After=mq-broker.service

[Service]
Type=notify
NotifyAccess=main
{account}EnvironmentFile={settings}
ExecStart={exe} -m mq workers run $MQ_WORKER_ARGS
# SIGHUP restarts the children one at a time, importing the handler's code again.
ExecReload=/bin/kill -HUP $MAINPID
# SIGTERM to the supervisor only: it drains the children (finish the records in hand,
# commit, leave the group) for up to --drain-timeout-s ({DRAIN_TIMEOUT_S} s by default); SIGKILL for
# what is left only after TimeoutStopSec, which must stay above the drain timeout.
KillMode=mixed
TimeoutStopSec={DRAIN_TIMEOUT_S * 2}s
WatchdogSec=30s
Restart=on-failure
RestartSec=5s
# Handler code is the application's: only the sandboxing that does not get in its way.
{_HARDENING_WORKER}
[Install]
WantedBy={'default.target' if user else 'multi-user.target'}
"""


_SYSUSERS = """\
# mq-sysusers.conf: the mq system user and group (sysusers.d(5)), for /etc/sysusers.d/mq.conf.
# Written by `mq systemd install` (mq/cli/systemd_units.py). They own the broker's data and
# socket; client users join the group: `usermod -aG mq NAME`.
u mq - "mq message broker" /var/lib/mq
# Worker pools (mq-worker@.service) run as mq-worker, with mq as their primary group.
u mq-worker - "mq worker pools"
m mq-worker mq
"""
