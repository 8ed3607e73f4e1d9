"""Kafka's internal topics as the controller serves them: ``__consumer_offsets`` (the group
coordinator's log) and ``__transaction_state`` (the transaction coordinator's).

Theory of operation
-------------------
An internal topic's partition logs belong to the coordinator that writes them, in the controller
(Kafka node 0), under ``<data dir>/controller/``.  The controller lists the topic in the cluster
metadata the way Kafka does, with ``is_internal`` true and node 0 as the leader of every partition
(``MetadataStore.register_internal_topic``), when the topic is first needed: a FindCoordinator for
a group or a Metadata request that may create topics (Kafka creates it then too), the
coordinator's first write, or at start when the log already holds records.  Its partition count
is fixed from then on.

Clients read it like any topic: Metadata sends them to node 0, whose ``BrokerContext.logs`` is an
``InternalLogs``, so Fetch, ListOffsets and OffsetForLeaderEpoch find the coordinator's logs
through ``BrokerContext.log_for`` and answer from the same files the coordinator appends to; an
append wakes long-polling fetches.  Clients never write it: Produce and DeleteRecords answer
INVALID_TOPIC_EXCEPTION (Kafka's ``ReplicaManager``), CreateTopics, CreatePartitions and
DeleteTopics INVALID_REQUEST.  Workers lead no partition of it and answer NOT_LEADER_OR_FOLLOWER.

A coordinator adds its topic with ``InternalLogs.add(topic, log_of_partition)``; nothing else here
knows which topic it is.
"""

from __future__ import annotations

from collections.abc import Callable

from shmq.storage.log import PartitionLog
from shmq.storage.log_config import LogConfig


def offsets_topic_configs(segment_bytes: int) -> dict[str, str]:
    """The topic configs Kafka gives ``__consumer_offsets`` (``groupMetadataTopicConfigs``)."""
    return {"cleanup.policy": "compact", "compression.type": "producer",
            "segment.bytes": str(segment_bytes)}


class InternalLogs:
    """The controller's ``BrokerContext.logs``: the partition logs of the internal topics, by
    topic.  It never creates a log of its own (the coordinators do)."""

    def __init__(self) -> None:
        self._logs: dict[str, Callable[[int], PartitionLog]] = {}

    def add(self, topic: str, log_of_partition: Callable[[int], PartitionLog]) -> None:
        self._logs[topic] = log_of_partition

    def get_log(self, topic: str, partition: int) -> PartitionLog | None:
        log_of = self._logs.get(topic)
        if log_of is None:
            return None
        try:
            return log_of(partition)
        except IndexError:
            return None

    def get_or_create_log(self, topic: str, partition: int, config: LogConfig | None = None,
                          topic_id: str | None = None) -> PartitionLog | None:
        return self.get_log(topic, partition)

    def checkpoint(self) -> None:
        """Nothing to do: the coordinators checkpoint their own log directories."""
