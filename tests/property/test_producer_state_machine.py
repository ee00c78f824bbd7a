"""A Hypothesis state machine of the producer-state table against a model.

The model keeps every producer's whole history and decides each batch from it directly:
duplicate if it repeats one of the last five batches of its epoch (since the last marker),
refused for an older epoch, a bump not starting at 0, a sequence that does not follow, or a
plain batch inside an open transaction. Sends of every kind (next, recent and old retries,
gaps, stale and bumped epochs, transactional or not) and COMMIT/ABORT markers are interleaved
(a marker keeps the window: sequences go on across transactions of one epoch);
after each step the table and the model must agree on the outcome, the open transactions and
the last stable offset.
"""

from __future__ import annotations

import dataclasses

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from mq import errors
from mq.log.producer_state import ProducerStateManager

_MOD = 1 << 31


@dataclasses.dataclass
class ModelProducer:
    epoch: int = 0
    window: list = dataclasses.field(default_factory=list)   # (fs, ls, fo, lo) since reset
    open_first: int | None = None


class Model:
    def __init__(self) -> None:
        self.producers: dict[int, ModelProducer] = {}

    def decide(self, pid, epoch, fs, ls, txn):
        """("dup", (fo, lo)) | ("ok", None) | ("error", type)."""
        p = self.producers.get(pid)
        if p is None:
            return "ok", None
        if epoch == p.epoch:
            for b in p.window[-5:]:
                if (b[0], b[1]) == (fs, ls):
                    return "dup", (b[2], b[3])
        if epoch < p.epoch:
            return "error", errors.InvalidProducerEpochError
        if epoch > p.epoch:
            if fs != 0:
                return "error", errors.OutOfOrderSequenceError
        else:
            expected = (p.window[-1][1] + 1) % _MOD if p.window else 0
            if fs != expected:
                return "error", errors.OutOfOrderSequenceError
        if not txn and p.open_first is not None:
            return "error", errors.InvalidTxnStateError
        return "ok", None

    def append(self, pid, epoch, fs, ls, fo, lo, txn):
        p = self.producers.setdefault(pid, ModelProducer(epoch))
        if epoch != p.epoch:
            p.epoch, p.window = epoch, []
        p.window.append((fs, ls, fo, lo))
        if txn and p.open_first is None:
            p.open_first = fo

    def marker(self, pid, epoch):
        """The first offset of the transaction the marker closes (the model's rule: a new
        epoch starts the window over; the same epoch keeps counting)."""
        p = self.producers.setdefault(pid, ModelProducer(epoch))
        first = p.open_first
        if epoch != p.epoch:
            p.epoch, p.window = epoch, []
        p.open_first = None
        return first

    def open_firsts(self):
        return sorted((p.open_first, pid) for pid, p in self.producers.items()
                      if p.open_first is not None)


KINDS = ["next", "next", "next", "retry", "old-retry", "gap", "stale-epoch", "bump", "bad-bump"]


class ProducerTable(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.psm = ProducerStateManager()
        self.model = Model()
        self.leo = 0

    def _next_seq(self, pid):
        p = self.model.producers.get(pid)
        return (p.window[-1][1] + 1) % _MOD if p and p.window else 0

    @rule(pid=st.integers(1, 3), kind=st.sampled_from(KINDS), count=st.integers(1, 3),
          txn=st.booleans(), pick=st.integers(0, 10))
    def send(self, pid, kind, count, txn, pick):
        p = self.model.producers.get(pid)
        epoch = p.epoch if p else 0
        fs = self._next_seq(pid)
        if kind in ("retry", "old-retry") and p and p.window:
            fs, ls = p.window[-1 - pick % len(p.window)][:2] if kind == "retry" else \
                p.window[0][:2]
        else:
            if kind == "gap":
                fs = (fs + 1 + pick) % _MOD
            elif kind == "stale-epoch":
                epoch = max(epoch - 1, 0)       # epochs are >= 0 (the broker checks)
            elif kind == "bump":
                epoch, fs = epoch + 1, 0
            elif kind == "bad-bump":
                epoch, fs = epoch + 1, 1 + pick
            ls = (fs + count - 1) % _MOD
        expected = self.model.decide(pid, epoch, fs, ls, txn)
        try:
            got = self.psm.check(pid, epoch, fs, ls, txn)
        except errors.BrokerError as err:
            assert expected == ("error", type(err)), (expected, err)
            return
        if got is not None:
            assert expected == ("dup", (got.first_offset, got.last_offset)), (expected, got)
            return
        assert expected == ("ok", None), expected
        n = (ls - fs) % _MOD + 1
        fo, lo = self.leo, self.leo + n - 1
        self.psm.append(pid, epoch, fs, ls, fo, lo, 1, txn)
        self.model.append(pid, epoch, fs, ls, fo, lo, txn)
        self.leo = lo + 1

    @precondition(lambda self: self.model.open_firsts())
    @rule(pick=st.integers(0, 10), aborted=st.booleans())
    def end_txn(self, pick, aborted):
        opens = self.model.open_firsts()
        _, pid = opens[pick % len(opens)]
        epoch = self.model.producers[pid].epoch
        done = self.psm.complete_txn(pid, epoch, 0, self.leo, aborted, 1)
        first = self.model.marker(pid, epoch)
        assert (done.producer_id, done.first_offset, done.last_offset, done.aborted) == \
            (pid, first, self.leo, aborted)
        self.leo += 1

    @invariant()
    def same_open_transactions_and_stable_offset(self):
        opens = self.model.open_firsts()
        assert self.psm.open_transactions() == [(pid, first) for first, pid in opens]
        assert self.psm.last_stable_offset(self.leo) == (opens[0][0] if opens else self.leo)


TestProducerTable = ProducerTable.TestCase
TestProducerTable.settings = settings(max_examples=200, stateful_step_count=60,
                                      deadline=None)
