"""shmq's Python client: confluent-kafka's API, shared memory when the broker is local.

    from shmq import Producer, Consumer
    p = Producer({"bootstrap.servers": "127.0.0.1:9092"}); p.produce("t", b"v"); p.flush()
    c = Consumer({"bootstrap.servers": "127.0.0.1:9092", "group.id": "g"}); c.subscribe(["t"])
    msg = c.poll(1.0)
"""

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from shmq.client._common import Message
from shmq.client.admin import AdminClient
from shmq.client.consumer import Consumer
from shmq.client.producer import Producer

__all__ = ["AdminClient", "Consumer", "KafkaError", "KafkaException", "Message", "Producer",
           "TopicPartition"]
