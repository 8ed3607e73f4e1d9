"""shmq: a single-host, Kafka-compatible message broker."""

from shmq._version import __version__

__all__ = ["__version__"]
