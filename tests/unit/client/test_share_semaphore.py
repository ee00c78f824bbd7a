"""A consumer's wake-up semaphore is opened by the broker, which may run as another user
(user ``mq`` under the systemd units): ``share_semaphore`` makes it read-write for the group
whatever the umask, and hands it to the broker's group."""

from __future__ import annotations

import os
import secrets
import stat

import posix_ipc
import pytest

from mq.client.consumer_driver import share_semaphore

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")


@pytest.fixture
def semaphore():
    name = f"/mq-test-share-{os.getpid()}-{secrets.token_hex(4)}"
    old = os.umask(0o077)                     # the strictest umask a user may have
    try:
        sem = posix_ipc.Semaphore(name, posix_ipc.O_CREX, mode=0o660, initial_value=0)
    finally:
        os.umask(old)
    yield name, "/dev/shm/sem." + name[1:]
    sem.unlink()
    sem.close()


def test_group_may_open_it_whatever_the_umask(semaphore):
    name, path = semaphore
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    share_semaphore(name, os.getegid())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
    assert os.stat(path).st_gid == os.getegid()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another group needs root "
                                              "or membership of that group")
def test_it_goes_to_the_brokers_group(semaphore):
    name, path = semaphore
    share_semaphore(name, 65534)
    assert os.stat(path).st_gid == 65534


def test_a_refused_change_leaves_it_as_created(tmp_path):
    share_semaphore("/mq-test-no-such-semaphore", 65534)          # no file: nothing happens
