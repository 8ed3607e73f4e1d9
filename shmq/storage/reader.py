"""A read-only view of one partition's log for processes that are not its writer.

The Spark bridge's executors (and any other local reader) read a partition straight from its
segment files while the leader worker keeps appending, rolling and deleting them.  Nothing
here writes, locks or waits on the writer; what makes that safe:

* **The caller bounds every read** by an offset it took from the broker (the high watermark in
  the shared state table).  Every batch below the high watermark was written whole before the
  watermark moved, so bytes past the last batch read (a batch being appended) are never looked
  at: headers are walked without CRCs, the walk stops at the first batch at or above the bound,
  and only then are the batches kept checked (CRC) and decoded.
* **Segment files are mapped read-only and only up to the size seen at open.**  A log file is
  truncated only below bytes nobody may read (recovery cuts a torn tail past the high
  watermark), so a mapping never faults past the end of its file.  Index files are never
  mapped: the recovering writer truncates and rebuilds them, so they are read with ``pread``.
* **Index entries are hints.**  The active segment's index is preallocated (a zero tail), may
  be rebuilt at any moment and may be read mid-write: an entry is used only after the batch
  header it names agrees with it; otherwise the walk starts at the segment's first byte.
* **Segments can disappear** (retention, DeleteRecords, topic deletion) between listing and
  opening.  An open segment stays readable (its inode lives while mapped); a missing one is
  re-listed, and offsets below the first segment left are a gap reported to the caller, who
  decides between an error and a skip (Spark's ``failOnDataLoss``).

The reader yields records sections (uncompressed bytes and their ``meta`` rows as
``_fast.fill_columns`` takes them) in chunks of about ``chunk_records`` records; control
batches never reach the caller, nor (for a read_committed reader given ``aborted``) the
batches of aborted transactions.  A corrupt batch raises ``CorruptRecordError`` naming the file
and byte position.
"""

from __future__ import annotations

import errno
import mmap
import os
import struct
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shmq import _fast
from shmq.errors import CorruptRecordError
from shmq.protocol import compression as codecs
from shmq.protocol.records import (
    COMPRESSION_MASK,
    CONTROL_FLAG,
    TIMESTAMP_TYPE_MASK,
    TRANSACTIONAL_FLAG,
)
from shmq.storage import layout, txn_index

HEADER_SIZE = _fast.HEADER_SIZE
_INDEX_ENTRY = struct.Struct(">ii")
_SCAN_ROWS = 4096
# A chunk's batches stay near this size whatever the record size: Arrow buffers of a few MiB are
# reused by the allocator where 64 MiB ones are fresh pages every time (1 KiB records in Spark:
# 0.67x the CPU of 65,536-record chunks, perf/README.md)
DEFAULT_CHUNK_BYTES = 8 << 20
_MADV_POPULATE_READ = 22  # Linux 5.14: map the pages in one call instead of a fault per page
_MAX_DECOMPRESSED = codecs.DEFAULT_MAX_DECOMPRESSED_BYTES


@dataclass
class SectionChunk:
    """Records sections of consecutive batches, ready for ``_fast.fill_columns``; valid until
    the next chunk is asked for (uncompressed sections are views of the mapped segment).

    ``meta`` holds (count, base offset, base timestamp, log append time or
    NO_LOG_APPEND_TIME) per section; ``first_offset`` / ``next_offset`` bound the offsets the
    chunk covers (the caller's window applied), ``records`` is an upper bound of its rows.
    """

    bodies: list[Any]
    meta: np.ndarray
    first_offset: int
    next_offset: int
    records: int
    data_bytes: int


class PartitionReader:
    """Reads offsets ``[start, end)`` of the partition log in ``directory``."""

    def __init__(self, directory: Path | str, *, verify_crc: bool = True,
                 max_decompressed: int = _MAX_DECOMPRESSED,
                 aborted: Sequence[tuple[int, int, int]] = ()) -> None:
        self.directory = Path(directory)
        self.verify_crc = verify_crc
        self.max_decompressed = max_decompressed
        # read_committed: (producer id, first offset, marker offset) of aborted transactions;
        # their batches are left out as control batches are (a Kafka consumer's rule)
        self.aborted = list(aborted)

    def aborted_transactions(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """(producer id, first offset, marker offset) of the aborted transactions in the
        segments' ``.txnindex`` files that overlap offsets ``[start, end)``: what a Fetch
        with read_committed lists.  ``end`` must not pass the last stable offset (below it,
        every abort marker is indexed)."""
        out = []
        for base in self.segment_bases():
            for e in txn_index.read(txn_index.path_for(self.directory, base)):
                if e.last_offset >= start and e.first_offset < end:
                    out.append((e.producer_id, e.first_offset, e.last_offset))
        return out

    def segment_bases(self) -> list[int]:
        """Base offsets of the segments present now, in order (``FileNotFoundError`` if the
        partition directory does not exist)."""
        bases = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                name = entry.name
                if name.endswith(layout.LOG_SUFFIX) and len(name) == 24 and name[:20].isdigit():
                    bases.append(int(name[:20]))
        bases.sort()
        return bases

    def read(self, start: int, end: int, *, chunk_records: int = 65536,
             chunk_bytes: int = DEFAULT_CHUNK_BYTES,
             on_gap: Callable[[int, int], None] | None = None) -> Iterator[SectionChunk]:
        """The sections holding offsets ``[start, end)``, in chunks of at most about
        ``chunk_records`` records and ``chunk_bytes`` bytes of batches (at least one batch).

        ``end`` must not be above the partition's high watermark.  Offsets in the range that are
        no longer stored (below the first segment, or in a segment deleted meanwhile) are passed
        to ``on_gap(first_missing, next_present)`` before reading resumes at ``next_present``;
        without ``on_gap`` they are skipped.
        """
        offset = start
        while offset < end:
            bases = self.segment_bases()
            i = _segment_index(bases, offset)
            if i < 0:
                if not bases or bases[0] >= end:
                    if on_gap is not None:
                        on_gap(offset, end)
                    return
                if on_gap is not None:
                    on_gap(offset, bases[0])
                offset, i = bases[0], 0
            path = self.directory / (layout.filename_prefix(bases[i]) + layout.LOG_SUFFIX)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # deleted since the listing: list again
            limit = bases[i + 1] if i + 1 < len(bases) else None
            try:
                reached = yield from self._read_segment(
                    fd, str(path), bases[i], offset, end if limit is None else min(end, limit),
                    chunk_records, chunk_bytes)
            finally:
                os.close(fd)
            if limit is not None:
                # a gap between two segments is a hole of the log (a compacted Kafka topic),
                # not a loss: the next segment holds what comes next
                offset = max(reached, min(end, limit))
            elif reached > offset:
                offset = reached  # then list again: the writer may have rolled meanwhile
            elif self.segment_bases()[-1:] == bases[-1:]:
                # nothing more in the last segment and no new one: the records up to `end`
                # are not there (a log that lost its tail)
                if on_gap is not None:
                    on_gap(offset, end)
                return

    # -- one segment ------------------------------------------------------------------------

    def _read_segment(self, fd: int, path: str, base: int, start: int, end: int,
                      chunk_records: int, chunk_bytes: int) -> Generator[SectionChunk, None, int]:
        """Yield the chunks of offsets [start, end) in this segment; return the next offset."""
        size = os.fstat(fd).st_size
        if size == 0:
            return start
        position = self._start_position(fd, path, base, start, size)
        aligned = position - position % mmap.ALLOCATIONGRANULARITY
        mm = mmap.mmap(fd, size - aligned, mmap.MAP_SHARED, mmap.PROT_READ, offset=aligned)
        view = memoryview(mm)
        try:
            table, stop = _scan_until(view, position - aligned, size - aligned, start, end, path,
                                      aligned)
            if len(table) == 0:
                return start
            first_pos = int(table[0, _fast.COL_POSITION])
            page = (first_pos - aligned) - (first_pos - aligned) % mmap.PAGESIZE
            try:
                mm.madvise(_MADV_POPULATE_READ, page, stop - aligned - page)
            except OSError as exc:  # older kernels: page faults instead
                if exc.errno not in (errno.EINVAL, errno.ENOSYS):
                    raise
            yield from self._chunks(view, table, start, end, chunk_records, chunk_bytes, path,
                                    aligned)
            return min(end, int(table[-1, _fast.COL_LAST_OFFSET]) + 1)
        finally:
            try:
                view.release()
                mm.close()
            except BufferError:
                pass  # a caller that stopped mid-chunk still holds a view: unmapped with it

    def _start_position(self, fd: int, path: str, base: int, offset: int, size: int) -> int:
        """Byte position to walk from for ``offset``: an index entry at or below it that names a
        real batch (checked against the batch header), else 0."""
        if offset <= base:
            return 0
        index_path = path[: -len(layout.LOG_SUFFIX)] + layout.INDEX_SUFFIX
        try:
            ifd = os.open(index_path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return 0
        try:
            slot_offset, position = _index_lookup(ifd, offset - base)
        finally:
            os.close(ifd)
        if position <= 0 or position > size - HEADER_SIZE:
            return 0
        head = os.pread(fd, HEADER_SIZE, position)
        if len(head) < HEADER_SIZE:
            return 0
        h = _fast.batch_header(head)
        if h[3] != 2 or h[0] + h[6] != base + slot_offset or h[0] < base:
            return 0  # a stale, torn or garbled entry: walk from the start
        return position

    def _chunks(self, view: memoryview, table: np.ndarray, start: int, end: int,
                chunk_records: int, chunk_bytes: int, path: str,
                aligned: int) -> Iterator[SectionChunk]:
        attrs = table[:, _fast.COL_ATTRIBUTES]
        keep = (attrs & CONTROL_FLAG) == 0
        if self.aborted:
            txn = (attrs & TRANSACTIONAL_FLAG) != 0
            pids, firsts = table[:, _fast.COL_PRODUCER_ID], table[:, _fast.COL_BASE_OFFSET]
            for pid, first, last in self.aborted:
                keep &= ~(txn & (pids == pid) & (firsts >= first) & (firsts <= last))
        table, attrs = table[keep], attrs[keep]
        if len(table) == 0:
            return
        counts = table[:, _fast.COL_RECORDS_COUNT]
        lat = np.where(attrs & TIMESTAMP_TYPE_MASK, table[:, _fast.COL_MAX_TIMESTAMP],
                       _fast.NO_LOG_APPEND_TIME)
        meta = np.column_stack([counts, table[:, _fast.COL_BASE_OFFSET],
                                table[:, _fast.COL_BASE_TIMESTAMP], lat]).astype(np.int64)
        positions = table[:, _fast.COL_POSITION].tolist()
        sizes = table[:, _fast.COL_SIZE].tolist()
        codecs_ = (attrs & COMPRESSION_MASK).tolist()
        bases = table[:, _fast.COL_BASE_OFFSET].tolist()
        lasts = table[:, _fast.COL_LAST_OFFSET].tolist()
        cumulative = np.cumsum(counts)
        cumulative_bytes = np.cumsum(table[:, _fast.COL_SIZE])
        lo = 0
        n = len(table)
        while lo < n:
            # batches up to about chunk_records records and chunk_bytes bytes (at least one)
            done = int(cumulative[lo - 1]) if lo else 0
            done_bytes = int(cumulative_bytes[lo - 1]) if lo else 0
            hi = min(int(np.searchsorted(cumulative, done + chunk_records, side="right")),
                     int(np.searchsorted(cumulative_bytes, done_bytes + chunk_bytes,
                                         side="right")))
            hi = max(hi, lo + 1)
            if self.verify_crc:  # each chunk just before it is read: its bytes are in cache
                _verify(view, positions[lo], positions[hi - 1] + sizes[hi - 1], hi - lo, path,
                        aligned)
            bodies: list[Any] = []
            data = 0
            raw: Any = None
            for j in range(lo, hi):
                pos = positions[j] - aligned
                raw = view[pos + HEADER_SIZE : pos + sizes[j]]
                if codecs_[j] != codecs.NONE:
                    try:
                        raw = codecs.decompress(codecs_[j], raw, self.max_decompressed)
                    except CorruptRecordError as exc:
                        raise CorruptRecordError(
                            f"{path}: batch at byte {positions[j]}: {exc}") from None
                count = int(meta[j, 0])
                if count < 0 or 7 * count > len(raw):
                    raise CorruptRecordError(
                        f"{path}: batch at byte {positions[j]}: record count {count} cannot "
                        f"fit in {len(raw)} bytes")
                bodies.append(raw)
                data += len(raw)
            yield SectionChunk(bodies, np.ascontiguousarray(meta[lo:hi]).reshape(-1),
                               max(start, bases[lo]), min(end, lasts[hi - 1] + 1),
                               int(counts[lo:hi].sum()), data)
            bodies.clear()  # the caller is done with the chunk: no view may outlive the mapping
            raw = None
            lo = hi


def _segment_index(bases: list[int], offset: int) -> int:
    """Index of the last segment whose base offset is <= offset (-1 if none)."""
    lo, hi = 0, len(bases)
    while lo < hi:
        mid = (lo + hi) // 2
        if bases[mid] <= offset:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


def _index_lookup(fd: int, relative: int) -> tuple[int, int]:
    """(relative offset, position) of the largest valid entry with relative offset <= target,
    or (0, 0).  Valid entries are the prefix with a position above 0 (an entry always names a
    batch after the first ``index.interval.bytes``); the active segment's tail is zeros."""
    entries = os.fstat(fd).st_size // _INDEX_ENTRY.size

    def entry(slot: int) -> tuple[int, int]:
        raw = os.pread(fd, _INDEX_ENTRY.size, slot * _INDEX_ENTRY.size)
        if len(raw) < _INDEX_ENTRY.size:
            return 0, 0  # the file shrank (a rebuild): treat as the tail
        return _INDEX_ENTRY.unpack(raw)

    lo, hi = 0, entries  # find the first slot whose key is > relative (tail keys are infinite)
    while lo < hi:
        mid = (lo + hi) // 2
        rel, pos = entry(mid)
        if pos > 0 and rel <= relative:
            lo = mid + 1
        else:
            hi = mid
    return entry(lo - 1) if lo else (0, 0)


def _scan_until(view: memoryview, pos: int, size: int, start: int, end: int, path: str,
                aligned: int) -> tuple[np.ndarray, int]:
    """Headers (``_fast.COL_*`` table, file positions) of the batches from ``pos`` holding
    offsets in [start, end), without CRCs, and the mapped position after the last one.

    The walk stops at the first batch at or above ``end``: what follows may be mid-append."""
    cols = _fast.SCAN_COLUMNS
    out = np.empty(cols * _SCAN_ROWS, dtype=np.int64)
    tables = []
    stop = pos
    seen = start - 1  # the last offset walked so far
    while True:
        n, at, status, reason = _fast.scan_batches(view, pos, size, out, False, False)
        table = out[: n * cols].reshape(n, cols)
        past = np.flatnonzero(table[:, _fast.COL_BASE_OFFSET] >= end)
        if len(past):
            table = table[: past[0]]
        keep = table[table[:, _fast.COL_LAST_OFFSET] >= start]
        if len(keep):
            tables.append(keep.copy())
            stop = int(keep[-1, _fast.COL_POSITION] + keep[-1, _fast.COL_SIZE])
        if len(table):
            seen = int(table[-1, _fast.COL_LAST_OFFSET])
        if len(past) or status == _fast.SCAN_END:
            break
        if status != _fast.SCAN_FULL:
            if seen + 1 >= end:
                break  # the batches wanted are all there; what follows is being appended
            raise CorruptRecordError(
                f"{path}: invalid record batch at byte {aligned + at}: {reason}")
        pos = at
    if not tables:
        return np.empty((0, cols), dtype=np.int64), stop
    table = np.concatenate(tables) if len(tables) > 1 else tables[0]
    table[:, _fast.COL_POSITION] += aligned
    return table, stop + aligned


def _verify(view: memoryview, first: int, stop: int, count: int, path: str, aligned: int) -> None:
    """CRC-check the ``count`` batches in [first, stop) (file positions)."""
    out = np.empty(_fast.SCAN_COLUMNS * min(count, _SCAN_ROWS), dtype=np.int64)
    pos, end = first - aligned, stop - aligned
    while True:
        _, pos, status, reason = _fast.scan_batches(view, pos, end, out, True, False)
        if status == _fast.SCAN_END:
            return
        if status != _fast.SCAN_FULL:
            raise CorruptRecordError(f"{path}: invalid record batch at byte {aligned + pos}: "
                                     f"{reason}")
