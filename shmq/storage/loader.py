"""Opening a partition log at startup, and recovering it after a crash (Kafka ``LogLoader``).

Passes, in order:

1. Remove temporary files (``.deleted``, ``.cleaned``, ``.swap``, ``.tmp``) and index files whose
   ``.log`` is gone.
2. Decide where validation starts.  After a clean shutdown (the ``.kafka_cleanshutdown`` marker)
   nothing is validated.  After an unclean one, from the partition's recovery record
   (``recovery_point.py``: the recovery point as a segment and a byte position, written at
   every checkpoint, ``PartitionLog.flush``) if it agrees with the files, else from the start
   of the segment holding the checkpointed recovery point (Kafka's rule).  Bytes past the
   record that an acknowledgement's flush made durable (the durable offset) are not on record:
   they are validated, and their index entries rebuilt, like any other bytes past it (their
   index entries may not have reached the disk: only a checkpoint msyncs the indexes).
3. Segments before that point are trusted and opened lazily (``LogSegment`` "Lazy loading"):
   their indexes are checked, and rebuilt if the checks fail, at first use.  So is the last
   segment after a clean shutdown when the recovery record names its exact end (the LEO);
   otherwise it is checked now.
4. From that point to the end, validate batch by batch (size, magic, CRC, contiguous offsets,
   leader epochs), rebuild the indexes (from the recorded index state when resuming mid
   segment), truncate at the first invalid or partial batch.  Once a segment was truncated,
   every later segment is deleted: the log that survives is always a prefix of what was
   appended.  What this costs depends on the bytes written since the last checkpoint (at
   most about ``CHECKPOINT_BYTES``, or ``CHECKPOINT_INTERVAL_MS`` of appends, with acks=all;
   everything since the last one with acks=0/1), not on the size of the log.
5. The last segment becomes the active one (indexes regrown to their preallocated size); the log
   start offset is clamped into the log; the recovery point becomes the LEO after a clean
   shutdown, and after an unclean one the highest of the checkpoint and the record (recovered
   bytes past it are valid but not known to be on disk), never above the LEO.  The log's durable
   offset starts there too: its first flush fdatasyncs what recovery kept past it.
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path
from typing import NamedTuple

import numpy as np

from shmq.storage import checkpoint, layout
from shmq.storage import recovery_point as recovery_point_file
from shmq.storage.log_config import LogConfig
from shmq.storage.recovery_point import RecoveryRecord
from shmq.storage.segment import LogSegment

log = logging.getLogger(__name__)


class LoadedLog(NamedTuple):
    segments: list[LogSegment]
    log_start_offset: int
    recovery_point: int
    leader_epoch: int
    recovered_batches: np.ndarray   # headers of every batch validated by recovery
    truncated_bytes: int
    rebuilt_segments: list[int]     # base offsets of segments whose indexes were rebuilt now
    resumed_at: tuple[int, int] | None = None   # (segment, byte) where validation resumed
    validated_bytes: int = 0        # bytes of .log validated batch by batch
    txn_bases: set[int] | None = None   # segments with a .txnindex file (None: not known)


def _remove_temp_files(directory: Path) -> tuple[list[int], set[int], list[str]]:
    """Remove temporary files and indexes without their log; (the segments' base offsets, those
    with a ``.txnindex``, the producer snapshots' names).  One listing of the directory: a log
    may hold 100,000 segments."""
    bases: set[int] = set()
    indexes: list[tuple[str, str]] = []
    snapshots: list[str] = []
    for name in os.listdir(directory):
        if name.endswith(layout.SNAPSHOT_SUFFIX):
            snapshots.append(name)
        elif name.endswith(layout.TEMP_SUFFIXES):
            os.unlink(os.path.join(directory, name))
        elif name.endswith(layout.LOG_SUFFIX):
            try:
                bases.add(layout.offset_from_filename(name))
            except ValueError:
                log.warning("ignoring stray file %s", os.path.join(directory, name))
        elif name.endswith((layout.INDEX_SUFFIX, layout.TIME_INDEX_SUFFIX,
                            layout.TXN_INDEX_SUFFIX)):
            indexes.append((name, name.split(".", 1)[1]))
    txn: set[int] = set()
    for name, suffix in indexes:
        try:
            base = layout.offset_from_filename(name)
        except ValueError:
            continue
        if base not in bases:
            os.unlink(os.path.join(directory, name))  # an index without its log
        elif "." + suffix == layout.TXN_INDEX_SUFFIX:
            txn.add(base)
    return sorted(bases), txn, snapshots


def _last_entry(path: Path, entry_size: int, count: int) -> bytes | str:
    """Entry ``count - 1`` of an index file (b"" when ``count`` is 0), or why it cannot be read."""
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size < count * entry_size:
                return f"{path.name} holds fewer than {count} entries"
            return os.pread(f.fileno(), entry_size, (count - 1) * entry_size) if count else b""
    except FileNotFoundError:
        return f"{path.name} is missing"


_TIME_ENTRY = np.dtype([("timestamp", ">i8"), ("offset", ">i4")])


def _kept_time_entries(path: Path, recorded: int, below: int, base: int) -> int | str:
    """How many time index entries to keep when resuming at offset ``below``: the recorded
    count, or the valid entries below it when the file no longer matches the record (its
    indexes were rebuilt since, e.g. at a lazy load, without the entry a clean close adds)."""
    entry = _last_entry(path, 12, recorded)
    if isinstance(entry, str) and "missing" in entry:
        return entry
    if isinstance(entry, bytes) and (not entry or base + struct.unpack(">qi", entry)[1] < below):
        return recorded
    with open(path, "rb") as f:
        data = f.read(recorded * 12)
    table = np.frombuffer(data[: len(data) // 12 * 12], dtype=_TIME_ENTRY)
    ts, offsets = table["timestamp"].astype(np.int64), table["offset"].astype(np.int64) + base
    good = (ts >= 0) & (offsets < below)
    good[1:] &= (np.diff(ts) > 0) & (np.diff(offsets) >= 0)
    bad = np.flatnonzero(~good)
    return int(bad[0]) if len(bad) else len(table)


def _resumable(segment: LogSegment, record: RecoveryRecord) -> RecoveryRecord | str:
    """``record`` as recovery can resume from it in ``segment``, or why it cannot: its fields
    are checked against the files with a few small reads.  Whatever follows the position (a
    torn batch, zeros, garbage) is recovery's business."""
    if record.position > segment.size:
        return f"the segment has {segment.size} bytes, the record names byte {record.position}"
    _, index_path, time_path = layout.segment_paths(segment.directory, segment.base_offset)
    base = segment.base_offset
    entry = _last_entry(index_path, 8, record.offset_index_entries)
    if isinstance(entry, str):
        return entry
    walk_from = 0
    if entry:  # the last kept offset index entry names a batch below the recovery point
        rel, walk_from = struct.unpack(">ii", entry)
        if not (base + rel < record.offset and 0 < walk_from < record.position):
            return f"{index_path.name} entry {record.offset_index_entries - 1} is past the record"
    kept_time = _kept_time_entries(time_path, record.time_index_entries, record.offset, base)
    if isinstance(kept_time, str):
        return kept_time
    # the batches from that entry on end exactly at the position, just below the offset
    # (a short walk of headers: entries are index.interval.bytes apart)
    last = segment.last_offset_before(record.position, walk_from)
    if last != record.offset - 1:
        return (f"the batches before byte {record.position} end at offset {last}, "
                f"not {record.offset - 1}")
    return record._replace(time_index_entries=kept_time)


def load_log(directory: Path, config: LogConfig, *, recovery_point: int = 0,
             log_start_offset: int = 0, clean_shutdown: bool = False) -> LoadedLog:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    bases, txn_bases, snapshots = _remove_temp_files(directory)
    epochs = checkpoint.read_leader_epochs(directory / layout.LEADER_EPOCH_CHECKPOINT)
    checkpointed_epoch = max((e for e, _ in epochs), default=-1) if epochs else -1
    record = recovery_point_file.read(directory)
    segments = [LogSegment(directory, base, config, active=False, lazy=True) for base in bases]
    for trusted, following in zip(segments, segments[1:], strict=False):
        trusted.next_offset = following.base_offset  # trusted segments end where the next begins
    recovered: list[np.ndarray] = []
    rebuilt: list[int] = []
    truncated = validated = 0
    epoch = -1
    resume: RecoveryRecord | None = None
    resumed_at: tuple[int, int] | None = None
    if record is not None:
        at = next((i for i, s in enumerate(segments) if s.base_offset == record.segment_base), None)
        why = "its segment is gone" if at is None else _resumable(segments[at], record)
        if isinstance(why, RecoveryRecord):
            resume = why
        elif not clean_shutdown:
            log.warning("not resuming recovery of %s from its recovery record: %s", directory, why)

    def recover(i: int, from_record: RecoveryRecord | None = None) -> bool:
        """Recover segment i; True when it lost bytes (later segments must go)."""
        nonlocal truncated, epoch, validated
        seg = segments[i]
        start = from_record.position if from_record is not None else 0
        validated += max(0, seg.size - start)
        result = seg.recover(min_leader_epoch=epoch, resume=from_record)
        if from_record is not None:
            # the entries kept below the record were not rebuilt: they get the index check a
            # clean start makes, at the first read (a cold cache makes it ~0.2 s per GiB)
            seg.defer_check()
        if from_record is None:
            rebuilt.append(seg.base_offset)
        recovered.append(result.batches)
        if len(result.batches):
            epoch = max(epoch, int(result.batches[:, 5].max()))
        if from_record is not None:
            epoch = max(epoch, from_record.leader_epoch)
        if result.truncated_bytes or result.reason:
            log.warning("Corruption found in segment %s (%s), truncating %d bytes",
                        seg.log_path, result.reason, result.truncated_bytes)
            truncated += result.truncated_bytes
            return True
        return False

    first_to_recover = len(segments)
    if clean_shutdown:
        if resume is not None and resume.segment_base == bases[-1] \
                and resume.position == segments[-1].size:
            segments[-1].next_offset = resume.offset  # the LEO, on record: the tail stays lazy
        else:
            resume = None
            if segments:
                last = segments[-1]  # the LEO is not on record: load (and check) the tail now
                if last.size == 0 and not any(p.exists() for p in last._index_paths):
                    last.adopt_unwritten()  # never written: a clean close made no index files
                else:
                    problem = last.check_indexes()
                    if problem is not None:
                        log.warning("rebuilding indexes of %s: %s", last.log_path, problem)
                        recover(len(segments) - 1)
    elif resume is not None:
        first_to_recover = bases.index(resume.segment_base)
        if first_to_recover == len(segments) - 1 and resume.position == segments[-1].size:
            # the record names the log's exact end: nothing to validate (after a crash, a log
            # idle since its last checkpoint, or closed cleanly and not written since)
            segments[-1].adopt_tail(resume)
            resumed_at = (resume.segment_base, resume.position)
            epoch = max(epoch, resume.leader_epoch)
            first_to_recover = len(segments)
    else:
        first_to_recover = 0
        for i, seg in enumerate(segments):
            if seg.base_offset <= recovery_point:
                first_to_recover = i
    i = first_to_recover
    while i < len(segments):
        seg = segments[i]
        if i == first_to_recover and resume is not None:
            resumed_at = (seg.base_offset, resume.position)
            lost = recover(i, resume)
        else:
            lost = recover(i)
        nxt = segments[i + 1] if i + 1 < len(segments) else None
        if nxt is not None and (lost or nxt.base_offset != seg.next_offset):
            for later in segments[i + 1 :]:
                log.warning("deleting segment %s after corruption", later.log_path)
                later.delete()
            del segments[i + 1 :]
        i += 1
    # an empty segment in front of others holds nothing: keep the structure simple
    if not segments:
        base = max(log_start_offset, 0)
        seg = LogSegment(directory, base, config, active=True, create=True, lazy_indexes=True)
        seg.next_offset = base
        segments.append(seg)
    else:
        segments[-1].make_active()
    leo = segments[-1].next_offset
    if record is not None and record.offset > leo:
        # it describes bytes recovery dropped (it could not resume from it), which new appends
        # could fill again: gone, until the next flush writes one that holds
        recovery_point_file.remove(directory)
    for name in snapshots:  # producer snapshots of offsets the log lost
        try:
            if layout.offset_from_filename(name) > leo:
                os.unlink(os.path.join(directory, name))
        except (ValueError, FileNotFoundError):
            continue
    start = min(max(log_start_offset, segments[0].base_offset), leo)
    if clean_shutdown and not truncated:
        rp = leo
    else:
        durable = max(recovery_point, resume.offset) if resume is not None else recovery_point
        rp = min(durable, leo)
    epoch = max(epoch, checkpointed_epoch)
    batches = np.concatenate(recovered) if recovered else np.empty((0, 12), dtype=np.int64)
    return LoadedLog(segments, start, rp, epoch, batches, truncated, rebuilt, resumed_at, validated,
                     txn_bases)
