"""The Kafka api versions this broker serves: what ApiVersions advertises.

Clients pick, per api, the highest version both sides know (``ApiVersions`` negotiation), so
these ranges decide what every client speaks to mq. The floors are Kafka 4's own (KIP-896):
Produce 3 and Fetch 4 are where RecordBatch v2 starts, the only format mq stores. The tops
stop where a version would need what one host does not have or mq does not keep:

- Produce 11+, AddPartitionsToTxn 4+, AddOffsetsToTxn/EndTxn/TxnOffsetCommit 4+: KIP-890's
  transactions, which need server-side verification state;
- Fetch 13+ and Metadata 13: topic ids in Fetch (clients fall back to names at 12);
- JoinGroup 8+, OffsetCommit/OffsetFetch 9+: member epochs of KIP-848 on the classic apis.

Every range is within Kafka 4.3.1's schemas (checked at import), so the codec can read it.
"""

from __future__ import annotations

from typing import Final

from mq.protocol.kafka.codec import schema_range

__all__ = ["API_VERSIONS", "SERVED"]

API_VERSIONS: Final = 18

# api key: (lowest, highest) version served
SERVED: Final[dict[int, tuple[int, int]]] = {
    0: (3, 10),      # Produce
    1: (4, 12),      # Fetch
    2: (1, 8),       # ListOffsets
    3: (0, 12),      # Metadata
    8: (2, 8),       # OffsetCommit
    9: (1, 8),       # OffsetFetch
    10: (0, 4),      # FindCoordinator
    11: (0, 7),      # JoinGroup
    12: (0, 4),      # Heartbeat
    13: (0, 4),      # LeaveGroup
    14: (0, 5),      # SyncGroup
    15: (0, 5),      # DescribeGroups
    16: (0, 4),      # ListGroups
    17: (0, 1),      # SaslHandshake (v0 is advertised, not served: sasl_wire.py)
    18: (0, 3),      # ApiVersions
    19: (2, 5),      # CreateTopics
    20: (1, 4),      # DeleteTopics
    21: (0, 2),      # DeleteRecords
    22: (0, 4),      # InitProducerId
    23: (2, 4),      # OffsetForLeaderEpoch
    24: (0, 3),      # AddPartitionsToTxn
    25: (0, 3),      # AddOffsetsToTxn
    26: (0, 3),      # EndTxn
    28: (0, 3),      # TxnOffsetCommit
    29: (1, 3),      # DescribeAcls (v0 went in Kafka 4: KIP-896)
    30: (1, 3),      # CreateAcls
    31: (1, 3),      # DeleteAcls
    32: (1, 4),      # DescribeConfigs
    33: (0, 2),      # AlterConfigs
    35: (1, 4),      # DescribeLogDirs
    36: (0, 2),      # SaslAuthenticate
    37: (0, 3),      # CreatePartitions
    42: (0, 2),      # DeleteGroups
    44: (0, 1),      # IncrementalAlterConfigs
    47: (0, 0),      # OffsetDelete
    50: (0, 0),      # DescribeUserScramCredentials
    51: (0, 0),      # AlterUserScramCredentials
    60: (0, 1),      # DescribeCluster
    61: (0, 0),      # DescribeProducers
    65: (0, 0),      # DescribeTransactions
    66: (0, 1),      # ListTransactions
    68: (0, 1),      # ConsumerGroupHeartbeat
    69: (0, 0),      # ConsumerGroupDescribe
}

for _key, (_lo, _hi) in SERVED.items():
    _slo, _shi = schema_range(_key)
    if not _slo <= _lo <= _hi <= _shi:
        raise AssertionError(f"api {_key}: {_lo}-{_hi} is outside Kafka's {_slo}-{_shi}")
