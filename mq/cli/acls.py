"""``mq acls``: Kafka's kafka-acls over ``mq.Admin`` — add, list and delete the ACLs that the
Kafka listener enforces (``mq/broker/acls.py``), through the Unix socket.

``add`` makes one binding for each principal x host x operation x resource given (as
kafka-acls does); ``list`` and ``delete`` take the same options as a filter, where what is not
given matches anything.
"""

from __future__ import annotations

import argparse
import itertools
import sys

from mq.cli import json_line
from mq.cli.common import add_broker_arguments, add_command_group, client_options, formatter, table
from mq.protocol.acl_codes import (AclOperation, PatternType, Permission, ResourceType, display,
                                   parse)

__all__ = ["add_parser", "bindings_of", "filters_of"]

CLUSTER_NAME = "kafka-cluster"

DESCRIPTION = """\
Add, list and delete the ACLs of the Kafka listener (Kafka's kafka-acls). A Kafka client that
authenticated as User:NAME may do only what an ALLOW ACL grants it and no DENY ACL takes away;
kafka_super_users bypass ACLs; unauthenticated clients (User:ANONYMOUS, loopback PLAINTEXT)
are held to ACLs only with kafka_acl_enforce_anonymous = true. mq's own clients on the Unix
socket are not subject to ACLs. With --bootstrap-server: a Kafka cluster's ACLs (it needs an
authorizer)."""

EPILOG = """\
examples:
  mq acls add --allow-principal User:alice --operation Read --operation Describe --topic orders
  mq acls add --allow-principal User:alice --operation Read --group billing
  mq acls add --allow-principal User:etl --operation Write --topic orders- \\
      --resource-pattern-type prefixed
  mq acls add --deny-principal User:bob --operation All --topic payroll
  mq acls list --topic orders
  mq acls delete --principal User:bob --topic payroll"""

RESOURCES = """\
resources (each may repeat; --cluster is the one Cluster resource, kafka-cluster):
  --topic NAME  --group NAME  --transactional-id NAME  --cluster
operations: Read, Write, Create, Delete, Alter, Describe, DescribeConfigs, AlterConfigs,
IdempotentWrite, ClusterAction, All. An ALLOW of Read, Write, Delete or Alter also allows
Describe; AlterConfigs allows DescribeConfigs; All allows everything. DENY wins over ALLOW.
Principals are User:NAME (User:* is every user); hosts are addresses (* is any)."""

ADD_EPILOG = f"""\
{RESOURCES}

The ACLs are written to the broker's metadata log and fsync'd before the command returns;
they apply to the next request of every Kafka connection.

examples:
  mq acls add --allow-principal User:alice --operation Read --topic orders --group billing
  mq acls add --allow-principal User:etl --operation Write --topic orders- \\
      --resource-pattern-type prefixed
  mq acls add --allow-principal User:ops --operation Alter --cluster"""

LIST_EPILOG = f"""\
{RESOURCES}

output: a table ResourceType Name PatternType Principal Host Operation Permission, one ACL a
line. --json prints one object per ACL per line: {{"resourceType", "name", "patternType",
"principal", "host", "operation", "permission"}}.

--resource-pattern-type: literal (the default with a resource), prefixed, any (the default
without one) or match (every ACL that applies to the named resource: literal, * and
prefixes).

examples:
  mq acls list
  mq acls list --topic orders --resource-pattern-type match
  mq acls list --principal User:alice --json"""

DELETE_EPILOG = f"""\
{RESOURCES}

Deletes every ACL the options match (what is not given matches anything; at least one option
is needed) and prints them as 'mq acls list' does.

examples:
  mq acls delete --principal User:bob --topic payroll
  mq acls delete --topic orders- --resource-pattern-type prefixed"""


def _add_resource_options(p: argparse.ArgumentParser, patterns: tuple[str, ...]) -> None:
    p.add_argument("--topic", action="append", default=[], metavar="NAME", help="a topic")
    p.add_argument("--group", action="append", default=[], metavar="NAME",
                   help="a consumer group")
    p.add_argument("--transactional-id", action="append", default=[], metavar="NAME",
                   help="a transactional id")
    p.add_argument("--cluster", action="store_true", help="the cluster (kafka-cluster)")
    p.add_argument("--resource-pattern-type", choices=patterns, metavar="TYPE",
                   help=f"how names match: {', '.join(patterns)}")
    p.add_argument("--operation", action="append", default=[], metavar="OP",
                   help="an operation (repeat for more)")
    add_broker_arguments(p)


def add_parser(subparsers) -> None:
    commands = add_command_group(subparsers, "acls", "add, list or delete",
                                 help="Kafka listener ACLs (kafka-acls)",
                                 description=DESCRIPTION, epilog=EPILOG, cluster=True)
    add = commands.add_parser("add", help="add ACLs", epilog=ADD_EPILOG,
                              description="Add an ACL for each principal, host, operation and "
                                          "resource given.", formatter_class=formatter)
    add.add_argument("--allow-principal", action="append", default=[], metavar="PRINCIPAL",
                     help="User:NAME to allow (repeat for more)")
    add.add_argument("--deny-principal", action="append", default=[], metavar="PRINCIPAL",
                     help="User:NAME to deny (repeat for more)")
    add.add_argument("--allow-host", action="append", default=[], metavar="HOST",
                     help="host the allowed principals connect from (default *)")
    add.add_argument("--deny-host", action="append", default=[], metavar="HOST",
                     help="host the denied principals connect from (default *)")
    _add_resource_options(add, ("literal", "prefixed"))
    add.set_defaults(run=run_add)

    for name, run, help_, epilog in (
            ("list", run_list, "list ACLs", LIST_EPILOG),
            ("delete", run_delete, "delete ACLs", DELETE_EPILOG)):
        p = commands.add_parser(name, help=help_, epilog=epilog, formatter_class=formatter,
                                description=f"{help_.capitalize()} that the options match.")
        p.add_argument("--principal", metavar="PRINCIPAL", help="only this principal's")
        p.add_argument("--host", metavar="HOST", help="only this host's")
        p.add_argument("--permission", choices=("allow", "deny"), help="only ALLOW or DENY")
        _add_resource_options(p, ("literal", "prefixed", "any", "match"))
        if name == "list":
            p.add_argument("--json", action="store_true", help="one JSON object per ACL a line")
        p.set_defaults(run=run)


def _resources(args: argparse.Namespace) -> list[tuple[ResourceType, str]]:
    found = [(ResourceType.TOPIC, n) for n in args.topic]
    found += [(ResourceType.GROUP, n) for n in args.group]
    found += [(ResourceType.TRANSACTIONAL_ID, n) for n in args.transactional_id]
    if args.cluster:
        found.append((ResourceType.CLUSTER, CLUSTER_NAME))
    for _, name in found:
        if not name:
            raise ValueError("a resource name is empty")
    return found


def _principal(text: str) -> str:
    kind, sep, name = text.partition(":")
    if not sep or not kind or not name:
        raise ValueError(f"principal {text!r} must be of the form User:NAME")
    return text


def bindings_of(args: argparse.Namespace) -> list[list]:
    """The bindings ``mq acls add`` makes. Raises ``ValueError`` for what is missing."""
    resources = _resources(args)
    if not resources:
        raise ValueError("name a resource: --topic, --group, --transactional-id or --cluster")
    if not args.operation:
        raise ValueError("name an --operation (Read, Write, Describe, All, ...)")
    if not args.allow_principal and not args.deny_principal:
        raise ValueError("name an --allow-principal or a --deny-principal")
    ops = [parse(AclOperation, op) for op in args.operation]
    if AclOperation.ANY in ops:
        raise ValueError("an ACL names an operation, not Any")
    pattern = parse(PatternType, args.resource_pattern_type or "literal")
    out = []
    for principals, hosts, perm in ((args.allow_principal, args.allow_host, Permission.ALLOW),
                                    (args.deny_principal, args.deny_host, Permission.DENY)):
        for principal, host, op, (rtype, name) in itertools.product(
                principals, hosts or ["*"], ops, resources):
            if rtype == ResourceType.CLUSTER and pattern != PatternType.LITERAL:
                raise ValueError("--cluster takes no --resource-pattern-type but literal")
            out.append([int(rtype), name, int(pattern), _principal(principal), host,
                        int(op), int(perm)])
    return out


def filters_of(args: argparse.Namespace) -> list[list]:
    """The filters ``mq acls list`` and ``delete`` send (one per resource and operation)."""
    resources: list[tuple[ResourceType, str | None]] = list(_resources(args))
    default_pattern = "literal" if resources else "any"
    pattern = parse(PatternType, args.resource_pattern_type or default_pattern)
    perm = Permission.ANY if args.permission is None else parse(Permission, args.permission)
    ops = [parse(AclOperation, op) for op in args.operation] or [AclOperation.ANY]
    principal = None if args.principal is None else _principal(args.principal)
    return [[int(rtype), name, int(pattern), principal, args.host, int(op), int(perm)]
            for rtype, name in resources or [(ResourceType.ANY, None)] for op in ops]


def _row(b: list) -> tuple:
    return (display(ResourceType(b[0])), b[1], display(PatternType(b[2])), b[3], b[4],
            display(AclOperation(b[5])), display(Permission(b[6])))


_HEADER = ("ResourceType", "Name", "PatternType", "Principal", "Host", "Operation",
           "Permission")


def _print(bindings: list[list], as_json: bool) -> None:
    rows = [_row(b) for b in sorted(bindings, key=lambda b: (b[0], b[1], b[2], b[3], b[5]))]
    if as_json:
        keys = ("resourceType", "name", "patternType", "principal", "host", "operation",
                "permission")
        sys.stdout.write("".join(json_line(dict(zip(keys, r, strict=True))) for r in rows))
    elif rows:
        sys.stdout.write(table(_HEADER, rows))


def _admin(args: argparse.Namespace):
    from mq.client.admin import Admin
    return Admin(**client_options(args))


def run_add(args: argparse.Namespace) -> int:
    bindings = bindings_of(args)
    with _admin(args) as admin:
        admin.create_acls(bindings)
    _print(bindings, False)
    return 0


def run_list(args: argparse.Namespace) -> int:
    filters = filters_of(args)
    with _admin(args) as admin:
        found: dict[tuple, list] = {}
        for f in filters:
            for b in admin.describe_acls(f):
                found.setdefault(tuple(b), b)
    _print(list(found.values()), args.json)
    return 0


def run_delete(args: argparse.Namespace) -> int:
    if not (args.principal or args.host or args.permission or args.operation
            or _resources(args)):
        raise ValueError("name what to delete (--principal, --topic, ...); "
                         "'mq acls list' shows the ACLs")
    with _admin(args) as admin:
        removed = admin.delete_acls(filters_of(args))
    _print(removed, False)
    return 0
