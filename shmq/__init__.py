"""shmq: a single-host, Kafka-compatible message broker.

``shmq.Producer``, ``shmq.Consumer`` and ``shmq.AdminClient`` are the Python client
(``shmq.client``): confluent-kafka's API over shared memory when the broker is local.
"""

from typing import Any

from shmq._version import __version__

_CLIENT = ("AdminClient", "Consumer", "KafkaError", "KafkaException", "Message", "Producer",
           "TopicPartition")

__all__ = ["__version__", *_CLIENT]


def __getattr__(name: str) -> Any:  # the client loads confluent-kafka: only when asked for
    if name in _CLIENT:
        import shmq.client

        return getattr(shmq.client, name)
    raise AttributeError(f"module 'shmq' has no attribute {name!r}")
