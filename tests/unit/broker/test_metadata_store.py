"""Topic metadata: the config a topic gets, internal topics included."""

from __future__ import annotations

from mq.broker.metadata import PRODUCER_ID_BLOCK, MetadataStore
from mq.broker.offsets import OFFSETS_TOPIC
from mq.log.config import LogConfig
from mq.log.log import PartitionLog


def test_internal_topics_keep_their_fixed_config_over_any_defaults(tmp_path):
    # A SIGHUP reload recomputes every partition's config from the (new) defaults: the
    # offsets topic must stay compacted whatever they say.
    plog = PartitionLog.open(str(tmp_path / "__cluster_metadata-0"))
    try:
        store = MetadataStore(plog)
        defaults = LogConfig.from_properties({"cleanup.policy": "delete",
                                              "segment.bytes": "1073741824"})
        cfg = store.config_for(OFFSETS_TOPIC, defaults)
        assert cfg.cleanup_policy == "compact" and cfg.segment_bytes == 100 * 1024 * 1024
        store.create_topic("t", 1, {"retention.ms": "5"})
        assert store.config_for("t", defaults).retention_ms == 5
        assert store.config_for("unknown", defaults) is defaults
    finally:
        plog.close()


def test_producer_ids_come_in_recorded_blocks_and_are_never_handed_out_twice(tmp_path):
    path = str(tmp_path / "__cluster_metadata-0")
    seen = set()
    for restart in range(3):
        plog = PartitionLog.open(path)
        try:
            store = MetadataStore(plog)
            store.create_topic(f"t{restart}", 1, {})
            ids = [store.allocate_producer_id() for _ in range(PRODUCER_ID_BLOCK + 5)]
        finally:
            plog.close()
        assert len(set(ids)) == len(ids) and not seen & set(ids)
        seen |= set(ids)
    plog = PartitionLog.open(path)
    try:
        store = MetadataStore(plog)                       # topics replay past the records
        assert set(store.topics) == {"t0", "t1", "t2"}
        assert store.allocate_producer_id() == 6 * PRODUCER_ID_BLOCK
    finally:
        plog.close()


def test_alter_config_deletes_overrides_and_a_replay_agrees(tmp_path):
    """A deleted override is gone from the topic's config, after a restart too (the broker
    default applies again)."""
    path = str(tmp_path / "__cluster_metadata-0")
    plog = PartitionLog.open(path)
    try:
        store = MetadataStore(plog)
        store.create_topic("t", 1, {"retention.ms": "5", "segment.bytes": "100000"})
        info = store.alter_config("t", {"cleanup.policy": "compact"}, delete=["retention.ms",
                                                                          "flush.ms"])
        assert info.config == {"segment.bytes": "100000", "cleanup.policy": "compact"}
    finally:
        plog.close()
    plog = PartitionLog.open(path)
    try:
        assert MetadataStore(plog).topics["t"].config == info.config
    finally:
        plog.close()


def test_acls_are_records_replayed_at_start_and_a_removal_stays_removed(tmp_path):
    from mq.broker.acls import AclBinding
    path = str(tmp_path / "__cluster_metadata-0")
    read = AclBinding(2, "orders", 3, "User:alice", "*", 3, 3)
    write = AclBinding(2, "ord", 4, "User:bob", "10.0.0.1", 4, 2)
    plog = PartitionLog.open(path)
    try:
        store = MetadataStore(plog)
        store.create_topic("orders", 1, {})
        store.change_acls(add=[read, write, read])          # the same binding twice: one
        store.change_acls(remove=[write])
        store.change_acls(add=[write])
        store.change_acls(remove=[read])
        assert store.acls == {write}
    finally:
        plog.close()
    plog = PartitionLog.open(path)
    try:
        store = MetadataStore(plog)
        assert store.acls == {write} and set(store.topics) == {"orders"}
    finally:
        plog.close()
