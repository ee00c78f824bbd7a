"""Kafka's ACL apis: CreateAcls, DescribeAcls, DeleteAcls, on the native ACL component.

CreateAcls and DeleteAcls need Alter on the Cluster, DescribeAcls Describe on it; without it
every result says CLUSTER_AUTHORIZATION_FAILED (31), as Kafka's. The bindings and filters go
to the native apis (``apis/acls.py``) unchanged — the wire carries Kafka's own codes — and
come back grouped by resource, Kafka's response shape. Filters with an unknown code match
nothing rather than fail, like Kafka's ``AclBindingFilter`` of UNKNOWN values.
"""

from __future__ import annotations

from collections.abc import Mapping

from mq import errors
from mq.broker.acls import AclOperation, Authorizer, ResourceType
from mq.broker.kafka.conn import KafkaConn
from mq.broker.kafka.exchange import Call, Calls
from mq.protocol.messages import Api

__all__ = ["AclWireApis"]

_DENIED = errors.ClusterAuthorizationFailedError.code
_DENIED_MESSAGE = "not authorized for the cluster's ACLs"


def _filter(f: dict) -> list:
    return [f["resource_type_filter"], f["resource_name_filter"], f["pattern_type_filter"],
            f["principal_filter"], f["host_filter"], f["operation"], f["permission_type"]]


class AclWireApis:
    def __init__(self, authz: Authorizer) -> None:
        self._authz = authz

    def handlers(self) -> Mapping[int, object]:
        return {29: self.describe_acls, 30: self.create_acls, 31: self.delete_acls}

    def create_acls(self, conn: KafkaConn, version: int, body: dict):
        creations = body["creations"]
        if not self._authz.allows(conn, AclOperation.ALTER, ResourceType.CLUSTER):
            return {"throttle_time_ms": 0, "results": [
                {"error_code": _DENIED, "error_message": _DENIED_MESSAGE} for _ in creations]}
        bindings = [[c["resource_type"], c["resource_name"], c["resource_pattern_type"],
                     c["principal"], c["host"], c["operation"], c["permission_type"]]
                    for c in creations]
        (reply,) = yield Calls([Call(Api.CREATE_ACLS, {"bindings": bindings})])
        if reply.error_code:
            results = [{"error_code": reply.error_code, "error_message": reply.error_message}
                       for _ in creations]
        else:
            results = [{"error_code": code, "error_message": message}
                       for code, message in reply["results"]]
        return {"throttle_time_ms": 0, "results": results}

    def describe_acls(self, conn: KafkaConn, version: int, body: dict):
        if not self._authz.allows(conn, AclOperation.DESCRIBE, ResourceType.CLUSTER):
            return {"throttle_time_ms": 0, "error_code": _DENIED,
                    "error_message": _DENIED_MESSAGE, "resources": []}
        (reply,) = yield Calls([Call(Api.DESCRIBE_ACLS, {"filter": _filter(body)})])
        if reply.error_code:
            return {"throttle_time_ms": 0, "error_code": reply.error_code,
                    "error_message": reply.error_message,
                    "resources": []}
        return {"throttle_time_ms": 0, "error_code": 0, "error_message": None,
                "resources": _by_resource(reply["bindings"])}

    def delete_acls(self, conn: KafkaConn, version: int, body: dict):
        filters = body["filters"]
        if not self._authz.allows(conn, AclOperation.ALTER, ResourceType.CLUSTER):
            return {"throttle_time_ms": 0, "filter_results": [
                {"error_code": _DENIED, "error_message": _DENIED_MESSAGE, "matching_acls": []}
                for _ in filters]}
        (reply,) = yield Calls([Call(Api.DELETE_ACLS,
                                     {"filters": [_filter(f) for f in filters]})])
        if reply.error_code:
            return {"throttle_time_ms": 0, "filter_results": [
                {"error_code": reply.error_code, "error_message": reply.error_message,
                 "matching_acls": []}
                for _ in filters]}
        return {"throttle_time_ms": 0, "filter_results": [
            {"error_code": code, "error_message": message, "matching_acls": [
                {"error_code": 0, "error_message": None, "resource_type": b[0],
                 "resource_name": b[1], "pattern_type": b[2], "principal": b[3],
                 "host": b[4], "operation": b[5], "permission_type": b[6]} for b in found]}
            for code, message, found in reply["results"]]}


def _by_resource(bindings: list[list]) -> list[dict]:
    """DescribeAcls's shape: one entry per resource (type, name, pattern), its ACLs under it."""
    resources: dict[tuple, list[dict]] = {}
    for rtype, name, pattern, principal, host, op, perm in bindings:
        resources.setdefault((rtype, name, pattern), []).append(
            {"principal": principal, "host": host, "operation": op, "permission_type": perm})
    return [{"resource_type": rtype, "resource_name": name, "pattern_type": pattern,
             "acls": acls} for (rtype, name, pattern), acls in resources.items()]
