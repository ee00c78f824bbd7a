"""``mq migrate``: move an mq broker's topics, records and committed group offsets into an
Apache Kafka cluster, so that every group continues there where it stopped on mq: no record
lost, none read twice.

Why a command and not MirrorMaker 2: MM2 needs a Connect runtime, and translates a group's
offset only to the last offset sync before it (one every ``offset.lag.max`` records), so a
group re-reads records after the move. This command writes every record itself and can find
the exact target offset of any source offset afterwards.

How (``mq.migrate.migration`` runs it; the source is only read):

- Source: the running broker, through ``mq.Admin`` and an ``mq.Consumer`` with
  ``isolation_level="read_committed"``: aborted transactions' records and control records
  are not copied, and each partition is copied up to its last stable offset.
- Target: ``mq.migrate.target`` over confluent-kafka. Each topic is created with the source's
  partition count and the configs that shape it (``mq.migrate.offsets.target_config``); each
  record keeps its partition, key, value, headers and timestamp (as CreateTime), in order, and
  gains one header, ``mq.source.offset``: its offset in the mq partition.
- Resuming: the header makes the target describe itself. The idempotent producer (acks=all,
  gapless) leaves each target partition a prefix of what was sent, so its last record names
  the last source offset copied: a new run reads it, checks that it matches the source's
  record at that offset (key, value, timestamp and headers, while mq still holds it), and
  copies from the next offset on. A run killed at any point is run again with the same
  command, from any machine, and the target ends as one uninterrupted run would leave it.
  Refused: a non-empty target partition whose last record lacks the header or does not match
  (mq migrate never writes into data it did not write), and one that had records but holds
  none (Kafka's retention took the last one: where to continue is unknown). A killed run's
  last requests may land after it died (the leader appends them on arrival and counts them
  once replicated), so a run that resumes first waits until the target's ends hold still for
  two seconds. After each topic, every partition's end must be where this run's records put
  it; otherwise something else wrote there meanwhile (a second run, a request later still) and
  the run stops, saying so. A local state file was the other choice: it lives on one machine,
  lags the target after a crash between a write and its update (so the target must be read
  anyway), and cannot translate offsets copied by earlier runs without keeping a table; the
  header costs about 20 bytes a record and is the one visible difference of a copy.
- Offsets: a committed source offset O (the next record to read) becomes the target offset
  of the first copied record whose source offset is >= O, or the partition's end if none
  (``mq.migrate.offsets.translate``, exact, found by probing the target's headers: a couple
  of reads per partition and group, and no table kept in memory). Groups are written with
  AdminClient.alter_consumer_group_offsets, all at once after every check passed: none may
  have live members on either side, nor committed offsets on the target that differ from
  the translation (it consumed there: writing would make it read again), nor offsets held
  by an open transaction on mq.

Records are copied while producers run (the copy stops at each partition's end as it was
when the run started, and a later run copies the rest); group offsets only move when the
groups' consumers and transactional producers have stopped on mq, which the run checks.
"""

from mq.migrate.migration import Migration, PartitionCopy, TopicPlan

__all__ = ["Migration", "PartitionCopy", "TopicPlan"]
