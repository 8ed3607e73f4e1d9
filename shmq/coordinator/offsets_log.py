"""The coordinator's ``__consumer_offsets`` logs in the controller's own log directory.

Theory of operation
-------------------
The controller keeps ``<data dir>/controller/__consumer_offsets-<p>/`` through the ordinary storage
layer (``LogManager`` / ``PartitionLog``: Kafka's segment format, recovery after a crash, clean
shutdown marker).  A group lives in partition ``abs(javaHash(group)) % partitions``, as in Kafka.

* Write: ``append`` encodes the records as uncompressed RecordBatch v2 batches (at most
  ``BATCH_RECORDS`` records each) and appends them to the page cache at once; ``durable`` then
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
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from shmq.errors import CorruptRecordError
from shmq.protocol.records import encode_batch, iter_batches
from shmq.storage.log import PartitionLog
from shmq.storage.log_config import LogConfig
from shmq.storage.log_manager import LogManager

TOPIC = "__consumer_offsets"
BATCH_RECORDS = 500
READ_CHUNK = 4 << 20

log = logging.getLogger("shmq.coordinator")


class OffsetsLog:
    def __init__(self, directory: Path, partitions: int, segment_bytes: int,
                 snapshot_bytes: int) -> None:
        self.directory = Path(directory)
        self.config = LogConfig(segment_bytes=segment_bytes, retention_ms=-1,
                                cleanup_policy="compact", max_message_bytes=1 << 30)
        self.manager = LogManager(self.directory, self.config)
        self.manager.startup({TOPIC: self.config})
        found = [p for (t, p) in self.manager.logs if t == TOPIC]
        # Like Kafka, the partition count is fixed when the topic is first created: a changed
        # offsets.topic.num.partitions would move groups to other partitions.
        self.partitions = max(found) + 1 if found else partitions
        if found and self.partitions != partitions:
            log.warning("__consumer_offsets has %d partitions on disk; offsets.topic.num.partitions"
                        "=%d is ignored", self.partitions, partitions)
        self.logs: list[PartitionLog] = [
            self.manager.get_or_create_log(TOPIC, p, self.config) for p in range(self.partitions)]
        for plog in self.logs:
            plog.update_high_watermark(plog.log_end_offset)
        self.snapshot_bytes = snapshot_bytes
        self.live_bytes = [0] * self.partitions    # size of the last snapshot of each partition
        self._flushing: list[asyncio.Future | None] = [None] * self.partitions
        self.closed = False

    # -- write ------------------------------------------------------------------------------

    def append(self, partition: int, records: list[tuple[bytes, bytes | None]]) -> int:
        """Append records to the page cache; returns the offset after the last one."""
        plog = self.logs[partition]
        batches = bytearray()
        for i in range(0, len(records), BATCH_RECORDS):
            batches += encode_batch(records[i : i + BATCH_RECORDS])
        plog.append(batches, validate=False)
        return plog.update_high_watermark(plog.log_end_offset)

    async def durable(self, partition: int, end_offset: int) -> None:
        """Return once every record below ``end_offset`` is fsynced (group commit)."""
        plog = self.logs[partition]
        loop = asyncio.get_running_loop()
        while plog.recovery_point < end_offset and not self.closed:
            running = self._flushing[partition]
            # a finished flush may predate our append: start the next one (awaiting a done
            # future does not yield, so reusing it here would spin the event loop)
            if running is None or running.done():
                running = self._flushing[partition] = loop.run_in_executor(None, plog.flush)
            await asyncio.shield(running)

    def needs_snapshot(self, partition: int) -> bool:
        size = self.logs[partition].size_in_bytes
        return size > max(self.snapshot_bytes, 4 * self.live_bytes[partition])

    def snapshot(self, partition: int, live: list[tuple[bytes, bytes | None]]) -> None:
        """Rewrite the partition as ``live`` (every record the coordinator holds for it)."""
        plog = self.logs[partition]
        plog.roll()
        start = plog.log_end_offset
        if live:
            self.append(partition, live)
        plog.flush()
        plog.delete_records_before(start)
        self.manager.checkpoint()
        self.live_bytes[partition] = plog.size_in_bytes
        log.info("__consumer_offsets-%d snapshot: %d live records, %d bytes", partition,
                 len(live), plog.size_in_bytes)

    # -- read -------------------------------------------------------------------------------

    def replay(self, partition: int) -> Iterator[tuple[bytes, bytes | None]]:
        """Every record's (key, value) from the log start to the end, in order."""
        plog = self.logs[partition]
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

    # -- life cycle -------------------------------------------------------------------------

    def checkpoint(self) -> None:
        self.manager.checkpoint()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.manager.shutdown()

