"""Where things live on disk: Kafka's directory and file names (``LogFileUtils``).

    <log.dir>/
      meta.properties                      cluster/node identity
      .kafka_cleanshutdown                 present only after a clean shutdown
      recovery-point-offset-checkpoint     "<topic> <partition> <offset>" lines (checkpoint.py)
      log-start-offset-checkpoint
      replication-offset-checkpoint        high watermarks
      <topic>-<partition>/
        00000000000000000000.log           record batches, as the clients sent them
        00000000000000000000.index         offset index, 8-byte entries (offset_index.py)
        00000000000000000000.timeindex     time index, 12-byte entries (time_index.py)
        00000000000000001234.snapshot      producer state at offset 1234
        leader-epoch-checkpoint            "<epoch> <start offset>" lines
        partition.metadata                 "version: 0" / "topic_id: <base64 uuid>"
        shmq-recovery-point                shmq's own: the recovery point as a byte position
                                           (recovery_point.py; Kafka ignores the file)
      <topic>-<partition>.<uuid>-delete/   a log being deleted (finished at the next start)

A segment is named after its base offset, zero-padded to 20 digits.  ``.deleted`` / ``.cleaned``
/ ``.swap`` suffixes mark files in the middle of deletion or compaction; the loader removes them.
"""

from __future__ import annotations

import re
from pathlib import Path

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
SNAPSHOT_SUFFIX = ".snapshot"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
TEMP_SUFFIXES = (DELETED_SUFFIX, CLEANED_SUFFIX, SWAP_SUFFIX, ".tmp")

CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
REPLICATION_OFFSET_CHECKPOINT = "replication-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
PARTITION_METADATA = "partition.metadata"

_PARTITION_DIR = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")
_LEGAL_TOPIC = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")


def filename_prefix(offset: int) -> str:
    """The 20-digit zero-padded base offset every segment file starts with."""
    return f"{offset:020d}"


def segment_paths(directory: Path, base_offset: int) -> tuple[Path, Path, Path]:
    """(.log, .index, .timeindex) paths of the segment starting at ``base_offset``."""
    prefix = filename_prefix(base_offset)
    return (
        directory / (prefix + LOG_SUFFIX),
        directory / (prefix + INDEX_SUFFIX),
        directory / (prefix + TIME_INDEX_SUFFIX),
    )


def offset_from_filename(name: str) -> int:
    """Base offset of a segment file name such as ``00000000000000001234.log``."""
    stem = name.split(".", 1)[0]
    if len(stem) != 20 or not stem.isdigit():
        raise ValueError(f"not a segment file name: {name}")
    return int(stem)


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_partition_dir(name: str) -> tuple[str, int] | None:
    """(topic, partition) of a partition directory name, or None for anything else."""
    if name.endswith("-delete") or name.startswith("."):
        return None
    m = _PARTITION_DIR.match(name)
    if not m or not _LEGAL_TOPIC.match(m.group("topic")):
        return None
    return m.group("topic"), int(m.group("partition"))
