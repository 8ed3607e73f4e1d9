"""What a handler may touch: the narrow interface between Kafka APIs and the process they run in.

Handlers get a ``BrokerContext``; the controller and the workers each provide one.  A worker has
partition logs; the controller has the metadata store.  Anything that only the controller may do
(create or delete topics, hand out producer ids) goes through ``controller``, which in a worker is
an RPC over the control channel and in the controller a direct call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from shmq.broker.config import BrokerConfig
from shmq.broker.metadata import ClusterMetadata, PartitionInfo
from shmq.ipc.state_table import storage_flags
from shmq.storage.log import PartitionLog


@dataclass
class TopicRequest:
    name: str
    num_partitions: int
    replication_factor: int
    configs: dict[str, str | None]
    # manual replica assignment: [partition index, [broker ids]] per partition (CreateTopics)
    assignments: list[list[Any]] = field(default_factory=list)


@dataclass
class TopicResult:
    name: str | None
    error_code: int
    error_message: str | None = None
    topic_id: str | None = None
    num_partitions: int = -1
    replication_factor: int = -1
    # the new topic's effective configs, CreateTopics v5+: [name, value, read_only, source,
    # sensitive] sorted by name; None on errors
    configs: list[list[Any]] | None = None


class ControllerApi(Protocol):
    async def create_topics(self, topics: Sequence[TopicRequest],
                            validate_only: bool) -> list[TopicResult]: ...

    async def delete_topics(self, names: Sequence[str],
                            ids: Sequence[str] = ()) -> list[TopicResult]: ...

    async def allocate_producer_ids(self, count: int) -> int: ...

    async def create_partitions(self, topics: list[dict[str, Any]],
                                validate_only: bool) -> list[dict[str, Any]]: ...

    async def alter_configs(self, resources: list[dict[str, Any]], validate_only: bool,
                            incremental: bool) -> list[dict[str, Any]]: ...

    async def create_internal_topic(self, name: str, wait: bool = True) -> bool: ...


@dataclass
class BrokerContext:
    node_id: int
    config: BrokerConfig
    metadata: ClusterMetadata
    controller: ControllerApi
    logs: Any = None                     # LogManager in a worker, InternalLogs in the controller
    coordinator: Any = None              # GroupCoordinator in the controller, None in a worker
    txn_coordinator: Any = None          # TransactionCoordinator in the controller, else None
    # parked long-poll fetches: partition -> futures to resolve on its next append; every
    # parked fetch also waits for the next metadata change
    _fetch_waiters: dict[tuple[str, int], set[asyncio.Future]] = field(default_factory=dict)
    _metadata_waiters: set[asyncio.Future] = field(default_factory=set)
    _pid_block: list[int] = field(default_factory=lambda: [0, 0])   # next, end
    stats: dict[str, int] = field(default_factory=lambda: {"sendfile_bytes": 0,
                                                            "sendfile_calls": 0,
                                                            "responses": 0,
                                                            "response_writes": 0,
                                                            "send_waits": 0})
    state_table: Any = None              # shmq.ipc.StateTable attached read-write (workers)
    state_reader: Any = None             # the state table to read flags from (any process)
    metrics: Any = None                  # this process's MetricsWriter (None: collection off)
    remote_ns: int = 0                   # a handler's wait (purgatory), for the router
    # encoded Metadata answers of the current metadata generation (handlers/metadata.py)
    metadata_answers: dict[Any, Any] = field(default_factory=dict)

    def publish_state(self, topic: str, partition: int, log: PartitionLog) -> None:
        """Write the partition's offsets to its shared-memory slot (seqlock, ~1 us)."""
        if self.state_table is not None:
            self.publish_partition(self.metadata.topics[topic].partitions[partition], log)

    def publish_partition(self, info: PartitionInfo, log: PartitionLog) -> None:
        """``publish_state`` for a partition whose metadata the caller holds (the produce
        path: one lookup per partition, not two)."""
        table = self.state_table
        if table is not None and 0 <= info.slot < table.slot_count:
            table.write(info.slot, self.node_id, info.leader_epoch, log.log_start_offset,
                        log.high_watermark, log.last_stable_offset, log.log_end_offset,
                        log.generation,
                        0 if log.storage_errno is None else storage_flags(log.storage_errno))

    def log_for(self, topic: str, partition: int) -> PartitionLog | None:
        """The local log of a partition this node leads (created on first use), else None."""
        if self.logs is None or self.metadata.leader_of(topic, partition) != self.node_id:
            return None
        log = self.logs.get_log(topic, partition)
        if log is None:
            from shmq.broker.dynamic_configs import effective_log_config

            config = effective_log_config(self.metadata, self.config.log, self.node_id, topic)
            topic_id = self.metadata.topics[topic].topic_id
            log = self.logs.get_or_create_log(topic, partition, config, topic_id=topic_id)
            if log is not None:
                self.publish_state(topic, partition, log)
        return log

    def park(self, keys: list[tuple[str, int]]) -> asyncio.Future:
        """A future resolved by the next append to any of ``keys`` (``notify_data``) or the next
        metadata change (``wake_fetches``); ``unpark`` it when done waiting.

        One future per parked fetch, registered in a set per partition: librdkafka names every
        partition in every Fetch (it keeps no KIP-227 session), and an ``Event.wait()`` task per
        partition cost ~10 us each to create and cancel on every wait (10 ms a long poll at
        1,000 partitions)."""
        fut = asyncio.get_running_loop().create_future()
        waiters = self._fetch_waiters
        for key in keys:
            parked = waiters.get(key)
            if parked is None:
                waiters[key] = {fut}
            else:
                parked.add(fut)
        self._metadata_waiters.add(fut)
        return fut

    def unpark(self, keys: list[tuple[str, int]], fut: asyncio.Future) -> None:
        waiters = self._fetch_waiters
        for key in keys:
            parked = waiters.get(key)
            if parked is not None:
                parked.discard(fut)
                if not parked:
                    del waiters[key]
        self._metadata_waiters.discard(fut)

    def notify_data(self, topic: str, partition: int) -> None:
        """Wake long-polling fetches of this partition."""
        parked = self._fetch_waiters.pop((topic, partition), None)
        if parked:
            for fut in parked:
                if not fut.done():
                    fut.set_result(None)

    def wake_fetches(self) -> None:
        """Wake every long-polling fetch after a metadata change: each reads again, and one
        whose partition was deleted, moved or changed epoch answers with that error at once
        (Kafka's ``DelayedFetch.tryComplete``)."""
        parked, self._metadata_waiters = self._metadata_waiters, set()
        for fut in parked:
            if not fut.done():
                fut.set_result(None)

    async def next_producer_id(self) -> int:
        nxt, end = self._pid_block
        if nxt >= end:
            first = await self.controller.allocate_producer_ids(1000)
            nxt, end = first, first + 1000
        self._pid_block[:] = [nxt + 1, end]
        return nxt
