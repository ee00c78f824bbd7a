"""Kafka's ACL model: binding patterns, filters, deny over allow, implied operations, super
users and the unauthenticated principal."""

from __future__ import annotations

import pytest

from mq import errors
from mq.broker.acls import (OPEN, AclBinding, AclFilter, AclIndex, AclOperation as Op, Authorizer,
                            PatternType, Permission, ResourceType as R, check_binding, implied,
                            peer_host)

ALICE = "User:alice"


def acl(name: str, op: Op, *, rtype: R = R.TOPIC, pattern: PatternType = PatternType.LITERAL,
        principal: str = ALICE, host: str = "*", perm: Permission = Permission.ALLOW
        ) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, perm)


def authz(*bindings: AclBinding, **kwargs) -> Authorizer:
    index = AclIndex(bindings)
    return Authorizer(lambda: index, **kwargs)


def test_no_binding_no_access_for_an_authenticated_user():
    a = authz()
    for op in (Op.READ, Op.WRITE, Op.DESCRIBE, Op.CREATE):
        assert not a.authorized(ALICE, "10.0.0.1", op, R.TOPIC, "orders")


def test_literal_binding_matches_its_name_only():
    a = authz(acl("orders", Op.READ))
    assert a.authorized(ALICE, "10.0.0.1", Op.READ, R.TOPIC, "orders")
    assert not a.authorized(ALICE, "10.0.0.1", Op.READ, R.TOPIC, "orders2")
    assert not a.authorized(ALICE, "10.0.0.1", Op.READ, R.GROUP, "orders")
    assert not a.authorized("User:bob", "10.0.0.1", Op.READ, R.TOPIC, "orders")
    assert not a.authorized(ALICE, "10.0.0.1", Op.WRITE, R.TOPIC, "orders")


def test_prefixed_and_wildcard_bindings():
    a = authz(acl("ord", Op.WRITE, pattern=PatternType.PREFIXED),
              acl("*", Op.READ, rtype=R.GROUP))
    assert a.authorized(ALICE, "h", Op.WRITE, R.TOPIC, "orders")
    assert a.authorized(ALICE, "h", Op.WRITE, R.TOPIC, "ord")
    assert not a.authorized(ALICE, "h", Op.WRITE, R.TOPIC, "xorders")
    assert a.authorized(ALICE, "h", Op.READ, R.GROUP, "any-group")
    # "*" is a wildcard only as a literal; a prefixed "*" is the prefix "*"
    assert not authz(acl("*", Op.READ, pattern=PatternType.PREFIXED)).authorized(
        ALICE, "h", Op.READ, R.TOPIC, "orders")


def test_wildcard_principal_and_host():
    a = authz(acl("orders", Op.READ, principal="User:*", host="10.0.0.1"))
    assert a.authorized("User:bob", "10.0.0.1", Op.READ, R.TOPIC, "orders")
    assert not a.authorized("User:bob", "10.0.0.2", Op.READ, R.TOPIC, "orders")


def test_deny_wins_over_allow():
    a = authz(acl("ord", Op.ALL, pattern=PatternType.PREFIXED),
              acl("orders-secret", Op.READ, perm=Permission.DENY))
    assert a.authorized(ALICE, "h", Op.READ, R.TOPIC, "orders")
    assert not a.authorized(ALICE, "h", Op.READ, R.TOPIC, "orders-secret")
    assert a.authorized(ALICE, "h", Op.WRITE, R.TOPIC, "orders-secret")   # denied Read only
    every = authz(acl("orders", Op.READ), acl("*", Op.ALL, perm=Permission.DENY,
                                                principal="User:*"))
    assert not every.authorized(ALICE, "h", Op.READ, R.TOPIC, "orders")


def test_implied_operations_are_kafkas():
    for op in (Op.READ, Op.WRITE, Op.DELETE, Op.ALTER):
        assert Op.DESCRIBE in implied(op)
        assert authz(acl("t", op)).authorized(ALICE, "h", Op.DESCRIBE, R.TOPIC, "t")
    assert not authz(acl("t", Op.CREATE)).authorized(ALICE, "h", Op.DESCRIBE, R.TOPIC, "t")
    assert Op.DESCRIBE_CONFIGS in implied(Op.ALTER_CONFIGS)
    assert implied(Op.ALL) >= {Op.READ, Op.WRITE, Op.IDEMPOTENT_WRITE, Op.ALTER_CONFIGS}
    assert not authz(acl("t", Op.READ)).authorized(ALICE, "h", Op.WRITE, R.TOPIC, "t")
    # a DENY of Read does not deny Describe (a deny implies nothing)
    a = authz(acl("t", Op.DESCRIBE), acl("t", Op.READ, perm=Permission.DENY))
    assert a.authorized(ALICE, "h", Op.DESCRIBE, R.TOPIC, "t")


def test_super_users_and_the_anonymous_principal():
    deny_all = acl("*", Op.ALL, principal="User:*", perm=Permission.DENY)
    a = authz(deny_all, super_users=["admin"])
    assert a.authorized("User:admin", "h", Op.ALTER, R.CLUSTER, "kafka-cluster")
    assert a.authorized("User:ANONYMOUS", "h", Op.WRITE, R.TOPIC, "t")   # not enforced
    strict = authz(super_users=["admin"], enforce_anonymous=True)
    assert not strict.authorized("User:ANONYMOUS", "h", Op.WRITE, R.TOPIC, "t")
    assert OPEN.authorized(ALICE, "h", Op.WRITE, R.TOPIC, "t")


def test_allows_reads_a_connections_principal_and_peer():
    class Conn:
        principal = ALICE
        peer = "[::1]:5000"
    a = authz(acl("t", Op.READ, host="::1"))
    assert a.allows(Conn(), Op.READ, R.TOPIC, "t")
    assert peer_host("127.0.0.1:9092") == "127.0.0.1"

    class Anonymous:
        peer = "127.0.0.1:1"
    assert a.allows(Anonymous(), Op.WRITE, R.TOPIC, "t")        # no principal: ANONYMOUS


def test_allows_any_is_kafkas_authorize_by_resource_type():
    class Conn:
        principal = ALICE
        peer = "127.0.0.1:1"
    assert authz(acl("t", Op.WRITE)).allows_any(Conn(), Op.WRITE, R.TOPIC)
    assert not authz(acl("t", Op.READ)).allows_any(Conn(), Op.WRITE, R.TOPIC)
    assert not authz(acl("t", Op.WRITE), acl("t", Op.WRITE, perm=Permission.DENY)
                     ).allows_any(Conn(), Op.WRITE, R.TOPIC)


def test_filters_match_as_kafkas_acl_binding_filter():
    lit = acl("orders", Op.READ)
    pre = acl("ord", Op.WRITE, pattern=PatternType.PREFIXED)
    star = acl("*", Op.DESCRIBE)
    grp = acl("orders", Op.READ, rtype=R.GROUP)
    every = [lit, pre, star, grp]
    assert [b for b in every if AclFilter().matches(b)] == every
    assert [b for b in every if AclFilter(R.TOPIC, "orders").matches(b)] == [lit]
    assert [b for b in every if AclFilter(R.TOPIC, "orders", PatternType.MATCH).matches(b)] \
        == [lit, pre, star]
    assert [b for b in every if AclFilter(pattern_type=PatternType.PREFIXED).matches(b)] == [pre]
    assert [b for b in every if AclFilter(operation=Op.READ).matches(b)] == [lit, grp]
    assert not AclFilter(principal="User:bob").matches(lit)
    assert not AclFilter(permission=Permission.DENY).matches(lit)


@pytest.mark.parametrize("binding", [
    AclBinding(R.ANY, "t", PatternType.LITERAL, ALICE, "*", Op.READ, Permission.ALLOW),
    AclBinding(R.TOPIC, "t", PatternType.MATCH, ALICE, "*", Op.READ, Permission.ALLOW),
    AclBinding(R.TOPIC, "t", PatternType.LITERAL, ALICE, "*", Op.ANY, Permission.ALLOW),
    AclBinding(R.TOPIC, "t", PatternType.LITERAL, ALICE, "*", Op.READ, Permission.ANY),
    AclBinding(R.TOPIC, "t", PatternType.LITERAL, "alice", "*", Op.READ, Permission.ALLOW),
    AclBinding(R.TOPIC, "", PatternType.LITERAL, ALICE, "*", Op.READ, Permission.ALLOW),
    AclBinding(R.CLUSTER, "c", PatternType.LITERAL, ALICE, "*", Op.ALTER, Permission.ALLOW),
    AclBinding(R.TOPIC, "t", PatternType.LITERAL, ALICE, "*", 99, Permission.ALLOW),
])
def test_check_binding_refuses_what_kafka_refuses(binding):
    with pytest.raises(errors.InvalidRequestError):
        check_binding(binding)


def test_check_binding_accepts_a_cluster_binding():
    check_binding(AclBinding(R.CLUSTER, "kafka-cluster", PatternType.LITERAL, ALICE, "*",
                             Op.ALTER, Permission.ALLOW))


def test_the_index_finds_what_a_scan_of_every_binding_finds():
    import random
    rng = random.Random(7)
    names = ["orders", "ord", "o", "*", "payroll", "pay"]
    bindings = {AclBinding(rng.choice([R.TOPIC, R.GROUP]), rng.choice(names),
                           rng.choice([PatternType.LITERAL, PatternType.PREFIXED]),
                           rng.choice([ALICE, "User:bob", "User:*"]), "*", Op.READ,
                           Permission.ALLOW) for _ in range(300)}
    index = AclIndex(bindings)
    assert len(index) == len(bindings)
    for principal in (ALICE, "User:bob", "User:carol"):
        for rtype in (R.TOPIC, R.GROUP):
            for name in names + ["orders-eu", "x"]:
                scanned = {b for b in bindings if b.principal in (principal, "User:*")
                           and b.applies_to(rtype, name)}
                found = list(index.matching(principal, rtype, name))
                assert len(found) == len(set(found)) and set(found) == scanned
