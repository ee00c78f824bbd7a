"""The Kafka listener's dispatch table: the api families composed, one handler per api key.

Each family is a small component over the broker's own (``data.py``: Produce, Fetch,
ListOffsets; ``admin.py``: Metadata and topic administration; ``coordination.py``:
FindCoordinator and producer ids; ``transactions.py``: the transaction apis; ``configs.py``:
DescribeConfigs and IncrementalAlterConfigs; ``groups.py``: group membership, classic and
KIP-848; ``group_admin.py``: committed offsets and group administration; ``acl_apis.py``:
CreateAcls, DescribeAcls, DeleteAcls; ``sasl_wire.py``: SASL and SCRAM credentials), built
with what it needs, and exposing ``handlers()``. ApiVersions is the listener's own. Every
family is handed the one ``Authorizer`` (``mq/broker/acls.py``) over the metadata log's ACLs,
and checks each resource it touches.
"""

from __future__ import annotations

from collections.abc import Mapping

from mq.broker.acls import Authorizer
from mq.broker.apis.groups import GroupApis
from mq.broker.apis.transactions import TransactionApis
from mq.broker.apis.users import UserApis
from mq.broker.config import BrokerConfig
from mq.broker.kafka.acl_apis import AclWireApis
from mq.broker.kafka.admin import AdminApis
from mq.broker.kafka.configs import ConfigApis
from mq.broker.kafka.coordination import CoordinationApis
from mq.broker.kafka.data import DataApis
from mq.broker.kafka.group_admin import GroupAdminApis
from mq.broker.kafka.groups import GroupWireApis
from mq.broker.kafka.sasl_wire import SaslWireApis
from mq.broker.kafka.transactions import TransactionWireApis
from mq.broker.metadata import MetadataStore
from mq.broker.partitions import PartitionTable
from mq.log.datadir import read_meta

__all__ = ["KafkaApis"]


class KafkaApis:
    def __init__(self, config: BrokerConfig, table: PartitionTable, groups: GroupApis,
                 transactions: TransactionApis, metadata: MetadataStore, users: UserApis,
                 *, leader_epoch: int) -> None:
        cluster_id = read_meta(config.data_dir).get("cluster.id", "")
        self.authz = authz = Authorizer(lambda: metadata.acl_index,
                                        super_users=config.kafka_super_users,
                                        enforce_anonymous=config.kafka_acl_enforce_anonymous)
        self.admin = AdminApis(config, table, metadata, leader_epoch=leader_epoch,
                               cluster_id=cluster_id, authz=authz)
        self.data = DataApis(table, leader_epoch=leader_epoch, node_id=config.node_id,
                             auto_create=self.admin.create_call if config.auto_create_topics
                             else None, authz=authz)
        self.coordination = CoordinationApis(self.admin, authz)
        self.transactions = TransactionWireApis(table, authz)
        self.configs = ConfigApis(config, authz)
        self.groups = GroupWireApis(groups, metadata, authz)
        self.group_admin = GroupAdminApis(groups, self.groups, metadata, authz)
        self.acls = AclWireApis(authz)
        self.sasl = SaslWireApis(users, config.kafka_sasl_mechanisms, authz)
        self._families = [self.admin, self.data, self.coordination, self.transactions,
                          self.configs, self.groups, self.group_admin, self.acls, self.sasl]

    def handlers(self) -> Mapping[int, object]:
        table: dict[int, object] = {}
        for family in self._families:
            for key, handler in family.handlers().items():
                if key in table:
                    raise ValueError(f"Kafka api {key} is handled by two families")
                table[key] = handler
        return table
