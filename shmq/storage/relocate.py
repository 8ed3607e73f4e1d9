"""Logs left behind by workers that no longer exist move to their partitions' new leaders.

Started with fewer ``--workers`` than before, the controller gives the partitions of the missing
workers to live ones (``MetadataStore.reassign_missing``, a new leader epoch).  Their logs are
still under ``<data-dir>/worker-<old>/``; before any worker starts, ``relocate_orphan_logs``
moves each of them to ``worker-<leader>/`` with what the old directory knew of it:

* its entries in ``recovery-point-offset-checkpoint`` and ``log-start-offset-checkpoint`` are
  merged into the new directory's files first (a lost log start offset would bring back records
  that DeleteRecords or retention removed);
* if the old directory did not stop cleanly, the new one's ``.kafka_cleanshutdown`` is removed,
  so the moved log is recovered (from its recovery record) instead of trusted;
* then the partition directory is renamed (one atomic step on the data dir's filesystem).

Every step can be repeated: a crash part-way leaves logs in the old directory, and the next
start moves them.  A log whose new home already holds a non-empty log of that name stays where
it is, with a warning (two histories; nothing is thrown away); an empty one there (created by a
start that did not relocate) is replaced.  An old directory left with no partition is removed.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path

from shmq.storage import checkpoint, layout

log = logging.getLogger(__name__)

_WORKER_DIR = re.compile(r"worker-(\d+)")


def relocate_orphan_logs(data_dir: Path, leaders: Mapping[tuple[str, int], int],
                         live: set[int]) -> list[tuple[str, int, int, int]]:
    """Move the logs of worker directories not in ``live`` to their leader's directory.

    ``leaders`` maps (topic, partition) to its leader's node id.  Returns the moves made as
    (topic, partition, old node, new node).
    """
    moved = []
    for old_dir in sorted(data_dir.glob("worker-*")):
        m = _WORKER_DIR.fullmatch(old_dir.name)
        if m is None or not old_dir.is_dir() or int(m.group(1)) in live:
            continue
        old = int(m.group(1))
        clean = (old_dir / layout.CLEAN_SHUTDOWN_FILE).exists()
        recovery = checkpoint.read_offsets(old_dir / layout.RECOVERY_POINT_CHECKPOINT)
        starts = checkpoint.read_offsets(old_dir / layout.LOG_START_OFFSET_CHECKPOINT)
        left = 0
        for entry in sorted(old_dir.iterdir()):
            tp = layout.parse_partition_dir(entry.name) if entry.is_dir() else None
            if tp is None:
                continue
            leader = leaders.get(tp)
            if leader is None or leader not in live:
                left += 1  # a deleted topic's log: left for the operator, as before
                continue
            new_dir = data_dir / f"worker-{leader}"
            target = new_dir / entry.name
            new_dir.mkdir(mode=0o700, exist_ok=True)
            if target.exists():
                if not _empty(target):
                    log.warning("not moving %s: %s already holds a log of that partition",
                                entry, target)
                    left += 1
                    continue
                doomed = target.with_name(f"{target.name}.{uuid.uuid4().hex}-delete")
                os.rename(target, doomed)
                checkpoint.fsync_directory(new_dir)
                shutil.rmtree(doomed, ignore_errors=True)
            for name, values in ((layout.RECOVERY_POINT_CHECKPOINT, recovery),
                                 (layout.LOG_START_OFFSET_CHECKPOINT, starts)):
                if tp in values:
                    merged = checkpoint.read_offsets(new_dir / name)
                    merged[tp] = values[tp]
                    checkpoint.write_offsets(new_dir / name, merged)
            if not clean:
                (new_dir / layout.CLEAN_SHUTDOWN_FILE).unlink(missing_ok=True)
                checkpoint.fsync_directory(new_dir)
            os.rename(entry, target)
            checkpoint.fsync_directory(new_dir)
            checkpoint.fsync_directory(old_dir)
            moved.append((tp[0], tp[1], old, leader))
        if left == 0:
            shutil.rmtree(old_dir, ignore_errors=True)
            checkpoint.fsync_directory(data_dir)
    return moved


def _empty(directory: Path) -> bool:
    """No segment of the log holds a byte."""
    return all(p.stat().st_size == 0 for p in directory.glob(f"*{layout.LOG_SUFFIX}"))
