"""Kafka's ACL codes, shared by the broker's authorizer, the native ACL apis and ``mq acls``.

The numbers are Kafka's own (``org.apache.kafka.common.resource.ResourceType``,
``PatternType``, ``org.apache.kafka.common.acl.AclOperation``, ``AclPermissionType``), so a
binding crosses Kafka's wire apis and mq's native ones unchanged. ``NAMES`` spells them as
``kafka-acls`` does (``Read``, ``IdempotentWrite``, ``TransactionalId``).
"""

from __future__ import annotations

import enum

__all__ = ["AclOperation", "PatternType", "Permission", "ResourceType", "display", "parse"]


class ResourceType(enum.IntEnum):
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(enum.IntEnum):
    ANY = 1
    MATCH = 2            # a filter only: the bindings that apply to a name
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class Permission(enum.IntEnum):
    ANY = 1
    DENY = 2
    ALLOW = 3


_CAMEL = {"IDEMPOTENT_WRITE": "IdempotentWrite", "DESCRIBE_CONFIGS": "DescribeConfigs",
          "ALTER_CONFIGS": "AlterConfigs", "CLUSTER_ACTION": "ClusterAction",
          "TRANSACTIONAL_ID": "TransactionalId"}


def display(code: enum.IntEnum) -> str:
    """Kafka's spelling of a code: ``Read``, ``TransactionalId``, ``Prefixed``..."""
    return _CAMEL.get(code.name, code.name.capitalize())


def parse(kind: type[enum.IntEnum], text: str) -> enum.IntEnum:
    """The code ``text`` names, any case, with or without ``_`` (``idempotent-write`` too).
    Raises ``ValueError`` listing the names ``kind`` has."""
    wanted = text.replace("-", "").replace("_", "").lower()
    for code in kind:
        if code.name.replace("_", "").lower() == wanted:
            return code
    raise ValueError(f"unknown {kind.__name__} {text!r}; one of "
                     f"{', '.join(display(c) for c in kind)}")
