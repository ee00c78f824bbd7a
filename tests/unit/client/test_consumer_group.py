"""The consumer's ``ConsumerGroup`` without a broker: reconciliation and commits over a real
``Fetcher`` (partition logs in the test's directory, ``test_fetcher.LogDriver``), a real
``GroupMember`` whose target the test sets as a heartbeat reply would, and a connection that
keeps the group's committed offsets in a dict, as the broker's offset store answers them (or
refuses a commit, or breaks, with the errors the test queued).

Topic "t" has partitions 0 and 1; ``T0``/``T1`` name them.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
from test_fetcher import T0, T1, LogDriver, produce, values

from mq.client.consumer_group import ConsumerGroup, ConsumerRebalanceListener
from mq.client.fetcher import Fetcher
from mq.client.group_member import GroupMember
from mq.errors import (
    BrokerError,
    BrokerUnavailableError,
    CommitFailedError,
    StaleMemberEpochError,
    UnknownMemberIdError,
    UnstableOffsetCommitError,
)
from mq.protocol.messages import Api, Response, response


class OffsetsConnection:
    """OffsetCommit and OffsetFetch answered from ``committed`` (``unstable``: partitions an
    unfinished transaction's offsets hold; ``refuse``: errors for the next commits, a broker
    error's code as the reply, any other raised as the connection breaking). ``commits``
    lists the commits taken, ``identities`` the (member id, epoch) of each sent."""

    def __init__(self) -> None:
        self.committed: dict = {}
        self.unstable: set = set()
        self.refuse: list[type] = []
        self.commits: list[dict] = []
        self.identities: list[tuple[str, int]] = []
        self._replies: dict[int, Response] = {}

    def send(self, api, *fields, claim: bool = False) -> int:
        if api == Api.OFFSET_COMMIT and self.refuse and \
                not issubclass(self.refuse[0], BrokerError):
            raise self.refuse.pop(0)("the broker closed the connection")
        rid = len(self._replies) + 1
        self._replies[rid] = self._answer(api, rid, *fields)
        return rid

    def wait_raw(self, rid: int) -> Response:
        return self._replies.pop(rid)

    def call(self, api, *fields) -> Response:
        return self.wait_raw(self.send(api, *fields))

    def ready(self) -> list:
        return []

    def _answer(self, api, rid: int, *fields) -> Response:
        if api == Api.OFFSET_COMMIT:
            _group, member_id, epoch, items = fields
            self.identities.append((member_id, epoch))
            if self.refuse:
                return Response.from_message(response(api, rid, self.refuse.pop(0).code,
                                                      "refused"))
            self.commits.append({(t, p): o for t, p, o, _, _ in items})
            self.committed.update({(t, p): o for t, p, o, _, _ in items})
            return Response.from_message(response(api, rid))
        _group, wanted, _stable = fields
        rows = [[t, p, -1 if (t, p) in self.unstable else self.committed.get((t, p), -1), -1,
                 "", -1, UnstableOffsetCommitError.code if (t, p) in self.unstable else 0]
                for t, p in wanted]
        return Response.from_message(response(api, rid, 0, None, rows))


class GroupDriver(LogDriver):
    """``LogDriver`` with the session ``ConsumerGroup`` commits through."""

    def __init__(self, data_dir: str) -> None:
        super().__init__(data_dir)
        self.socket_path, self.timeout = None, 1.0
        self.reconnects = 0
        self.session = SimpleNamespace(conn=OffsetsConnection())

    def require(self):
        return self.session

    def lost(self) -> None:
        self.reconnects += 1


class Member(GroupMember):
    """The poll thread's view of ``Membership``: the member, joined."""

    def __init__(self) -> None:
        super().__init__("g", topics=["t"])
        self.joined = threading.Event()
        self.joined.set()
        self.rejoin_assigns: tuple = ()
        self.left = False

    def assign(self, *tps) -> None:
        """A heartbeat whose reply assigns ``tps``."""
        self.heartbeat_request()
        self.on_heartbeat_reply("m1", self.epoch + 1, 1_000, [list(tp) for tp in tps], now=0.0)

    def wait_commit_retry(self, partitions, first: int, last: int, timeout: float):
        """The heartbeat thread's reply came: it assigns ``rejoin_assigns``."""
        self.assign(*self.rejoin_assigns)
        return self.retry_commit(partitions, first, last)

    def leave(self) -> None:
        self.left = True


class Listener(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.calls: list[tuple[str, set]] = []

    def on_partitions_assigned(self, assigned):
        self.calls.append(("assigned", assigned))

    def on_partitions_revoked(self, revoked):
        self.calls.append(("revoked", revoked))

    def on_partitions_lost(self, lost):
        self.calls.append(("lost", lost))


@pytest.fixture
def parts(tmp_path):
    """``(driver, fetcher, group, member, listener)`` of a consumer in group "g"."""
    opened = []

    def make(read_committed: bool = False, auto_commit: bool = True):
        driver = GroupDriver(str(tmp_path))
        fetcher = Fetcher(driver, read_committed=read_committed, auto_offset_reset="earliest",
                          max_partition_fetch_bytes=1 << 20, check_crcs=True,
                          value_bytes=False, key_deserializer=None, value_deserializer=None)
        listener = Listener()
        group = ConsumerGroup(driver, fetcher, group_id="g", read_committed=read_committed,
                              enable_auto_commit=auto_commit, listener=listener,
                              instance_id=None, assignor=None, session_timeout_ms=45_000,
                              max_poll_interval_ms=300_000, auto_commit_interval_ms=60_000)
        group.membership = member = Member()
        opened.append((driver, fetcher))
        return driver, fetcher, group, member, listener
    yield make
    for driver, fetcher in opened:
        fetcher.close()
        driver.close()


def test_assigned_partitions_start_at_their_committed_offsets(parts):
    driver, fetcher, group, member, listener = parts()
    produce(driver, T0, b"a", b"b", b"c")
    produce(driver, T1, b"x")
    driver.session.conn.committed[("t", 0)] = 2
    member.assign(T0, T1)
    group.round(driver.session)
    assert listener.calls == [("assigned", {T0, T1})]
    assert member.owned == {T0, T1} and not group.changed()
    out = fetcher.take(driver.session, 10, in_group=True)
    assert values(out, T0) == [b"c"] and values(out, T1) == [b"x"]


def test_a_revoked_partition_is_committed_then_released(parts):
    driver, fetcher, group, member, listener = parts()
    produce(driver, T0, b"a")
    produce(driver, T1, b"x", b"y")
    member.assign(T0, T1)
    group.round(driver.session)
    fetcher.take(driver.session, 10, in_group=True)
    member.assign(T0)
    assert group.changed()
    group.round(driver.session)
    assert driver.session.conn.commits == [{("t", 1): 2}]        # before the listener ran
    assert listener.calls[-1] == ("revoked", {T1})
    assert set(fetcher.cursors) == {T0} and member.owned == {T0}
    assert member.reported - member.owned and member.hb_due     # report the release at once


def test_lost_partitions_are_dropped_without_a_commit(parts):
    driver, fetcher, group, member, listener = parts()
    member.assign(T0, T1)
    group.round(driver.session)
    member.connected(1)
    assert member.connected(1)                                  # the same broker dropped us
    group.round(driver.session)
    assert listener.calls[-1] == ("lost", {T0, T1})
    assert fetcher.cursors == {} and not member.lost
    assert driver.session.conn.commits == []


def test_read_committed_holds_a_partition_until_the_transaction_ends(parts):
    driver, fetcher, group, member, listener = parts(read_committed=True)
    produce(driver, T0, b"a", b"b", b"c")
    conn = driver.session.conn
    conn.unstable.add(("t", 0))
    member.assign(T0)
    group.round(driver.session)
    assert group.held == {T0} and fetcher.held() == {T0}
    assert fetcher.take(driver.session, 10, in_group=True) == {}
    conn.unstable.clear()
    conn.committed[("t", 0)] = 1
    group.retry_held_at = 0.0
    group.round(driver.session)
    assert group.held == set()
    assert values(fetcher.take(driver.session, 10, in_group=True), T0) == [b"b", b"c"]


def test_a_listener_error_comes_after_reconciliation(parts):
    driver, fetcher, group, member, listener = parts()

    def fail(assigned):
        raise RuntimeError("listener failed")
    listener.on_partitions_assigned = fail
    member.assign(T0)
    with pytest.raises(RuntimeError, match="listener failed"):
        group.round(driver.session)
    assert set(fetcher.cursors) == {T0} and member.owned == {T0}


@pytest.mark.parametrize("refused", [UnknownMemberIdError, StaleMemberEpochError,
                                     BrokerUnavailableError])
def test_a_refused_commit_goes_again_as_the_rejoined_member(parts, refused):
    driver, fetcher, group, member, listener = parts(auto_commit=False)
    member.assign(T0, T1)
    group.round(driver.session)
    conn = driver.session.conn
    # UNKNOWN_MEMBER_ID: the broker restarted and the member has not rejoined it yet;
    # STALE_MEMBER_EPOCH: the member's epoch moved while the commit was in flight; the
    # connection broke: the broker went away (and the member rejoins the next one).
    conn.refuse = [refused]
    member.rejoin_assigns = (T0, T1)
    epoch = member.epoch
    group.commit({T0: 5, T1: 7})
    broke = refused is BrokerUnavailableError
    assert conn.identities == [("m1", epoch)] * (not broke) + [("m1", epoch + 1)]
    assert conn.commits == [{("t", 0): 5, ("t", 1): 7}]
    assert driver.reconnects == broke


def test_a_refused_commit_of_a_partition_the_rejoin_did_not_give_back_fails(parts):
    driver, fetcher, group, member, listener = parts(auto_commit=False)
    member.assign(T0, T1)
    group.round(driver.session)
    conn = driver.session.conn
    conn.refuse = [UnknownMemberIdError]
    member.rejoin_assigns = (T1,)                   # T0 went to another member meanwhile
    with pytest.raises(CommitFailedError, match="t-0"):
        group.commit({T0: 5, T1: 7})
    assert conn.commits == [] and len(conn.identities) == 1
    group.round(driver.session)                     # the next poll revokes T0
    assert listener.calls[-1] == ("revoked", {T0}) and set(fetcher.cursors) == {T1}


def test_leaving_logs_a_commit_that_failed_and_leaves(parts, caplog):
    driver, fetcher, group, member, listener = parts()          # auto-commit
    produce(driver, T0, b"a")
    member.assign(T0)
    group.round(driver.session)
    fetcher.take(driver.session, 10, in_group=True)
    driver.session.conn.refuse = [UnknownMemberIdError]       # and T0 went elsewhere
    group.leave()
    assert member.left and group.membership is None
    assert driver.session.conn.commits == [] and "no longer assigned" in caplog.text
