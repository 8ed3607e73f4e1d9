"""The partition log: ordered segments, offsets, reads, roll, retention and flush.

Theory of operation (Kafka ``UnifiedLog`` + ``LocalLog``)
---------------------------------------------------------
Offsets::

    log start offset  <=  high watermark  <=  log end offset (LEO)
    first readable        readers stop here    next offset to assign

* ``append`` validates each batch (size, magic, CRC, and with ``validate`` the produce rules and
  every record's timestamp, reading the records as Kafka's ``LogValidator`` does: the batch's
  maxTimestamp comes from them), assigns offsets from the LEO, rolls first if the active segment
  would overflow, and writes the batches with one ``pwritev``.  The high watermark is the caller's business (the broker moves it
  when the ISR has the data; with one replica, right after the append).
* ``read`` returns whole batches from the one containing the requested offset, never past the
  given upper bound (HW, or LSO for read_committed), as ``FileSlice``s for ``sendfile``.
* Retention deletes whole segments from the oldest, never one holding offsets at or above the HW;
  ``delete_records_before`` moves the log start offset (DeleteRecords).
* Durability (Kafka's split of the durable offset and the recovery point).  Two offsets trail
  the LEO::

      recovery point  <=  durable offset  <=  LEO
      crash recovery      acks=all answers
      starts here         wait for this

  ``flush(up_to, checkpoint=False)`` is an acknowledgement's flush, a group commit: callers pass
  the offset they need durable; whoever gets the flush lock fdatasyncs the ``.log`` files up to
  the LEO it sees, with what makes those bytes findable after a power cut (a new segment's
  directory entry, the leader-epoch checkpoint, ``partition.metadata``, txn indexes), and
  everyone whose offset that covered returns without a second fsync.  It moves the *durable
  offset*.  It does not msync the indexes nor write the recovery record: each msync is a cache
  flush of the device, and they were a third of an acks=all flush's sync time (perf/README.md,
  "acks=all: the record bytes only").
  A *checkpoint* (``flush()``, Kafka's ``UnifiedLog.flush``) does all that and then msyncs the
  indexes of every segment from the recovery point's on, and only then moves the *recovery
  point* and writes its byte position with the index state there (``recovery_point.py``), so
  the record never vouches for index entries (or bytes) that are not on disk.  Checkpoints
  run at ``flush.messages`` / ``flush.ms`` as configured, at close, in the acknowledgement's
  flush after a roll, and whenever the recovery point is ``CHECKPOINT_BYTES`` or
  ``CHECKPOINT_INTERVAL_MS`` behind (``_checkpoint_due``; an idle log's from the owner's timer,
  ``flush_due`` / ``maybe_flush``).  That bounds what recovery after a SIGKILL validates (and
  whose indexes it rebuilds): everything after the recovery record, durable or not
  (``loader.py``).  Bytes between the recovery point and the durable offset are on disk, but
  recovery treats them as it treats any bytes past the recovery point.
* Restarts: producer state is snapshotted at every roll, at close, and every
  ``PRODUCER_SNAPSHOT_BYTES`` of appends, so rebuilding it after a crash replays at most that many
  bytes of batch headers, not the whole active segment.

Thread safety: one writer (the partition's worker).  ``flush`` may run on other threads while the
writer appends: it only reads the segment list under ``_lock`` and fsyncs outside it; flushes
run one at a time (``_flush_lock``), so the offsets only grow (truncation takes the flush lock).
"""

from __future__ import annotations

import logging
import os
import secrets
import struct
import threading
import time
import uuid
from pathlib import Path
from typing import Any, NamedTuple

from shmq import _fast
from shmq.errors import CorruptRecordError, KafkaApiError, OffsetOutOfRangeError
from shmq.limits import Throttled
from shmq.protocol.compression import decompress_scratch
from shmq.storage import checkpoint as checkpoint_file
from shmq.storage import disk, layout, partition_metadata, txn_index
from shmq.storage.log_config import LogConfig
from shmq.storage.producer_state import ProducerStateManager, snapshot_path
from shmq.storage.recovery_point import UNKNOWN as UNKNOWN_UNSTABLE
from shmq.storage.recovery_point import RecoveryPointFile
from shmq.storage.segment import LogSegment
from shmq.storage.slices import FileSlice
from shmq.storage.txn_index import AbortedTxn

MESSAGE_TOO_LARGE, INVALID_TIMESTAMP, INVALID_RECORD = 10, 32, 87
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
UNDEFINED_EPOCH = -1  # LeaderEpochFileCache's answer for an epoch it cannot place
UNDEFINED_EPOCH_OFFSET = -1
# producer state is snapshotted after this many bytes of appends (besides every roll): the replay
# of batch headers after a crash reads at most this much
PRODUCER_SNAPSHOT_BYTES = 16 << 20
# the recovery point trails the durable offset by at most about this many bytes or this long
# (Kafka: log.flush.offset.checkpoint.interval.ms, 60 s, and a whole segment to rescan): what
# recovery after a SIGKILL validates per log, 0.02-0.13 s for 64 MiB in the page cache (batches
# of 150 and of 10 100-byte records, perf/README.md "acks=all: the record bytes only")
CHECKPOINT_BYTES = 64 << 20
CHECKPOINT_INTERVAL_MS = 1000

log = logging.getLogger(__name__)
_throttled = Throttled(log)

_I64 = struct.Struct(">q")
_I16 = struct.Struct(">h")


def _add_seq(seq: int, delta: int) -> int:
    """baseSequence + lastOffsetDelta, wrapping at Int.MAX (DefaultRecordBatch)."""
    return seq + delta - 0x80000000 if seq > 0x7FFFFFFF - delta else seq + delta
_I32 = struct.Struct(">i")
HEADER = 61
# the attribute bits Kafka's computeAttributes keeps when it rewrites a header: compression
# (0-2), transactional (4), control (5), delete horizon (6); bit 3 (LogAppendTime) is set anew
_KEPT_ATTRIBUTES = 0x77
# header bytes 21..57 in one unpack: attributes, lastOffsetDelta, baseTimestamp, maxTimestamp,
# producerId, producerEpoch, baseSequence
_FIELDS = struct.Struct(">hiqqqhi")
# header bytes 0..16 as append writes them: baseOffset, batchLength, partitionLeaderEpoch
_PREFIX = struct.Struct(">qii")


class RecordTooLargeError(KafkaApiError):
    """A batch is larger than ``max.message.bytes`` (Kafka MESSAGE_TOO_LARGE)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(MESSAGE_TOO_LARGE, f"batch of {size} bytes exceeds max.message.bytes {limit}")


class RecordValidationError(KafkaApiError):
    """Kafka's ``RecordValidationException``: records of a batch that ``LogValidator`` rejects
    one by one.  The answer carries ``record_errors`` [(index in the batch, reason)], Kafka's
    summary as its message and the log start; the default is INVALID_RECORD's summary."""

    def __init__(self, record_errors: list[tuple[int, str]], code: int = INVALID_RECORD,
                 message: str | None = None) -> None:
        if message is None:
            shown = ", ".join(f"RecordError(batchIndex={i}, message='{why}')"
                              for i, why in record_errors[:3])
            message = (f"One or more records have been rejected due to {len(record_errors)} "
                       f"record errors in total, and only showing the first three errors at "
                       f"most: [{shown}]")
        super().__init__(code, message)
        self.record_errors = record_errors


class InvalidTimestampError(RecordValidationError):
    """Records whose timestamps Kafka's ``LogValidator.validateTimestamp`` refuses
    (INVALID_TIMESTAMP), with one ``(record index, message)`` per record, Kafka's words."""

    def __init__(self, errors: list[tuple[int, int, int, int, int, int]], now: int,
                 before_max_ms: int, after_max_ms: int) -> None:
        record_errors: list[tuple[int, str]] = []
        for index, kind, ts, offset, key_len, value_len in errors:
            if kind == 0:
                message = (f"Timestamp {ts} of message with offset {offset} is out of range. The "
                           f"timestamp should be within [{now - before_max_ms}, "
                           f"{now + after_max_ms}]")
            else:
                message = (f"Invalid timestamp type in message DefaultRecord(offset={offset}, "
                           f"timestamp={ts}, key={key_len} bytes, value={value_len} bytes). "
                           f"Producer should not set timestamp type to LogAppendTime.")
            record_errors.append((index, message))
        super().__init__(record_errors, INVALID_TIMESTAMP,
                         "One or more records have been rejected due to invalid timestamp")


class AppendInfo(NamedTuple):
    first_offset: int
    last_offset: int
    max_timestamp: int
    offset_of_max_timestamp: int
    log_append_time: int            # -1 unless the topic uses LogAppendTime (or a duplicate)
    batch_count: int
    size: int


class TimestampAndOffset(NamedTuple):
    """A ListOffsets answer (Kafka ``FileRecords.TimestampAndOffset``)."""

    timestamp: int
    offset: int
    leader_epoch: int               # -1: unknown


class LoadSummary(NamedTuple):
    """What opening the log did (for the broker's start-up line)."""

    validated_bytes: int            # bytes validated batch by batch
    truncated_bytes: int
    rebuilt_segments: int           # segments whose indexes were rebuilt at open
    resumed_at: tuple[int, int] | None   # (segment, byte) where validation resumed


class LogReadResult(NamedTuple):
    slices: list[FileSlice]         # zero or one slice, whole batches
    log_start_offset: int
    high_watermark: int
    log_end_offset: int

    @property
    def size(self) -> int:
        return sum(s.length for s in self.slices)


class PartitionLog:
    """One partition's log in ``<log dir>/<topic>-<partition>/``."""

    # Called with the nanoseconds of every flush that ran an fsync (Kafka's LogFlushStats), from
    # whichever thread flushed; the broker process sets it to count into its metrics.
    flush_observer: Any = None
    # Diagnostics (``SHMQ_RING_TRACE``, the worker's ring trace): every flush that ran an fsync
    # as (flush called, flush lock taken, fsync done, offset made durable) in
    # ``time.monotonic_ns``, and every ``start_writeback`` as (called, called, returned, -1);
    # the ring session writes them out beside its own trace.
    flush_trace: list[tuple[int, int, int, int]] | None = \
        [] if os.environ.get("SHMQ_RING_TRACE") else None

    def __init__(self, directory: Path, config: LogConfig, segments: list[LogSegment],
                 log_start_offset: int, recovery_point: int, leader_epoch: int = -1,
                 recovered: Any = None, summary: LoadSummary | None = None, *,
                 new: bool = False, txn_bases: set[int] | None = None,
                 synced: bool = True) -> None:
        """``recovered``: the header table (``scan_headers`` columns) of the batches recovery
        scanned, whose leader epochs rebuild what the checkpoint lacks.  ``new``: a directory
        just created (``create``), holding no file to read.  ``synced=False``: opened after an
        unclean shutdown, so the small files read now may be what a killed process left in the
        page cache, never fsynced (a clean shutdown that was killed before its ``syncfs``,
        ``LogManager.shutdown``): the next flush (an acknowledgement's too) fsyncs them before
        its durable offset or recovery point counts on them."""
        self.directory = directory
        self.config = config
        self.segments = segments
        self._bases = [s.base_offset for s in segments]
        # bumped whenever the segment list changes (roll, deletion, truncation) and published in
        # the state table (segments_gen): local readers re-list the segment files when it moves.
        # Random at open, so a restarted worker's log never repeats the value a reader cached.
        self.generation = secrets.randbits(32)
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        # every offset below it is fdatasynced (>= the recovery point; see "Durability")
        self.durable_offset = recovery_point
        self.high_watermark = self.log_end_offset
        self.leader_epoch = leader_epoch
        # what the next checkpoint covers: Kafka's unflushed messages, and bytes appended
        self.unflushed_messages = 0
        self._bytes_since_checkpoint = 0
        # the next acknowledgement's flush takes the checkpoint too: a segment rolled, or
        # recovery validated bytes past the recovery point (a restart after SIGKILL)
        self._checkpoint_wanted = summary is not None and summary.validated_bytes > 0
        # when the recovery point last moved (flush.ms, CHECKPOINT_INTERVAL_MS)
        self.last_flush_ms = int(time.time() * 1000)
        self._directory_dirty = True  # a fresh or recovered directory: fsync it on first flush
        # (segment base offset, byte position): where the bytes whose writeback no flush has
        # started yet begin (``_start_writeback``)
        self._writeback_mark = (-1, 0)
        self._lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self.closed = False
        # why the last write failed (a full disk...), until a write succeeds again: in the produce
        # answers, and (the errno) in the state table's flags, from which Metadata's offline
        # replicas, ``shmq topics --describe`` and the metrics show it
        self.storage_error: str | None = None
        self.storage_errno: int | None = None
        # flush.messages / flush.ms came due in an append: with ``defer_flushes`` (a worker: a
        # slow disk must not stall its event loop) the caller runs the flush in a thread
        self.flush_requested = False
        self.load_summary = summary or LoadSummary(0, 0, 0, None)
        self.topic_id: uuid.UUID | None = None if new else partition_metadata.read(directory)
        self._topic_id_durable = synced or self.topic_id is None
        self._recovery_file = RecoveryPointFile(directory)
        self._bytes_since_snapshot = 0
        self.producer_state = ProducerStateManager(directory)
        # aborted transactions of every segment (their ``.txnindex`` files), by marker offset
        self.aborted: list[AbortedTxn] = []
        self._aborted_ends: list[int] = []
        self._txn_dirty: set[int] = set()  # segments whose .txnindex the next flush fsyncs
        # the offset of the newest producer snapshot known to hold the state at the LEO (close
        # takes none when it is the LEO: Kafka's takeSnapshot skips an unchanged state too)
        self._snapshot_at = -1
        if not new:
            self._load_txn_indexes(txn_bases)
            self._rebuild_producer_state()
            if not synced:  # entries past the recovery point may live only in the page cache
                first = self._bases[self._segment_for(recovery_point)]
                self._txn_dirty = {b for b in (txn_bases if txn_bases is not None
                                               else self._bases) if b >= first}
        # leader-epoch-checkpoint (LeaderEpochFileCache): (epoch, start offset), one per epoch.
        # Written (and fsynced) by the next flush after an epoch starts (see _assign_epoch):
        # entries of batches past the recovery point are rebuilt from those batches.
        self._epoch_path = directory / layout.LEADER_EPOCH_CHECKPOINT
        self._epoch_lock = threading.Lock()  # one writer of the checkpoint file at a time
        # what the file holds (None: missing or unreadable), and whether that is known durable:
        # a write that would not change it is skipped, an unsynced one is fsynced (_write_epochs)
        self._epochs_file = None if new else checkpoint_file.read_leader_epochs(self._epoch_path)
        self._epochs_synced = synced or not self._epochs_file
        self._epochs_durable = self._epochs_synced
        self.epoch_entries = [
            (e, o) for e, o in self._epochs_file or []
            if o < self.log_end_offset or (e, o) == (leader_epoch, o)]
        rebuilt = False
        for row in recovered if recovered is not None else ():
            epoch, base = int(row[_fast.COL_LEADER_EPOCH]), int(row[_fast.COL_BASE_OFFSET])
            if epoch >= 0 and (not self.epoch_entries or (epoch > self.epoch_entries[-1][0]
                                                          and base >= self.epoch_entries[-1][1])):
                self.epoch_entries.append((epoch, base))  # LeaderEpochFileCache.assign
                rebuilt = True
        if leader_epoch >= 0 and (not self.epoch_entries or self.epoch_entries[-1][0] < leader_epoch):
            self.epoch_entries.append((leader_epoch, self._first_offset_of_epoch(leader_epoch)))
            rebuilt = True
        if rebuilt:
            self._write_epochs(self.epoch_entries, sync=True)
        if self.epoch_entries:
            self.leader_epoch = max(self.leader_epoch, self.epoch_entries[-1][0])

    def assign_topic_id(self, topic_id: str | uuid.UUID, *, new: bool = False) -> None:
        """Record the topic id in ``partition.metadata`` (if it is not there already).  Written
        at once, made durable by the next flush, before anything it flushes counts as durable
        (Kafka flushes the file before the first append; here that cost two fsyncs per new
        partition on CreateTopics' path).  ``new``: the directory was just created, so there is
        no file to replace atomically (``partition_metadata.create``)."""
        value = topic_id if isinstance(topic_id, uuid.UUID) else uuid.UUID(topic_id)
        if value == self.topic_id:
            return
        if new:
            partition_metadata.create(self.directory, value)
        else:
            partition_metadata.write(self.directory, value, sync=False)
        with self._lock:
            self.topic_id = value
            self._topic_id_durable = False
            self._directory_dirty = True  # the file's name, renamed into place

    def _first_offset_of_epoch(self, epoch: int) -> int:
        for e, o in self.epoch_entries:
            if e == epoch:
                return o
        return self.log_start_offset

    def _assign_epoch(self, epoch: int, start_offset: int) -> None:
        """A batch with a newer epoch starts that epoch (``LeaderEpochFileCache.assign``).

        The checkpoint file is written by the next ``flush`` (or ``close``), which fsyncs it
        before it moves the recovery point past the batch; recovery rebuilds the entries of
        batches past the recovery point from their headers, so a file that lacks them until
        then loses nothing.  Kafka dropped the fsync from the append path (KAFKA-15046: it
        stalled produce requests under disk load) but still rewrites the file; here even the
        unsynced rewrite (create, write, rename) was the first append's largest cost: kcat
        producing into 1,000 new partitions spent 60 % of the workers' time in it on the
        shared box (file creation waits for the journal other processes' fsyncs hold)."""
        if epoch < 0 or (self.epoch_entries and self.epoch_entries[-1][0] >= epoch):
            return
        self.epoch_entries.append((epoch, start_offset))
        self._epochs_durable = False
        self.leader_epoch = max(self.leader_epoch, epoch)

    def _write_epochs(self, entries: list[tuple[int, int]], *, sync: bool,
                      sync_directory: bool = True) -> None:
        """Make the checkpoint file hold ``entries`` (``sync``: durably).  A file that holds
        them already is not written again, only fsynced if that is asked and not known done
        (a clean stop rewrote the unchanged file of every log it closed)."""
        with self._epoch_lock:
            if entries == self._epochs_file:
                if sync and not self._epochs_synced:
                    checkpoint_file.fsync_file(self._epoch_path)
                    self._epochs_synced = True
                return
            checkpoint_file.write_leader_epochs(self._epoch_path, entries, sync=sync,
                                                sync_directory=sync_directory)
            self._epochs_file = list(entries)
            self._epochs_synced = sync

    def _rebuild_producer_state(self) -> None:
        """Latest snapshot at or below the LEO, then replay the batch headers after it
        (``UnifiedLog.rebuildProducerState``); snapshots outside the log are dropped.  Markers
        met on the way are read (their type and coordinator epoch are in the record): an ABORT
        missing from the ``.txnindex`` (a crash between the two writes) is indexed again, as
        Kafka's ``LogSegment.recover`` rebuilds the index."""
        ps = self.producer_state
        start = ps.truncate_and_reload(self.log_start_offset, self.log_end_offset,
                                       int(time.time() * 1000))
        self._snapshot_at = start  # a snapshot's offset, or the log start (an empty state)
        for seg in self.segments:
            if seg.next_offset <= start or seg.size == 0:
                continue
            header = None
            if start > seg.base_offset:
                # snapshots sit at batch boundaries; an index not checked yet (recovery resumed
                # in this segment) must name the batch starting there, else it is checked first
                header = seg.translate_offset(start, checked=False)
                if header is None or header.base_offset != start:
                    header = seg.translate_offset(start)
            table = seg.scan_headers_from(header.position if header is not None else 0)
            if len(table):
                self._replay_rows(seg, table[table[:, 1] >= start])

    def _replay_rows(self, seg: LogSegment, rows: Any) -> None:
        ps = self.producer_state
        control = [i for i, a in enumerate(rows[:, _fast.COL_ATTRIBUTES].tolist()) if a & 0x20]
        prev = 0
        for i in control:
            ps.load_from_batches(rows[prev:i])
            prev = i + 1
            row = rows[i].tolist()
            pid = row[_fast.COL_PRODUCER_ID]
            if pid < 0 or row[_fast.COL_RECORDS_COUNT] <= 0:
                continue
            marker = read_marker(seg.handle.fd, row[_fast.COL_POSITION], row[_fast.COL_SIZE])
            if marker is None:
                ps.load_from_batches(rows[i : i + 1])
                continue
            commit, coordinator_epoch = marker
            offset = row[_fast.COL_BASE_OFFSET]
            first = ps.complete_txn(pid, row[_fast.COL_PRODUCER_EPOCH], offset,
                                    row[_fast.COL_MAX_TIMESTAMP], coordinator_epoch, check=False)
            if not commit and first is not None:
                unstable = ps.first_unstable_offset()
                entry = AbortedTxn(pid, first, offset, offset + 1 if unstable is None else unstable)
                if not self._abort_indexed(offset):
                    self._index_abort(seg.base_offset, entry)
        ps.load_from_batches(rows[prev:])

    # -- transactions (``.txnindex``, markers, the last stable offset) ------------------------

    def _load_txn_indexes(self, bases: set[int] | None = None) -> None:
        """Every segment's aborted transactions, those past the LEO dropped (a truncated log).
        ``bases``: the segments that have a ``.txnindex`` (the loader listed them)."""
        leo = self.log_end_offset
        for seg in self.segments:
            if bases is not None and seg.base_offset not in bases:
                continue
            path = txn_index.path_for(self.directory, seg.base_offset)
            try:
                entries = txn_index.read(path)
            except txn_index.CorruptTxnIndexError as exc:
                import logging

                logging.getLogger(__name__).warning("%s: %s; rebuilt from the log", path, exc)
                entries = []
                path.unlink()
            # one entry per ABORT marker, in marker order: a file written before the replay's
            # duplicate check looked at every entry may hold the same one several times (each
            # listed in Fetch's aborted list, and read_committed consumers then dropped the
            # producer's committed batches after it, waiting for aborts that never come)
            kept = sorted({e.last_offset: e for e in reversed(entries)
                           if e.last_offset < leo}.values(), key=lambda e: e.last_offset)
            if kept != entries or (entries and path.stat().st_size
                                   != len(entries) * txn_index.ENTRY_SIZE):
                txn_index.rewrite(path, kept)
            self.aborted.extend(kept)
        self._aborted_ends = [e.last_offset for e in self.aborted]

    def _truncate_txn_indexes(self, leo: int) -> None:
        """Drop the aborted transactions whose marker is at or past ``leo`` (truncation)."""
        if not self.aborted or self.aborted[-1].last_offset < leo:
            return
        self.aborted = [e for e in self.aborted if e.last_offset < leo]
        self._aborted_ends = [e.last_offset for e in self.aborted]
        for name in os.listdir(self.directory):
            if name.endswith(layout.TXN_INDEX_SUFFIX):
                path = self.directory / name
                entries = txn_index.read(path)
                kept = [e for e in entries if e.last_offset < leo]
                if len(kept) != len(entries):
                    txn_index.rewrite(path, kept)

    def _abort_indexed(self, marker_offset: int) -> bool:
        """Whether the ABORT marker at ``marker_offset`` is in the ``.txnindex`` already."""
        from bisect import bisect_left

        i = bisect_left(self._aborted_ends, marker_offset)
        return i < len(self._aborted_ends) and self._aborted_ends[i] == marker_offset

    def _index_abort(self, segment_base: int, entry: AbortedTxn) -> None:
        """Index an aborted transaction, keeping the entries in marker order (an entry found
        missing at recovery may belong before others: its segment's file is rewritten)."""
        from bisect import bisect_left

        path = txn_index.path_for(self.directory, segment_base)
        self._txn_dirty.add(segment_base)
        if not self._aborted_ends or entry.last_offset > self._aborted_ends[-1]:
            txn_index.append(path, entry)
            self.aborted.append(entry)
            self._aborted_ends.append(entry.last_offset)
            return
        i = bisect_left(self._aborted_ends, entry.last_offset)
        self.aborted.insert(i, entry)
        self._aborted_ends.insert(i, entry.last_offset)
        txn_index.rewrite(path, sorted([*txn_index.read(path), entry],
                                       key=lambda e: e.last_offset))

    @property
    def last_stable_offset(self) -> int:
        """min(first offset of the earliest open transaction, HW) (``UnifiedLog.lastStableOffset``)."""
        first = self.producer_state.first_unstable_offset()
        hw = self.high_watermark
        return hw if first is None or first > hw else first

    def aborted_transactions(self, fetch_offset: int, upper_bound: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions a read from ``fetch_offset``
        up to ``upper_bound`` overlaps (``collectAbortedTransactions``)."""
        from bisect import bisect_left

        aborted = self.aborted
        i = bisect_left(self._aborted_ends, fetch_offset)
        return [(e.producer_id, e.first_offset) for e in aborted[i:]
                if e.first_offset < upper_bound]

    def append_control(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                       commit: bool, *, leader_epoch: int | None = None,
                       now_ms: int | None = None,
                       transaction_version: int = 0) -> AppendInfo | None:
        """Append a COMMIT or ABORT marker of a producer's transaction (Kafka
        ``UnifiedLog.appendAsLeader`` with origin COORDINATOR and ``appendEndTxnMarker``):
        an older producer epoch raises INVALID_PRODUCER_EPOCH (47), an older coordinator epoch
        TRANSACTION_COORDINATOR_FENCED (52), and nothing is written.  An ABORT that ended an
        open transaction goes into the active segment's ``.txnindex``.

        A ``transaction_version`` 2 marker (KIP-890 part 2: the coordinator bumped the epoch to
        end the transaction) must carry an epoch above the producer's here: the same epoch is
        a late or repeated marker, INVALID_PRODUCER_EPOCH while a transaction of that epoch is
        open, and a retry of a marker already written when none is (KAFKA-19999: nothing is
        written, None is returned)."""
        from shmq.storage.producer_state import (
            INVALID_PRODUCER_EPOCH,
            TRANSACTION_COORDINATOR_FENCED,
        )

        entry = self.producer_state.last_entry(producer_id)
        if entry is not None:
            if transaction_version >= 2 and producer_epoch == entry.producer_epoch:
                if entry.current_txn_first_offset is None:
                    return None
                raise KafkaApiError(INVALID_PRODUCER_EPOCH,
                                    f"transaction version 2 marker epoch {producer_epoch} of "
                                    f"producer {producer_id} is not above {entry.producer_epoch}")
            if producer_epoch < entry.producer_epoch:
                raise KafkaApiError(INVALID_PRODUCER_EPOCH,
                                    f"marker epoch {producer_epoch} of producer {producer_id} "
                                    f"is older than {entry.producer_epoch}")
            if 0 <= coordinator_epoch < entry.coordinator_epoch:
                raise KafkaApiError(TRANSACTION_COORDINATOR_FENCED,
                                    f"marker coordinator epoch {coordinator_epoch} is older "
                                    f"than {entry.coordinator_epoch}")
        epoch = self.leader_epoch if leader_epoch is None else leader_epoch
        batch = control_batch(producer_id, producer_epoch, coordinator_epoch, commit, epoch,
                              now_ms)
        info = self.append(batch, leader_epoch=leader_epoch, validate=False, now_ms=now_ms)
        with self._lock:
            first = self.producer_state.complete_txn(
                producer_id, producer_epoch, info.first_offset, info.max_timestamp,
                coordinator_epoch, check=False)
            if not commit and first is not None:
                unstable = self.producer_state.first_unstable_offset()
                self._index_abort(self.segments[-1].base_offset, AbortedTxn(
                    producer_id, first, info.first_offset,
                    info.first_offset + 1 if unstable is None else unstable))
        return info

    @classmethod
    def create(cls, directory: Path, config: LogConfig | None = None, *,
               topic_id: str | uuid.UUID | None = None) -> PartitionLog:
        """A new, empty log in ``directory``, which must not exist (FileExistsError).

        The directory, ``partition.metadata`` and an empty first ``.log``; the index files are
        created at their first use (``LogSegment(lazy_indexes=True)``: Kafka creates them,
        sparse, with the log, and maps them at first use through its ``LazyIndex``), and nothing
        is read back (``open`` would list the directory three times and try to read five
        files that cannot exist yet).  Topic creation at 10,000 partitions was 46 s, most of it
        opening each new log like an old one and mapping two preallocated index files."""
        config = config or LogConfig()
        try:
            os.mkdir(directory, 0o700)
        except FileNotFoundError:  # the log directory itself is new
            directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.mkdir(directory, 0o700)
        try:
            seg = LogSegment(directory, 0, config, active=True, create=True, lazy_indexes=True)
            plog = cls(directory, config, [seg], 0, 0, new=True)
            if topic_id is not None:
                plog.assign_topic_id(topic_id, new=True)
        except BaseException:
            import shutil

            shutil.rmtree(directory, ignore_errors=True)  # never half a log
            raise
        return plog

    @classmethod
    def open(cls, directory: Path, config: LogConfig | None = None, *, recovery_point: int = 0,
             log_start_offset: int = 0, clean_shutdown: bool = False) -> PartitionLog:
        """Open (or create) the log in ``directory``, recovering it if the shutdown was unclean."""
        from shmq.storage.loader import load_log

        config = config or LogConfig()
        loaded = load_log(directory, config, recovery_point=recovery_point,
                          log_start_offset=log_start_offset, clean_shutdown=clean_shutdown)
        summary = LoadSummary(loaded.validated_bytes, loaded.truncated_bytes,
                              len(loaded.rebuilt_segments), loaded.resumed_at)
        return cls(directory, config, loaded.segments, loaded.log_start_offset,
                   loaded.recovery_point, loaded.leader_epoch, loaded.recovered_batches, summary,
                   txn_bases=loaded.txn_bases, synced=clean_shutdown)

    # -- offsets ------------------------------------------------------------------------------

    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self.segments[-1].next_offset

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    def update_high_watermark(self, offset: int) -> int:
        """Set the HW, clamped to [log start, LEO]; returns the new value."""
        leo = self.segments[-1].next_offset
        if offset > leo:
            offset = leo
        start = self.log_start_offset
        self.high_watermark = hw = offset if offset > start else start
        return hw

    def _segment_for(self, offset: int) -> int:
        """Index of the segment whose range holds ``offset`` (the last one at or below it)."""
        from bisect import bisect_right

        return max(0, bisect_right(self._bases, offset) - 1)

    # -- append -------------------------------------------------------------------------------

    def append(self, records: Any, *, leader_epoch: int | None = None, validate: bool = True,
               now_ms: int | None = None) -> AppendInfo:
        """Append every batch in ``records`` (bytes-like), assigning offsets from the LEO.

        ``validate`` applies Kafka's produce checks (exact record counts, no control batches,
        ``_validate_timestamps``); a replica or a coordinator appending its own batches passes
        False.  Nothing is written unless every batch is valid.  Raises CorruptRecordError
        (InvalidRecordError), RecordTooLargeError or InvalidTimestampError.
        """
        mv = records if isinstance(records, memoryview) else memoryview(records)
        if mv.ndim != 1 or mv.itemsize != 1:
            mv = mv.cast("B")
        if len(mv) == 0:
            raise CorruptRecordError("no record batches to append")
        epoch = self.leader_epoch if leader_epoch is None else leader_epoch
        now = int(time.time() * 1000) if now_ms is None else now_ms
        config = self.config
        log_append = config.log_append_time
        limit = config.max_message_bytes
        # pass 1: validate everything before touching the file
        spans: list[tuple[int, int, int, int, int]] = []
        producers: list[tuple[int, int, int, int, int, int, bool]] = []
        pos, end, n_records, incoming_max_ts = 0, len(mv), 0, -1
        compacted = validate and "compact" in config.cleanup_policy
        check_batch = _fast.check_batch
        before_max = config.message_timestamp_before_max_ms
        after_max = config.message_timestamp_after_max_ms
        while pos < end:
            if compacted:  # the key check comes before the timestamps' (LogValidator)
                size = _fast.validate_batch(mv, pos, -1, True, validate)
                if size > limit:
                    raise RecordTooLargeError(size, limit)
                self._check_keys(mv[pos:pos + size])
                attributes, delta, base_ts, batch_max, pid, pepoch, seq = _FIELDS.unpack_from(
                    mv, pos + 21)
                batch_max, rewrite = self._validate_timestamps(
                    mv, pos, size, attributes, delta + 1, base_ts, batch_max, now)
            else:
                # validation, the header's fields and (uncompressed) the timestamps in one call;
                # ``rewrite``: attributes to rewrite the header with (and maxTimestamp, CRC)
                size, attributes, delta, batch_max, rewrite, pid, pepoch, seq, errors = \
                    check_batch(mv, pos, limit, validate, not log_append, now, before_max,
                                after_max)
                if size > limit:
                    raise RecordTooLargeError(size, limit)
                if errors:
                    raise InvalidTimestampError(errors, now, before_max, after_max)
                if rewrite == _fast.TIMESTAMPS_UNCHECKED:  # compressed: decompressed here
                    batch_max, rewrite = self._validate_timestamps(
                        mv, pos, size, attributes, delta + 1, _I64.unpack_from(mv, pos + 27)[0],
                        _I64.unpack_from(mv, pos + 35)[0], now)
            if pid >= 0 and not attributes & 0x20:  # markers: ``append_control``
                producers.append((len(spans), pid, pepoch, seq, _add_seq(seq, delta), delta,
                                  bool(attributes & 0x10)))
            spans.append((pos, size, delta, batch_max, rewrite))
            n_records += delta + 1
            if batch_max > incoming_max_ts:
                incoming_max_ts = batch_max
            pos += size
        if log_append:
            incoming_max_ts = now
        with self._lock:
            if self.closed:
                raise ValueError("log is closed")
            if producers:
                duplicate = self._check_producers(producers, validate)
                if duplicate is not None:
                    return duplicate
            segment = self.segments[-1]
            first = segment.next_offset
            entries = self.epoch_entries
            if epoch >= 0 and (not entries or entries[-1][0] < epoch):
                self._assign_epoch(epoch, first)
            if segment.should_roll(end, len(spans), incoming_max_ts, now, first + n_records - 1):
                segment = self._roll_locked(now)
            # pass 2: the iovec.  The header's first 16 bytes are replaced (baseOffset stamped,
            # batchLength as validated, partitionLeaderEpoch stamped: all outside the CRC) and
            # the client's bytes follow from the magic byte on; LogAppendTime, or a CreateTime
            # batch whose maxTimestamp is not its records' (``_validate_timestamps``), also
            # rewrites attributes, maxTimestamp and CRC, so it copies the whole header.
            meta = []
            offset, position = first, segment.size
            max_ts, offset_of_max = -1, first
            if len(spans) == 1 and not log_append and spans[0][4] < 0:
                # one batch stored as sent (every produce request, mostly): stamped as it is
                # written, from C (``LogSegment.append_one``), no iovec
                pos, size, delta, batch_max, _ = spans[0]
                last = first + delta
                segment.append_one(mv, pos, size, first, epoch, last, batch_max)
                if batch_max > max_ts:
                    max_ts, offset_of_max = batch_max, last
                meta.append((position, last, batch_max, size))
                offset = last + 1
            else:
                iov: list[Any] = []
                pack_prefix = _PREFIX.pack
                for pos, size, delta, batch_max, rewrite in spans:
                    if log_append or rewrite >= 0:
                        header = bytearray(mv[pos : pos + 61])
                        _PREFIX.pack_into(header, 0, offset, size - 12, epoch)
                        body = mv[pos + 61 : pos + size]
                        if log_append:
                            attributes = _I16.unpack_from(header, 21)[0] & _KEPT_ATTRIBUTES | 0x08
                            batch_max = now
                        else:
                            attributes = rewrite
                        self._set_max_timestamp(header, body, attributes, batch_max)
                        iov.append(header)
                    else:
                        iov.append(pack_prefix(offset, size - 12, epoch))
                        body = mv[pos + 16 : pos + size]
                    iov.append(body)
                    last = offset + delta
                    if batch_max > max_ts:
                        max_ts, offset_of_max = batch_max, last
                    meta.append((position, last, batch_max, size))
                    offset = last + 1
                    position += size
                segment.append(iov, meta, end)
            self.unflushed_messages += n_records
            self._bytes_since_checkpoint += end
            if producers:
                update = self.producer_state.update
                for i, pid, pepoch, seq, last_seq, delta, txn in producers:
                    position, last, batch_max, _ = meta[i]
                    update(pid, pepoch, seq, last_seq, last - delta, last, batch_max, txn)
            self._bytes_since_snapshot += end
            if self._bytes_since_snapshot >= PRODUCER_SNAPSHOT_BYTES:
                try:
                    self._take_periodic_snapshot()
                except OSError as exc:  # a cache of the log: recovery replays without it
                    self._bytes_since_snapshot = 0
                    _throttled(logging.WARNING, ("snapshot", str(self.directory)),
                               "%s: producer snapshot not written: %s", self.directory, exc)
        info = AppendInfo(first, offset - 1, max_ts, offset_of_max, now if log_append else -1,
                          len(meta), end)
        if (self.unflushed_messages >= config.flush_messages
                or now - self.last_flush_ms >= config.flush_ms):
            if self.defer_flushes:
                self.flush_requested = True  # the caller flushes off its event loop
            else:
                self.flush()
        return info

    def _take_periodic_snapshot(self) -> None:
        """Snapshot producer state at the LEO and drop the periodic snapshots before it in the
        active segment (the one taken at its roll stays: truncation reloads from it)."""
        leo = self.log_end_offset
        base = self.segments[-1].base_offset
        self.producer_state.take_snapshot(leo)
        self._snapshot_at = leo
        for offset in self.producer_state.list_snapshot_offsets():
            if base < offset < leo:
                try:
                    snapshot_path(self.directory, offset).unlink()
                except FileNotFoundError:
                    pass
        self._bytes_since_snapshot = 0

    def _check_keys(self, batch: memoryview) -> None:
        """Kafka's ``LogValidator.validateKey``: every record of a compacted topic has a key.
        The only produce check that decodes records (compressed batches are decompressed)."""
        from shmq.protocol.records import RecordBatchView

        keyless = [i for i, r in enumerate(RecordBatchView(batch).records()) if r.key is None]
        if keyless:
            why = f"Compacted topic cannot accept message without key in topic partition " \
                  f"{self.directory.name}"
            raise RecordValidationError([(i, why) for i in keyless])

    def _check_producers(self, producers: list, validate: bool) -> AppendInfo | None:
        """Idempotence (``ProducerAppendInfo``): a batch the producer already wrote is answered
        with its original offsets and nothing is appended; sequence and epoch errors raise
        KafkaApiError (45 OUT_OF_ORDER_SEQUENCE_NUMBER, 47 INVALID_PRODUCER_EPOCH, ...)."""
        check = self.producer_state.check_append
        for _, pid, pepoch, seq, last_seq, _, txn in producers:
            dup = check(pid, pepoch, seq, last_seq, txn, validate)
            if dup is not None:
                if len(producers) == 1:
                    # Kafka answers a duplicate with the original batch's offsets and its
                    # timestamp as the log append time, whatever the topic's timestamp type
                    # (UnifiedLog.append: appendInfo.setLogAppendTime(duplicate.timestamp))
                    return AppendInfo(dup.first_offset, dup.last_offset, dup.timestamp,
                                      dup.last_offset, dup.timestamp, 0, 0)
                raise KafkaApiError(46, "duplicate batch inside a multi-batch append")
        return None

    def _validate_timestamps(self, mv: memoryview, pos: int, size: int, attributes: int,
                             count: int, base_timestamp: int, header_max: int,
                             now: int) -> tuple[int, int]:
        """Kafka's ``LogValidator`` on one client batch's timestamps: every record is read
        (a compressed batch decompressed, keys and values skipped), a CreateTime record's
        timestamp other than -1 must lie within ``message.timestamp.before.max.ms`` before and
        ``message.timestamp.after.max.ms`` after now, and a batch may not claim LogAppendTime
        where Kafka refuses it; else InvalidTimestampError.  The batch's maxTimestamp is derived
        from its records, not taken from the header.

        Returns (the batch's max timestamp as it will be stored, the attributes to rewrite the
        header with, or -1 when it stays as sent).  On a CreateTime topic the header is
        rewritten (``setMaxTimestamp``: attributes rebuilt from their known bits, the
        LogAppendTime bit cleared, maxTimestamp set, CRC redone) when its maxTimestamp is not
        its records' or it claims LogAppendTime; on a LogAppendTime topic pass 2 stamps it."""
        config = self.config
        codec = attributes & 0x07
        body = mv[pos + HEADER : pos + size]
        section = body if codec == 0 else decompress_scratch(codec, body)
        create_time = not config.log_append_time
        derived, errors = _fast.check_timestamps(
            section, count, _I64.unpack_from(mv, pos)[0], base_timestamp,
            header_max if attributes & 0x08 else _fast.NO_LOG_APPEND_TIME, create_time, now,
            config.message_timestamp_before_max_ms, config.message_timestamp_after_max_ms)
        if errors:
            raise InvalidTimestampError(errors, now, config.message_timestamp_before_max_ms,
                                        config.message_timestamp_after_max_ms)
        if not create_time:
            return now, -1
        if attributes & 0x08 or derived != header_max:
            return derived, attributes & _KEPT_ATTRIBUTES
        return derived, -1

    @staticmethod
    def _set_max_timestamp(header: bytearray, body: memoryview, attributes: int,
                           max_timestamp: int) -> None:
        """``DefaultRecordBatch.setMaxTimestamp``: new attributes and maxTimestamp, then the
        CRC (over the header's bytes 21..61 and the body as it is)."""
        struct.pack_into(">h", header, 21, attributes)
        struct.pack_into(">q", header, 35, max_timestamp)
        crc = _fast.crc32c(bytes(header[21:61]))
        crc = _fast.crc32c(body, crc) if len(body) else crc
        struct.pack_into(">I", header, 17, crc)

    # -- reads --------------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, *, upper_bound: int | None = None,
             min_one_batch: bool = True) -> LogReadResult:
        """Whole batches from the one containing ``offset``, below ``upper_bound`` (default HW).

        Raises OffsetOutOfRangeError below the log start or above the LEO; returns no slices at
        the bound.  Reads stay inside one segment, as Kafka's do.
        """
        with self._lock:
            bound = self.high_watermark if upper_bound is None else min(upper_bound, self.log_end_offset)
            start, leo, hw = self.log_start_offset, self.log_end_offset, self.high_watermark
            if offset < start or offset > leo:
                raise OffsetOutOfRangeError(offset, start, leo)
            # the segment holding the offset and the next one suffice (segments are never empty
            # except the active one); copying the whole list cost 40 us with 10,000 segments
            first = self._segment_for(offset)
            segments = self.segments[first : first + 2]
        slices: list[FileSlice] = []
        if offset < bound:
            i = 0
            while i < len(segments):
                seg = segments[i]
                max_pos = self._position_of(segments, i, bound)
                piece = seg.read(offset, max_bytes, max_pos, min_one_batch)
                if piece is not None:  # found the batch (an empty slice: it did not fit)
                    if piece.length:
                        slices.append(piece)
                    break
                i += 1
        return LogReadResult(slices, start, hw, leo)

    def _position_of(self, segments: list[LogSegment], i: int, bound: int) -> int:
        """Byte position in segment ``i`` where offset ``bound`` starts (its size if beyond)."""
        seg = segments[i]
        if bound >= seg.next_offset:
            return seg.size
        header = seg.translate_offset(bound)
        return header.position if header is not None else seg.size

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of ``fetch_offset_by_timestamp``."""
        found = self.fetch_offset_by_timestamp(timestamp)
        return None if found is None else (found.offset, found.timestamp)

    def fetch_offset_by_timestamp(self, timestamp: int) -> TimestampAndOffset | None:
        """ListOffsets (``UnifiedLog.fetchOffsetByTimestamp``) for a timestamp or -1 / -2 / -3.

        -1 latest: the LEO and the latest epoch; -2 earliest: the log start offset and the epoch
        that covers it (-1 if the epoch cache does not reach back to it); -3 the first record
        with the largest timestamp and its batch's epoch; otherwise the first record with
        timestamp >= ``timestamp`` and its batch's epoch, or None if there is none.
        """
        if timestamp == LATEST_TIMESTAMP:
            latest = self.epoch_entries[-1][0] if self.epoch_entries else -1
            return TimestampAndOffset(-1, self.log_end_offset, latest)
        if timestamp == EARLIEST_TIMESTAMP:
            start = self.log_start_offset
            covering = [e for e, o in self.epoch_entries if o <= start]
            return TimestampAndOffset(-1, start, covering[-1] if covering else -1)
        segments = list(self.segments)
        found = None
        if timestamp == MAX_TIMESTAMP:
            found = max(segments, key=lambda s: s.max_timestamp_so_far).find_max_timestamp()
        else:
            for seg in segments:
                if seg.max_timestamp_so_far >= timestamp and seg.next_offset > self.log_start_offset:
                    found = seg.find_offset_by_timestamp(timestamp, self.log_start_offset)
                    if found is not None:
                        break
        if found is None:
            return None
        offset, ts, epoch = found
        return TimestampAndOffset(ts, offset, epoch if epoch >= 0 else -1)

    def legacy_offsets_before(self, timestamp: int, max_num_offsets: int) -> list[int]:
        """ListOffsets v0 (Kafka's ``UnifiedLog.legacyFetchOffsetsBefore``): up to
        ``max_num_offsets`` offsets, highest first, from the list of every segment's base offset
        (at least the log start) with its file's mtime, plus the log end offset stamped now
        when the active segment holds data.  -1 starts from the newest entry, -2 from the
        oldest, a time from the newest entry modified at or before it."""
        segments = list(self.segments)
        entries = [(max(seg.base_offset, self.log_start_offset), seg.last_modified_ms)
                   for seg in segments]
        if segments[-1].size > 0:
            entries.append((self.log_end_offset, int(time.time() * 1000)))
        if timestamp == LATEST_TIMESTAMP:
            start = len(entries) - 1
        elif timestamp == EARLIEST_TIMESTAMP:
            start = 0
        else:
            start = len(entries) - 1
            while start >= 0 and entries[start][1] > timestamp:
                start -= 1
        count = min(max_num_offsets, start + 1)
        return sorted((entries[start - j][0] for j in range(count)), reverse=True)

    # -- producer state -----------------------------------------------------------------------

    def remove_expired_producers(self, now_ms: int, expiration_ms: int) -> int:
        """Forget producers idle for ``expiration_ms`` (``producer.id.expiration.ms``, a broker
        config that may change, hence passed each time); how many went."""
        with self._lock:
            self.producer_state.producer_id_expiration_ms = expiration_ms
            return self.producer_state.count_expired(now_ms)

    # -- roll, retention, truncation ----------------------------------------------------------

    def roll(self, now_ms: int | None = None) -> LogSegment:
        with self._lock:
            return self._roll_locked(int(time.time() * 1000) if now_ms is None else now_ms)

    def _roll_locked(self, now_ms: int) -> LogSegment:
        """A new active segment at the LEO; all or nothing: a roll that fails (a full disk:
        ENOSPC creating the files or the snapshot) leaves the old segment active and no new
        file behind, so the append that asked for it fails cleanly and a later one rolls."""
        old = self.active_segment
        base = old.next_offset
        if old.size == 0:
            return old  # never roll an empty segment
        try:
            old.on_become_inactive()
            self.producer_state.take_snapshot(base)  # UnifiedLog.roll
            self._snapshot_at = base
            new = LogSegment(self.directory, base, self.config, active=True, create=True)
        except OSError:
            for path in layout.segment_paths(self.directory, base):
                try:
                    path.unlink()
                except FileNotFoundError:
                    pass
            old.make_active()
            raise
        self._bytes_since_snapshot = 0
        new.next_offset = base
        self.segments.append(new)
        self._bases.append(base)
        self.generation = (self.generation + 1) & 0xFFFFFFFF
        self._directory_dirty = True  # the new file's name is durable only after a dir fsync
        self._checkpoint_wanted = True  # the sealed indexes: msynced by the next flush
        return new

    def update_config(self, config: LogConfig) -> None:
        """A topic config changed at run time (AlterConfigs).  Segments share the log's config:
        roll size and age, index interval and flush rules apply from the next append; index
        files keep the size they were created with, like Kafka's."""
        with self._lock:
            self.config = config
            for seg in self.segments:
                seg.config = config

    def delete_old_segments(self, now_ms: int | None = None) -> int:
        """Kafka's retention pass: log-start breach, then retention.bytes, then retention.ms."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        deleted = self._delete_segments(
            lambda seg, nxt: nxt is not None and nxt.base_offset <= self.log_start_offset)
        if not self.config.delete_enabled:
            return deleted
        if self.config.retention_bytes >= 0:
            excess = [self.size_in_bytes - self.config.retention_bytes]

            def over_size(seg: LogSegment, nxt: LogSegment | None) -> bool:
                if excess[0] - seg.size >= 0:
                    excess[0] -= seg.size
                    return True
                return False

            deleted += self._delete_segments(over_size)
        if self.config.retention_ms >= 0:
            deleted += self._delete_segments(
                lambda seg, nxt: now - seg.largest_timestamp > self.config.retention_ms)
        return deleted

    def _delete_segments(self, predicate: Any) -> int:
        with self._lock:
            doomed: list[LogSegment] = []
            for i, seg in enumerate(self.segments):
                nxt = self.segments[i + 1] if i + 1 < len(self.segments) else None
                upper = nxt.base_offset if nxt is not None else self.log_end_offset
                if nxt is None and seg.size == 0:
                    break
                if self.high_watermark >= upper and predicate(seg, nxt):
                    doomed.append(seg)
                else:
                    break
            if not doomed:
                return 0
            if doomed[-1] is self.active_segment:
                self._roll_locked(int(time.time() * 1000))
            for seg in doomed:
                self.segments.remove(seg)
                seg.delete()
                txn_index.rewrite(txn_index.path_for(self.directory, seg.base_offset), [])
            if self.aborted and self.aborted[0].last_offset < self.segments[0].base_offset:
                self.aborted = [e for e in self.aborted
                                if e.last_offset >= self.segments[0].base_offset]
                self._aborted_ends = [e.last_offset for e in self.aborted]
            self._bases = [s.base_offset for s in self.segments]
            self.generation = (self.generation + 1) & 0xFFFFFFFF
            self.log_start_offset = max(self.log_start_offset, self.segments[0].base_offset)
            self.producer_state.delete_snapshots_below(self.segments[0].base_offset)
            return len(doomed)

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: move the log start offset to ``offset`` (<= HW); returns it."""
        if offset > self.high_watermark or offset < 0:
            raise OffsetOutOfRangeError(offset, self.log_start_offset, self.high_watermark)
        with self._lock:
            self.log_start_offset = max(self.log_start_offset, offset)
        self._delete_segments(
            lambda seg, nxt: nxt is not None and nxt.base_offset <= self.log_start_offset)
        return self.log_start_offset

    def truncate_to(self, offset: int) -> None:
        """Drop every record at or above ``offset``, cutting at the start of the batch that
        holds it (a follower's truncation after a leader change): the LEO may end below it.

        Runs under the flush lock: a flush that started before must not record its (higher)
        recovery point after this lowered it."""
        with self._flush_lock:
            self._truncate_to(offset)

    def _truncate_to(self, offset: int) -> None:
        with self._lock:
            if offset >= self.log_end_offset:
                return
            offset = max(offset, self.log_start_offset)
            while len(self.segments) > 1 and self.segments[-1].base_offset >= offset:
                self.segments.pop().delete()
            seg = self.segments[-1]
            if seg.base_offset >= offset:
                seg.delete()
                seg = LogSegment(self.directory, offset, self.config, active=True, create=True)
                seg.next_offset = offset
                self.segments[-1] = seg
            else:
                if not seg.active:
                    seg.make_active()
                seg.truncate_to(offset)
            self._bases = [s.base_offset for s in self.segments]
            self.generation = (self.generation + 1) & 0xFFFFFFFF
            leo = self.log_end_offset
            self.high_watermark = min(self.high_watermark, leo)
            self._truncate_txn_indexes(leo)
            self.durable_offset = min(self.durable_offset, leo)
            if self.recovery_point >= leo:
                # everything left was durable: record it at once (and durably), before new
                # appends land below the old recorded position
                self.recovery_point = leo
                # the producer state is rebuilt below: its first unstable offset is unknown here
                self._recovery_file.write(self._recovery_record()._replace(
                    first_unstable=UNKNOWN_UNSTABLE), sync=True)
        self.producer_state.clear()
        self._rebuild_producer_state()
        kept = [(e, o) for e, o in self.epoch_entries if o < self.log_end_offset]
        if kept != self.epoch_entries:
            self.epoch_entries = kept
            self._write_epochs(kept, sync=True)

    # -- durability ---------------------------------------------------------------------------

    # set by a worker: appends never fsync inline (see ``flush_requested``)
    defer_flushes = False

    def flush(self, up_to: int | None = None, *, checkpoint: bool = True) -> bool:
        """Make every offset below ``up_to`` (default: the LEO) durable; a group commit.

        ``checkpoint`` (Kafka's ``UnifiedLog.flush``: close, flush.messages / flush.ms, the
        periodic checkpoint) also msyncs the indexes and moves the recovery point and its
        record; ``checkpoint=False`` (an acknowledgement's flush) fdatasyncs the ``.log`` files
        only and moves the durable offset, and takes the checkpoint too only when one is due
        (``_checkpoint_due``): see "Durability" in the module docstring.

        Returns True when this call ran the fsync, False when an earlier flush already covered
        ``up_to``.  When it must wait for the flush lock (an fsync of earlier appends holds it)
        it first starts the disk writes of what is new (``_start_writeback``): the fsync it then
        runs finds them written or in flight instead of starting them itself.  With the lock
        free it starts nothing: its fdatasync starts them at once.
        """
        called = time.monotonic_ns() if self.flush_trace is not None else 0
        if not self._flush_lock.acquire(blocking=False):
            # an fsync of earlier appends runs: start the disk writes of what is new while
            # this waits for it (with the lock free the fdatasync below starts them itself
            # at once, and a start first would be one more system call for nothing)
            self._start_writeback(up_to)
            self._flush_lock.acquire()
        try:
            return self._flush_locked(up_to, checkpoint, called)
        finally:
            self._flush_lock.release()

    def _flush_locked(self, up_to: int | None, checkpoint: bool, called: int) -> bool:
        """``flush`` with ``_flush_lock`` held."""
        locked = time.monotonic_ns() if called else 0
        with self._lock:
            leo = self.log_end_offset
            needed = leo if up_to is None else min(up_to, leo)
            if self.recovery_point >= leo:
                self.flush_requested = False  # nothing left for flush.messages / flush.ms
            if needed <= (self.recovery_point if checkpoint else self.durable_offset):
                return False
            now_ms = int(time.time() * 1000)
            checkpoint = checkpoint or self._checkpoint_due(now_ms)
            target = leo  # cover every append so far: later waiters find it done
            logs = self.segments[self._segment_for(self.durable_offset):] \
                if self.durable_offset < leo else []
            if logs:  # the fsync writes every byte so far: a later start begins after them
                self._writeback_mark = (logs[-1].base_offset, logs[-1].size)
            indexes = self.segments[self._segment_for(self.recovery_point):] \
                if checkpoint else []
            # (index files a checkpoint creates need their names made durable too)
            sync_dir = self._directory_dirty or any(s.indexes_deferred for s in indexes)
            self._directory_dirty = False
            epochs = None if self._epochs_durable else list(self.epoch_entries)
            self._epochs_durable = True
            sync_topic_id, self._topic_id_durable = not self._topic_id_durable, True
            record = self._recovery_record() if checkpoint and self.segments[-1].loaded \
                else None
            txn_dirty, self._txn_dirty = self._txn_dirty, set()
            if checkpoint:
                self.flush_requested = self._checkpoint_wanted = False
                flushed_messages, flushed_bytes = (self.unflushed_messages,
                                                   self._bytes_since_checkpoint)
        started = time.perf_counter_ns()
        for seg in logs:
            seg.flush_log()
        for seg in indexes:
            seg.flush_indexes()
        for base in txn_dirty:
            checkpoint_file.fsync_file(txn_index.path_for(self.directory, base))
        if epochs is not None:  # before the durable offset passes the batches they start
            # a new log's first flush fsyncs its directory below anyway: that one fsync
            # makes the checkpoint's rename durable too (one fsync in five of a clean stop
            # of new logs, which spent half its time in fsync)
            self._write_epochs(epochs, sync=True, sync_directory=not sync_dir)
        if sync_topic_id:
            checkpoint_file.fsync_file(self.directory / layout.PARTITION_METADATA)
        if sync_dir:
            checkpoint_file.fsync_directory(self.directory)
        if self.flush_observer is not None:
            self.flush_observer(time.perf_counter_ns() - started)
        if called and self.flush_trace is not None:
            self.flush_trace.append((called, locked, time.monotonic_ns(), target))
        with self._lock:
            self.durable_offset = max(self.durable_offset, target)
            if checkpoint:
                self.recovery_point = max(self.recovery_point, target)
                self.unflushed_messages = max(0, self.unflushed_messages - flushed_messages)
                self._bytes_since_checkpoint = max(
                    0, self._bytes_since_checkpoint - flushed_bytes)
                self.last_flush_ms = now_ms
                if record is not None and not self.closed:
                    self._recovery_file.write(record)
        return True

    def _checkpoint_due(self, now_ms: int) -> bool:
        """Whether an acknowledgement's flush should take the checkpoint too (under ``_lock``):
        flush.messages / flush.ms came due, a segment rolled, or the recovery point is
        ``CHECKPOINT_BYTES`` or ``CHECKPOINT_INTERVAL_MS`` behind (the bound on what recovery
        after a SIGKILL validates)."""
        return (self.flush_requested or self._checkpoint_wanted
                or self._bytes_since_checkpoint >= CHECKPOINT_BYTES
                or now_ms - self.last_flush_ms >= CHECKPOINT_INTERVAL_MS)

    def flush_due(self, now_ms: int) -> bool:
        """Whether the owner's timer should call ``maybe_flush``: flush.messages / flush.ms,
        or, ``CHECKPOINT_INTERVAL_MS`` after the last checkpoint, durable bytes the recovery
        point has not caught up with (an idle log after its last acknowledgement), a roll, or
        bytes recovery validated past the recovery point (a restart after SIGKILL: without it
        an idle log would be validated again at every unclean start)."""
        since = now_ms - self.last_flush_ms
        return (self.flush_requested
                or (self.unflushed_messages > 0 and since >= self.config.flush_ms)
                or (since >= CHECKPOINT_INTERVAL_MS
                    and (self.durable_offset > self.recovery_point
                         or (self._checkpoint_wanted
                             and self.log_end_offset > self.recovery_point))))

    def start_writeback(self, up_to: int | None = None) -> None:
        """Start the disk writes of the bytes appended since the last call, without waiting
        for them: an acks=all append calls it at once (``RingSession.drain``), so that the disk
        writes its bytes while the previous group commit runs, and the fsync that covers them
        finds them written or in flight (an fdatasync of 4 MB started 2 ms after the writes
        took 0.28 ms here, against 2.16 ms from dirty pages)."""
        if self.flush_trace is None:
            self._start_writeback(up_to)
            return
        began = time.monotonic_ns()
        self._start_writeback(up_to)
        self.flush_trace.append((began, began, time.monotonic_ns(), -1))  # target -1: this

    def _start_writeback(self, up_to: int | None) -> None:
        """``disk.start_writeback`` of the bytes appended since the last call (up to the LEO),
        when some offset below ``up_to`` is not durable yet.  Nothing waits for the writes and
        nothing counts as durable because of them."""
        with self._lock:
            leo = self.log_end_offset
            if min(leo, up_to if up_to is not None else leo) <= self.durable_offset:
                return
            base, position = self._writeback_mark
            todo = []
            for seg in self.segments[self._segment_for(max(base, self.durable_offset)):]:
                start = position if seg.base_offset == base else 0
                if seg.size > start:
                    todo.append((seg.handle, start, seg.size - start))
            last = self.segments[-1]
            self._writeback_mark = (last.base_offset, last.size)
        for handle, start, length in todo:
            disk.start_writeback(handle.fd, start, length)

    def _recovery_record(self) -> Any:
        """The recovery record of the LEO (under ``_lock``): the active segment's end and index
        state, with the largest leader epoch of the batches below and the first unstable
        offset (an unclean start publishes the LSO of a log it leaves unopened from it)."""
        leo = self.log_end_offset
        epoch = next((e for e, o in reversed(self.epoch_entries) if o < leo), -1)
        unstable = self.producer_state.first_unstable_offset()
        return self.segments[-1].recovery_record(epoch, -1 if unstable is None else unstable)

    def maybe_flush(self, now_ms: int | None = None) -> None:
        """Honour ``flush.ms`` without appends, and take the periodic checkpoint of a log
        whose recovery point is ``CHECKPOINT_INTERVAL_MS`` behind (called from the owner's
        timer; ``flush_due`` says when)."""
        if self.flush_due(int(time.time() * 1000) if now_ms is None else now_ms):
            self.flush()

    # -- life cycle ---------------------------------------------------------------------------

    def close(self, *, sync: bool = True) -> None:
        """Flush, trim the active segment's indexes, and release every file.

        ``sync=False`` (``LogManager.shutdown``, see "Clean shutdown" there): everything is
        written as ``close`` writes it, but nothing is fsynced, and neither the recovery point
        nor the recovery record moves; the caller makes the whole filesystem durable at once
        (``disk.syncfs``) and then calls ``finish_close``, which does."""
        if self.closed:
            return
        if sync:
            self.flush()
        if not self._epochs_durable:
            self._write_epochs(list(self.epoch_entries), sync=sync)
            self._epochs_durable = sync
        with self._lock:
            try:  # a full disk: the files are released all the same, and the error raised
                leo = self.log_end_offset
                if leo not in (self._snapshot_at, self.log_start_offset):
                    # (at the log start the state is empty: nothing to replay at load)
                    self.producer_state.take_snapshot(leo)
                    self._snapshot_at = leo
                active = self.active_segment
                # a segment never written needs no record (nothing to vouch for) and gets no
                # index files (the loader treats it as the new segment it is): a stop of
                # 10,000 partitions, a third of them empty, created four files for each of those
                if active.loaded and not active.unwritten:
                    active.append_final_time_entry()
                    if sync:
                        self._recovery_file.write(self._recovery_record())
                    else:
                        self._closing_record = self._recovery_record()
            finally:
                if sync:
                    self._recovery_file.close()
                for seg in self.segments:
                    seg.close()
                self.closed = True

    _closing_record: Any = None  # close(sync=False): the record finish_close writes

    def finish_close(self, durable: bool) -> None:
        """After ``close(sync=False)``: ``durable`` (the caller's ``syncfs`` succeeded after the
        close) moves the recovery point to the LEO and writes the recovery record that says so
        (through its mapping, unsynced: a record on disk that is older vouches for less);
        otherwise nothing moves.  Releases the record's file either way."""
        with self._lock:
            try:
                if durable:
                    self.recovery_point = max(self.recovery_point, self.log_end_offset)
                    self.durable_offset = max(self.durable_offset, self.recovery_point)
                    self.unflushed_messages = self._bytes_since_checkpoint = 0
                    self._epochs_durable = self._epochs_synced = True
                    self._topic_id_durable = True
                    self._txn_dirty = set()
                    if self._closing_record is not None:
                        self._recovery_file.write(self._closing_record)
            finally:
                self._closing_record = None
                self._recovery_file.close()

    def discard(self) -> None:
        """Release every file of a log about to be deleted, without flushing, trimming or
        writing a checkpoint, snapshot or recovery record (Kafka's ``closeHandlers`` before a
        delete): ``close`` fsynced and created up to five files only for the directory to be
        removed, and each file created costs an inode (``index_file.py``)."""
        self.crash_close()

    def crash_close(self) -> None:
        """Drop every file without flushing or trimming: what SIGKILL leaves (fault tests)."""
        with self._lock:
            self._recovery_file.close()
            for seg in self.segments:
                seg.crash_close()
            self.closed = True

    def end_offset_for_epoch(self, requested: int,
                             current_epoch: int = UNDEFINED_EPOCH) -> tuple[int, int]:
        """``LeaderEpochFileCache.endOffsetFor``: (the largest epoch <= ``requested``, the
        offset where the next epoch starts, or the LEO for the latest epoch); (-1, -1) when
        ``requested`` is undefined or newer than every epoch.  A requested epoch older than
        every known one answers (``requested``, start of the oldest known epoch).

        ``current_epoch`` is the leader epoch the partition is led in now: Kafka's leader
        writes it to its cache when it becomes leader (``Partition.makeLeader``), before any
        batch of that epoch, so an epoch without appends yet starts at the LEO."""
        entries = self.epoch_entries
        if current_epoch >= 0 and (not entries or entries[-1][0] < current_epoch):
            entries = [*entries, (current_epoch, self.log_end_offset)]
        if requested == UNDEFINED_EPOCH:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        if entries and entries[-1][0] == requested:
            return requested, self.log_end_offset
        higher = next(((e, o) for e, o in entries if e > requested), None)
        if higher is None:
            return UNDEFINED_EPOCH, UNDEFINED_EPOCH_OFFSET
        floor = [e for e, _ in entries if e <= requested]
        return (floor[-1] if floor else requested), higher[1]

    def write_leader_epoch_checkpoint(self, entries: list[tuple[int, int]]) -> None:
        self.epoch_entries = list(entries)
        self._write_epochs(self.epoch_entries, sync=True)

    def __repr__(self) -> str:
        return (f"PartitionLog({self.directory.name}, start={self.log_start_offset}, "
                f"hw={self.high_watermark}, leo={self.log_end_offset}, segments={len(self.segments)})")


CONTROL_ABORT, CONTROL_COMMIT = 0, 1
_CONTROL_KEY = struct.Struct(">hh")      # version 0, type (ABORT 0, COMMIT 1)
_CONTROL_VALUE = struct.Struct(">hi")    # version 0, coordinator epoch


def control_batch(producer_id: int, producer_epoch: int, coordinator_epoch: int, commit: bool,
                  leader_epoch: int = -1, now_ms: int | None = None) -> bytearray:
    """Kafka's end-transaction marker batch (``MemoryRecords.withEndTransactionMarker``):
    transactional + control attributes, no compression, CreateTime, baseSequence -1, one record
    whose key is (version 0, type) and value (version 0, coordinator epoch)."""
    from shmq.protocol.records import encode_batch

    now = int(time.time() * 1000) if now_ms is None else now_ms
    key = _CONTROL_KEY.pack(0, CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = _CONTROL_VALUE.pack(0, coordinator_epoch)
    return encode_batch([(key, value, now)], partition_leader_epoch=leader_epoch,
                        producer_id=producer_id, producer_epoch=producer_epoch,
                        transactional=True, control=True)


def parse_marker(batch: Any) -> tuple[bool, int] | None:
    """(commit, coordinator epoch) of a control batch's record, or None when it is no
    transaction marker (another control type, or unreadable)."""
    from shmq.protocol.records import RecordBatchView

    try:
        view = RecordBatchView(memoryview(batch), 0)
        for rec in view.records():
            if rec.key is None or len(rec.key) < 4:
                return None
            _, kind = _CONTROL_KEY.unpack_from(rec.key, 0)
            if kind not in (CONTROL_ABORT, CONTROL_COMMIT):
                return None
            coord = (_CONTROL_VALUE.unpack_from(rec.value, 0)[1]
                     if rec.value is not None and len(rec.value) >= 6 else -1)
            return kind == CONTROL_COMMIT, coord
    except (ValueError, IndexError, struct.error):
        return None
    return None


def read_marker(fd: int, position: int, size: int) -> tuple[bool, int] | None:
    """``parse_marker`` of the batch at ``position`` in a segment file."""
    if size > 4096:
        return None
    return parse_marker(os.pread(fd, size, position))
