"""One log segment: a ``.log`` file of record batches with its offset and time indexes.

Theory of operation (Kafka ``LogSegment``)
------------------------------------------
Batches are appended to the ``.log`` file with one ``pwritev`` per append: a rewritten 61-byte
header (base offset and leader epoch stamped; for LogAppendTime topics also attributes, max
timestamp and CRC) followed by the client's record bytes, untouched.  Appending with ``write``
rather than through a writable mmap means the file never has a zero-filled tail, running out of
disk is ``ENOSPC`` rather than ``SIGBUS`` (reliability.md §1.4), and a crash leaves at worst a torn
last batch, which recovery truncates.  Readers get ``FileSlice``s (sendfile) or map the file
read-only.

After every batch the indexes may grow (``_index_batch``): an offset index entry (lastOffset,
batch position) once more than ``index.interval.bytes`` were written since the previous entry, and
with it a time index entry (max timestamp so far, its offset).  Recovery runs the very same rule
over the batches it validates, so a rebuilt index equals the one the appends produced.

Reads translate an offset to a position with the index, then walk batch headers forward with a
windowed ``pread`` (``_headers``); they never decode records.

Lazy loading (Kafka's ``LazyIndex``).  A segment the loader trusts (below the recovery point, or
the last one after a clean shutdown) is opened with ``lazy=True``: only its ``.log`` descriptor.
Its indexes, their checks (``sanity_check``, a rebuild if they fail) and the state read from them
(max timestamp, bytes since the last index entry, the roll timer's base) are loaded by
``_load_lazily`` at the first access to any of those attributes, through ``__getattr__`` (called
only while an attribute is missing, so loaded segments pay nothing).  A start then reads almost
nothing per segment: a clean start with 50 GB of 1 GiB segments used to read ~2,000 scattered
headers per segment for the index checks (~0.17 s each with a cold cache).  The inactive segments
whose indexes are mapped are bounded (``index_mappings.py``): past the bound the least recently
used one unmaps them (``_release_indexes``) and maps them again, unchecked, at its next use.
"""

from __future__ import annotations

import logging
import mmap
import os
import time
from bisect import bisect_right
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from shmq import _fast
from shmq.errors import CorruptIndexError, CorruptRecordError
from shmq.protocol.records import RecordBatchView, scan_headers
from shmq.storage import disk, layout
from shmq.storage.descriptors import CACHE, open_with_retry
from shmq.storage.index_mappings import INDEXES
from shmq.storage.log_config import LogConfig
from shmq.storage.offset_index import OffsetIndex
from shmq.storage.recovery_point import RecoveryRecord
from shmq.storage.slices import FileHandle, FileSlice
from shmq.storage.time_index import TimeIndex

log = logging.getLogger(__name__)

HEADER_SIZE = _fast.HEADER_SIZE
_WINDOW = 64 * 1024
_FIRST_WINDOW = 8 * 1024   # an index entry is at most ~index.interval.bytes before the target
_IOV_MAX = 1024
_SCAN_ROWS = 512
# the large-segment sanity check reads one batch header per index entry up to this many entries,
# and an evenly spaced sample of this many beyond (a 1 GiB segment has ~260,000 entries: all of
# them cost ~0.2 s warm and a read of most of its pages cold, per segment, at every start)
_CHECK_ENTRIES = 1024
# the batch header fields an index entry is checked against (RecordBatch v2, big-endian)
_ENTRY_HEADER = np.dtype({"names": ["base", "length", "magic", "delta", "max_ts"],
                          "formats": [">i8", ">i4", "i1", ">i4", ">i8"],
                          "offsets": [0, 8, 16, 23, 35], "itemsize": HEADER_SIZE})
# what a lazy segment loads at first access (see "Lazy loading" above)
_LAZY = frozenset({"offset_index", "time_index", "max_timestamp_so_far", "offset_of_max_timestamp",
                   "bytes_since_last_index_entry", "rolling_base_timestamp"})


def _sample(n: int) -> np.ndarray:
    """Indexes of the entries ``_check_entries`` reads: all of ``n`` up to ``_CHECK_ENTRIES``,
    else that many evenly spaced, the first and the last included."""
    if n <= _CHECK_ENTRIES:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, _CHECK_ENTRIES).astype(np.int64))


class BatchHeader(NamedTuple):
    """What the read path needs from one batch header, plus its place in the file."""

    position: int
    base_offset: int
    last_offset: int
    max_timestamp: int
    size: int
    leader_epoch: int


class RecoveryResult(NamedTuple):
    truncated_bytes: int
    next_offset: int        # offset after the last valid batch (base offset if none)
    batches: np.ndarray     # SCAN_COLUMNS int64 per valid batch (for epoch and producer state)
    reason: str | None      # why recovery stopped early, if it did


class IndexPlan(NamedTuple):
    positions: np.ndarray       # per batch
    last_offsets: np.ndarray    # per batch
    running_max: np.ndarray     # per batch: max timestamp up to and including it
    max_offsets: np.ndarray     # per batch: last offset of the batch that set running_max
    events: np.ndarray          # batches that get an index entry
    bytes_since_last_entry: int


def index_plan(table: np.ndarray, interval: int, bytes_since: int = 0, prev_max: int = -1,
               prev_max_offset: int = -1) -> IndexPlan:
    """Which batches of a contiguous run get index entries: ``LogSegment._index_batch``'s rule
    over a whole scan table at once (recovery, and verifying an index against its log).

    An entry goes to batch i when the bytes since the last entry exceed the interval: the first
    i with B + pos_i - pos_0 > interval, then each next i with pos_i - pos_j > interval after an
    entry at j.  The time index gets (running max timestamp, last offset of the batch that set
    it) at each entry; the max only moves on a strictly larger timestamp.
    """
    n = len(table)
    pos, last, mts = table[:, 0], table[:, 2], table[:, 3]
    end = int(pos[-1] + table[-1, 4])
    running = np.maximum.accumulate(np.maximum(mts, prev_max))
    before = np.concatenate(([prev_max], running[:-1]))
    setter = np.maximum.accumulate(np.where(mts > before, np.arange(n), -1))
    max_offsets = np.where(setter >= 0, last[np.maximum(setter, 0)], prev_max_offset)
    # bisect on a list: one np.searchsorted call per event cost ~7 us, which with batches
    # larger than the interval (an event per batch) was a third of recovering 64 KiB batches
    positions = pos.tolist()
    events = []
    i = bisect_right(positions, interval - bytes_since + positions[0])
    while i < n:
        events.append(i)
        i = bisect_right(positions, positions[i] + interval, i + 1)
    since = end - int(pos[events[-1]]) if events else bytes_since + end - int(pos[0])
    return IndexPlan(pos, last, running, max_offsets, np.asarray(events, dtype=np.int64), since)


class LogSegment:
    """A ``.log`` / ``.index`` / ``.timeindex`` triple starting at ``base_offset``."""

    # set at construction, or by _load_lazily at the first access of a lazy segment
    offset_index: OffsetIndex
    time_index: TimeIndex
    max_timestamp_so_far: int
    offset_of_max_timestamp: int
    bytes_since_last_index_entry: int
    # LogSegment.rollingBasedTimestamp: the first batch's max timestamp
    rolling_base_timestamp: int | None
    # set at construction, or at first use for a segment the loader opened lazily
    log_path: Path
    _index_paths: tuple[Path, Path]
    size: int

    def __init__(self, directory: Path, base_offset: int, config: LogConfig, *,
                 active: bool, create: bool = False, lazy: bool = False,
                 lazy_indexes: bool = False) -> None:
        """``lazy_indexes`` (with ``create``): the index objects are made at their first use
        (the first append, or a lookup), in anonymous memory, and their files are created at
        the first flush, trim or close, or at ``index_file.DEFERRED_ENTRIES`` entries: a new
        partition costs its ``.log`` file only until then (Kafka creates them with the log and
        maps them at first use)."""
        self.directory = directory
        self.base_offset = base_offset
        self.config = config
        # the .log descriptor: opened now to create the file or read it at once, else at first
        # use; at most ``descriptors.CACHE.capacity`` segments hold one (see descriptors.py)
        self._handle: FileHandle | None = None
        if lazy and not create:
            pass  # its paths and size at first use (__getattr__): a log may have 100,000
        elif create and lazy_indexes:
            log_path = self.log_path
            # a new partition's first segment: created, then closed until its first use (a
            # topic of 10,000 partitions would hold 10,000 descriptors for empty files)
            flags = os.O_RDWR | os.O_CLOEXEC | os.O_CREAT | os.O_EXCL
            os.close(open_with_retry(lambda: os.open(log_path, flags, 0o600)))
            self.size = 0
        else:
            log_path = self.log_path
            flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT | os.O_EXCL if create else 0)
            fd = open_with_retry(lambda: os.open(log_path, flags, 0o600))
            self._handle = FileHandle(fd, str(log_path))
            self.size = os.fstat(fd).st_size
            CACHE.opened(self)
        self.active = active
        self.next_offset = base_offset      # set by the loader / appends
        self.created_ms = int(time.time() * 1000)
        self.rebuilt = False                # its indexes were rebuilt since it was opened
        # a new, empty segment whose index files do not exist yet (``lazy_indexes``): its state
        # is known (empty), only the index objects are made at first access
        self._fresh = create and lazy_indexes
        self._released = False              # indexes checked, then unmapped (index_mappings)
        self._lazy = (lazy and not create) or self._fresh
        self._unchecked = False             # kept index entries still to check (defer_check)
        if not self._lazy or self._fresh:
            if not self._fresh:
                self._open_indexes(writable=active)
            self.max_timestamp_so_far = -1
            self.offset_of_max_timestamp = base_offset
            self.bytes_since_last_index_entry = 0
            self.rolling_base_timestamp = None

    @property
    def handle(self) -> FileHandle:
        """The ``.log`` file's descriptor, reopened if the cache closed it; keep the handle (not
        just its ``fd``) while using the descriptor: it stays open while referenced."""
        handle = self._handle
        if handle is None:
            return self._reopen()
        CACHE.touch(self)
        return handle

    @handle.setter
    def handle(self, value: FileHandle) -> None:
        self._handle = value
        CACHE.forget(self)

    def _reopen(self) -> FileHandle:
        fd = open_with_retry(lambda: os.open(self.log_path, os.O_RDWR | os.O_CLOEXEC))
        handle = FileHandle(fd, str(self.log_path))
        self._handle = handle
        CACHE.opened(self)
        return handle

    def _release_handle(self) -> None:
        """Evicted from the descriptor cache: the file closes once no slice holds it."""
        self._handle = None

    @property
    def has_descriptor(self) -> bool:
        return self._handle is not None and self._handle.fd >= 0

    def __getattr__(self, name: str) -> object:
        # only called for a missing attribute: the lazily loaded ones of a lazy segment, and
        # the paths and size of a segment the loader opened lazily (set at first use: opening a
        # log of 100,000 segments spent 5 of its 7 s making paths and stat-ing files)
        if name in _LAZY and self.__dict__.get("_lazy"):
            self._load_lazily()
            return self.__dict__[name]
        if name == "size" and "directory" in self.__dict__:
            self.size = os.stat(self.log_path).st_size
            return self.size
        if name == "log_path" and "directory" in self.__dict__:
            self.log_path = path = self.directory / (layout.filename_prefix(self.base_offset)
                                                     + layout.LOG_SUFFIX)
            return path
        if name == "_index_paths" and "directory" in self.__dict__:
            _, index_path, time_path = layout.segment_paths(self.directory, self.base_offset)
            self._index_paths = paths = (index_path, time_path)
            return paths
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def unwritten(self) -> bool:
        """Nothing was ever appended to this segment and its index files do not exist: a new
        log's first segment (``lazy_indexes``), or one the loader found so (``adopt_unwritten``).
        Its close creates no file, and nothing needs a recovery record for it."""
        if self._fresh:
            return True
        if self._lazy or self.size:
            return False
        indexes = self._opened_indexes()
        return len(indexes) == 2 and all(i.deferred and i.entries == 0 for i in indexes)

    def adopt_unwritten(self) -> None:
        """The loader's last segment, empty and without index files (a clean close leaves a
        log never written so): what ``lazy_indexes`` makes of a new one, without creating its
        ``.log`` (it exists) or reading anything."""
        self.__dict__.pop("offset_index", None)
        self.__dict__.pop("time_index", None)
        self.size = 0
        self._fresh = self._lazy = True
        self._released = self._unchecked = False
        self.next_offset = self.base_offset
        self.max_timestamp_so_far = -1
        self.offset_of_max_timestamp = self.base_offset
        self.bytes_since_last_index_entry = 0
        self.rolling_base_timestamp = None

    @property
    def loaded(self) -> bool:
        """False until a lazy segment's indexes are loaded and checked (a new segment whose
        index files are not created yet counts as loaded: its state is known)."""
        return not self._lazy or self._fresh or self._released

    def _entries(self) -> tuple[int, int]:
        """(offset, time) index entries, without creating the index files of a new segment."""
        if self._fresh:
            return 0, 0
        return self.offset_index.entries, self.time_index.entries

    def _open_indexes(self, *, writable: bool, deferred: bool = False) -> None:
        index_path, time_path = self._index_paths
        bytes_ = self.config.segment_index_bytes
        self.offset_index = OffsetIndex(index_path, self.base_offset, bytes_, writable=writable,
                                        deferred=deferred)
        self.time_index = TimeIndex(time_path, self.base_offset, bytes_, writable=writable,
                                    deferred=deferred)
        if not writable:
            INDEXES.opened(self)

    def adopt_tail(self, record: RecoveryRecord) -> None:
        """The last segment after an unclean shutdown, when its (checked) recovery record names
        its exact end: nothing to validate.  The indexes are mapped writable with the recorded
        entry counts (a crash leaves them preallocated) and the state is the record's, which is
        what ``recover(resume=record)`` would leave, without cutting, trimming and regrowing
        both files (six ftruncates: 58 % of an unclean start's time per log).  The kept entries
        get the clean start's check at the first read, as after a resumed recovery."""
        self._lazy = self._fresh = self._released = False
        self.active = True
        index_path, time_path = self._index_paths
        size = self.config.segment_index_bytes
        self.offset_index = OffsetIndex(index_path, self.base_offset, size, writable=True,
                                        entries=record.offset_index_entries)
        self.time_index = TimeIndex(time_path, self.base_offset, size, writable=True,
                                    entries=record.time_index_entries)
        self.max_timestamp_so_far = record.max_timestamp
        self.offset_of_max_timestamp = record.offset_of_max_timestamp
        self.bytes_since_last_index_entry = record.bytes_since_index_entry
        self.next_offset = record.offset
        self._load_rolling_base()
        self.append_final_time_entry()  # as recover() leaves the time index
        self.defer_check()

    def _release_indexes(self) -> bool:
        """Unmap the indexes of an inactive segment (``index_mappings.py``); they are mapped
        again, without the first load's checks, at the next use.  False if it cannot now."""
        indexes = self._opened_indexes()
        if self.active or self._lazy or any(i.writable or i.rebuilding for i in indexes):
            return False
        for index in indexes:
            index.flush()  # what a flush of this segment would have written back
        for index in indexes:
            try:
                index.close()
            except BufferError:  # a view of it is alive: unmapped when that goes
                pass
        self.__dict__.pop("offset_index", None)
        self.__dict__.pop("time_index", None)
        self._lazy = self._released = True
        return True

    def _opened_indexes(self) -> tuple[OffsetIndex | TimeIndex, ...]:
        """The index objects that exist (none for a lazy segment not loaded yet)."""
        return tuple(i for i in (self.__dict__.get("offset_index"), self.__dict__.get("time_index"))
                     if i is not None)

    def ensure_loaded(self) -> None:
        """Load a lazy segment now (its indexes checked, and rebuilt if they fail)."""
        if self._lazy:
            self._load_lazily()
        self._ensure_checked()

    def defer_check(self) -> None:
        """Check the indexes (``sanity_check``) at the first read rather than now: recovery
        resumed in this segment and kept its entries below the recovery point unchecked.  The
        check reads ~2,000 scattered batch headers of a large segment: ~0.2 s per 1 GiB segment
        with a cold cache, which a restart would pay for every partition.  Appends do not read
        the kept entries and do not wait for it."""
        self._unchecked = True

    def _ensure_checked(self) -> None:
        if not self._unchecked:
            return
        self._unchecked = False
        problem = self.verify_indexes()
        if problem is not None:
            log.warning("rebuilding indexes of %s: %s", self.log_path, problem)
            expected = self.next_offset
            result = self.recover(truncate=False)
            if result.reason or result.next_offset != expected:
                log.error("segment %s is corrupt: %s; its batches from offset %d on cannot be "
                          "read", self.log_path, result.reason or "offsets end early",
                          result.next_offset)
            self.next_offset = expected
            if self.active:
                self.make_active()

    def verify_indexes(self) -> str | None:
        """``sanity_check`` of loaded indexes: what is wrong with them, or None."""
        try:
            self.sanity_check()
        except (CorruptIndexError, FileNotFoundError) as exc:
            return str(exc)  # the caller recovers outside the handler: a traceback pins buffers
        return None

    def check_indexes(self) -> str | None:
        """Open the indexes, check them (``sanity_check``) and read the tail state from them,
        next offset included: what is wrong with them, or None."""
        self._lazy = self._fresh = self._released = False
        self._open_indexes(writable=False)
        try:
            self.sanity_check()
            self.load_tail_state()
        except (CorruptIndexError, FileNotFoundError) as exc:
            return str(exc)  # the caller recovers outside the handler: a traceback pins buffers
        return None

    def _load_lazily(self) -> None:
        """The checks a clean start used to make for every segment (``check_indexes``; the last
        batch ending where the loader expects), made at first use.  A new segment only creates
        its (preallocated, sparse) index files."""
        if self._fresh:  # their files at the first flush, trim or ~1 MiB (index_file.py)
            self._open_indexes(writable=self.active, deferred=self.active)
            self._fresh = self._lazy = False
            return
        if self._released:  # checked at its first load: map the indexes again
            self._open_indexes(writable=False)
            self._released = self._lazy = False
            if self.active:
                self.make_active()
            return
        expected = self.next_offset
        problem = self.check_indexes()
        if problem is None and self.next_offset != expected:
            problem = f"the last batch ends at offset {self.next_offset}, not {expected}"
        if problem is not None:
            log.warning("rebuilding indexes of %s: %s", self.log_path, problem)
            self.next_offset = expected
            result = self.recover(truncate=False)
            if result.reason or result.next_offset != expected:
                log.error("segment %s is corrupt at rest: %s; its batches from offset %d on "
                          "cannot be read", self.log_path, result.reason or "offsets end early",
                          result.next_offset)
            self.next_offset = expected
        if self.active:
            self.make_active()

    # -- appending ----------------------------------------------------------------------------

    def should_roll(self, incoming_bytes: int, incoming_batches: int, max_timestamp: int,
                    now_ms: int, last_offset: int) -> bool:
        """Kafka's ``LogSegment.shouldRoll``: size, age, full indexes, relative offset overflow.

        Age is measured in record time when the segment has a timestamped first batch
        (``timeWaitedForRoll``: incoming max timestamp - first batch's max timestamp), otherwise
        in wall-clock time since the segment was created or loaded.
        """
        if self.size == 0:
            return False
        if self.size > self.config.segment_bytes - incoming_bytes:
            return True
        base = self.rolling_base_timestamp
        waited = max_timestamp - base if base is not None and base >= 0 else now_ms - self.created_ms
        if waited > self.config.segment_ms:
            return True
        # room for one index entry per incoming batch keeps a multi-batch append all-or-nothing
        if (self.offset_index.entries + incoming_batches > self.offset_index.max_entries
                or self.time_index.entries + incoming_batches > self.time_index.max_entries):
            return True
        return last_offset - self.base_offset > 0x7FFFFFFF

    def append(self, iov: list, batches: list[tuple[int, int, int, int]],
               total: int = -1) -> None:
        """Write ``iov`` at the end of the log; ``batches`` = (position, last, max ts, size);
        ``total``: the sum of their sizes, if the caller knows it.

        ``iov`` must hold exactly the batches' bytes.  Up to ``_IOV_MAX`` buffers (every produce)
        go out in one ``pwritev`` whose expected length is the batches' total, so the buffers'
        lengths are only summed when a write comes back short."""
        start = self.size
        handle = self.handle  # held while its descriptor is in use
        fd = handle.fd
        if total < 0:
            total = 0
            for b in batches:
                total += b[3]
        # room for the index entries first: a full disk is ENOSPC here, before any byte is
        # written, never SIGBUS from a store into the mapped index (index_file.py)
        self.offset_index.reserve(len(batches))
        self.time_index.reserve(len(batches) + 1)
        try:
            if len(iov) <= _IOV_MAX:
                n = os.pwritev(fd, iov, start)
                if n != total:
                    self._finish_write(iov, n, start, total)
            else:
                written = 0
                for i in range(0, len(iov), _IOV_MAX):
                    chunk = iov[i : i + _IOV_MAX]
                    want = sum(len(v) for v in chunk)
                    n = os.pwritev(fd, chunk, start + written)
                    if n != want:
                        self._finish_write(chunk, n, start + written, want)
                    written += want
                assert written == total
        except OSError:
            os.ftruncate(fd, start)  # never leave half a batch behind
            raise
        if self.rolling_base_timestamp is None:
            self.rolling_base_timestamp = batches[0][2]
        index_batch = self._index_batch
        for position, last_offset, max_ts, size in batches:
            index_batch(position, last_offset, max_ts, size)
        self.size = start + total
        self.next_offset = batches[-1][1] + 1

    def append_one(self, buf: Any, pos: int, size: int, base_offset: int, leader_epoch: int,
                   last_offset: int, max_ts: int) -> None:
        """``append`` of one batch as the client sent it (``buf[pos:pos + size]``), stamped
        with ``base_offset`` and ``leader_epoch`` as it is written (``_fast.write_stamped``):
        the produce path's usual case, without the iovec and per-batch lists."""
        start = self.size
        handle = self.handle  # held while its descriptor is in use
        fd = handle.fd
        self.offset_index.reserve(1)  # room for the index entries first, as ``append``
        self.time_index.reserve(2)
        try:
            _fast.write_stamped(fd, start, buf, pos, size, base_offset, leader_epoch)
        except OSError:
            os.ftruncate(fd, start)  # never leave half a batch behind
            raise
        if self.rolling_base_timestamp is None:
            self.rolling_base_timestamp = max_ts
        self._index_batch(start, last_offset, max_ts, size)
        self.size = start + size
        self.next_offset = last_offset + 1

    def _finish_write(self, iov: list, n: int, position: int, want: int) -> None:
        """A short ``pwritev`` of ``iov`` at ``position``: write the rest byte-exactly."""
        data = b"".join(bytes(v) for v in iov)
        assert len(data) == want, "iovec and batch sizes disagree"
        while n < want:
            handle = self.handle
            n += os.pwrite(handle.fd, data[n:], position + n)

    def _index_batch(self, position: int, last_offset: int, max_ts: int, size: int) -> None:
        """The one indexing rule, shared by append and recovery (``LogSegment.append``)."""
        if max_ts > self.max_timestamp_so_far:
            self.max_timestamp_so_far = max_ts
            self.offset_of_max_timestamp = last_offset
        since = self.bytes_since_last_index_entry
        if since > self.config.index_interval_bytes:
            # a full index only happens inside one multi-batch append (should_roll leaves room
            # otherwise); the index is sparse, so skipping an entry costs a longer scan, no more
            index = self.offset_index
            if index.entries < index.max_entries:
                index.append(last_offset, position)
            time_index = self.time_index
            if time_index.entries < time_index.max_entries:
                time_index.maybe_append(self.max_timestamp_so_far, self.offset_of_max_timestamp)
            since = 0
        self.bytes_since_last_index_entry = since + size

    def _index_table(self, table: np.ndarray) -> None:
        """``_index_batch`` over a table of contiguous batches at once (recovery)."""
        if len(table) == 0:
            return
        plan = index_plan(table, self.config.index_interval_bytes,
                          self.bytes_since_last_index_entry, self.max_timestamp_so_far,
                          self.offset_of_max_timestamp)
        ev = plan.events
        self.offset_index.append_many(plan.last_offsets[ev], plan.positions[ev])
        self.time_index.append_many(plan.running_max[ev], plan.max_offsets[ev])
        self.bytes_since_last_index_entry = plan.bytes_since_last_entry
        self.max_timestamp_so_far = int(plan.running_max[-1])
        self.offset_of_max_timestamp = int(plan.max_offsets[-1])

    # -- reading ------------------------------------------------------------------------------

    def _headers(self, start: int, end: int) -> Iterator[BatchHeader]:
        """Batch headers from byte ``start`` up to ``end``, read in windows (no CRC check)."""
        out = np.empty(_fast.SCAN_COLUMNS * _SCAN_ROWS, dtype=np.int64)
        pos = start
        handle = self.handle  # held while its descriptor is in use
        fd = handle.fd
        window = _FIRST_WINDOW
        while pos < end:
            buf = os.pread(fd, min(window, end - pos), pos)
            window = _WINDOW
            if len(buf) < 17:
                return
            n, stop, status, _ = _fast.scan_batches(buf, 0, len(buf), out, False, False)
            for i in range(n):
                r = out[i * _fast.SCAN_COLUMNS : (i + 1) * _fast.SCAN_COLUMNS]
                yield BatchHeader(pos + int(r[0]), int(r[1]), int(r[2]), int(r[3]), int(r[4]),
                                  int(r[5]))
            pos += stop
            if status == _fast.SCAN_CORRUPT:
                return
            if status == _fast.SCAN_PARTIAL:
                if len(buf) - stop < HEADER_SIZE:
                    if stop == 0:
                        return  # a header cut by `end` or by the end of the file
                    continue  # the next window starts at this header
                h = _fast.batch_header(buf, stop)
                size = h[1] + 12
                if pos + size > end:
                    return
                yield BatchHeader(pos, h[0], h[0] + h[6], h[8], size, h[2])
                pos += size

    def translate_offset(self, offset: int, start_position: int = 0,
                         end_position: int | None = None, *,
                         checked: bool = True) -> BatchHeader | None:
        """The first batch whose lastOffset >= ``offset`` (the one containing it), or None.

        ``checked=False`` skips a deferred index check (``defer_check``); the caller must
        verify what it gets."""
        if checked and self._unchecked:
            self._ensure_checked()
        if not self.active:
            INDEXES.touch(self)
        _, pos = self.offset_index.lookup(offset)
        end = self.size if end_position is None else end_position
        pos = max(pos, start_position)
        if end - pos >= HEADER_SIZE:
            # the batch at the index entry first, from its header alone: it holds ``offset``
            # whenever the read starts at an indexed batch (every read from a segment's start,
            # as a consumer's first of each partition): one 61-byte pread and no window to scan
            # (12.3 -> 7.5 us a read of a 200-record partition from offset 0)
            handle = self.handle
            buf = os.pread(handle.fd, HEADER_SIZE, pos)
            if len(buf) == HEADER_SIZE:
                h = _fast.batch_header(buf, 0)
                size = h[1] + 12
                last = h[0] + h[6]
                if last >= offset and h[3] == 2 and HEADER_SIZE <= size <= end - pos:
                    return BatchHeader(pos, h[0], last, h[8], size, h[2])
        for header in self._headers(pos, end):
            if header.last_offset >= offset:
                return header
        return None

    def read(self, offset: int, max_bytes: int, max_position: int | None = None,
             min_one_batch: bool = True) -> FileSlice | None:
        """Whole batches from the one containing ``offset``, at most ``max_bytes`` of them.

        ``max_position`` bounds the read (the high watermark's position); with
        ``min_one_batch`` the first batch is returned whole even when larger than ``max_bytes``
        (KIP-74), otherwise a consumer with a small fetch size would stall.
        """
        bound = self.size if max_position is None else min(max_position, self.size)
        first = self.translate_offset(offset, end_position=bound)
        if first is None:
            return None
        start = first.position
        limit = start + max_bytes
        if limit >= bound:
            end = bound
        elif first.size > max_bytes:
            # KIP-74: the first batch whole; without min_one_batch an empty slice (not None:
            # the caller must not move on to later offsets)
            end = start + first.size if min_one_batch else start
        else:
            # last batch boundary <= limit: every batch before the index entry at or below the
            # limit fits; walk forward from there
            _, from_pos = self.offset_index.lookup_position(limit)
            end = max(start + first.size, from_pos)
            for header in self._headers(end, bound):
                if header.position + header.size > limit:
                    break
                end = header.position + header.size
        return FileSlice(self.handle, start, end - start)

    def last_offset_before(self, position: int, start: int = 0) -> int | None:
        """The last offset of the batches from byte ``start`` (a batch boundary) that end
        exactly at byte ``position``: ``base_offset - 1`` when both are 0, None when no batch
        ends there."""
        last = self.base_offset - 1 if start == 0 else None
        end = start
        for header in self._headers(start, position):
            last, end = header.last_offset, header.position + header.size
        return last if end == position else None

    def read_bytes(self, position: int, length: int) -> bytes:
        handle = self.handle
        return os.pread(handle.fd, length, position)

    def scan_headers_from(self, position: int) -> np.ndarray:
        """The header table (``scan_headers``, no CRC check) of the batches from ``position`` to
        the end, through a mapping of that range only: replaying producer state read (copied)
        the whole rest of the segment before."""
        if position >= self.size:
            return np.empty((0, _fast.SCAN_COLUMNS), dtype=np.int64)
        mapped_from = position - position % mmap.ALLOCATIONGRANULARITY
        handle = self.handle
        with mmap.mmap(handle.fd, self.size - mapped_from, access=mmap.ACCESS_READ,
                       offset=mapped_from) as mm:
            with memoryview(mm) as view:
                table = scan_headers(view, position - mapped_from, verify_crc=False)
        table[:, _fast.COL_POSITION] += mapped_from
        return table

    def find_offset_by_timestamp(self, timestamp: int,
                                 starting_offset: int) -> tuple[int, int, int] | None:
        """(offset, timestamp, leader epoch of its batch) of the first record with ts >=
        ``timestamp`` and offset >= start (``LogSegment.findOffsetByTimestamp``)."""
        if self._unchecked:
            self._ensure_checked()
        if not self.active:
            INDEXES.touch(self)
        _, ts_offset = self.time_index.lookup(timestamp)
        _, pos = self.offset_index.lookup(max(ts_offset, starting_offset))
        for header in self._headers(pos, self.size):
            if header.max_timestamp >= timestamp and header.last_offset >= starting_offset:
                batch = RecordBatchView(self.read_bytes(header.position, header.size))
                for rec in batch.records():
                    if rec.timestamp >= timestamp and rec.offset >= starting_offset:
                        return rec.offset, rec.timestamp, header.leader_epoch
        return None

    def find_max_timestamp(self) -> tuple[int, int, int] | None:
        """(offset, timestamp, leader epoch) of the first record carrying the segment's largest
        timestamp (KIP-734, ``UnifiedLog.fetchOffsetByTimestamp(MAX_TIMESTAMP)``): the first
        batch whose maxTimestamp equals it, then its first record with that timestamp.  When no
        batch has a timestamp (all -1) that is the segment's first record, as in Kafka (its
        maxTimestampSoFar is then -1 at the base offset); None for an empty segment or a batch
        whose records do not carry its maxTimestamp."""
        target = self.max_timestamp_so_far
        start = 0
        if target >= 0:
            header = self.translate_offset(self.offset_of_max_timestamp)
            start = header.position if header is not None else 0
        for header in self._headers(start, self.size):
            if header.max_timestamp != target:
                continue
            batch = RecordBatchView(self.read_bytes(header.position, header.size))
            for rec in batch.records():
                if rec.timestamp == target:
                    return rec.offset, rec.timestamp, header.leader_epoch
            return None
        return None

    @property
    def last_modified_ms(self) -> int:
        """The ``.log`` file's mtime (Kafka's ``LogSegment.lastModified``)."""
        handle = self.handle
        return os.fstat(handle.fd).st_mtime_ns // 1_000_000

    @property
    def largest_timestamp(self) -> int:
        """Max record timestamp, or the file's mtime when no batch has one (retention)."""
        if self.max_timestamp_so_far >= 0:
            return self.max_timestamp_so_far
        return int(os.stat(self.log_path).st_mtime * 1000)

    # -- recovery -----------------------------------------------------------------------------

    def load_tail_state(self) -> None:
        """For a segment loaded without recovery: next offset, max timestamp (Kafka's
        ``readLargestTimestamp``: the last time index entry, then every batch after it), the
        byte count since the last index entry, and the roll timer's base."""
        ts, ts_offset = self.time_index.last_entry
        entry_off, entry_pos = self.offset_index.last_entry
        _, ts_pos = self.offset_index.lookup(ts_offset)
        self.max_timestamp_so_far, self.offset_of_max_timestamp = ts, ts_offset
        last: BatchHeader | None = None
        for header in self._headers(min(ts_pos, entry_pos), self.size):
            last = header
            if header.max_timestamp > self.max_timestamp_so_far:
                self.max_timestamp_so_far = header.max_timestamp
                self.offset_of_max_timestamp = header.last_offset
        self.next_offset = last.last_offset + 1 if last else self.base_offset
        self.bytes_since_last_index_entry = (
            self.size - entry_pos if self.offset_index.entries else self.size)
        self._load_rolling_base()

    def _load_rolling_base(self) -> None:
        handle = self.handle
        head = os.pread(handle.fd, HEADER_SIZE, 0) if self.size >= HEADER_SIZE else b""
        self.rolling_base_timestamp = _fast.batch_header(head)[8] if head else None

    def recover(self, *, min_leader_epoch: int = -1, resume: RecoveryRecord | None = None,
                truncate: bool = True) -> RecoveryResult:
        """Validate every batch (size, magic, CRC, contiguous offsets, epochs that never go
        back), rebuild both indexes, and truncate the file at the first invalid or partial batch.

        With ``resume`` (a recovery record of this segment, checked by the loader) only the bytes
        from its position on are validated: the indexes keep their entries below it and go on
        from the state it recorded, as appends would have.  ``truncate=False`` (a lazy segment
        whose indexes failed their checks) rebuilds the indexes and leaves the file alone.

        Stricter than Kafka on one point: batch base offsets must follow each other without gaps
        (shmq never compacts), because baseOffset is not covered by the CRC.
        """
        self._lazy = self._fresh = self._released = False
        if not self._opened_indexes():
            self._open_indexes(writable=False)
        self.rebuilt = resume is None
        start, expected, epoch = 0, self.base_offset, min_leader_epoch
        if resume is None:
            self.offset_index.begin_rebuild()
            self.time_index.begin_rebuild()
            self.max_timestamp_so_far = -1
            self.offset_of_max_timestamp = self.base_offset
            self.bytes_since_last_index_entry = 0
        else:
            self.offset_index.begin_rebuild(keep=resume.offset_index_entries)
            self.time_index.begin_rebuild(keep=resume.time_index_entries)
            self.max_timestamp_so_far = resume.max_timestamp
            self.offset_of_max_timestamp = resume.offset_of_max_timestamp
            self.bytes_since_last_index_entry = resume.bytes_since_index_entry
            start, expected = resume.position, resume.offset
            epoch = max(epoch, resume.leader_epoch)
        handle = self.handle
        size = os.fstat(handle.fd).st_size
        rows: list[np.ndarray] = []
        valid, reason = start, None
        cols = _fast.SCAN_COLUMNS
        if size > start:
            # map from the page holding `start` (an mmap offset is page aligned); MAP_POPULATE:
            # one pass over the page tables instead of a fault per 4 KiB page
            mapped_from = start - start % mmap.ALLOCATIONGRANULARITY
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            handle = self.handle
            with mmap.mmap(handle.fd, size - mapped_from, flags=flags, prot=mmap.PROT_READ,
                           offset=mapped_from) as mm:
                view = memoryview(mm)
                out = np.empty(cols * 4096, dtype=np.int64)
                pos, end = start - mapped_from, size - mapped_from
                try:
                    while True:
                        n, stop, status, why = _fast.scan_batches(view, pos, end, out, True, False)
                        table = out[: n * cols].reshape(n, cols)
                        table[:, _fast.COL_POSITION] += mapped_from  # file positions
                        bad = self._first_bad_row(table, expected, epoch)
                        if bad < n:
                            table = table[:bad]
                            reason = "batch offsets or leader epochs are out of sequence"
                        self._index_table(table)
                        if len(table):
                            expected = int(table[-1, 2]) + 1
                            epoch = max(epoch, int(table[:, 5].max()))
                            valid = int(table[-1, 0] + table[-1, 4])
                            rows.append(table.copy())
                        if bad < n or status != _fast.SCAN_FULL:
                            if status in (_fast.SCAN_PARTIAL, _fast.SCAN_CORRUPT) and bad == n:
                                reason = why
                            break
                        pos = stop
                finally:
                    view.release()
        truncated = size - valid
        if truncated and truncate:
            handle = self.handle
            os.ftruncate(handle.fd, valid)
        self.size = valid
        self.next_offset = expected
        if start:
            self._load_rolling_base()
        else:
            self.rolling_base_timestamp = int(rows[0][0, 3]) if rows else None
        self.append_final_time_entry()
        self.offset_index.seal()
        self.time_index.seal()
        batches = np.concatenate(rows) if rows else np.empty((0, cols), dtype=np.int64)
        return RecoveryResult(truncated, expected, batches, reason)

    def recovery_record(self, leader_epoch: int, first_unstable: int) -> RecoveryRecord:
        """Where recovery may start if everything below this segment's end is durable, its
        index entries included (taken under the log's lock, written once the checkpoint's
        fdatasync and msyncs are done: ``PartitionLog.flush``);
        ``first_unstable``: the log's first unstable offset there (-1: none)."""
        offset_entries, time_entries = self._entries()
        return RecoveryRecord(self.next_offset, self.base_offset, self.size,
                              offset_entries, time_entries,
                              self.bytes_since_last_index_entry, leader_epoch,
                              self.max_timestamp_so_far, self.offset_of_max_timestamp,
                              first_unstable)

    def _first_bad_row(self, table: np.ndarray, expected: int, epoch: int) -> int:
        """Index of the first batch breaking offset continuity or epoch order (len if none)."""
        n = len(table)
        if n == 0:
            return 0
        base, last, epochs = table[:, 1], table[:, 2], table[:, 5]
        prev_next = np.empty(n, dtype=np.int64)
        prev_next[0] = expected
        prev_next[1:] = last[:-1] + 1
        ok = base == prev_next
        ok &= (last - self.base_offset) <= 0x7FFFFFFF
        prev_epoch = np.empty(n, dtype=np.int64)
        prev_epoch[0] = epoch
        prev_epoch[1:] = np.maximum.accumulate(epochs)[:-1]
        ok &= epochs >= prev_epoch
        bad = np.flatnonzero(~ok)
        return int(bad[0]) if len(bad) else n

    def sanity_check(self, verify_bytes: int = 16 << 20) -> None:
        """Raise CorruptIndexError (or FileNotFoundError) when the indexes cannot be trusted.

        Always: entries in order and inside the log.  For segments up to ``verify_bytes`` (one
        header scan, no CRC) every entry is checked against the log: the offset index must be
        exactly what the indexing rule gives, and each time index entry a (running max
        timestamp, offset of the batch that set it) pair (a clean close may add such pairs
        mid-segment, as Kafka's does).  Larger segments are not scanned, but the entries of both
        indexes are still checked against the one batch header each names (``_check_entries``;
        all of them up to ``_CHECK_ENTRIES``, an evenly spaced sample beyond): order checks alone
        keep an entry garbled to another in-order value, which then misleads reads and timestamp
        lookups until the next rebuild.  (Kafka checks only the order and the last entries.)
        """
        for index in (self.offset_index, self.time_index):
            if index.missing:
                raise FileNotFoundError(index.path)
            if index.misaligned:  # cut, or grown by a torn write: not what append leaves
                raise CorruptIndexError(f"index {index.path} is not a whole number of entries")
        self.offset_index.sanity_check(self.size)
        if self.size <= verify_bytes:
            self._verify_indexes()
            return
        entry_off, entry_pos = self.offset_index.last_entry
        last: BatchHeader | None = None
        for header in self._headers(entry_pos, self.size):
            if last is None and self.offset_index.entries and header.last_offset != entry_off:
                raise CorruptIndexError(f"{self.offset_index.path}: last entry names no batch")
            last = header
        last_offset = last.last_offset if last is not None else self.base_offset - 1
        self.time_index.sanity_check(last_offset)
        self._check_entries()

    def _headers_at(self, positions: np.ndarray) -> np.ndarray:
        """The ``_ENTRY_HEADER`` fields of the batches starting at ``positions`` (each with a
        whole header inside the log), one ``preadv`` each straight into the result (a mapping of
        the segment cost ~10 ms to set up and tear down for 1,024 headers of a 90 MB one)."""
        out = np.empty(len(positions), dtype=_ENTRY_HEADER)
        raw = memoryview(out.view(np.uint8).reshape(-1).data)
        handle = self.handle  # held while its descriptor is in use
        fd = handle.fd
        for i, pos in enumerate(positions.tolist()):
            slot = i * HEADER_SIZE
            if os.preadv(fd, [raw[slot : slot + HEADER_SIZE]], pos) != HEADER_SIZE:
                raise CorruptIndexError(f"{self.log_path}: no batch header at byte {pos}")
        return out

    def _check_entries(self) -> None:
        """The index entries against the batches they name, without scanning the log (the
        large-segment path; orders and bounds were checked before): every entry up to
        ``_CHECK_ENTRIES`` per index, an evenly spaced sample (first and last included) beyond.

        An offset index entry (O, P) must name the batch starting at byte P, ending at offset O.
        A time index entry (T, O) must name the batch ending at offset O, whose max timestamp is
        T: found through the offset index entry for O (the usual case, both are written at the
        same index event) or else by a short header walk from the entry below O.
        """
        oi, ti = self.offset_index, self.time_index
        offsets = positions = np.empty(0, dtype=np.int64)
        if oi.entries:
            with memoryview(oi.buffer) as view:
                table = np.frombuffer(view, dtype=">i4", count=oi.entries * 2).reshape(-1, 2)
                offsets = table[:, 0].astype(np.int64) + self.base_offset
                positions = table[:, 1].astype(np.int64)
                del table  # no view of the mapping may outlive this block
            pick = _sample(len(offsets))
            at, named = positions[pick], offsets[pick]
            if at[-1] > self.size - HEADER_SIZE:
                raise CorruptIndexError(f"{oi.path}: last entry names no batch")
            h = self._headers_at(at)
            base, length = h["base"].astype(np.int64), h["length"].astype(np.int64)
            ends = at + length + 12
            if (np.any(h["magic"] != 2) or np.any(length < HEADER_SIZE - 12)
                    or np.any(base < self.base_offset) or np.any(h["delta"] < 0)
                    or np.any(base + h["delta"] != named) or ends[-1] > self.size
                    or np.any(ends[:-1] > at[1:])):
                raise CorruptIndexError(f"{oi.path}: an entry names no batch of its log")
        if not ti.entries:
            return
        with memoryview(ti.buffer) as view:
            ttable = np.frombuffer(view, dtype=np.dtype([("ts", ">i8"), ("rel", ">i4")]),
                                   count=ti.entries)
            ts = ttable["ts"].astype(np.int64)
            toffs = ttable["rel"].astype(np.int64) + self.base_offset
            del ttable
        pick = _sample(len(ts))
        ts, toffs = ts[pick], toffs[pick]
        slot = np.minimum(np.searchsorted(offsets, toffs), max(len(offsets) - 1, 0))
        found = (offsets[slot] == toffs) if len(offsets) else np.zeros(len(toffs), dtype=bool)
        if np.any(found):
            h = self._headers_at(positions[slot[found]])
            if np.any(h["max_ts"].astype(np.int64) != ts[found]):
                raise CorruptIndexError(f"{ti.path}: an entry is no (max timestamp, offset) pair "
                                        "of the batch it names")
        for t, off in zip(ts[~found].tolist(), toffs[~found].tolist(), strict=True):
            named_batch = self.translate_offset(off)
            if (named_batch is None or named_batch.last_offset != off
                    or named_batch.max_timestamp != t):
                raise CorruptIndexError(f"{ti.path}: entry ({t}, {off}) names no batch")

    def _verify_indexes(self) -> None:
        table = np.empty((0, _fast.SCAN_COLUMNS), dtype=np.int64)
        if self.size:
            handle = self.handle
            with mmap.mmap(handle.fd, self.size, access=mmap.ACCESS_READ) as mm:
                with memoryview(mm) as view:
                    try:
                        table = scan_headers(view, verify_crc=False)
                    except CorruptRecordError as exc:
                        raise CorruptIndexError(f"{self.log_path}: {exc}") from None
        if len(table) == 0:
            if self.offset_index.entries or self.time_index.entries:
                raise CorruptIndexError(f"indexes of empty {self.log_path} have entries")
            return
        plan = index_plan(table, self.config.index_interval_bytes)
        ev = plan.events[: self.offset_index.max_entries]
        got = [self.offset_index.entry(i) for i in range(self.offset_index.entries)]
        want = list(zip(plan.last_offsets[ev].tolist(), plan.positions[ev].tolist(), strict=True))
        if got != want:
            raise CorruptIndexError(f"{self.offset_index.path} differs from its log")
        pairs = dict(zip(plan.max_offsets.tolist(), plan.running_max.tolist(), strict=True))
        prev_ts = -1
        for i in range(self.time_index.entries):
            ts, off = self.time_index.entry(i)
            if pairs.get(off) != ts or ts <= prev_ts:
                raise CorruptIndexError(f"{self.time_index.path}: entry {i} ({ts}, {off}) "
                                        "is no (running max, offset) pair of its log")
            prev_ts = ts

    # -- life cycle ---------------------------------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Drop the batch holding ``offset`` and everything after it; return bytes removed."""
        header = self.translate_offset(offset)
        if header is None:
            return 0
        # LogSegment.truncateTo: from the start of the batch holding `offset`
        cut = header.position
        removed = self.size - cut
        self.offset_index.truncate_to(header.base_offset)
        self.time_index.truncate_to(header.base_offset)
        handle = self.handle
        os.ftruncate(handle.fd, cut)
        self.size = cut
        self.load_tail_state()
        return removed

    def append_final_time_entry(self) -> None:
        """(max timestamp, its offset) as the last time index entry, full or not (roll, close)."""
        if self.max_timestamp_so_far >= 0:
            self.time_index.maybe_append(self.max_timestamp_so_far, self.offset_of_max_timestamp,
                                         skip_full_check=True)

    def on_become_inactive(self) -> None:
        """On roll: the final time index entry, trimmed indexes, read-only from now on."""
        self.append_final_time_entry()
        self.offset_index.seal()
        self.time_index.seal()
        self.active = False
        INDEXES.opened(self)

    def make_active(self) -> None:
        """Regrow the indexes to their preallocated size (the last segment after load; a lazy
        one regrows them when it is loaded)."""
        self.active = True
        INDEXES.forget(self)
        if self._lazy:
            return
        self.offset_index.make_writable(self.config.segment_index_bytes)
        self.time_index.make_writable(self.config.segment_index_bytes)

    def flush_log(self) -> None:
        """``fdatasync`` of the ``.log``: what an acknowledgement needs (the record bytes)."""
        handle = self.handle
        disk.fsync(handle.fd, data_only=True, slowed=True)

    @property
    def indexes_deferred(self) -> bool:
        """Its index files are still to be created (``flush_indexes`` creates them)."""
        return any(i.deferred for i in self._opened_indexes())

    def flush_indexes(self) -> None:
        """msync of both indexes, each a cache flush of the device (a checkpoint's business:
        recovery rebuilds entries past the recovery point from the log)."""
        for index in self._opened_indexes():  # a lazy segment's were not touched
            index.flush()

    def close(self) -> None:
        """Trim the indexes and drop this segment's reference to the log descriptor.  A segment
        never written gets no index files (``unwritten``: the loader takes an empty last segment
        without them for what it is); a deferred index's file is written at its valid size."""
        INDEXES.forget(self)
        if self.unwritten:
            for index in self._opened_indexes():
                index.close_untrimmed()  # a deferred index: nothing in it, no file
        else:
            for index in self._opened_indexes():
                index.close()
        self.handle = FileHandle(-1, str(self.log_path))

    def crash_close(self) -> None:
        """Release everything without trimming: the state a SIGKILL leaves (fault tests)."""
        INDEXES.forget(self)
        for index in self._opened_indexes():
            index.close_untrimmed()
        self.handle = FileHandle(-1, str(self.log_path))

    def delete(self) -> None:
        """Remove the segment's files; slices already handed out keep the log readable."""
        for index in self._opened_indexes():
            index.close_untrimmed()
        for path in (*self._index_paths, self.log_path):
            try:
                path.unlink()
            except FileNotFoundError:
                pass
        self._lazy = self._fresh = self._released = False  # nothing left to load
        INDEXES.forget(self)
        self.handle = FileHandle(-1, str(self.log_path))

    def __repr__(self) -> str:
        return f"LogSegment(base={self.base_offset}, size={self.size}, next={self.next_offset})"

