"""Kafka's ACL model and authorizer (pure): bindings, filters, and the allow/deny decision.

A binding (Kafka's ``AclBinding``) says: ``principal`` from ``host`` is ALLOWED or DENIED
``operation`` on the resources of ``resource_type`` that ``pattern_type`` and
``resource_name`` select — LITERAL: that name, or every name when it is ``*``; PREFIXED:
every name that starts with it. The codes are Kafka's (``mq/protocol/acl_codes.py``), so
bindings pass through the wire apis unchanged.

The decision (``Authorizer.authorized``) is Kafka's ``StandardAuthorizer``'s:

1. a super user (``kafka_super_users``: user names, ``User:<name>`` principals) may do
   everything;
2. a DENY binding that matches the principal (or ``User:*``), the host (or ``*``), the
   resource and the operation (or All) wins over any ALLOW;
3. otherwise an ALLOW binding that matches decides, where All allows every operation,
   Read, Write, Delete and Alter each imply Describe, and AlterConfigs implies
   DescribeConfigs (Kafka's implied operations; a DENY implies nothing);
4. otherwise the request is denied: no binding, no access (Kafka's
   ``allow.everyone.if.no.acl.found = false``).

Unauthenticated clients (``User:ANONYMOUS``) are the exception that keeps issue 20's loopback
users working: they are allowed everything unless ``kafka_acl_enforce_anonymous`` is on, since
a listener that does not authenticate is loopback-only unless the operator said
``kafka_allow_anonymous`` — whoever reaches it is a local user, like the Unix socket's.

Invariants: the authorizer holds no state of its own; it reads the store's index of the
bindings (``MetadataStore.acl_index``, rebuilt at each change) at every decision, so a
CreateAcls applies to the next request.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator

from mq import errors
from mq.protocol.acl_codes import AclOperation, PatternType, Permission, ResourceType

__all__ = ["ANONYMOUS", "CLUSTER_NAME", "OPEN", "AclBinding", "AclFilter", "AclIndex",
           "AclOperation",
           "Authorizer", "PatternType", "Permission", "ResourceType", "check_binding",
           "implied", "peer_host"]

ANONYMOUS = "User:ANONYMOUS"
CLUSTER_NAME = "kafka-cluster"       # the Cluster resource's only name
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"


# An ALLOW of the key also allows the operations of the value (Kafka's AclEntry
# implications, e.g. a consumer given Read can Describe the topic it reads).
_IMPLIES: dict[AclOperation, frozenset[AclOperation]] = {
    AclOperation.READ: frozenset({AclOperation.DESCRIBE}),
    AclOperation.WRITE: frozenset({AclOperation.DESCRIBE}),
    AclOperation.DELETE: frozenset({AclOperation.DESCRIBE}),
    AclOperation.ALTER: frozenset({AclOperation.DESCRIBE}),
    AclOperation.ALTER_CONFIGS: frozenset({AclOperation.DESCRIBE_CONFIGS}),
}


def implied(granted: AclOperation) -> frozenset[AclOperation]:
    """The operations an ALLOW of ``granted`` allows (itself included)."""
    if granted == AclOperation.ALL:
        return frozenset(AclOperation) - {AclOperation.ANY}
    return frozenset({granted}) | _IMPLIES.get(granted, frozenset())


# The same by plain code, for the decisions (an enum lookup costs about as much as the rest).
_ALLOWED_BY: dict[int, frozenset[int]] = {int(op): frozenset(map(int, implied(op)))
                                          for op in AclOperation}


@dataclasses.dataclass(frozen=True, slots=True)
class AclBinding:
    resource_type: int
    resource_name: str
    pattern_type: int
    principal: str            # "User:alice", or "User:*" for every principal
    host: str                 # an address, or "*" for every host
    operation: int
    permission: int

    def as_list(self) -> list:
        return list(dataclasses.astuple(self))

    @classmethod
    def from_list(cls, fields: list) -> AclBinding:
        return cls(*fields)

    def applies_to(self, resource_type: int, name: str) -> bool:
        """This binding's pattern selects resource ``name`` of ``resource_type``."""
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name in (name, WILDCARD)


@dataclasses.dataclass(frozen=True, slots=True)
class AclFilter:
    """Kafka's ``AclBindingFilter``: None and the ANY codes match every value; pattern MATCH
    matches the bindings that apply to ``resource_name`` (literal, ``*`` and prefixes)."""

    resource_type: int = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: int = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: int = AclOperation.ANY
    permission: int = Permission.ANY

    def as_list(self) -> list:
        return list(dataclasses.astuple(self))

    @classmethod
    def from_list(cls, fields: list) -> AclFilter:
        return cls(*fields)

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type != ResourceType.ANY and b.resource_type != self.resource_type:
            return False
        if self.pattern_type == PatternType.MATCH:
            if self.resource_name is not None and not b.applies_to(b.resource_type,
                                                                   self.resource_name):
                return False
        else:
            if self.pattern_type != PatternType.ANY and b.pattern_type != self.pattern_type:
                return False
            if self.resource_name is not None and b.resource_name != self.resource_name:
                return False
        return ((self.principal is None or b.principal == self.principal)
                and (self.host is None or b.host == self.host)
                and (self.operation == AclOperation.ANY or b.operation == self.operation)
                and (self.permission == Permission.ANY or b.permission == self.permission))


def check_binding(b: AclBinding) -> None:
    """Raises ``InvalidRequestError`` for a binding Kafka refuses to create: an ANY or unknown
    code, an empty name, a principal not ``Type:name``, a Cluster resource not named
    ``kafka-cluster``."""
    try:
        rtype = ResourceType(b.resource_type)
        pattern = PatternType(b.pattern_type)
        op = AclOperation(b.operation)
        perm = Permission(b.permission)
    except ValueError as err:
        raise errors.InvalidRequestError(f"unknown ACL code in {b.as_list()}") from err
    if rtype == ResourceType.ANY or op == AclOperation.ANY or perm == Permission.ANY:
        raise errors.InvalidRequestError("an ACL names one resource type, operation and "
                                         "permission, not ANY")
    if pattern not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise errors.InvalidRequestError("an ACL's pattern type is LITERAL or PREFIXED")
    if not b.resource_name:
        raise errors.InvalidRequestError("an ACL's resource name is empty")
    if rtype == ResourceType.CLUSTER and (b.resource_name != CLUSTER_NAME
                                          or pattern != PatternType.LITERAL):
        raise errors.InvalidRequestError(f"the Cluster resource is named {CLUSTER_NAME!r} "
                                         "(literal)")
    kind, sep, name = b.principal.partition(":")
    if not sep or not kind or not name:
        raise errors.InvalidRequestError(f"principal {b.principal!r} is not of the form "
                                         "User:NAME")
    if not b.host:
        raise errors.InvalidRequestError("an ACL's host is an address or *")


class AclIndex:
    """The bindings by principal and resource type, literal ones by name: a decision looks at
    the bindings that can apply to it, not all of them (1,000 bindings over 10 users: 3 µs
    a check instead of 170 µs for a scan). Prefixed bindings of a principal and type are
    scanned (Kafka keeps them in a sorted map; a few per user is the usual count)."""

    def __init__(self, bindings: Iterable[AclBinding] = ()) -> None:
        self._literal: dict[tuple[str, int], dict[str, list[AclBinding]]] = {}
        self._prefixed: dict[tuple[str, int], list[AclBinding]] = {}
        self._count = 0
        for b in bindings:
            key = (b.principal, b.resource_type)
            if b.pattern_type == PatternType.PREFIXED:
                self._prefixed.setdefault(key, []).append(b)
            else:
                self._literal.setdefault(key, {}).setdefault(b.resource_name, []).append(b)
            self._count += 1

    def __len__(self) -> int:
        return self._count

    def matching(self, principal: str, resource_type: int, name: str) -> Iterator[AclBinding]:
        """The bindings of ``principal`` (and ``User:*``) whose pattern selects ``name``."""
        for who in (principal, WILDCARD_PRINCIPAL):
            key = (who, resource_type)
            literal = self._literal.get(key)
            if literal is not None:
                yield from literal.get(name, ())
                if name != WILDCARD:
                    yield from literal.get(WILDCARD, ())
            for b in self._prefixed.get(key, ()):
                if name.startswith(b.resource_name):
                    yield b

    def of_type(self, principal: str, resource_type: int) -> Iterator[AclBinding]:
        """Every binding of ``principal`` (and ``User:*``) on resources of the type."""
        for who in (principal, WILDCARD_PRINCIPAL):
            for found in self._literal.get((who, resource_type), {}).values():
                yield from found
            yield from self._prefixed.get((who, resource_type), ())


class Authorizer:
    """Kafka's allow/deny decision over the bindings ``acls()`` returns (the store's
    current index)."""

    def __init__(self, acls: Callable[[], AclIndex], *,
                 super_users: Iterable[str] = (), enforce_anonymous: bool = False,
                 open_to_all: bool = False) -> None:
        """``open_to_all``: every request is allowed (``OPEN``: the api families' default
        when built without the broker's authorizer, as in unit tests of one family)."""
        self._acls = acls
        self._open = open_to_all
        self._super = frozenset(u if ":" in u else f"User:{u}" for u in super_users)
        self._enforce_anonymous = enforce_anonymous

    def authorized(self, principal: str, host: str, operation: AclOperation,
                   resource_type: ResourceType, name: str) -> bool:
        if self._open or principal in self._super:
            return True
        if principal == ANONYMOUS and not self._enforce_anonymous:
            return True
        allowed = False
        for b in self._acls().matching(principal, resource_type, name):
            if b.host not in (host, WILDCARD):
                continue
            if b.permission == Permission.DENY:
                if b.operation in (operation, AclOperation.ALL):
                    return False
            elif operation in _ALLOWED_BY.get(b.operation, ()):
                allowed = True
        return allowed

    def allows(self, conn: object, operation: AclOperation, resource_type: ResourceType,
               name: str = CLUSTER_NAME) -> bool:
        """``authorized`` for a Kafka connection: its principal (``User:ANONYMOUS`` until a
        listener authenticates it) from its peer's address."""
        principal = getattr(conn, "principal", ANONYMOUS)
        if self._open or (principal == ANONYMOUS and not self._enforce_anonymous):
            return True           # the common loopback case: no address to parse
        return self.authorized(principal, peer_host(getattr(conn, "peer", "")), operation,
                               resource_type, name)

    def may_create_topic(self, conn: object, topic: str) -> bool:
        """Kafka's rule for creating a topic: Create on the Cluster, or on the topic."""
        return (self.allows(conn, AclOperation.CREATE, ResourceType.CLUSTER)
                or self.allows(conn, AclOperation.CREATE, ResourceType.TOPIC, topic))

    def allows_any(self, conn: object, operation: AclOperation,
                   resource_type: ResourceType) -> bool:
        """Kafka's ``authorizeByResourceType``: some binding lets the principal do
        ``operation`` on some resource of the type (and no DENY covers every name)."""
        principal = getattr(conn, "principal", ANONYMOUS)
        host = peer_host(getattr(conn, "peer", ""))
        if self._open or principal in self._super or (
                principal == ANONYMOUS and not self._enforce_anonymous):
            return True
        for b in self._acls().of_type(principal, resource_type):
            if (b.permission == Permission.ALLOW and b.host in (host, WILDCARD)
                    and operation in _ALLOWED_BY.get(b.operation, ())
                    and self.authorized(principal, host, operation, resource_type,
                                        b.resource_name)):
                return True
        return False


OPEN = Authorizer(AclIndex, open_to_all=True)


def peer_host(peer: str) -> str:
    """The address of a ``host:port`` peer (``[::1]:9092`` -> ``::1``)."""
    host = peer.rsplit(":", 1)[0] if ":" in peer else peer
    return host.strip("[]")
