"""The README's "Kafka clients" examples, verbatim: they must stay identical to the code blocks
there (test_readme_examples.py runs these copies against a broker, with its own address for
127.0.0.1:9092). Each runs as written against ``mq broker --kafka-listener 127.0.0.1:9092``,
on its own topic, so that any one of them can be tried alone."""

KCAT = """\
printf 'order-1:{"qty": 2}\\norder-2:{"qty": 5}\\n' |
    kcat -b 127.0.0.1:9092 -P -t orders -K: -z zstd          # creates the topic
kcat -b 127.0.0.1:9092 -C -t orders -o beginning -e -f '%o %k %s\\n'
kcat -b 127.0.0.1:9092 -L -t orders                        # 1 broker, 1 partition
"""

CONFLUENT_KAFKA = """\
from confluent_kafka import Consumer, KafkaException, Producer

producer = Producer({"bootstrap.servers": "127.0.0.1:9092", "enable.idempotence": True,
                     "compression.type": "lz4"})
producer.produce("payments", key=b"order-1", value=b'{"amount": 12}',
                 headers={"source": b"web"})
producer.flush(10)

consumer = Consumer({"bootstrap.servers": "127.0.0.1:9092", "group.id": "billing",
                     "auto.offset.reset": "earliest", "enable.auto.commit": False})
consumer.subscribe(["payments"])
for msg in consumer.consume(num_messages=1, timeout=30):
    if msg.error():
        raise KafkaException(msg.error())
    print(msg.topic(), msg.partition(), msg.offset(), msg.key(), msg.value(), msg.headers())
consumer.commit(asynchronous=False)
consumer.close()
"""

KAFKA_PYTHON = """\
from kafka import KafkaConsumer, KafkaProducer

producer = KafkaProducer(bootstrap_servers="127.0.0.1:9092")     # idempotent by default
producer.send("invoices", key=b"order-1", value=b"paid").get(timeout=10)
producer.close()

consumer = KafkaConsumer("invoices", bootstrap_servers="127.0.0.1:9092", group_id="ledger",
                         auto_offset_reset="earliest", consumer_timeout_ms=30_000)
for record in consumer:
    print(record.topic, record.partition, record.offset, record.key, record.value)
    break
consumer.close()
"""

AIOKAFKA = """\
import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer


async def main():
    producer = AIOKafkaProducer(bootstrap_servers="127.0.0.1:9092", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait("shipments", key=b"order-1", value=b"packed")
    finally:
        await producer.stop()

    consumer = AIOKafkaConsumer("shipments", bootstrap_servers="127.0.0.1:9092",
                                group_id="warehouse", auto_offset_reset="earliest")
    await consumer.start()
    try:
        record = await consumer.getone()
        print(record.topic, record.partition, record.offset, record.key, record.value)
        await consumer.commit()
    finally:
        await consumer.stop()

asyncio.run(main())
"""
