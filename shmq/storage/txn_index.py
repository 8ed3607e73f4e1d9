"""The transaction index (``.txnindex``, Kafka ``TransactionIndex`` / ``AbortedTxn``).

One file per segment, beside its ``.log``, holding the aborted transactions whose ABORT marker
is in that segment (``LogSegment.updateTxnIndex``), in marker order.  Only aborts are recorded: a
read_committed consumer needs them to drop the aborted records it is sent (Fetch's
``aborted_transactions``).  Kafka's layout, big-endian, 34 bytes an entry, no header::

    offset  size  field
    0       2     version            int16   0
    2       8     producerId         int64
    10      8     firstOffset        int64   first offset of the aborted transaction
    18      8     lastOffset         int64   offset of its ABORT marker
    26      8     lastStableOffset   int64   the partition's LSO once the marker was written

``PartitionLog`` keeps every entry of the log in memory too (sorted by marker offset: a bisect
finds those a fetch overlaps) and writes each new one to its segment's file at once; the file
is fsynced with the segment (``flush``) and rewritten on truncation.  Files are created only
when a segment gets its first abort, as Kafka creates them lazily.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import NamedTuple

from shmq.storage import layout

VERSION = 0
ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = ENTRY.size  # 34


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class CorruptTxnIndexError(ValueError):
    pass


def path_for(directory: Path, base_offset: int) -> Path:
    return directory / (layout.filename_prefix(base_offset) + layout.TXN_INDEX_SUFFIX)


def encode(entries: Iterable[AbortedTxn]) -> bytes:
    return b"".join(ENTRY.pack(VERSION, *e) for e in entries)


def decode(data: bytes) -> list[AbortedTxn]:
    """Entries of a ``.txnindex``; a partial last entry (a torn write) is dropped, an entry of
    another version is corrupt (Kafka: "Unexpected aborted transaction version")."""
    out = []
    for pos in range(0, len(data) - len(data) % ENTRY_SIZE, ENTRY_SIZE):
        version, pid, first, last, lso = ENTRY.unpack_from(data, pos)
        if version != VERSION:
            raise CorruptTxnIndexError(f"unexpected aborted transaction version {version}")
        out.append(AbortedTxn(pid, first, last, lso))
    return out


def read(path: Path) -> list[AbortedTxn]:
    try:
        return decode(path.read_bytes())
    except FileNotFoundError:
        return []


def append(path: Path, entry: AbortedTxn) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, ENTRY.pack(VERSION, *entry))
    finally:
        os.close(fd)


def rewrite(path: Path, entries: list[AbortedTxn]) -> None:
    """Replace the file with ``entries`` (truncation); no entries removes it."""
    if not entries:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        return
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, encode(entries))
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
