"""How many partitions the broker's open-file limit (``RLIMIT_NOFILE``) holds: pure arithmetic.

What a partition keeps open (measured with ``ls -l /proc/PID/fd`` on a broker)::

    active segment   .log, .index, .timeindex            3 descriptors, held
    the flusher      a dup of the .log during an fsync   1 more, for the length of a job
    older segments   nothing: opened by a read and closed after it (Kafka opens them lazily)

so ``FDS_PER_PARTITION`` is 4 (it was 6: each index also kept a memory map, which in Python
before 3.13 holds a duplicate descriptor, and every older segment kept its files too).

Kept aside from partitions: ``RESERVED_FDS`` for the broker's own files (measured: 14 open by
an idle broker without partitions — std streams, the data dir lock, the listening socket, the
selector, pipes, the state region — plus what comes and goes: a checkpoint or snapshot being
written, a segment being read, the cleaner's pass) and ``CONNECTION_FDS`` for clients: 128
connections (the listening backlog) of two descriptors each (the socket, and a producer's
shared-memory arena, whose map also holds one). A broker filled with partitions to its limit
still accepts that many clients; past them ``accept`` fails and the client is refused, while
a topic change past the budget is refused before it creates anything, never half-way.

Nothing here touches the process: the caller reads and raises the limit, counts partitions
and passes the numbers in.
"""

from __future__ import annotations

import dataclasses
from typing import Final

from mq.errors import FileLimitError, InvalidPartitionsError

__all__ = ["CONNECTION_FDS", "FDS_PER_PARTITION", "RESERVED_FDS", "FdBudget"]

FDS_PER_PARTITION: Final = 4
RESERVED_FDS: Final = 64
CONNECTION_FDS: Final = 2 * 128

HOW_TO_RAISE: Final = ("raise it with `ulimit -n` (hard limit: /etc/security/limits.conf) or "
                       "LimitNOFILE= in the broker's systemd unit")


@dataclasses.dataclass(frozen=True, slots=True)
class FdBudget:
    """The open-file limit (soft ``RLIMIT_NOFILE``, as raised at start; None: unlimited)."""

    limit: int | None

    @staticmethod
    def needed(partitions: int) -> int:
        """Descriptors a broker with ``partitions`` partition logs needs, clients included."""
        return RESERVED_FDS + CONNECTION_FDS + partitions * FDS_PER_PARTITION

    def room(self, partitions: int) -> int | None:
        """How many more partitions fit beside ``partitions`` (None: no limit); may be < 0."""
        if self.limit is None:
            return None
        return (self.limit - self.needed(partitions)) // FDS_PER_PARTITION

    def check_start(self, partitions: int) -> None:
        """Raise ``FileLimitError`` when a data dir of ``partitions`` partitions does not fit."""
        needed = self.needed(partitions)
        if self.limit is not None and needed > self.limit:
            raise FileLimitError(
                f"the data dir's {partitions} partitions need {needed} open files but the "
                f"limit (RLIMIT_NOFILE) is {self.limit}; {HOW_TO_RAISE}, then start again")

    def check_create(self, partitions: int, new: int) -> None:
        """Raise ``InvalidPartitionsError`` unless ``new`` partitions fit beside ``partitions``
        open ones."""
        needed = self.needed(partitions + new)
        if self.limit is not None and needed > self.limit:
            room = max(self.room(partitions) or 0, 0)
            raise InvalidPartitionsError(
                f"{new} more partitions need {needed} open files but the broker's limit "
                f"(RLIMIT_NOFILE) is {self.limit}: room for {room} more; {HOW_TO_RAISE}, "
                "then restart the broker")
