"""The Produce request's shape, shared by ``wire`` and its twin ``shmq.protocol.produce_request``.

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
