"""mq's clients on an Apache Kafka cluster: ``mq.Producer``, ``mq.Consumer``, ``mq.Admin`` and
``mq.aio``'s, given ``bootstrap_servers=`` (or ``$MQ_BOOTSTRAP_SERVERS``), are these classes,
which keep mq's API over confluent-kafka (librdkafka) instead of the Unix socket and the maps.

- ``config.py``: where the cluster is (``bootstrap``), and mq's options as librdkafka's;
- ``errors.py``: librdkafka's errors as mq's exception classes;
- ``producer.py``, ``consumer.py``, ``admin.py``: the three clients;
- ``mq/aio/kafka.py``: the same for asyncio.

Each public class picks its backend in ``__new__`` (``config.bootstrap``): with a cluster it
returns the class here instead of itself, so ``mq.Producer(bootstrap_servers=...)`` is a
``KafkaProducer`` and the local classes carry no test per call.

librdkafka is imported on first use of a Kafka backend only: the local path never pays for it.
"""
