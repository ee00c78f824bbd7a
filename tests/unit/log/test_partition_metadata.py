import os
import uuid

from mq.log.partition_metadata import PARTITION_METADATA, read_topic_id, write_topic_id


def test_kafkas_format_and_round_trip(tmp_path):
    tid = uuid.UUID("deadbeef-0000-4000-8000-000000000000").hex
    write_topic_id(str(tmp_path), tid)
    text = (tmp_path / PARTITION_METADATA).read_text()
    # Kafka's Uuid.toString: URL-safe base64 of the 16 bytes, no padding.
    assert text == "version: 0\ntopic_id: 3q2-7wAAQACAAAAAAAAAAA\n"
    assert read_topic_id(str(tmp_path)) == tid
    assert not [n for n in os.listdir(tmp_path) if n != PARTITION_METADATA]


def test_missing_or_garbled_file_reads_as_none(tmp_path):
    assert read_topic_id(str(tmp_path)) is None
    (tmp_path / PARTITION_METADATA).write_text("version: 0\ntopic_id: !!\n")
    assert read_topic_id(str(tmp_path)) is None
