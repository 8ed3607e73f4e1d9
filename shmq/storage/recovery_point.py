"""Where recovery may start: the recovery point as a byte position (shmq's own file).

Why
---
Kafka keeps only the recovery point *offset* (``recovery-point-offset-checkpoint``, rewritten
every 60 s) and after an unclean shutdown validates every segment from the one holding it, so a
restart reads the whole active segment: 1.5-2 s per GB here, tens of seconds for a worker with
many 1 GiB segments.  With acks=all and ``flush.on.ack`` almost all of that is known to be on
disk and valid.  At every checkpoint (``PartitionLog.flush``: at most ``CHECKPOINT_BYTES`` or
``CHECKPOINT_INTERVAL_MS`` apart while acks=all appends go on, and at flush.messages / flush.ms,
roll and close) shmq records where the checkpointed prefix ends, as an offset *and* a byte
position in a segment, together with the index state at that byte; recovery then validates
only what was appended after the last checkpoint, whatever the size of the log.  An
acknowledgement's flush (the durable offset) writes no record: the record would vouch for index
entries, and making those durable costs an msync per index, a cache flush of the device each.

The file
--------
``<topic>-<partition>/shmq-recovery-point``: two 80-byte slots (at bytes 0 and 80), written
alternately, each big-endian::

    0   magic                   4s    b"SRP2"
    4   crc                     u32   CRC-32C of bytes 8..80 of the slot
    8   sequence                u64   grows with every write: the newer valid slot wins, so a
                                      write torn by a crash leaves the other slot readable
    16  recovery offset         i64   every offset below it is fsynced (and was valid), and
                                      the index entries counted below are msynced
    24  segment base offset     i64   the segment holding it (or ending at it)
    32  position                i64   bytes of that segment below the recovery offset
    40  offset index entries    i32   entries of its .index below the position
    44  time index entries      i32   entries of its .timeindex below the position
    48  bytes since index entry i32   LogSegment.bytes_since_last_index_entry at the position
    52  leader epoch            i32   largest leader epoch of the batches below (-1: none)
    56  max timestamp           i64   the segment's running max timestamp below the position
    64  offset of max timestamp i64   the last offset of the batch that set it
    72  first unstable offset   i64   first offset of the earliest open transaction at the
                                      recovery offset (-1: none): the last stable offset of a
                                      log whose record names its end, without its producer state

Version 1 (``SRP1``, 72-byte slots at 0 and 72, without the first unstable offset) is still
read, its first unstable offset unknown (-2); the next write replaces it with version 2.

The file is written through a shared mapping without ``fsync`` (a few stores per flush, ~2 us):
a process crash keeps the page cache, and after a power cut the file on disk is some earlier
version, which vouches for less than what was fsynced, never more: a record is written only
after the fdatasync of the ``.log`` bytes and the msync of the index entries it describes.  Only truncation lowers it, and ``write(..., sync=True)`` makes
that durable at once, before new bytes can land below the old position.

Recovery trusts the record only after checking it against the files (the segment exists and is
long enough, a batch starting at the recorded offset sits at the position, the index files hold
the counted entries); otherwise it falls back to Kafka's rule.

After an unclean shutdown a log whose record names the exact end of its last segment has
nothing to recover: ``LogManager`` leaves it unopened until its first use, publishing its offsets
from the record (``unclean_deferral``).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import NamedTuple

from shmq import _fast

FILE_NAME = "shmq-recovery-point"
MAGIC = b"SRP2"
_SLOT = struct.Struct(">4sIQqqqiiiiqqq")
SLOT_SIZE = _SLOT.size  # 80
FILE_SIZE = 2 * SLOT_SIZE
_V1_MAGIC = b"SRP1"
_V1_SLOT = struct.Struct(">4sIQqqqiiiiqq")  # 72 bytes: version 1, without the last field
UNKNOWN = -2  # first_unstable of a version 1 record


class RecoveryRecord(NamedTuple):
    offset: int                 # the recovery point: everything below is durable
    segment_base: int           # the segment holding it
    position: int               # byte position of that offset in the segment
    offset_index_entries: int
    time_index_entries: int
    bytes_since_index_entry: int
    leader_epoch: int           # largest epoch of the batches below the position (-1: none)
    max_timestamp: int          # the segment's running max timestamp below the position
    offset_of_max_timestamp: int
    first_unstable: int = UNKNOWN  # first offset of the earliest open transaction (-1: none)


def _encode(record: RecoveryRecord, sequence: int) -> bytes:
    body = _SLOT.pack(MAGIC, 0, sequence, *record)
    crc = _fast.crc32c(body[8:])
    return body[:4] + struct.pack(">I", crc) + body[8:]


def _decode(raw: bytes, layout: struct.Struct = _SLOT,
            magic: bytes = MAGIC) -> tuple[int, RecoveryRecord] | None:
    if len(raw) < layout.size:
        return None
    found, crc, sequence, *fields = layout.unpack_from(raw)
    if found != magic or crc != _fast.crc32c(raw[8:layout.size]):
        return None
    record = RecoveryRecord(*fields)
    if (record.offset < record.segment_base or record.position < 0
            or record.offset_index_entries < 0 or record.time_index_entries < 0
            or record.bytes_since_index_entry < 0
            or not (record.first_unstable in (-1, UNKNOWN)
                    or 0 <= record.first_unstable < record.offset)):
        return None
    return sequence, record


def _slots(data: bytes) -> list[tuple[int, RecoveryRecord]]:
    """The valid slots of a file's bytes, of either version."""
    found = [_decode(data[i * SLOT_SIZE : (i + 1) * SLOT_SIZE]) for i in (0, 1)]
    size = _V1_SLOT.size
    found += [_decode(data[i * size : (i + 1) * size], _V1_SLOT, _V1_MAGIC) for i in (0, 1)]
    return [s for s in found if s]


def read(directory: Path | str) -> RecoveryRecord | None:
    """The newest valid record of the partition in ``directory``, or None."""
    try:
        fd = os.open(os.path.join(directory, FILE_NAME), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        data = os.pread(fd, FILE_SIZE, 0)
    finally:
        os.close(fd)
    slots = _slots(data)
    return max(slots, key=lambda s: s[0])[1] if slots else None


def remove(directory: Path) -> None:
    """Delete the record (it no longer describes the log)."""
    try:
        os.unlink(directory / FILE_NAME)
    except FileNotFoundError:
        pass


class RecoveryPointFile:
    """The writer: a shared mapping of the file, opened at the first write."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / FILE_NAME
        self._map: _fast.MappedFile | None = None
        self._sequence = 0
        self.last: RecoveryRecord | None = None

    def _open(self) -> _fast.MappedFile:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            size = os.fstat(fd).st_size
            if size < FILE_SIZE:
                # written, not ftruncate'd: a hole in a mapped file is allocated at the first
                # store into it, and on a full disk that store is SIGBUS, not ENOSPC
                os.pwrite(fd, bytes(FILE_SIZE - size), size)
            mapping = _fast.MappedFile(fd, FILE_SIZE, True)
        finally:
            os.close(fd)
        with memoryview(mapping) as view:
            old = _slots(bytes(view))
        self._sequence = max((s[0] for s in old), default=0)
        self._map = mapping
        return mapping

    def write(self, record: RecoveryRecord, *, sync: bool = False) -> None:
        """Store ``record`` in the older slot; ``sync`` makes it durable before returning."""
        if record == self.last and not sync:
            return
        mapping = self._map if self._map is not None else self._open()
        self._sequence += 1
        slot = self._sequence % 2
        with memoryview(mapping) as view:
            view[slot * SLOT_SIZE : (slot + 1) * SLOT_SIZE] = _encode(record, self._sequence)
        if sync:
            mapping.flush()
        self.last = record

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None
