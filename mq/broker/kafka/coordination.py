"""FindCoordinator and InitProducerId for Kafka clients.

One node coordinates every group and every transactional id: FindCoordinator answers this
node, at the address the client connected to, for both key types (0 group, 1 transaction)
and for each key of a batched request (v4). InitProducerId goes to the native transaction
coordinator (``apis/transactions.py``), which hands out producer ids from the metadata log
and fences older epochs of a transactional id: an id with a transaction open has it aborted
with a bumped epoch first and answers CONCURRENT_TRANSACTIONS (retriable) meanwhile, as
Kafka's does. Without a transactional id every request gets a new producer id at epoch 0,
whatever id and epoch it names (Kafka's answer to an idempotent producer's KIP-360 bump).

**ACLs** (``acls.py``), as Kafka's: FindCoordinator needs Describe on the group
(GROUP_AUTHORIZATION_FAILED) or transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
InitProducerId Write on the transactional id, or for an idempotent producer IdempotentWrite
on the Cluster or Write on some topic (KIP-679), else CLUSTER_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from collections.abc import Mapping

from mq import errors
from mq.broker.acls import OPEN, AclOperation, Authorizer, ResourceType
from mq.broker.kafka.admin import AdminApis
from mq.broker.kafka.conn import KafkaConn
from mq.broker.kafka.exchange import Call, Calls
from mq.broker.kafka.transactions import fenced_error
from mq.protocol.messages import Api

__all__ = ["CoordinationApis"]

# What FindCoordinator's key types (0 group, 1 transaction) need: Describe, else this code.
_KEY_TYPES = {0: (ResourceType.GROUP, errors.GroupAuthorizationFailedError.code),
              1: (ResourceType.TRANSACTIONAL_ID,
                  errors.TransactionalIdAuthorizationFailedError.code)}


class CoordinationApis:
    def __init__(self, admin: AdminApis, authz: Authorizer = OPEN) -> None:
        self._admin = admin
        self._authz = authz

    def handlers(self) -> Mapping[int, object]:
        return {10: self.find_coordinator, 22: self.init_producer_id}

    def find_coordinator(self, conn: KafkaConn, version: int, body: dict) -> dict:
        node = self._admin.node(conn)
        where = {"node_id": node["node_id"], "host": node["host"], "port": node["port"]}
        if version >= 4:
            return {"throttle_time_ms": 0, "coordinators": [
                {"key": key, **where, "error_code": self._coordinator_error(
                    conn, body["key_type"], key), "error_message": None}
                for key in body["coordinator_keys"]]}
        return {"throttle_time_ms": 0, "error_message": None, **where, "error_code":
                self._coordinator_error(conn, body["key_type"], body["key"])}

    def _coordinator_error(self, conn: KafkaConn, key_type: int, key: str) -> int:
        if key_type not in _KEY_TYPES:
            return errors.InvalidRequestError.code
        resource, denied = _KEY_TYPES[key_type]
        return errors.NONE if self._authz.allows(conn, AclOperation.DESCRIBE, resource, key) \
            else denied

    def init_producer_id(self, conn: KafkaConn, version: int, body: dict):
        """A new producer id (idempotence), or the next epoch of a transactional id's.

        From v3 a client may name the id and epoch it holds (KIP-360: it asks for a bump
        after an abortable error or a transaction the coordinator timed out). Kafka accepts
        the current epoch or the one before it (the coordinator's bump on a timeout); any
        other pair is a zombie's: PRODUCER_FENCED (INVALID_PRODUCER_EPOCH before v4)."""
        tid = body["transactional_id"]
        if tid is not None and not self._authz.allows(conn, AclOperation.WRITE,
                                                      ResourceType.TRANSACTIONAL_ID, tid):
            return _init_answer(errors.TransactionalIdAuthorizationFailedError.code)
        if tid is None and not (
                self._authz.allows(conn, AclOperation.IDEMPOTENT_WRITE, ResourceType.CLUSTER)
                or self._authz.allows_any(conn, AclOperation.WRITE, ResourceType.TOPIC)):
            return _init_answer(errors.ClusterAuthorizationFailedError.code)
        pid, epoch = (body["producer_id"], body["producer_epoch"]) if version >= 3 \
            else (-1, -1)
        if tid is not None and pid >= 0:
            (held,) = yield Calls([Call(Api.DESCRIBE_TRANSACTIONS,
                                        {"transactional_ids": [tid]})])
            current = held["rows"][0] if held.error_code == errors.NONE else None
            if current is None or current["producer_id"] != pid or \
                    epoch not in (current["producer_epoch"], current["producer_epoch"] - 1):
                return _init_answer(fenced_error(22, version, errors.ProducerFencedError.code))
        (reply,) = yield Calls([Call(Api.INIT_PRODUCER_ID, {
            "transactional_id": tid, "transaction_timeout_ms": body["transaction_timeout_ms"]})])
        if reply.error_code != errors.NONE:
            return _init_answer(fenced_error(22, version, reply.error_code))
        return _init_answer(errors.NONE, reply["producer_id"], reply["producer_epoch"])


def _init_answer(code: int, producer_id: int = -1, producer_epoch: int = -1) -> dict:
    return {"throttle_time_ms": 0, "error_code": code, "producer_id": producer_id,
            "producer_epoch": producer_epoch}
