"""Opening a partition log at startup, and recovering it after a crash (Kafka ``LogLoader``).

Passes, in order:

1. Remove temporary files (``.deleted``, ``.cleaned``, ``.swap``, ``.tmp``) and index files whose
   ``.log`` is gone.
2. Open every segment.  After a clean shutdown each segment's indexes are sanity-checked; a
   missing or corrupt index is rebuilt by recovering that segment.
3. After an unclean shutdown (no ``.kafka_cleanshutdown`` marker), recover every segment from the
   one holding the recovery point to the end: validate batch by batch (size, magic, CRC,
   contiguous offsets, leader epochs), rebuild both indexes, truncate at the first invalid or
   partial batch.  Once a segment was truncated, every later segment is deleted: the log that
   survives is always a prefix of what was appended.
4. The last segment becomes the active one (indexes regrown to their preallocated size); the log
   start offset is clamped into the log; the recovery point becomes min(checkpoint, LEO) after an
   unclean shutdown (recovered bytes are valid but not known to be on disk) and the LEO after a
   clean one.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from shmq.errors import CorruptIndexError
from shmq.storage import checkpoint, layout
from shmq.storage.log_config import LogConfig
from shmq.storage.segment import LogSegment

log = logging.getLogger(__name__)


class LoadedLog(NamedTuple):
    segments: list[LogSegment]
    log_start_offset: int
    recovery_point: int
    leader_epoch: int
    recovered_batches: np.ndarray   # headers of every batch validated by recovery
    truncated_bytes: int
    rebuilt_segments: list[int]     # base offsets of segments whose indexes were rebuilt


def _remove_temp_files(directory: Path) -> list[int]:
    bases: set[int] = set()
    for entry in os.scandir(directory):
        name = entry.name
        if name.endswith(layout.TEMP_SUFFIXES):
            os.unlink(entry.path)
        elif name.endswith(layout.LOG_SUFFIX):
            try:
                bases.add(layout.offset_from_filename(name))
            except ValueError:
                log.warning("ignoring stray file %s", entry.path)
    for entry in os.scandir(directory):
        if entry.name.endswith((layout.INDEX_SUFFIX, layout.TIME_INDEX_SUFFIX, layout.TXN_INDEX_SUFFIX)):
            try:
                base = layout.offset_from_filename(entry.name)
            except ValueError:
                continue
            if base not in bases:
                os.unlink(entry.path)  # an index without its log
    return sorted(bases)


def load_log(directory: Path, config: LogConfig, *, recovery_point: int = 0,
             log_start_offset: int = 0, clean_shutdown: bool = False) -> LoadedLog:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    bases = _remove_temp_files(directory)
    epochs = checkpoint.read_leader_epochs(directory / layout.LEADER_EPOCH_CHECKPOINT)
    checkpointed_epoch = max((e for e, _ in epochs), default=-1) if epochs else -1
    segments = [LogSegment(directory, base, config, active=False) for base in bases]
    recovered: list[np.ndarray] = []
    rebuilt: list[int] = []
    truncated = 0
    epoch = -1

    def recover(i: int) -> bool:
        """Recover segment i; True when it lost bytes (later segments must go)."""
        nonlocal truncated, epoch
        seg = segments[i]
        result = seg.recover(min_leader_epoch=epoch)
        rebuilt.append(seg.base_offset)
        recovered.append(result.batches)
        if len(result.batches):
            epoch = max(epoch, int(result.batches[:, 5].max()))
        if result.truncated_bytes or result.reason:
            log.warning("Corruption found in segment %s (%s), truncating %d bytes",
                        seg.log_path, result.reason, result.truncated_bytes)
            truncated += result.truncated_bytes
            return True
        return False

    first_to_recover = len(segments)
    if not clean_shutdown:
        first_to_recover = 0
        for i, seg in enumerate(segments):
            if seg.base_offset <= recovery_point:
                first_to_recover = i
    i = 0
    while i < len(segments):
        seg = segments[i]
        lost = False
        if i >= first_to_recover:
            lost = recover(i)
        else:
            problem = None
            try:
                seg.sanity_check()
                seg.load_tail_state()
            except (CorruptIndexError, FileNotFoundError) as exc:
                problem = str(exc)  # recover outside the handler: its traceback pins buffers
            if problem is not None:
                log.warning("rebuilding indexes of %s: %s", seg.log_path, problem)
                lost = recover(i)
            else:
                if len(segments) > i + 1 and segments[i + 1].base_offset != seg.next_offset:
                    log.warning("segment %s does not end where the next begins; recovering", seg.log_path)
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
        seg = LogSegment(directory, base, config, active=True, create=True)
        seg.next_offset = base
        segments.append(seg)
    else:
        segments[-1].make_active()
    leo = segments[-1].next_offset
    for entry in os.scandir(directory):  # producer snapshots of offsets the log lost
        if entry.name.endswith(layout.SNAPSHOT_SUFFIX):
            try:
                if layout.offset_from_filename(entry.name) > leo:
                    os.unlink(entry.path)
            except ValueError:
                continue
    start = min(max(log_start_offset, segments[0].base_offset), leo)
    rp = leo if clean_shutdown and not truncated else min(recovery_point, leo)
    epoch = max(epoch, checkpointed_epoch)
    batches = np.concatenate(recovered) if recovered else np.empty((0, 12), dtype=np.int64)
    return LoadedLog(segments, start, rp, epoch, batches, truncated, rebuilt)
