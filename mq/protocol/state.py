"""The shared-memory state region: per-partition offsets the broker publishes to clients.

One POSIX shared-memory object per data directory, created by the broker (read-write) and
mapped read-only by every client. Layout (native little-endian, 64-byte aligned)::

    header (64 bytes)
      0  8  magic            b"MQSTATE1"
      8  4  layout version   1
     12  4  broker pid
     16  8  broker generation (bumped at every broker start)
     24  4  slot count
     28  4  slot size        64
     32  8  metadata version (bumped when topics or partitions change)
     40 24  reserved
    slot i (64 bytes, at 64 + 64*i)
      0  8  sequence         odd while the broker writes the slot (seqlock)
      8  8  high watermark
     16  8  last stable offset
     24  8  log start offset
     32  8  active segment base offset
     40  8  high-watermark position: byte offset in the active segment where it ends
     48  8  segment-set generation: changes on every roll, deletion and swap
     56  8  log end offset

Seqlock: the writer makes the sequence odd, writes the fields, makes it even again; a reader
copies the slot and retries until it saw the same even sequence before and after, so it never
sees a torn (offset, position) pair. Stores are ordered on x86-64 (TSO) and each field write
is a separate C call, so no barrier is needed there; other architectures would need one.

What a crash leaves: the broker unlinks the region when it stops (SIGTERM included); one killed
(SIGKILL, OOM) leaves ``/dev/shm/mq-<tag>`` (64 + 64 x slots bytes: 256 KiB with the default
4096 slots) until the next broker start on the same data dir replaces it, or
``remove_leftovers`` removes it. A client's wake-up semaphore (``/dev/shm/sem.mq-<tag>-w...``)
is unlinked by the client within one round trip of creating it: one killed in between leaves it
until the next broker start, which removes the semaphores of its data dir before it listens.

Futex word: the low 32 bits of a slot's sequence (its first 4 bytes) change on every publish.
A caught-up consumer sleeps on them (``futex_waitv``, ``_futex.wait_any``) having read the
sequence before its last look; after each publish the writer wakes one sleeper
(``FUTEX_WAKE``, 1), and the consumer it woke wakes the rest (``mq/client/consumer.py``). A
publish the consumer has not seen makes the word differ, so its sleep does not begin.
"""

from __future__ import annotations

import errno
import hashlib
import importlib
import mmap
import os
import struct
from typing import Any, Final, NamedTuple

import posix_ipc

from mq.errors import BrokerUnavailableError

__all__ = ["PartitionState", "StateReader", "StateWriter", "futex", "leftovers",
           "remove_leftovers", "semaphore_prefix", "shm_name", "slot_offset"]

_SHM_DIR: Final = "/dev/shm"           # where Linux keeps POSIX shared memory and semaphores

try:                                   # optional C extension (setup.py): futex wake-ups
    futex: Any = importlib.import_module("mq.protocol._futex")
except ImportError:                    # not built, or not Linux: semaphores only
    futex = None

MAGIC: Final = b"MQSTATE1"
LAYOUT_VERSION: Final = 1
HEADER_SIZE: Final = 64
SLOT_SIZE: Final = 64
_HEADER: Final = struct.Struct("<8sIIqIIq24x")
_SLOT: Final = struct.Struct("<qqqqqqqq")
_SEQ: Final = struct.Struct("<q")
_FIELDS: Final = struct.Struct("<qqqqqqq")          # the slot after its sequence
_META_VERSION: Final = struct.Struct("<q")
DEFAULT_SLOTS: Final = 4096


def slot_offset(slot: int) -> int:
    """Where slot ``slot`` starts in the region: its sequence, whose low half is its futex
    word."""
    return HEADER_SIZE + SLOT_SIZE * slot


def _tag(data_dir: str) -> str:
    return hashlib.sha1(os.path.realpath(data_dir).encode()).hexdigest()[:16]


def shm_name(data_dir: str) -> str:
    """The shared-memory object's name for a data directory (so tests can run side by side)."""
    return f"/mq-{_tag(data_dir)}"


def semaphore_prefix(data_dir: str) -> str:
    """Prefix of the wake-up semaphores of clients of this data directory."""
    return f"/mq-{_tag(data_dir)}-w"


def leftovers(data_dir: str) -> list[str]:
    """The names of ``data_dir``'s region and wake-up semaphores present in ``/dev/shm``
    (POSIX names: ``/mq-<tag>``, ``/mq-<tag>-w...``)."""
    region, prefix = shm_name(data_dir)[1:], "sem." + semaphore_prefix(data_dir)[1:]
    try:
        names = os.listdir(_SHM_DIR)
    except FileNotFoundError:
        return []
    return sorted("/" + (n[4:] if n.startswith("sem.") else n) for n in names
                  if n == region or n.startswith(prefix))


def remove_leftovers(data_dir: str, broker_pid: int, semaphores: bool = True) -> list[str]:
    """Unlink what broker ``broker_pid``, which must have exited, left for ``data_dir``: its
    region (only if that pid wrote it: a later broker's stays) and, with ``semaphores``, the
    semaphores of clients killed before they unlinked theirs (leave them while a client may
    still be registering: it unlinks its own). Returns the names removed."""
    removed = []
    region = shm_name(data_dir)
    for name in leftovers(data_dir):
        try:
            if name == region:
                if _region_pid(name) != broker_pid:
                    continue
                posix_ipc.unlink_shared_memory(name)
            elif semaphores:
                posix_ipc.unlink_semaphore(name)
            else:
                continue
        except (posix_ipc.ExistentialError, posix_ipc.PermissionsError):
            continue                             # gone meanwhile, or another user's
        removed.append(name)
    return removed


def _region_pid(name: str) -> int | None:
    try:
        shm = posix_ipc.SharedMemory(name, 0, read_only=True)
    except (posix_ipc.ExistentialError, posix_ipc.PermissionsError):
        return None
    try:
        if shm.size < HEADER_SIZE:
            return None
        with mmap.mmap(shm.fd, HEADER_SIZE, access=mmap.ACCESS_READ) as m:
            magic, _, pid, *_ = _HEADER.unpack_from(m, 0)
    finally:
        shm.close_fd()
    return pid if magic == MAGIC else None


class PartitionState(NamedTuple):
    """One slot's fields, as a snapshot took them. A named tuple: consumers take two or three
    snapshots per poll, and a frozen dataclass cost them 1 us more each."""

    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    active_segment_base: int
    hw_position: int
    segment_generation: int
    log_end_offset: int


class StateWriter:
    """The broker's side: creates (replacing a dead broker's leftover) and writes the region."""

    def __init__(self, data_dir: str, slots: int = DEFAULT_SLOTS, generation: int = 0) -> None:
        self.name = shm_name(data_dir)
        self.slots = slots
        size = HEADER_SIZE + SLOT_SIZE * slots
        try:
            posix_ipc.unlink_shared_memory(self.name)   # a dead broker's region
        except posix_ipc.ExistentialError:
            pass
        for name in leftovers(data_dir):                # its clients' (no client of this
            if name != self.name:                       # broker exists yet); another user's
                try:                                    # may not be ours to unlink
                    posix_ipc.unlink_semaphore(name)
                except (posix_ipc.ExistentialError, posix_ipc.PermissionsError):
                    pass
        shm = posix_ipc.SharedMemory(self.name, posix_ipc.O_CREX, mode=0o640, size=size)
        try:
            # Reserve the pages now: a store into an unbacked page of a full /dev/shm is a
            # SIGBUS that would kill the broker later; ENOSPC here is a clear start-up error.
            try:
                os.posix_fallocate(shm.fd, 0, size)
            except OSError as err:
                if err.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    shm.unlink()
                    raise
            self._map = mmap.mmap(shm.fd, size)
        finally:
            shm.close_fd()
        _HEADER.pack_into(self._map, 0, MAGIC, LAYOUT_VERSION, os.getpid(), generation, slots,
                          SLOT_SIZE, 0)
        # The writable map, for the broker's publication in C (``mq.log.native.publish_slot``,
        # which writes a slot as ``publish`` does); None once closed.
        self.region: mmap.mmap | None = self._map

    def publish(self, slot: int, state: PartitionState) -> None:
        base = slot_offset(slot)
        (seq,) = _SEQ.unpack_from(self._map, base)          # this is the only writer
        seq += 1
        _SEQ.pack_into(self._map, base, seq)                  # odd: writing
        _FIELDS.pack_into(self._map, base + 8, state.high_watermark, state.last_stable_offset,
                          state.log_start_offset, state.active_segment_base, state.hw_position,
                          state.segment_generation, state.log_end_offset)
        _SEQ.pack_into(self._map, base, seq + 1)              # even: stable
        if futex is not None:
            futex.wake(self._map, base, 1)                    # one; it wakes the others

    def bump_metadata_version(self) -> int:
        (version,) = _META_VERSION.unpack_from(self._map, 32)
        _META_VERSION.pack_into(self._map, 32, version + 1)
        return version + 1

    def close(self) -> None:
        """Unmap and unlink (the creator removes what it created)."""
        if self._map is None:
            return
        self._map.close()
        self._map = self.region = None
        try:
            posix_ipc.unlink_shared_memory(self.name)
        except posix_ipc.ExistentialError:
            pass


class StateReader:
    """A client's read-only view of the region."""

    def __init__(self, data_dir: str) -> None:
        self.name = shm_name(data_dir)
        try:
            shm = posix_ipc.SharedMemory(self.name, 0, read_only=True)
        except posix_ipc.ExistentialError as err:
            raise BrokerUnavailableError(f"no broker state for {data_dir} "
                                         "(is the broker running?)") from err
        try:
            self._map = mmap.mmap(shm.fd, shm.size, access=mmap.ACCESS_READ)
        finally:
            shm.close_fd()
        magic, version, self.broker_pid, self.generation, self.slots, slot_size, _ = \
            _HEADER.unpack_from(self._map, 0)
        if magic != MAGIC or version != LAYOUT_VERSION or slot_size != SLOT_SIZE:
            self._map.close()
            raise BrokerUnavailableError(f"{self.name}: unknown state layout "
                                         f"(magic {magic!r}, version {version})")

    @property
    def metadata_version(self) -> int:
        return _META_VERSION.unpack_from(self._map, 32)[0]

    def read(self, slot: int) -> PartitionState:
        """A consistent snapshot of one slot (seqlock read)."""
        return self.snapshot(slot)[1]

    def snapshot(self, slot: int) -> tuple[int, PartitionState]:
        """A consistent snapshot of one slot with the (even) sequence it was taken at."""
        base = slot_offset(slot)
        unpack = _SLOT.unpack_from
        m = self._map
        while True:
            seq, *fields = unpack(m, base)
            if seq & 1:
                continue
            if _SEQ.unpack_from(m, base)[0] == seq:
                return seq, PartitionState(*fields)

    @property
    def region(self) -> mmap.mmap:
        """The read-only map, for futex waits on its slots' words."""
        return self._map

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
