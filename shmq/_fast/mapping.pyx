# cython: language_level=3, boundscheck=False, wraparound=False
"""A memory mapping that keeps no file descriptor.

Python's ``mmap.mmap`` duplicates the descriptor it maps and holds it open, so every mapped
index costs a descriptor: a 10,000-segment log would need 30,000 (ulimit here: 20,000).  This
maps with ``mmap(2)`` directly; the caller may close its descriptor right after.

Every mapping is advised ``MADV_RANDOM``.  An index is preallocated as a sparse 10 MiB file, and
without the advice the first write fault reads around the faulting page: the kernel allocates and
zero-fills a large window of the holes (4-12 ms for the first 8-byte entry of a new index on
Linux 6.18 / ext4, against 10 us advised), which every new segment paid twice (offset and time
index) on the first append's path.  Lookups are binary searches, random by nature.
"""

from libc.errno cimport errno
from posix.mman cimport (mmap, munmap, msync, madvise, mincore, PROT_READ, PROT_WRITE,
                         MAP_SHARED, MAP_FAILED, MS_SYNC, MADV_RANDOM, MADV_WILLNEED)
import os

# readahead requests of a populate: the kernel cuts one MADV_WILLNEED to max(read_ahead_kb,
# max_sectors_kb) of the device (a 4 MiB call on a 128 KiB-readahead disk would read 128 KiB)
DEF READAHEAD_CHUNK = 512 << 10


cdef bint _resident(char *page) noexcept nogil:
    cdef unsigned char v = 1
    return mincore(page, 4096, &v) != 0 or (v & 1)


cdef Py_ssize_t _read_ahead_missing(char *base, Py_ssize_t size, Py_ssize_t lo,
                                    Py_ssize_t hi) noexcept nogil:
    """``MADV_WILLNEED`` for each ``READAHEAD_CHUNK``-aligned chunk of ``[base, base + size)``
    (``size``: the file's bytes in the mapping) that meets ``[lo, hi)`` and whose first or last
    page is not in the page cache (a ``mincore`` of one page each: a ``mincore`` of every page
    costs a page-cache lookup each, as much as the readahead walk); returns how many chunks it
    asked for.  Whole aligned chunks, so the next read, which starts in the chunk where this
    one ends, finds it asked for already.  A chunk ends at the file's end: a page past it is
    never resident, and a chunk measured to the mapping's end was asked for again on every
    read of a file's last chunk (a local reader at the tail: ~7 us of a ~20 us one-record
    read, bench_shm's latency rows)."""
    cdef Py_ssize_t at = lo - lo % READAHEAD_CHUNK, n, asked = 0
    while at < hi:
        n = min(<Py_ssize_t>READAHEAD_CHUNK, size - at)
        if not _resident(base + at) or not _resident(base + ((at + n - 1) & ~<Py_ssize_t>4095)):
            madvise(base + at, n, MADV_WILLNEED)
            asked += 1
        at += READAHEAD_CHUNK
    return asked


cdef class MappedFile:
    """``length`` bytes of a file mapped shared; read-only unless ``writable``."""
    cdef char *addr
    cdef readonly Py_ssize_t length
    cdef readonly bint writable
    cdef int exports
    cdef Py_ssize_t shape[1]
    cdef Py_ssize_t strides[1]

    def __cinit__(self, int fd, Py_ssize_t length, bint writable=False):
        cdef void *p
        if length <= 0:
            raise ValueError("cannot map 0 bytes")
        p = mmap(NULL, length, PROT_READ | (PROT_WRITE if writable else 0), MAP_SHARED, fd, 0)
        if p == MAP_FAILED:
            raise OSError(errno, os.strerror(errno))
        madvise(p, length, MADV_RANDOM)  # no read-around of holes (see the module docstring)
        self.addr = <char *>p
        self.length = length
        self.writable = writable

    def __dealloc__(self):
        if self.addr != NULL:
            munmap(self.addr, self.length)

    def __len__(self):
        return self.length

    def __getbuffer__(self, Py_buffer *view, int flags):
        if self.addr == NULL:
            raise ValueError("mapping is closed")
        self.shape[0] = self.length
        self.strides[0] = 1
        view.buf = self.addr
        view.obj = self
        view.len = self.length
        view.readonly = 0 if self.writable else 1
        view.itemsize = 1
        view.format = "B"
        view.ndim = 1
        view.shape = self.shape
        view.strides = self.strides
        view.suboffsets = NULL
        view.internal = NULL
        self.exports += 1

    def __releasebuffer__(self, Py_buffer *view):
        self.exports -= 1

    def populate(self, Py_ssize_t start, Py_ssize_t length, Py_ssize_t file_size=-1):
        """Make ``[start, start + length)`` ready to be walked.  Pages no longer in the page
        cache (this VM's kernel evicts a log seconds after it is written) are asked for with
        ``MADV_WILLNEED`` in chunks, so the disk reads them ahead in large requests, and the
        range is then mapped in one call (``MADV_POPULATE_READ``, Linux >= 5.14) that waits
        for them: under ``MADV_RANDOM`` each major fault would be one synchronous 4 KiB read
        (2M records of 100 B: 0.05-0.33 M records/s into Arrow against 4-6 M with the
        readahead, perf/README).  ``mincore`` of two pages a chunk decides; the chunks end at
        ``file_size`` (the file's size, when the caller knows it; else the mapping's end: a
        page past the file's end is never resident, so a reader at the tail asked for the
        file's last chunk again on every read).  A resident range is left to the walker's page
        faults: each maps the 16 pages around it (fault-around, which ``MADV_RANDOM`` does not
        turn off), cheaper than the populate's walk of every page (a fresh reader of 2 M x 100 B
        records: 3.9 against 10.7 ns a record for the read, 15.5 against 14 for the decode that
        now takes the faults).  Best effort; the range must lie inside the file (the caller's
        bound).  Returns how many chunks were asked for."""
        cdef size_t page = 4096
        cdef Py_ssize_t lo, hi, asked
        if self.addr == NULL or length <= 0:
            return 0
        if start < 0 or start > self.length - length:
            raise ValueError("range outside the mapping")
        lo = start - start % page
        hi = start + length
        if file_size < hi or file_size > self.length:
            file_size = self.length
        with nogil:
            asked = _read_ahead_missing(self.addr, file_size, lo, hi)
            if asked:
                madvise(self.addr + lo, hi - lo, 22)  # MADV_POPULATE_READ
        return asked

    def flush(self):
        """msync(MS_SYNC) the whole mapping (also from a read-only mapping: it writes back the
        file's dirty pages in the range, e.g. entries written before the index was sealed)."""
        if self.addr != NULL and msync(self.addr, self.length, MS_SYNC) != 0:
            raise OSError(errno, os.strerror(errno))

    def close(self):
        """Unmap; refuses while a memoryview of the mapping is alive (as mmap does)."""
        if self.addr == NULL:
            return
        if self.exports:
            raise BufferError("cannot close a mapping with live memoryviews")
        munmap(self.addr, self.length)
        self.addr = NULL

    @property
    def closed(self):
        return self.addr == NULL
