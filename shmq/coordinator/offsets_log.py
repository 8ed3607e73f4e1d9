"""The coordinator's ``__consumer_offsets`` logs in the controller's own log directory.

Theory of operation
-------------------
The controller keeps ``<data dir>/controller/__consumer_offsets-<p>/`` through the ordinary storage
layer (``LogManager`` / ``PartitionLog``: Kafka's segment format, recovery after a crash, clean
shutdown marker).  A group lives in partition ``abs(javaHash(group)) % partitions``, as in Kafka.
The same logs are what clients read when they fetch ``__consumer_offsets`` (the controller leads
every partition of it: ``shmq.broker.internal_topics``).

* Partitions: ``offsets.topic.num.partitions`` (Kafka's 50), fixed once the topic is registered
  in the cluster metadata.  Kafka creates every partition's log with the topic; here ``prepare``
  does it in a thread once the topic is listed (creating 50 took 0.05-0.8 s on the shared 2-core
  box: not on the event loop, and not at every broker start), each with its leader epoch
  checkpointed, so a group's first commit costs what any commit costs (measured: a first commit
  into a partition not created yet took 28 ms median against 10-15 ms, loaded box).  A partition
  asked for before ``prepare`` reached it is created on the spot; a lock keeps the two apart.
* Write: ``append`` encodes the records as uncompressed RecordBatch v2 batches (at most
  ``BATCH_RECORDS`` records each, stamped with the partitions' leader epoch, 0, as Kafka's
  coordinator stamps its leader's) and appends them to the page cache at once; ``durable`` then
  waits for an fsync that covers them.  Flushes are a group commit: one flush runs at a time in a
  thread, and every commit appended before it started is answered by it.  A commit is answered
  only after ``durable`` returns.
* Read: ``replay`` yields every ``(key, value)`` from the log start to the end, in log order; the
  coordinator rebuilds its maps from them (last record of a key wins, a null value deletes).
* Keep small: when a partition holds more than ``max(snapshot_bytes, 4 x live bytes)``,
  ``snapshot`` rolls a new segment, appends the live records (what the coordinator holds for that
  partition), fsyncs them and moves the log start to the first of them, which deletes every older
  segment.  A crash at any point is safe: replaying old records and then the snapshot gives the
  same state as the snapshot alone, because every deletion was written as a tombstone before.
* Placement of an older layout (``placed=False``: the topic is not registered yet, so whatever is
  on disk was written before ``__consumer_offsets`` was a topic clients see, by a broker that kept
  one partition, or another count): ``place`` compacts every partition on disk to its live records
  (last value of each key, tombstones applied), appends each record to the partition its group
  has now and fsyncs them all, and only then drops the old records (log start moved past them;
  partitions beyond the count deleted).  A crash midway leaves only copies of the same state, and
  the next start places again; registering the topic afterwards is what marks the layout placed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from shmq.coordinator.records import group_of, partition_for
from shmq.errors import CorruptRecordError
from shmq.protocol.records import encode_batch, iter_batches
from shmq.storage.log import CHECKPOINT_INTERVAL_MS, PartitionLog
from shmq.storage.log_config import LogConfig
from shmq.storage.log_manager import LogManager

TOPIC = "__consumer_offsets"
LEADER_EPOCH = 0  # the epoch the metadata gives its partitions: node 0 leads them for good
BATCH_RECORDS = 500
READ_CHUNK = 4 << 20

log = logging.getLogger("shmq.coordinator")

Records = list[tuple[bytes, bytes | None]]


class OffsetsLog:
    def __init__(self, directory: Path, partitions: int, segment_bytes: int,
                 snapshot_bytes: int, *, placed: bool = True,
                 on_append: Callable[[int], None] | None = None, topic: str = TOPIC) -> None:
        self.topic = topic
        self.directory = Path(directory)
        self.config = LogConfig(segment_bytes=segment_bytes, retention_ms=-1,
                                cleanup_policy="compact", max_message_bytes=1 << 30)
        self.manager = LogManager(self.directory, self.config)
        self.manager.startup({topic: self.config})
        self.partitions = partitions
        self.logs: dict[int, PartitionLog] = {
            p: plog for (t, p), plog in self.manager.logs.items() if t == topic}
        for plog in self.logs.values():
            plog.update_high_watermark(plog.log_end_offset)
        self.snapshot_bytes = snapshot_bytes
        self.live_bytes: dict[int, int] = {}    # size of the last snapshot of each partition
        self._flushing: dict[int, asyncio.Future | None] = {}
        self._checkpoint_timers: set[int] = set()  # partitions with a checkpoint scheduled
        self.closed = False
        self.on_append: Callable[[int], None] | None = None
        # held while a partition log is created (the loop or ``prepare``'s thread) and while the
        # log manager's table is walked (checkpoint, shutdown)
        self._creating = threading.Lock()
        if not placed and self.logs:
            self.place()
        stray = sorted(p for p in self.logs if p >= partitions)
        if stray:  # like Kafka, the count is fixed once the topic exists
            log.warning("%s has %d partitions; partitions %s on disk are ignored",
                        topic, partitions, stray)
        self.on_append = on_append

    def log(self, partition: int) -> PartitionLog:
        """The partition's log, created on first use."""
        plog = self.logs.get(partition)
        if plog is None:
            if not 0 <= partition < self.partitions:
                raise IndexError(f"{self.topic} has no partition {partition}")
            with self._creating:
                plog = self.logs.get(partition) or self._create(partition)
        return plog

    def _create(self, partition: int) -> PartitionLog:
        """A new partition log, its leader epoch checkpointed (call with ``_creating`` held)."""
        if self.closed:
            raise ValueError(f"{self.topic} is closed")
        plog = self.manager.get_or_create_log(self.topic, partition, self.config)
        plog.update_high_watermark(plog.log_end_offset)
        if not plog.epoch_entries:
            plog.write_leader_epoch_checkpoint([(LEADER_EPOCH, plog.log_end_offset)])
        self.logs[partition] = plog
        return plog

    def prepare(self) -> int:
        """Create every partition log not created yet; returns how many.  For a thread."""
        created = 0
        for p in range(self.partitions):
            with self._creating:
                if self.closed:
                    break
                if p not in self.logs:
                    self._create(p)
                    created += 1
        return created

    def has_records(self) -> bool:
        return any(plog.log_end_offset > plog.log_start_offset
                   for plog in list(self.logs.values()))

    # -- write ------------------------------------------------------------------------------

    def append(self, partition: int, records: Records, *, producer_id: int = -1,
               producer_epoch: int = -1) -> int:
        """Append records to the page cache; returns the offset after the last one.  With a
        producer id the batches are that producer's transactional writes (TxnOffsetCommit)."""
        plog = self.log(partition)
        batches = bytearray()
        for i in range(0, len(records), BATCH_RECORDS):
            batches += encode_batch(records[i : i + BATCH_RECORDS], producer_id=producer_id,
                                    producer_epoch=producer_epoch,
                                    transactional=producer_id >= 0)
        plog.append(batches, validate=False, leader_epoch=LEADER_EPOCH)
        end = plog.update_high_watermark(plog.log_end_offset)
        if self.on_append is not None:
            self.on_append(partition)
        return end

    def append_marker(self, partition: int, producer_id: int, producer_epoch: int,
                      coordinator_epoch: int, commit: bool, transaction_version: int = 0) -> int:
        """A COMMIT/ABORT marker of a producer's transactional records; the offset after it
        (``PartitionLog.append_control``: a version 2 marker's retry writes nothing)."""
        plog = self.log(partition)
        plog.append_control(producer_id, producer_epoch, coordinator_epoch, commit,
                            leader_epoch=LEADER_EPOCH, transaction_version=transaction_version)
        end = plog.update_high_watermark(plog.log_end_offset)
        if self.on_append is not None:
            self.on_append(partition)
        return end

    async def durable(self, partition: int, end_offset: int) -> None:
        """Return once every record below ``end_offset`` is fsynced (group commit)."""
        plog = self.logs[partition]
        loop = asyncio.get_running_loop()
        while plog.durable_offset < end_offset and not self.closed:
            running = self._flushing.get(partition)
            # a finished flush may predate our append: start the next one (awaiting a done
            # future does not yield, so reusing it here would spin the event loop)
            if running is None or running.done():
                running = self._flushing[partition] = loop.run_in_executor(
                    None, partial(plog.flush, checkpoint=False))
            await asyncio.shield(running)
        if plog.durable_offset > plog.recovery_point and partition not in self._checkpoint_timers:
            # the acknowledgement's flush moved the durable offset only: the recovery point
            # catches up a checkpoint interval later if no flush took it meanwhile (a worker's
            # once-a-second timer does this for its logs), so what an unclean start of the
            # controller validates stays bounded when the commits stop
            self._checkpoint_timers.add(partition)
            loop.call_later(CHECKPOINT_INTERVAL_MS / 1000, self._checkpoint_later, partition)

    def _checkpoint_later(self, partition: int) -> None:
        self._checkpoint_timers.discard(partition)
        plog = self.logs.get(partition)
        if plog is None or self.closed:
            return
        if plog.flush_due(int(time.time() * 1000)):
            asyncio.get_running_loop().run_in_executor(None, self._checkpoint_quietly, plog)
        elif plog.durable_offset > plog.recovery_point:  # a flush took one meanwhile
            self._checkpoint_timers.add(partition)
            asyncio.get_running_loop().call_later(CHECKPOINT_INTERVAL_MS / 1000,
                                                  self._checkpoint_later, partition)

    def _checkpoint_quietly(self, plog: PartitionLog) -> None:
        with self._creating:  # not against a close under way
            if self.closed:
                return
            try:
                plog.maybe_flush()
            except OSError as exc:  # the next commit's flush reports it to its caller
                log.warning("%s checkpoint failed: %s", self.topic, exc)

    def needs_snapshot(self, partition: int) -> bool:
        size = self.logs[partition].size_in_bytes
        return size > max(self.snapshot_bytes, 4 * self.live_bytes.get(partition, 0))

    def snapshot(self, partition: int, live: Records) -> None:
        """Rewrite the partition as ``live`` (every record the coordinator holds for it)."""
        plog = self.log(partition)
        plog.roll()
        start = plog.log_end_offset
        if live:
            self.append(partition, live)
        plog.flush()
        plog.delete_records_before(start)
        self.checkpoint()
        self.live_bytes[partition] = plog.size_in_bytes
        log.info("__consumer_offsets-%d snapshot: %d live records, %d bytes", partition,
                 len(live), plog.size_in_bytes)

    def place(self) -> None:
        """Move every live record to the partition its group has among ``self.partitions``
        (see the module docstring: crash-safe, nothing dropped before the copies are fsynced)."""
        old = sorted(self.logs)
        live: dict[bytes, bytes] = {}
        for p in old:
            for key, value in self.replay(p):
                live.pop(key, None)  # the last write of a key decides its place in the order
                if value is not None:
                    live[key] = value
        moved: dict[int, Records] = {}
        for key, value in live.items():
            try:
                group = group_of(key)
            except (ValueError, IndexError) as exc:
                log.error("dropping an unreadable __consumer_offsets key %r: %s", key[:64], exc)
                continue
            moved.setdefault(partition_for(group, self.partitions), []).append((key, value))
        starts: dict[int, int] = {}
        for p in old:  # the live copies go after everything already there
            plog = self.logs[p]
            plog.roll()
            starts[p] = plog.log_end_offset
        on_append, self.on_append = self.on_append, None
        for p, records in sorted(moved.items()):
            self.append(p, records)
            self.logs[p].flush()
        self.on_append = on_append
        for p in old:
            if p >= self.partitions:
                self.manager.delete_log(self.topic, p)
                del self.logs[p]
            else:
                self.logs[p].delete_records_before(starts[p])
        self.checkpoint()
        log.warning("__consumer_offsets: %d live records of %d partitions placed into %d "
                    "partitions", len(live), len(old), self.partitions)

    # -- read -------------------------------------------------------------------------------

    def replay(self, partition: int) -> Iterator[tuple[bytes, bytes | None]]:
        """Every record's (key, value) from the log start to the end, in order."""
        plog = self.logs.get(partition)
        if plog is None:
            return
        offset, end = plog.log_start_offset, plog.log_end_offset
        while offset < end:
            result = plog.read(offset, READ_CHUNK, upper_bound=end)
            if not result.slices:
                break
            data = b"".join(os.pread(s.fd, s.length, s.position) for s in result.slices)
            nxt = offset
            try:
                for batch in iter_batches(data):
                    for rec in batch.records():
                        if rec.offset >= offset and rec.key is not None:
                            yield rec.key, rec.value
                    nxt = batch.next_offset
            except CorruptRecordError as exc:  # recovery already truncated torn writes
                log.error("__consumer_offsets-%d: stopping replay at %d: %s", partition, nxt, exc)
                return
            if nxt <= offset:
                break
            offset = nxt
        self.live_bytes[partition] = plog.size_in_bytes

    def replay_batches(self, partition: int) -> Iterator[tuple[Any, list[tuple[bytes | None, bytes | None]]]]:
        """Every batch (a ``RecordBatchView``: producer id, flags) with its records' (key,
        value), in log order (the coordinators' transactional records and markers)."""
        plog = self.logs.get(partition)
        if plog is None:
            return
        offset, end = plog.log_start_offset, plog.log_end_offset
        while offset < end:
            result = plog.read(offset, READ_CHUNK, upper_bound=end)
            if not result.slices:
                break
            data = b"".join(os.pread(s.fd, s.length, s.position) for s in result.slices)
            nxt = offset
            try:
                for batch in iter_batches(data):
                    yield batch, [(r.key, r.value) for r in batch.records()
                                  if r.offset >= offset]
                    nxt = batch.next_offset
            except CorruptRecordError as exc:
                log.error("%s-%d: stopping replay at %d: %s", self.topic, partition, nxt, exc)
                return
            if nxt <= offset:
                break
            offset = nxt
        self.live_bytes[partition] = plog.size_in_bytes

    def partitions_on_disk(self) -> list[int]:
        """The partitions that have a log, below the partition count."""
        return sorted(p for p in list(self.logs) if p < self.partitions)

    # -- life cycle -------------------------------------------------------------------------

    def checkpoint(self) -> None:
        with self._creating:
            self.manager.checkpoint()

    def close(self) -> None:
        with self._creating:  # after a creation under way; ``prepare`` then stops
            if not self.closed:
                self.closed = True
                self.manager.shutdown()
