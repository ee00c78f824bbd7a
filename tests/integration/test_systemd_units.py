"""The systemd units: the files in ``systemd/`` are exactly what ``mq systemd install`` renders
for /usr/bin/python3, ``systemd-analyze verify`` accepts every unit (system and --user
variants), and ``mq systemd install`` writes, prints and refuses as its help says."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest
from cli_run import ENV, assert_help, assert_one_error, mq_run, ok

from mq.cli.systemd_units import CHECKED_IN_PYTHON, SYSUSERS_FILE, exec_quote, render

REPO = pathlib.Path(__file__).resolve().parents[2]
SHIPPED = REPO / "systemd"
UNITS = ("mq-broker.socket", "mq-broker.service", "mq-worker@.service")

needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                   reason="systemd-analyze is not installed")


def test_shipped_files_are_the_rendered_system_units():
    rendered = {unit.name: unit.text for unit in render(CHECKED_IN_PYTHON)}
    assert set(rendered) == {*UNITS, SYSUSERS_FILE}
    for name, text in rendered.items():
        assert (SHIPPED / name).read_text() == text, \
            f"systemd/{name} differs: python3 -m mq systemd install --dir systemd " \
            f"--python {CHECKED_IN_PYTHON}"


def _verify(directory: pathlib.Path, user: bool, tmp_path) -> None:
    """``systemd-analyze [--user] verify`` on every unit in ``directory`` (the template as
    an instance): exit 0 and not one line of complaint."""
    instance = directory / "mq-worker@pool1.service"
    shutil.copy(directory / "mq-worker@.service", instance)
    env = dict(os.environ)
    if user:                            # a user manager needs a runtime dir to start up
        runtime = tmp_path / "runtime"
        runtime.mkdir(mode=0o700, exist_ok=True)
        env["XDG_RUNTIME_DIR"] = str(runtime)
    cmd = ["systemd-analyze", *(["--user"] if user else []), "verify",
           *(str(directory / name) for name in (*UNITS[:2], instance.name))]
    done = subprocess.run(cmd, cwd=directory, capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), \
        f"{' '.join(cmd)}: exit {done.returncode}\n{done.stdout}{done.stderr}"


@needs_analyze
@pytest.mark.skipif(not os.path.exists(CHECKED_IN_PYTHON),
                    reason=f"{CHECKED_IN_PYTHON} does not exist (verify checks ExecStart)")
def test_systemd_analyze_verifies_the_shipped_units(tmp_path):
    units = tmp_path / "system"
    units.mkdir()
    for name in UNITS:
        shutil.copy(SHIPPED / name, units / name)
    _verify(units, False, tmp_path)


@needs_analyze
@pytest.mark.parametrize("user", [False, True], ids=["system", "user"])
def test_systemd_analyze_verifies_installed_units(tmp_path, user):
    units = tmp_path / "units"
    result = ok(mq_run("systemd", "install", *(["--user"] if user else []), "--dir", units))
    _verify(units, user, tmp_path)
    assert ("--user" in result.out) == user


def test_install_writes_the_units_for_this_python_and_says_what_next(tmp_path):
    import sys
    units = tmp_path / "units"
    result = ok(mq_run("systemd", "install", "--dir", units))
    assert sorted(os.listdir(units)) == sorted((*UNITS, SYSUSERS_FILE))
    service = (units / "mq-broker.service").read_text()
    assert f"ExecStart={sys.executable} -m mq broker --data-dir %S/mq $MQ_BROKER_ARGS\n" \
        in service
    for needed in ("Type=notify", "NotifyAccess=main", "WatchdogSec=", "Restart=on-failure",
                   "KillMode=mixed", "TimeoutStopSec=", "ExecReload=/bin/kill -HUP $MAINPID",
                   "StateDirectory=mq", "ProtectSystem=strict", "ProtectHome=yes",
                   "NoNewPrivileges=yes", "PrivateTmp=yes", "User=mq"):
        assert needed in service, needed
    for forbidden in ("\nPrivateIPC=", "\nRemoveIPC=yes", "\nDynamicUser=yes"):
        assert forbidden not in service
    socket_unit = (units / "mq-broker.socket").read_text()
    assert "ListenStream=/run/mq/mq.sock\n" in socket_unit and "SocketMode=0660\n" in socket_unit
    worker = (units / "mq-worker@.service").read_text()
    assert "EnvironmentFile=%E/mq/workers/%i.env\n" in worker
    assert "After=mq-broker.service" in worker and "KillMode=mixed" in worker
    assert "systemctl daemon-reload" in result.out
    assert "systemctl enable --now mq-broker.socket" in result.out
    assert "MQ_SOCKET=/run/mq/mq.sock" in result.out


def test_install_user_puts_the_socket_where_clients_look(tmp_path):
    env = dict(ENV, XDG_CONFIG_HOME=str(tmp_path / "config"))
    result = ok(mq_run("systemd", "install", "--user", env=env))
    units = tmp_path / "config" / "systemd" / "user"
    assert sorted(os.listdir(units)) == sorted(UNITS)           # no system user for --user
    assert "ListenStream=%S/mq/mq.sock\n" in (units / "mq-broker.socket").read_text()
    service = (units / "mq-broker.service").read_text()
    assert "\nUser=" not in service and "\nProtectSystem=" not in service
    assert "WantedBy=default.target" in service
    for line in ("systemctl --user daemon-reload",
                 "systemctl --user enable --now mq-broker.socket"):
        assert line in result.out


def test_install_print_writes_nothing(tmp_path):
    result = ok(mq_run("systemd", "install", "--user", "--print"))
    for name in UNITS:
        assert f"### {name}\n" in result.out
    assert "Type=notify" in result.out


def test_install_errors_are_one_line(tmp_path):
    afile = tmp_path / "file"
    afile.write_text("")
    assert_one_error(mq_run("systemd", "install", "--dir", afile), "not a directory", code=2)
    assert_one_error(mq_run("systemd", "install", "--dir", tmp_path / "d", "--print"),
                     "not allowed with", code=2)
    readonly = tmp_path / "ro"
    readonly.mkdir(mode=0o500)
    if os.geteuid() != 0:                      # root writes anyway
        assert_one_error(mq_run("systemd", "install", "--dir", readonly / "x"), code=1)
    assert_one_error(mq_run("systemd"), "no systemd command given", code=2)


def test_help():
    assert_help(("systemd",), socket=False)
    assert_help(("systemd", "install"), socket=False)


def test_exec_quote():
    assert exec_quote("/usr/bin/python3") == "/usr/bin/python3"
    assert exec_quote("/opt/my env/bin/python") == '"/opt/my env/bin/python"'
    assert exec_quote("/opt/100%/python") == '"/opt/100%%/python"'
    with pytest.raises(ValueError, match="absolute"):
        render("python3")
