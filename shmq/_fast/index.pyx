# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Binary search over mmapped Kafka index files, with Kafka's warm-section search.

``.index`` entries are 8 bytes (int32 relativeOffset, int32 position); ``.timeindex`` entries are
12 bytes (int64 timestamp, int32 relativeOffset); all big-endian, sorted by every column.  A key
is named by its byte offset inside the entry and its width (4 or 8).

Why the warm section (``AbstractIndex.indexSlotRangeFor``, KAFKA-6432): almost every lookup is
for a recent offset, so the search first checks the last 8 KiB of entries (the pages the
appender keeps hot) and only falls back to a search over the whole file when the target is
older; a plain binary search would touch a cold page at the middle of the file every time.
"""

from libc.stdint cimport int32_t, int64_t

cdef extern from "_endian.h":
    int32_t shmq_load_i32(const unsigned char *p) nogil
    int64_t shmq_load_i64(const unsigned char *p) nogil

cdef enum:
    WARM_BYTES = 8192


cdef inline int64_t _key(const unsigned char *base, Py_ssize_t slot, int entry_size,
                         int key_offset, int key_width) noexcept nogil:
    cdef const unsigned char *p = base + slot * entry_size + key_offset
    if key_width == 8:
        return shmq_load_i64(p)
    return shmq_load_i32(p)


cdef Py_ssize_t _lower(const unsigned char *base, Py_ssize_t lo, Py_ssize_t hi, int entry_size,
                       int key_offset, int key_width, int64_t target) noexcept nogil:
    """Largest slot in [lo, hi] with key <= target, given key(lo) <= target."""
    cdef Py_ssize_t mid
    while lo < hi:
        mid = (lo + hi + 1) >> 1
        if _key(base, mid, entry_size, key_offset, key_width) > target:
            hi = mid - 1
        else:
            lo = mid
    return lo


cdef int _check_args(Py_ssize_t size, Py_ssize_t entries, int entry_size, int key_offset,
                     int key_width) except -1:
    if entry_size <= 0 or key_width not in (4, 8) or key_offset < 0 \
            or key_offset + key_width > entry_size:
        raise ValueError("bad index entry layout")
    if entries < 0 or entries > size // entry_size:  # no multiplication: it could overflow
        raise ValueError(f"{entries} entries of {entry_size} bytes do not fit in {size} bytes")
    return 0


def largest_lower_bound(const unsigned char[::1] buf not None, Py_ssize_t entries,
                        int entry_size, int key_offset, int key_width, int64_t target):
    """Slot of the last entry whose key is <= target, or -1 if every key is larger."""
    _check_args(buf.shape[0], entries, entry_size, key_offset, key_width)
    if entries == 0:
        return -1
    cdef const unsigned char *base = &buf[0]
    cdef Py_ssize_t warm = WARM_BYTES // entry_size
    cdef Py_ssize_t first_hot = entries - 1 - warm
    cdef Py_ssize_t slot
    if first_hot < 0:
        first_hot = 0
    with nogil:
        if _key(base, first_hot, entry_size, key_offset, key_width) <= target:
            slot = _lower(base, first_hot, entries - 1, entry_size, key_offset, key_width, target)
        elif _key(base, 0, entry_size, key_offset, key_width) > target:
            slot = -1
        else:
            slot = _lower(base, 0, first_hot, entry_size, key_offset, key_width, target)
    return slot


def smallest_upper_bound(const unsigned char[::1] buf not None, Py_ssize_t entries,
                         int entry_size, int key_offset, int key_width, int64_t target):
    """Slot of the first entry whose key is >= target, or -1 if every key is smaller."""
    _check_args(buf.shape[0], entries, entry_size, key_offset, key_width)
    if entries == 0:
        return -1
    cdef const unsigned char *base = &buf[0]
    cdef Py_ssize_t slot
    with nogil:
        if _key(base, entries - 1, entry_size, key_offset, key_width) < target:
            slot = -1
        elif _key(base, 0, entry_size, key_offset, key_width) >= target:
            slot = 0
        else:
            # largest slot with key < target, plus one
            slot = _lower(base, 0, entries - 1, entry_size, key_offset, key_width, target - 1) + 1
    return slot
