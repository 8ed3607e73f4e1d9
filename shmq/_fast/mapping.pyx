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
from posix.mman cimport (mmap, munmap, msync, madvise, PROT_READ, PROT_WRITE, MAP_SHARED,
                         MAP_FAILED, MS_SYNC, MADV_RANDOM)
import os


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

    def populate(self, Py_ssize_t start, Py_ssize_t length):
        """Map the pages of ``[start, start + length)`` now, in one call, read-only
        (``MADV_POPULATE_READ``, Linux >= 5.14): a reader about to walk a range of a segment
        otherwise takes one page fault per 4 KiB page (the mapping is ``MADV_RANDOM``: no
        fault-around).  Best effort; the range must lie inside the file (the caller's bound)."""
        cdef size_t page = 4096
        cdef Py_ssize_t lo, hi
        if self.addr == NULL or length <= 0:
            return
        if start < 0 or start > self.length - length:
            raise ValueError("range outside the mapping")
        lo = start - start % page
        hi = start + length
        with nogil:
            madvise(self.addr + lo, hi - lo, 22)  # MADV_POPULATE_READ

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
