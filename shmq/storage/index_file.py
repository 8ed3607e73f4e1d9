"""The machinery shared by the offset and time indexes (Kafka ``AbstractIndex``).

Theory of operation
-------------------
An index file is an array of fixed-size big-endian entries, sorted, mmapped read-write while
its segment is active.  A new index is *preallocated* to ``segment.index.bytes`` (rounded down to
whole entries) so appends never grow the file; the number of valid entries is kept in memory.
Kafka derives the entry count of an existing index from the file length, so an index must be
*trimmed* to its valid size before it is closed or its segment rolls — otherwise a reopen would
read the zero tail as entries.  After a crash the active segment's index is untrimmed: the loader
rebuilds it from the log (``LogSegment.recover``).

A full disk.  The preallocated tail is a hole, and a store through a mapping into a hole
allocates a block at the page fault: with the disk full that is SIGBUS, which kills the process
(Kafka's JVM turns it into an InternalError).  So the room for the next entries is allocated
first (``reserve``, ``posix_fallocate`` of ``_RESERVE_CHUNK`` at a time, before the segment writes
the batches the entries will point at): running out of disk is then ``ENOSPC`` from the append,
which answers KAFKA_STORAGE_ERROR and writes nothing.

Descriptors.  A mapping needs no descriptor once made, so an index holds none, writable or not
(a rebuild excepted, which writes with ``pwrite``): the few calls that need one (a resize, a
``reserve``, a trim) open the file for that call.  A worker's descriptors then go to the
segments' ``.log`` files only, which ``shmq.storage.descriptors`` bounds: with 2,000 partitions
the active indexes used to hold 4,000.

A new log's first index (``deferred``) lives in a small buffer until it is needed on disk:
its file is created, its entries written and the file mapped at the first flush, trim, roll,
close or resize, or once it holds ``DEFERRED_ENTRIES`` entries (about 1 MiB of log at the default
``index.interval.bytes``, so a local reader, which reads ``.index`` files, scans at most that
much from the segment's start).  Creating a file costs an inode: 0.6-0.9 ms of CPU on this
host's ext4 (``find_inode_bit`` walking recently deleted inodes), and the first append to each
of 1,000 new partitions created two of them: four kcat producers spreading over 1,000
partitions spent about 1.5 s of broker CPU there whatever the record size.  A log deleted
before any of that (the suite's topics; short-lived partitions) never creates the files, and a
crash before it leaves no index: recovery rebuilds the index of every segment past the recovery
point from the log in any case, and no flush has moved the recovery point past a deferred one.

An index with no entries keeps no mapping (mmap cannot map 0 bytes).  Lookups run in Cython
(``shmq._fast.largest_lower_bound``) with Kafka's warm-section binary search.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from shmq import _fast
from shmq.errors import CorruptIndexError

_RESERVE_CHUNK = 64 * 1024  # bytes of index allocated ahead (8,192 offset index entries)
DEFERRED_ENTRIES = 256  # a deferred index gets its file past this many entries (see above)


class _Entries(bytearray):
    """A deferred index's entries before its file exists, used where a mapping is."""

    def close(self) -> None:
        pass

    def flush(self) -> None:
        pass


class IndexFile:
    """An mmapped, preallocated array of ``ENTRY_SIZE``-byte entries."""

    ENTRY_SIZE = 8

    def __init__(self, path: Path, base_offset: int, max_index_size: int, *, writable: bool,
                 entries: int | None = None, deferred: bool = False) -> None:
        """``entries``: how many entries the file holds, when its length does not say (a
        preallocated index a crash left untrimmed, its count taken from a recovery record).
        ``deferred`` (writable, a file that does not exist yet): entries in anonymous memory
        until ``materialize`` (see "A new log's first index" above)."""
        self.path = path
        self.base_offset = base_offset
        self.max_entries = max_index_size // self.ENTRY_SIZE
        self._mmap: _fast.MappedFile | _Entries | None = None
        self._fd = -1
        self._length = 0
        self._reserved = 0  # bytes from the start known to be allocated (writable: see reserve)
        self.rebuilding = False
        # the last entry, decoded; None after anything but an append changed the entries.  Every
        # append compares with it: reading it back from the mapping cost ~1.5 us an append
        self._last: tuple[int, int] | None = None
        self.deferred = deferred and writable
        if self.deferred:  # the file's size to be, and room in memory for the deferred entries
            self.missing = self.misaligned = self.closed = False
            self.writable = True
            self.entries = 0
            self._length = self.max_entries * self.ENTRY_SIZE
            self._reserved = min(self.max_entries, DEFERRED_ENTRIES) * self.ENTRY_SIZE
            self._mmap = _Entries(self._reserved)  # 2 KiB, not a 10 MiB mapping
            return
        existed = path.exists()
        self.missing = not existed  # a missing index is rebuilt by the loader
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        length = os.fstat(self._fd).st_size
        # AbstractIndex: an existing index holds floor(length / entry) entries; a length that is
        # not a whole number of entries is corrupt (Kafka's sanityCheck rebuilds it)
        self.entries = length // self.ENTRY_SIZE if existed else 0
        if entries is not None:
            self.entries = min(entries, self.entries)
        self.misaligned = length % self.ENTRY_SIZE != 0
        self.writable = writable
        self.closed = False
        try:
            if writable:
                self._resize(max(self.max_entries, self.entries) * self.ENTRY_SIZE)
            else:
                self._map(self.entries * self.ENTRY_SIZE)
        finally:
            self._release_fd()

    # -- descriptor (see "Descriptors" above) -------------------------------------------------

    def materialize(self) -> None:
        """Give a deferred index its file: created at its preallocated size, the entries
        written, then mapped as any writable index (the anonymous memory let go)."""
        if not self.deferred:
            return
        length, used = self._length, self.entries * self.ENTRY_SIZE
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, length)
            if used:
                assert self._mmap is not None
                with memoryview(self._mmap) as view:
                    os.pwrite(fd, view[:used], 0)
            self._mmap = _fast.MappedFile(fd, length, True) if length > 0 else None
        finally:
            os.close(fd)
        self.deferred = False
        self._reserved = used  # blocks past the entries are reserved as for any index

    def _write_deferred(self) -> None:
        """A deferred index's file holding exactly its entries (close)."""
        used = self.entries * self.ENTRY_SIZE
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            if used:
                assert self._mmap is not None
                with memoryview(self._mmap) as view:
                    os.pwrite(fd, view[:used], 0)
        finally:
            os.close(fd)
        self.deferred = False
        self._mmap = None
        self._length = self._reserved = used

    def _open_fd(self) -> int:
        self.materialize()
        if self._fd < 0:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        return self._fd

    def _release_fd(self) -> None:
        if self._fd >= 0 and not self.rebuilding:
            os.close(self._fd)
            self._fd = -1

    # -- mapping --------------------------------------------------------------------------------

    def _map(self, length: int) -> None:
        self._unmap()
        if length > 0:
            self._mmap = _fast.MappedFile(self._open_fd(), length, self.writable)
        self._length = length
        self._reserved = min(self.entries * self.ENTRY_SIZE, length)  # the entries' blocks

    def reserve(self, count: int) -> None:
        """Allocate the blocks for ``count`` more entries (see "A full disk"); raises OSError
        (ENOSPC, EDQUOT, EIO) when the disk cannot hold them.  Only writable, mapped indexes
        store through a mapping; a rebuild writes with ``pwrite`` (errors come back there)."""
        need = (self.entries + count) * self.ENTRY_SIZE
        if self.deferred and need > self._reserved:
            self.materialize()  # before the batches are written: ENOSPC here writes nothing
        if need <= self._reserved or not self.writable or self.rebuilding or self.closed:
            return
        end = min(max(need, self._reserved + _RESERVE_CHUNK), self._length)
        if end > self._reserved:
            try:
                os.posix_fallocate(self._open_fd(), self._reserved, end - self._reserved)
            finally:
                self._release_fd()
            self._reserved = end

    def _unmap(self) -> None:
        self.materialize()  # the entries of a deferred index live only in its mapping
        # no msync here: durability is flush()'s job (it runs before the recovery point moves);
        # a synchronous msync on every roll or trim cost a third of recovery time
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None

    def _resize(self, length: int) -> None:
        self._unmap()
        try:
            fd = self._open_fd()
            if os.fstat(fd).st_size != length:  # an ftruncate costs ~0.5 ms on a busy disk
                os.ftruncate(fd, length)
            self._map(length)
        finally:
            self._release_fd()

    @property
    def buffer(self) -> memoryview | bytes:
        return memoryview(self._mmap) if self._mmap is not None else b""

    # -- state ------------------------------------------------------------------------------------

    @property
    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    @property
    def size_in_bytes(self) -> int:
        return self.entries * self.ENTRY_SIZE

    def _append_raw(self, entry: bytes) -> None:
        self._append_block(entry, 1)

    def _append_entry(self, packer: struct.Struct, a: int, b: int, grow: bool = False) -> None:
        """One entry ``packer.pack(a, b)`` after the last one.  The usual case (a writable,
        preallocated mapping with room) packs straight into the mapping: 2 us less an append than
        ``_append_block``'s bytes + memoryview; everything else goes through ``_append_block``."""
        start = self.entries * self.ENTRY_SIZE
        mm = self._mmap
        if (mm is not None and self.writable and not self.rebuilding
                and start + self.ENTRY_SIZE <= self._reserved):
            packer.pack_into(mm, start, a, b)
            self.entries += 1
            self._last = None
        else:
            self._append_block(packer.pack(a, b), 1, grow)

    def _append_block(self, block: bytes, count: int, grow: bool = False) -> None:
        """Write ``count`` entries after the last one (``grow``: past the preallocated size)."""
        self._last = None
        start = self.entries * self.ENTRY_SIZE
        if self.rebuilding:
            # the file has exactly its entries: write(2) grows it (no page faults on holes)
            if not grow and self.entries + count > self.max_entries:
                raise CorruptIndexError(f"index {self.path} is full ({self.entries} entries)")
            os.pwrite(self._fd, block, start)
            self.entries += count
            return
        if not self.writable or self._mmap is None:
            raise CorruptIndexError(f"index {self.path} is read-only")
        if start + len(block) > self._length:
            if not grow:
                raise CorruptIndexError(f"index {self.path} is full ({self.entries} entries)")
            self._resize(start + len(block))
        self.reserve(count)
        assert self._mmap is not None
        with memoryview(self._mmap) as view:
            view[start : start + len(block)] = block
        self.entries += count

    def begin_rebuild(self, keep: int = 0) -> None:
        """Empty the index for a rebuild, or keep its first ``keep`` entries (recovery resumed
        from a recovery record); entries are then appended with ``pwrite`` to a file that holds
        exactly them.  Writing through a fresh sparse mapping instead page-faults into the
        filesystem for every page (measured: a quarter of recovery time on ext4)."""
        self._unmap()
        os.ftruncate(self._open_fd(), keep * self.ENTRY_SIZE)
        self.entries = keep
        self.misaligned = False
        self._last = None
        self._length = 0
        self.writable = True
        self.rebuilding = True
        self.missing = False

    def entry_bytes(self, slot: int) -> bytes:
        if self.rebuilding:
            return os.pread(self._fd, self.ENTRY_SIZE, slot * self.ENTRY_SIZE)
        assert self._mmap is not None
        pos = slot * self.ENTRY_SIZE
        with memoryview(self._mmap) as view:
            return bytes(view[pos : pos + self.ENTRY_SIZE])

    def _search(self, key_offset: int, key_width: int, target: int, upper: bool = False) -> int:
        if self.entries == 0 or self._mmap is None:
            return -1
        fn = _fast.smallest_upper_bound if upper else _fast.largest_lower_bound
        view = memoryview(self._mmap)
        try:
            return fn(view, self.entries, self.ENTRY_SIZE, key_offset, key_width, target)
        finally:
            view.release()

    def truncate_entries(self, entries: int) -> None:
        """Forget every entry from slot ``entries`` on (zeroing them keeps the tail clean)."""
        entries = max(0, min(entries, self.entries))
        if self._mmap is not None and entries < self.entries:
            start, end = entries * self.ENTRY_SIZE, self.entries * self.ENTRY_SIZE
            with memoryview(self._mmap) as view:
                view[start:end] = bytes(end - start)
        self.entries = entries
        self._last = None

    def reset(self) -> None:
        """Forget every entry.  A writable index is cut to 0 bytes and regrown (sparse zeros)
        instead of zero-filled: recovery resets 10 MiB preallocated files."""
        if self.writable and not self.closed:
            length = self._length
            self._unmap()
            try:
                os.ftruncate(self._open_fd(), 0)
                os.ftruncate(self._fd, length)
                self.entries = 0
                self._map(length)
            finally:
                self._release_fd()
            self._last = None
        else:
            self.truncate_entries(0)

    def flush(self) -> None:
        if self.deferred:
            self.materialize()
        mapping = self._mmap  # read once: another thread may release it (index_mappings.py)
        if mapping is not None:
            mapping.flush()

    def trim_to_valid_size(self) -> None:
        """Shrink the file to exactly its entries (on roll and close, as Kafka does)."""
        self._resize(self.entries * self.ENTRY_SIZE)

    def seal(self) -> None:
        """Trim, remap read-only and drop the descriptor (an inactive segment's index)."""
        if self.rebuilding:
            self.rebuilding = False
            self._length = self.entries * self.ENTRY_SIZE
        if self.writable:
            self.trim_to_valid_size()
            self.writable = False
            self._map(self.entries * self.ENTRY_SIZE)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def make_writable(self, max_index_size: int) -> None:
        """Reopen read-write and regrow to the preallocated size (the active segment after load)."""
        self.max_entries = max_index_size // self.ENTRY_SIZE
        self.rebuilding = False
        self._unmap()
        self.writable = True
        self._resize(max(self.max_entries, self.entries) * self.ENTRY_SIZE)

    def close(self) -> None:
        """Trim (if writable) and release the mapping and the descriptor.  A deferred index gets
        its file now, at its valid size (created preallocated, mapped, then cut back and unmapped,
        it was a tenth of a clean stop of 10,000 new logs)."""
        if self.closed:
            return
        if self.deferred:
            self._write_deferred()
        elif self.writable:
            self.trim_to_valid_size()
        self.closed = True
        self._unmap()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close_untrimmed(self) -> None:
        """Release without trimming: what a crash leaves behind (tests and fault injection);
        a deferred index leaves no file."""
        self.closed = True
        self.deferred = False
        if self._mmap is not None:
            self._mmap.close()
            self._mmap = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        self.close_untrimmed()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def rename_to(self, path: Path) -> None:
        if not self.deferred:
            os.rename(self.path, path)
        self.path = path
