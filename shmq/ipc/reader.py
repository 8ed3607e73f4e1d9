"""Local readers: a partition's segment files mapped read-only, bounded by the state table.

Theory of operation
-------------------
* **The bound.**  Every read starts with a seqlocked snapshot of the partition's slot in the state
  table (``shmq.ipc.state_table``): log start, high watermark, last stable offset, segment
  generation.  Nothing at or past the bound (the HW; the LSO for ``read_committed``) is ever
  read; a read_committed read also leaves out the batches of aborted transactions, which it
  finds in the segments' ``.txnindex`` files (re-read when one grows), as a Kafka consumer
  drops them by Fetch's aborted-transactions list: the worker publishes the HW only after the bytes
  below it are in the file, so everything below it is whole.
* **Walking safely.**  The bytes right after the bound may be in the middle of a ``pwritev``
  (torn, or past the end of the file).  A read maps the segment read-only over 2 GiB of address
  space (a file never grows past its mapping; pages past the end of the file are never touched),
  takes the file's size with ``fstat`` *after* the snapshot, scans batch headers only below that
  size, and keeps a batch only while it continues the chain of offsets (its base offset is the
  previous batch's last offset + 1) and starts below the bound: a torn header can never pass for
  a batch.  The first batch comes from the offset index (an entry names a batch below the bound,
  since entries are written after their batch) or from the reader's own cursor.
* **Rolls and deletions.**  ``segments_gen`` in the slot changes whenever the worker rolls,
  deletes or truncates segments: the reader lists the directory again.  A deleted file stays
  readable while mapped, but offsets below the log start are ``OffsetOutOfRangeError``, as over
  the wire.
* **Waiting** for data is a futex wait on the slot's seq word (``wait_bound``: the whole wait in
  one call without the GIL, after looking at it for ``WAIT_SPIN_S``): the worker's
  publish wakes the reader, no polling.  The state table is therefore attached read-write (the
  reader sets the slot's ``waiters`` flag); segment files are only ever mapped read-only.
* A read returns whole batches from one segment, as Kafka's do: zero-copy views of the mapping
  (``ReadResult.buffer`` / ``batches``), decoded on demand into records or an Arrow
  ``RecordBatch`` in the spark_bridge schema.
"""

from __future__ import annotations

import array
import os
import time
from pathlib import Path
from typing import Any

from shmq import _fast
from shmq.errors import CorruptRecordError, OffsetOutOfRangeError, ShmqError
from shmq.ipc import sched
from shmq.ipc.buffers import BufferPool
from shmq.ipc.state_table import HEADER_SIZE, SLOT_SIZE, PartitionState, StateTable
from shmq.protocol import records as rec
from shmq.storage import layout

MAP_BYTES = 1 << 31          # a segment never outgrows segment.bytes (an int32) + one batch
READ_COMMITTED, READ_UNCOMMITTED = "read_committed", "read_uncommitted"
_SCAN_ROWS = 1024
_FIRST_SCAN_ROWS = 16
_COLS = _fast.SCAN_COLUMNS


# How long a reader waits for a slot whose seq stays odd.  A writer preempted mid-update (a
# loaded box) holds it odd for milliseconds, longer than read()'s spin budget; only a writer
# that died mid-update holds it longer (the controller or the restarted worker completes it).
STUCK_SLOT_S = 1.0
# A waiting reader looks at its slot this long before it sleeps on the futex: records that
# follow within that time are read without the futex round trip and the wake-up of a halted
# CPU (tens of microseconds on a VM), as a producer's client spins on its completion ring.
# Between looks the spin gives its CPU to whatever else wants it (sched_yield, _seqlock.h).
# 200 us, not 50: at 10,000 records/s (bench_shm's latency row, shared box, load 5-6) p50 / p99
# were 1.35 / 7.5 ms with 200 us against 1.5-2.1 / 91-443 ms with 50 us, in alternating runs.
WAIT_SPIN_S = 0.0002
# While a thread waits here it has time slices this long (``shmq.ipc.sched``; its own slice is
# put back when the wait returns, since the thread is the caller's): woken by the worker's
# publish, it then preempts a task that has run longer rather than waiting for that task's
# slice to end (1.4 ms here, up to a 4 ms tick): the waiting reader's run-queue time was most
# of bench_shm's p99 at 10,000 records/s.  Its share of the CPU is unchanged.  The slice is
# asked for only when the wait goes to sleep on the futex (``_fast.wait_bound``), not for a
# wait that the slot or the spin ends.  Its cost (Linux 6.18, this VM): changing a running
# thread's slice ends its run-to-parity protection, and a thread that has just run is often not
# eligible, so the switch to the short slice right before the sleep preempts it about once a
# wait (an involuntary context switch: a thread waiting on a slot published every 100 us spent
# 13.7 us of CPU a wait with the swap, 6-9 us without or with a short slice kept throughout).
# ``SHMQ_READER_SLICE_US=0`` leaves the thread's slice alone.
WAIT_SLICE_US = sched.slice_us_from_env("SHMQ_READER_SLICE_US", 100.0)
# ... but only while the waits are short: after a wait that lasted longer than this the next
# one sleeps at once.  At 10,000 records/s every wait lasts most of the 100 us gap, and a
# spin through it cost more CPU than the futex wake-up it saved (bench_shm --trace, shared
# box: the reader 28-31 us a record with the spin, 24.5 without).
SPIN_GAP_S = 0.00005


def read_state(table: StateTable, slot: int, patience: float = STUCK_SLOT_S) -> PartitionState | None:
    """A consistent snapshot of ``slot``, retrying (with short sleeps) for ``patience`` seconds
    while a write is in progress; None when it never settled."""
    st = table.read(slot)
    if st is not None:
        return st
    deadline = time.monotonic() + patience
    pause = 0.0001
    while time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(pause * 2, 0.01)
        st = table.read(slot)
        if st is not None:
            return st
    return None


class NotReadableError(ShmqError):
    """The partition's state or files cannot be read here (no published state, unknown slot,
    files not readable): read over the Kafka protocol instead."""


class _Segment:
    """One mapped ``.log`` file.  The compiled ``MappedFile`` maps ``MAP_BYTES`` at once (past the
    end of the file is address space only); the twin's ``mmap.mmap`` cannot map past the end, so
    there the mapping follows the file's size."""

    __slots__ = ("base", "path", "fd", "map", "view", "mapped", "file_size", "populated")

    def __init__(self, base: int, path: Path) -> None:
        self.base = base
        self.path = path
        self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self.map: Any = None
        self.view = memoryview(b"")
        self.mapped = 0
        self.file_size = 0  # as the last size() found it
        self.populated = 0  # the end of the range the last populate() mapped (0: none)
        try:
            self.remap(self.size())
        except BaseException:
            os.close(self.fd)
            raise

    def remap(self, size: int) -> None:
        length = MAP_BYTES if _fast.HAVE_FAST else size
        if length <= self.mapped:
            return
        old_view, old_map = self.view, self.map
        self.map = _fast.MappedFile(self.fd, length, False)
        self.view = memoryview(self.map)
        self.mapped = length
        self.populated = 0  # a new mapping: nothing of it is mapped yet
        old_view.release()
        if old_map is not None:
            try:
                old_map.close()
            except BufferError:  # a caller still holds a view of it: unmapped when that goes
                pass

    def size(self) -> int:
        size = os.fstat(self.fd).st_size
        if size > self.mapped:
            self.remap(size)
        self.file_size = size
        return size

    def populate(self, start: int, end: int) -> bool:
        """``MappedFile.populate`` of the range a read returns, less the page where the last
        populated range ended (mapped then, and still: a shared mapping of the page cache's
        page, which the file's appends fill in place).  A reader at the tail reads records that
        mostly lie in that page (24 of 100 B to a 4 KiB page): no system call for those, where
        each read cost three (two ``mincore``, a ``madvise``: ~2 us).  Only that one page is
        trusted to be mapped still: a page the kernel evicted meanwhile costs one major fault.
        Returns whether it asked the kernel."""
        if self.populated:
            page = (self.populated - 1) & ~4095  # the last populated page
            if page <= start < page + 4096:  # the read starts in it: map from the next one
                start = page + 4096
        self.populated = end  # its page is mapped now (or was the last one)
        if start >= end:
            return False
        self.map.populate(start, end - start, self.file_size)
        return True

    def index_position(self, offset: int) -> int:
        """Byte position of a batch at or before ``offset`` from the .index (0: from the start)."""
        path = self.path.with_suffix(layout.INDEX_SUFFIX)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return 0
        try:
            length = os.fstat(fd).st_size
            if length < 8:
                return 0
            view = memoryview(_fast.MappedFile(fd, length, False))
        finally:
            os.close(fd)
        with view:
            # a preallocated (active) index ends in zero entries: valid ones have positions > 0
            # (an entry is written once more than index.interval.bytes preceded it), so the
            # count is the first entry with position 0, found by bisection (~20 probes)
            lo, hi = 0, length // 8
            while lo < hi:
                mid = (lo + hi) // 2
                if int.from_bytes(view[mid * 8 + 4 : mid * 8 + 8], "big"):
                    lo = mid + 1
                else:
                    hi = mid
            slot = _fast.largest_lower_bound(view, lo, 8, 0, 4, offset - self.base) if lo else -1
            pos = int.from_bytes(view[slot * 8 + 4 : slot * 8 + 8], "big") if slot >= 0 else 0
        return pos

    def close(self) -> None:
        self.view.release()
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:  # a caller still holds a view of it: unmapped when that goes
                pass
        os.close(self.fd)


class ReadResult:
    """Whole batches from one segment, as a zero-copy view of the mapped file.

    ``buffer`` holds the batches; records outside ``[offset, next_offset)`` (the first batch may
    start before ``offset``; the last may run past ``offset + max_records``) are left out by
    ``records()`` and ``to_arrow()``.  Control batches are skipped by both.
    """

    __slots__ = ("buffer", "offset", "next_offset", "high_watermark", "log_start_offset",
                 "last_stable_offset", "pool")

    def __init__(self, buffer: memoryview, offset: int, next_offset: int,
                 state: PartitionState, aborted: Any = (), pool: BufferPool | None = None) -> None:
        if aborted:  # read_committed: the batches of aborted transactions are left out
            buffer = drop_aborted(buffer, aborted)
        self.pool = pool
        self.buffer = buffer
        self.offset = offset
        self.next_offset = next_offset
        self.high_watermark = state.high_watermark
        self.log_start_offset = state.log_start
        self.last_stable_offset = state.last_stable

    def __len__(self) -> int:
        return max(0, self.next_offset - self.offset)

    @property
    def batches(self) -> list[rec.RecordBatchView]:
        return list(rec.iter_batches(self.buffer, verify_crc=False))

    def records(self) -> list[rec.Record]:
        if not len(self.buffer):
            return []
        few = _plain_batches_records(self.buffer)
        if few is not None:
            return [r for r in few if self.offset <= r.offset < self.next_offset]
        bodies, meta = rec._records_sections(
            self.buffer, verify_crc=True, max_decompressed=rec.codecs.DEFAULT_MAX_DECOMPRESSED_BYTES,
            skip_control=True)
        out = _fast.decode_sections(bodies, meta, rec.Record)
        return [r for r in out if self.offset <= r.offset < self.next_offset]

    def to_arrow(self, topic: str, partition: int, *, include_headers: bool = False,
                 verify_crc: bool = True) -> Any:
        """A ``pyarrow.RecordBatch`` in the spark_bridge schema (``SPARK_SCHEMA``), in buffers
        of the reader's pool (``shmq.ipc.buffers``) when it has one.  ``verify_crc=False``
        skips the batches' CRC (librdkafka's ``check.crcs=false``: the broker checked it when
        it appended the batch)."""
        pool = self.pool
        return batches_to_spark_arrow(self.buffer, topic, partition, self.offset,
                                      self.next_offset, include_headers=include_headers,
                                      alloc=pool.take if pool is not None else None,
                                      constants=pool.constants if pool is not None else None,
                                      verify_crc=verify_crc)


# Up to this many batches ``records()`` decodes batch by batch, without ``_records_sections``'
# numpy table (a waiting reader's read is one or a few single-record batches under load).
_PLAIN_BATCHES = 4


def _plain_batches_records(buf: memoryview) -> list[rec.Record] | None:
    """The records of ``buf`` when it holds one to ``_PLAIN_BATCHES`` uncompressed data batches
    (a waiting reader's usual read), each checked as ``_records_sections`` checks it (size,
    magic, CRC; a count that cannot fit raises ``CorruptRecordError``); None for anything else
    (more batches, compressed, control, bytes after the last whole batch), which takes the
    general path.  No numpy table and no sections lists: ~1 us a batch against ~5 for one or
    two 100 B records (``timeit``, warm)."""
    n = len(buf)
    pos = 0
    out: list[rec.Record] | None = None
    for _ in range(_PLAIN_BATCHES):
        if n - pos < rec.HEADER_SIZE:
            return None
        size = _fast.validate_batch(buf, pos, n, True, False)
        (base, _, _, _, _, attr, _, base_ts, max_ts, _, _, _,
         count) = _fast.batch_header(buf, pos)
        if attr & (rec.CONTROL_FLAG | rec.COMPRESSION_MASK):
            return None
        if count < 0 or 7 * count > size - rec.HEADER_SIZE:
            raise CorruptRecordError(f"record count {count} cannot fit in "
                                     f"{size - rec.HEADER_SIZE} bytes")
        lat = max_ts if attr & rec.TIMESTAMP_TYPE_MASK else _fast.NO_LOG_APPEND_TIME
        got = _fast.decode_records(buf[pos + rec.HEADER_SIZE : pos + size], count, base,
                                   base_ts, lat, rec.Record)
        if out is None:
            out = got
        else:
            out += got
        pos += size
        if pos == n:
            return out
    return None


def drop_aborted(buffer: memoryview, aborted: Any) -> memoryview:
    """``buffer`` without the batches of aborted transactions: a batch of producer ``pid``
    whose base offset lies in ``[first, marker]`` of one of the ``(pid, first, marker)``
    entries (what a Kafka consumer does with Fetch's ``aborted_transactions``)."""
    by_pid: dict[int, list[tuple[int, int]]] = {}
    for pid, first, last in aborted:
        by_pid.setdefault(pid, []).append((first, last))
    kept = bytearray()
    dropped = False
    for batch in rec.iter_batches(buffer, verify_crc=False):
        ranges = by_pid.get(batch.producer_id)
        if ranges and batch.is_transactional and any(
                first <= batch.base_offset <= last for first, last in ranges):
            dropped = True
            continue
        kept += batch.buffer
    return memoryview(kept) if dropped else buffer


def spark_schema(include_headers: bool = False) -> Any:
    """Spark's Kafka source schema, as the spark_bridge uses it (``kafka_arrow.kafka_schema``)."""
    from shmq.protocol.kafka_arrow import kafka_schema

    return kafka_schema(include_headers)


def batches_to_spark_arrow(buf: Any, topic: str, partition: int, min_offset: int,
                           max_offset: int, *, include_headers: bool = False,
                           alloc: Any = None, constants: Any = None,
                           verify_crc: bool = True) -> Any:
    """Decode the batches in ``buf`` (records in ``[min_offset, max_offset)``, no control
    batches) into the spark_bridge schema: one scan of the headers (CRC checked), then the
    spark_bridge's own columnar pass (``kafka_arrow.sections_to_arrow``: keys, values and
    headers filled in Cython, no Python object per record)."""
    from shmq.protocol.kafka_arrow import sections_to_arrow

    bodies, meta = rec._records_sections(buf, verify_crc=verify_crc,
                                         max_decompressed=rec.codecs.DEFAULT_MAX_DECOMPRESSED_BYTES,
                                         min_offset=min_offset, max_offset=max_offset,
                                         skip_control=True)
    return sections_to_arrow(bodies, meta, topic, partition, min_offset=min_offset,
                             max_offset=max_offset, include_headers=include_headers, alloc=alloc,
                             constants=constants)


class PartitionReader:
    """Reads one partition from its mapped segments; see the module docstring."""

    def __init__(self, table: StateTable, slot: int, partition_dir: Any,
                 pool: BufferPool | None = None) -> None:
        """``partition_dir(leader node id) -> Path`` names the partition's directory; ``pool``
        holds the Arrow buffers of ``ReadResult.to_arrow`` (reused once released)."""
        self.pool = pool
        self.table = table
        self.slot = slot
        self._dir_of = partition_dir
        self._segments: list[_Segment] = []
        self._gen: int | None = None
        self._leader: int | None = None
        # (next offset, segment base, its position, the last batch's position and base offset):
        # the next read starts there, or at that last batch when a read ended inside it
        self._cursor: tuple[int, int, int, int, int] | None = None
        self._last_batch = (0, 0)
        # scan_batches' tables: an array.array, whose items Python reads without numpy's
        # per-call costs (a slice and a tolist a batch: ~0.7 us a tail read), and a small one
        # for the first window (a memoryview slice of the large one costs a slice each read)
        self._out = array.array("q", [0]) * (_COLS * _SCAN_ROWS)
        self._first = array.array("q", [0]) * (_COLS * _FIRST_SCAN_ROWS)
        self._txn: dict[int, tuple[int, list[Any]]] = {}  # segment base -> (file size, entries)
        self._last_wait = 0.0  # how long the last wait that waited lasted (see SPIN_GAP_S)
        self.populates = 0  # reads that asked the kernel to map their range (_Segment.populate)
        self.closed = False

    def aborted(self, offset: int, bound: int) -> list[tuple[int, int, int]]:
        """(producer id, first offset, marker offset) of the aborted transactions overlapping
        ``[offset, bound)``, from the segments' ``.txnindex`` files (re-read when they grow).

        An entry lives in the segment of its abort marker (``last_offset``), so a segment that
        ends at or below ``offset`` holds none that overlaps: the scan starts at the segment of
        ``offset``, as Kafka's ``collectAbortedTransactions`` does (a stat per segment of the
        whole log on every read otherwise)."""
        from shmq.storage import txn_index

        out: list[tuple[int, int, int]] = []
        segments = self._segments
        first = len(segments) - 1  # a read is near the end: walk back from there
        while first > 0 and segments[first].base > offset:
            first -= 1
        for seg in segments[first:]:
            path = txn_index.path_for(seg.path.parent, seg.base)
            try:
                size = os.stat(path).st_size
            except FileNotFoundError:
                continue
            cached = self._txn.get(seg.base)
            if cached is None or cached[0] != size:
                try:
                    cached = (size, txn_index.read(path))
                except (OSError, ValueError):
                    continue
                self._txn[seg.base] = cached
            out.extend((e.producer_id, e.first_offset, e.last_offset) for e in cached[1]
                       if e.last_offset >= offset and e.first_offset < bound)
        return out

    # -- state ------------------------------------------------------------------------------

    def state(self, patience: float = STUCK_SLOT_S) -> PartitionState:
        st = read_state(self.table, self.slot, patience)
        if st is None:
            raise NotReadableError(f"state table slot {self.slot} stayed odd for {patience} s "
                                   f"(its writer died mid-update): read over the Kafka protocol")
        if st.leader < 0:
            raise NotReadableError(f"slot {self.slot} has no published state")
        return st

    def _refresh(self, st: PartitionState) -> None:
        if st.segments_gen == self._gen and st.leader == self._leader:
            return
        directory = Path(self._dir_of(st.leader))
        try:
            names = sorted(n for n in os.listdir(directory) if n.endswith(layout.LOG_SUFFIX)
                           and len(n) == 24 and n[:20].isdigit())
        except OSError as exc:
            raise NotReadableError(f"cannot list {directory}: {exc}") from exc
        old = {(s.base, str(s.path)): s for s in self._segments}
        fresh = []
        for n in names:
            base = int(n[:20])
            path = directory / n
            seg = old.pop((base, str(path)), None)
            if seg is None:
                try:
                    seg = _Segment(base, path)
                except FileNotFoundError:  # deleted between the listing and the open
                    continue
            fresh.append(seg)
        for seg in old.values():
            seg.close()
        self._segments = fresh
        self._gen, self._leader = st.segments_gen, st.leader
        self._cursor = None

    def wait(self, offset: int, timeout: float, isolation: str = READ_UNCOMMITTED,
             spin: float = WAIT_SPIN_S) -> PartitionState:
        """The state once the bound passes ``offset`` or ``timeout`` seconds passed (each wait
        looks at the slot for ``spin`` seconds before it sleeps on the futex, unless the last
        wait lasted longer than ``SPIN_GAP_S``: then it sleeps at once).

        One call into ``_fast.wait_bound`` (no GIL, no Python frame a round): it reads the
        slot, spins, and sleeps, and the thread has ``WAIT_SLICE_US`` slices only from its
        first futex sleep until it returns (three scheduler calls a wait that sleeps, none for
        one that the spin or the slot itself ends)."""
        deadline = time.monotonic() + timeout
        buf = self.table._buffer()
        at = HEADER_SIZE + SLOT_SIZE * self.slot
        committed = isolation == READ_COMMITTED
        while True:
            values, waited = _fast.wait_bound(
                buf, at, offset, committed, deadline - time.monotonic(),
                spin if self._last_wait < SPIN_GAP_S else 0.0, WAIT_SLICE_US)
            if waited >= 0:
                self._last_wait = waited
            if values is not None:
                st = tuple.__new__(PartitionState, values)
                if st.leader < 0:
                    raise NotReadableError(f"slot {self.slot} has no published state")
                return st
            # the slot stayed odd past the seqlock's spins: a writer preempted mid-update
            # (waited out here, with patience) or dead (NotReadableError); then wait on
            st = self.state()
            bound = st.last_stable if committed else st.high_watermark
            if bound > offset or offset < st.log_start or time.monotonic() >= deadline:
                return st

    # -- reads ------------------------------------------------------------------------------

    def read(self, offset: int, max_records: int = 1 << 20, *, max_bytes: int = 64 << 20,
             timeout: float = 0.0, isolation: str = READ_UNCOMMITTED) -> ReadResult:
        """Whole batches holding ``offset`` onwards, at most ``max_records`` records' worth and
        about ``max_bytes`` (at least one batch), never past the bound.  With ``timeout`` the
        read waits (futex on the state table) for the bound to pass ``offset``.  Raises
        ``OffsetOutOfRangeError`` below the log start or past the bound, as Fetch answers
        OFFSET_OUT_OF_RANGE."""
        if self.closed:
            raise ValueError("reader is closed")
        st = self.wait(offset, timeout, isolation) if timeout > 0 else self.state()
        bound = st.last_stable if isolation == READ_COMMITTED else st.high_watermark
        if offset < st.log_start or offset > bound:
            raise OffsetOutOfRangeError(offset, st.log_start, bound)
        if offset == bound or max_records <= 0:
            return ReadResult(memoryview(b""), offset, offset, st)
        self._refresh(st)
        seg, pos, expected = self._locate(offset)
        while seg is not None:
            found = self._scan(seg, pos, expected, offset, bound, offset + max_records, max_bytes)
            if found is None:  # an index entry that points past the offset: from the start
                found = self._scan(seg, 0, seg.base, offset, bound, offset + max_records,
                                   max_bytes)
            if found is not None and found[2] >= offset:
                start, end, last = found
                # evicted pages read ahead and mapped; the readahead ends at the file's end
                self.populates += seg.populate(start, end)
                next_offset = min(last + 1, offset + max_records, bound)
                self._cursor = (last + 1, seg.base, end, *self._last_batch)
                aborted = self.aborted(offset, next_offset) \
                    if isolation == READ_COMMITTED else ()
                return ReadResult(seg.view[start:end], offset, next_offset, st, aborted,
                                  self.pool)
            # nothing at or past the offset in this segment below the bound: the next one
            seg = self._next_segment(seg)
            if seg is None or seg.base > offset:
                break
            pos, expected = 0, seg.base
        return ReadResult(memoryview(b""), offset, offset, st)

    def _scan(self, seg: _Segment, pos: int, expected: int | None, offset: int, bound: int,
              limit: int, max_bytes: int) -> tuple[int, int, int] | None:
        """(start, end, last offset) of the batches to return from ``pos`` on, (-1, -1, -1) for
        none, or None when the first batch (from the index) starts past ``offset``."""
        size = seg.size()  # after the snapshot: every byte below the bound is in the file
        start = end = last_included = -1
        first = True
        # headers are read in windows of growing size: a read that needs a few batches does not
        # touch (fault in) the pages of a thousand batch headers past them
        cap = _FIRST_SCAN_ROWS
        while True:
            out: Any = self._first if cap == _FIRST_SCAN_ROWS else \
                memoryview(self._out)[: cap * _COLS]
            n, stop, status, _ = _fast.scan_batches(seg.view, pos, size, out, False, False)
            cap = min(cap * 4, _SCAN_ROWS)
            for i in range(n):
                k = i * _COLS  # the row: pos, base, last, max ts, size, ...
                base, last = out[k + 1], out[k + 2]
                if first and expected is None and base > offset:
                    return None
                first = False
                # the chain rule (module docstring): a torn header never passes for a batch
                if (expected is not None and base != expected) or base >= bound or last < base:
                    return start, end, last_included
                expected = last + 1
                if last < offset:
                    continue
                row_pos = out[k]
                row_end = row_pos + out[k + 4]
                if start < 0:
                    start = row_pos
                elif row_end - start > max_bytes:
                    return start, end, last_included
                end, last_included = row_end, last
                self._last_batch = (row_pos, base)
                if last + 1 >= limit:
                    return start, end, last_included
            if status != _fast.SCAN_FULL:
                return start, end, last_included
            pos = stop

    def _next_segment(self, seg: _Segment) -> _Segment | None:
        for i, s in enumerate(self._segments):
            if s is seg:
                return self._segments[i + 1] if i + 1 < len(self._segments) else None
        return None

    def _locate(self, offset: int) -> tuple[_Segment | None, int, int | None]:
        """(segment, byte position of a batch at or before ``offset``, its base offset if known)."""
        segs = self._segments
        if not segs:
            return None, 0, None
        cur = self._cursor
        if cur is not None and cur[4] <= offset <= cur[0]:
            for s in segs:
                if s.base == cur[1]:
                    return (s, cur[2], offset) if offset == cur[0] else (s, cur[3], cur[4])
        seg = segs[0]
        for s in segs:
            if s.base <= offset:
                seg = s
            else:
                break
        pos = seg.index_position(offset)
        return seg, pos, (seg.base if pos == 0 else None)

    def close(self) -> None:
        for seg in self._segments:
            seg.close()
        self._segments = []
        self.closed = True
