"""The Produce and Fetch requests' shapes, shared by ``wire`` and its twins
``shmq.protocol.produce_request`` and ``shmq.protocol.fetch_request``.

They live in the ``_fast`` leaf because the compiled parser builds them and may not import
``shmq.protocol``; the twin re-exports them.
"""

from __future__ import annotations

from typing import NamedTuple


class ProducePartition(NamedTuple):
    partition_index: int
    records: memoryview | None  # a slice of the request frame, or None for null records


class ProduceTopic(NamedTuple):
    name: str
    partitions: list[ProducePartition]


class ProduceRequest(NamedTuple):
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: list[ProduceTopic]


class FetchPartition(NamedTuple):
    partition: int
    current_leader_epoch: int  # -1 before v9
    fetch_offset: int
    last_fetched_epoch: int  # -1 before v12
    log_start_offset: int  # -1 before v5
    partition_max_bytes: int


class FetchTopic(NamedTuple):
    topic: str
    partitions: list[FetchPartition]


class ForgottenTopic(NamedTuple):
    topic: str
    partitions: list[int]


class FetchRequest(NamedTuple):
    """A Fetch request v4..v12; fields a version lacks hold Kafka's (and kio's) defaults."""

    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation_level: int
    session_id: int  # 0 before v7
    session_epoch: int  # -1 before v7
    topics: list[FetchTopic]
    forgotten_topics_data: list[ForgottenTopic]  # empty before v7
    rack_id: str  # "" before v11
