"""FindCoordinator and InitProducerId for Kafka clients.

One node coordinates every group and every transactional id: FindCoordinator answers this
node, at the address the client connected to, for both key types (0 group, 1 transaction)
and for each key of a batched request (v4). InitProducerId goes to the native transaction
coordinator (``apis/transactions.py``), which hands out producer ids from the metadata log
and fences older epochs of a transactional id.
"""

from __future__ import annotations

from collections.abc import Mapping

from mq.broker.kafka.admin import AdminApis
from mq.broker.kafka.conn import KafkaConn
from mq.broker.kafka.exchange import Call, Calls
from mq.protocol.messages import Api

__all__ = ["CoordinationApis"]

NONE = 0
INVALID_REQUEST = 42


class CoordinationApis:
    def __init__(self, admin: AdminApis) -> None:
        self._admin = admin

    def handlers(self) -> Mapping[int, object]:
        return {10: self.find_coordinator, 22: self.init_producer_id}

    def find_coordinator(self, conn: KafkaConn, version: int, body: dict) -> dict:
        node = self._admin.node(conn)
        where = {"node_id": node["node_id"], "host": node["host"], "port": node["port"]}
        code = NONE if body["key_type"] in (0, 1) else INVALID_REQUEST
        if version >= 4:
            return {"throttle_time_ms": 0, "coordinators": [
                {"key": key, **where, "error_code": code, "error_message": None}
                for key in body["coordinator_keys"]]}
        return {"throttle_time_ms": 0, "error_code": code, "error_message": None, **where}

    def init_producer_id(self, conn: KafkaConn, version: int, body: dict):
        timeout = body["transaction_timeout_ms"]
        (reply,) = yield Calls([Call(Api.INIT_PRODUCER_ID, {
            "transactional_id": body["transactional_id"] or None,
            "transaction_timeout_ms": timeout if timeout > 0 else 60_000})])
        if reply[2] != NONE:
            return {"throttle_time_ms": 0, "error_code": reply[2], "producer_id": -1,
                    "producer_epoch": -1}
        return {"throttle_time_ms": 0, "error_code": NONE, "producer_id": reply[4],
                "producer_epoch": reply[5]}
