"""``mq.protocol._futex``: futex waits and wakes on shared words, across real processes."""

from __future__ import annotations

import contextlib
import mmap
import multiprocessing
import os
import secrets
import threading

import posix_ipc
import pytest

from mq.protocol.state import futex

pytestmark = pytest.mark.skipif(futex is None, reason="mq.protocol._futex is not built")

CTX = multiprocessing.get_context("fork")
WAIT = 30.0


def word(m, offset: int) -> int:
    return int.from_bytes(m[offset:offset + 4], "little")


def put(m, offset: int, value: int) -> None:
    m[offset:offset + 4] = value.to_bytes(4, "little")


@pytest.fixture
def region():
    """A POSIX shared-memory page, mapped read-write and read-only (as broker and client)."""
    shm = posix_ipc.SharedMemory(f"/mq-test-futex-{os.getpid()}-{secrets.token_hex(4)}",
                                 posix_ipc.O_CREX, size=4096)
    rw = mmap.mmap(shm.fd, 4096)
    ro = mmap.mmap(shm.fd, 4096, access=mmap.ACCESS_READ)
    shm.close_fd()
    shm.unlink()
    yield rw, ro
    ro.close()
    rw.close()


def test_a_timeout_a_changed_word_and_a_wake():
    m, local = mmap.mmap(-1, 4096), bytearray(4)
    assert futex.wait_any(m, [0, 64], [0, 0], local, 0, 0.01) == -1
    put(m, 64, 7)
    assert futex.wait_any(m, [0, 64], [0, 0], local, 0, WAIT) == -2   # never slept
    assert futex.wait_any(m, [0], [0], local, 1, WAIT) == -2          # the local word too
    assert futex.wake(m, 0, 1) == 0                                   # nobody asleep

    def wake_second() -> None:
        while futex.wake(m, 64, 1) == 0:
            pass
    t = threading.Thread(target=wake_second)
    t.start()
    assert futex.wait_any(m, [0, 64], [0, 7], local, 0, WAIT) == 1
    t.join()


def test_the_local_word_interrupts_a_sleep():
    m, local = mmap.mmap(-1, 4096), bytearray(4)

    def interrupt() -> None:
        local[:] = (1).to_bytes(4, "little")
        futex.wake(local, 0, 1, private=True)
    t = threading.Timer(0.05, interrupt)
    t.start()
    assert futex.wait_any(m, [0, 64], [0, 0], local, 0, WAIT) == 2   # len(offsets)
    t.join()


@contextlib.contextmanager
def sleepers(target, *args):
    """Three processes running ``target(pipe, *args)``, each said "asleep" on its pipe
    (maybe still on its way into the sleep); killed after."""
    pipes, procs = [], []
    try:
        for _ in range(3):
            ours, theirs = CTX.Pipe()
            p = CTX.Process(target=target, args=(theirs, *args), daemon=True)
            p.start()
            pipes.append(ours)
            procs.append(p)
        for pipe in pipes:
            assert pipe.poll(WAIT) and pipe.recv() == "asleep"
        yield pipes
    finally:
        for p in procs:
            p.kill()
            p.join(WAIT)


def _sleeper(pipe, ro, offset: int, value: int) -> None:
    pipe.send("asleep")
    pipe.send(futex.wait_any(ro, [offset], [value], bytearray(4), 0, WAIT))


def test_processes_sleep_on_a_read_only_map_and_the_writer_wakes_them_all(region):
    """Three processes sleep on a word of their read-only map; one wake of all wakes each
    (a wake of one, then of the rest, is how consumers pass a publish on)."""
    rw, ro = region
    with sleepers(_sleeper, ro, 128, 0) as pipes:
        put(rw, 128, 1)
        woken = 0
        while woken < 3:                  # a sleeper may still be on its way into the sleep
            woken += futex.wake(rw, 128, 1)
            if woken:
                woken += futex.wake(rw, 128, 0x7FFFFFFF)
            if all(pipe.poll(0) for pipe in pipes):
                break
        results = []
        for pipe in pipes:
            assert pipe.poll(WAIT), "a sleeper was never woken"
            results.append(pipe.recv())
        assert all(r in (0, -2) for r in results)     # woken, or the word had changed
        assert word(ro, 128) == 1


def _passing_sleeper(pipe, ro, offset: int) -> None:
    passed: dict[int, int] = {}
    pipe.send("asleep")
    pipe.send((futex.wait_any(ro, [64, offset], [0, 0], bytearray(4), 0, WAIT, 0.0, passed),
               passed))


def test_the_sleeper_woken_passes_the_wake_up_on_in_the_same_call(region):
    """The writer wakes one of three sleepers (as the broker does per publish); the one it
    woke wakes the others before its call returns, and says in ``passed`` which value of
    which word it passed on, so it does not pass the same one on again."""
    rw, ro = region
    with sleepers(_passing_sleeper, ro, 128) as pipes:
        put(rw, 128, 1)
        futex.wake(rw, 128, 1)                        # one wake, and never another
        results = []
        for pipe in pipes:
            assert pipe.poll(WAIT), "a sleeper was never woken"
            results.append(pipe.recv())
        # Each was woken (index 1), or saw the word changed before it slept (-2).
        assert all(r in (1, -2) for r, _ in results)
        assert all(passed == ({128: 1} if r == 1 else {}) for r, passed in results)


def test_a_value_already_passed_on_is_not_passed_on_again():
    m, local = mmap.mmap(-1, 4096), bytearray(4)
    passed = {0: True}             # == 1, yet not the int a pass-on of value 1 would store

    def publish() -> None:
        put(m, 0, 1)
        futex.wake(m, 0, 1)
    t = threading.Timer(0.05, publish)
    t.start()
    assert futex.wait_any(m, [0, 64], [0, 0], local, 0, WAIT, 0.0, passed) == 0
    t.join()
    assert passed[0] is True
    with pytest.raises(TypeError):
        futex.wait_any(m, [0], [1], local, 0, 0.01, 0.0, [])   # passed: a dict or None


def test_bad_arguments_raise():
    m, local = mmap.mmap(-1, 4096), bytearray(4)
    with pytest.raises(ValueError):
        futex.wake(m, 2, 1)                            # not 4-byte aligned
    with pytest.raises(ValueError):
        futex.wake(m, 4096, 1)                         # outside the buffer
    with pytest.raises(ValueError):
        futex.wait_any(m, [0, 4], [0], local, 0, 0.01)   # lengths differ
    with pytest.raises(ValueError):
        futex.wait_any(m, list(range(0, 128 * 4, 4)), [0] * 128, local, 0, 0.01)
    with pytest.raises(ValueError):
        futex.wait_any(m, [0], [0], bytearray(2), 0, 0.01)   # no room for the local word


# --- the spin wait strategy -------------------------------------------------------------------
def test_a_spin_sees_a_word_change_in_another_process_without_a_wake(region):
    """A spinning wait returns -2 for a change no one woke it for (the writer, a forked
    process, only writes), and its map stays exported while it spins."""
    rw, ro = region

    def writer(pipe) -> None:
        pipe.recv()
        put(rw, 128, 5)                                  # no futex.wake: only a spin sees it
    here, there = CTX.Pipe()
    proc = CTX.Process(target=writer, args=(there,))
    proc.start()
    try:
        here.send("go")
        assert futex.wait_any(ro, [0, 128], [0, 0], bytearray(4), 0, WAIT, WAIT) == -2
    finally:
        proc.join(WAIT)
    assert word(ro, 128) == 5


def test_a_spin_then_sleeps_out_the_timeout_and_a_local_bump_ends_it():
    m, local = mmap.mmap(-1, 4096), bytearray(4)
    assert futex.wait_any(m, [0], [0], local, 0, 0.02, 0.01) == -1    # spun, then slept
    assert futex.wait_any(m, [0], [0], local, 0, 0.01, WAIT) == -1    # spin capped by timeout

    def interrupt() -> None:
        local[:] = (1).to_bytes(4, "little")
    t = threading.Timer(0.05, interrupt)
    t.start()
    assert futex.wait_any(m, [0], [0], local, 0, WAIT, WAIT) == -2
    t.join()


def test_a_map_cannot_be_closed_under_a_spin():
    m, local = mmap.mmap(-1, 4096), bytearray(4)
    refused = []

    def close_then_wake() -> None:
        try:
            m.close()
        except BufferError:
            refused.append(True)
        local[:] = (1).to_bytes(4, "little")
    t = threading.Timer(0.05, close_then_wake)
    t.start()
    assert futex.wait_any(m, [0], [0], local, 0, WAIT, WAIT) == -2
    t.join()
    assert refused == [True] and not m.closed
