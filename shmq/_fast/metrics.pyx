# cython: language_level=3, boundscheck=False, wraparound=False
"""Counting into the shared metrics table: one call per event, no lock, no system call.

The layout (words, histograms, regions and partition slots) is drawn in
``shmq/ipc/metrics_table.py``; the constants below repeat ``_metrics_reference`` (the twin and
oracle), and ``tests/unit/ipc/test_metrics_table.py`` checks that they agree.

Every word has one writer.  A writer holds the GIL for the whole call (no ``nogil``), so the
threads of one process (the event loop, the flush executor) never interleave an update; another
process reads a word with one aligned 8-byte load, which the relaxed atomic stores here make
whole.  A call is a handful of loads and stores: ~60-90 ns including the method call
(perf/bench_metrics.py measures what the hooks cost the broker).
"""

from libc.stdint cimport int64_t, uint64_t

cdef extern from *:
    """
    static inline void shmq_mx_add(uint64_t *w, uint64_t v) {
        __atomic_store_n(w, __atomic_load_n(w, __ATOMIC_RELAXED) + v, __ATOMIC_RELAXED);
    }
    static inline void shmq_mx_set(uint64_t *w, uint64_t v) {
        __atomic_store_n(w, v, __ATOMIC_RELAXED);
    }
    static inline uint64_t shmq_mx_get(const uint64_t *w) {
        return __atomic_load_n(w, __ATOMIC_RELAXED);
    }
    """
    void shmq_mx_add(uint64_t *w, uint64_t v) noexcept nogil
    void shmq_mx_set(uint64_t *w, uint64_t v) noexcept nogil
    uint64_t shmq_mx_get(const uint64_t *w) noexcept nogil

cdef enum:
    N_BOUNDS = 19

cdef int64_t[N_BOUNDS] _BOUNDS = [
    10000, 25000, 50000, 100000, 250000, 500000,
    1000000, 2500000, 5000000, 10000000, 25000000, 50000000,
    100000000, 250000000, 500000000, 1000000000, 2500000000, 5000000000,
    10000000000]

BUCKET_BOUNDS_NS = tuple(_BOUNDS[i] for i in range(N_BOUNDS))
BUCKETS = N_BOUNDS + 1
HIST_SUM = BUCKETS
HIST_WORDS = 24
SCALARS = 64
FSYNC_HIST = 64
PRODUCE_WAIT_HIST = 88
FETCH_WAIT_HIST = 112
API_SLOTS = 128
VERSION_SLOTS = 32
ERROR_SLOTS = 192
N_PHASES = 5
REQUESTS = 256
ERRORS = REQUESTS + API_SLOTS * VERSION_SLOTS
LATENCY = ERRORS + API_SLOTS * ERROR_SLOTS
PARTITION_WORDS = 16
FAILED_PRODUCE_OTHER = 8
FAILED_FETCH_OTHER = 9

cdef enum:
    C_HIST_SUM = N_BOUNDS + 1
    C_HIST_WORDS = 24
    C_SCALARS = 64
    C_FSYNC_HIST = 64
    C_PRODUCE_WAIT_HIST = 88
    C_FETCH_WAIT_HIST = 112
    C_API_SLOTS = 128
    C_VERSION_SLOTS = 32
    C_ERROR_SLOTS = 192
    C_PHASES = 5
    C_REQUESTS = 256
    C_ERRORS = C_REQUESTS + C_API_SLOTS * C_VERSION_SLOTS
    C_LATENCY = C_ERRORS + C_API_SLOTS * C_ERROR_SLOTS
    C_PARTITION_WORDS = 16
    C_FAILED_PRODUCE_OTHER = 8
    C_FAILED_FETCH_OTHER = 9


cdef inline int _bucket(int64_t ns) noexcept nogil:
    cdef int i
    for i in range(N_BOUNDS):
        if ns <= _BOUNDS[i]:
            return i
    return N_BOUNDS


cdef inline void _observe(uint64_t *hist, int64_t ns) noexcept nogil:
    if ns < 0:
        ns = 0
    shmq_mx_add(hist + _bucket(ns), 1)
    shmq_mx_add(hist + C_HIST_SUM, <uint64_t>ns)


def bucket_of(int64_t ns):
    return _bucket(ns)


cdef class MetricsWriter:
    """One writer's view: its process region and the partition slots (see the twin)."""
    cdef object _view
    cdef uint64_t *base
    cdef uint64_t *region
    cdef uint64_t *partitions
    cdef readonly Py_ssize_t partition_slots

    def __init__(self, buf, Py_ssize_t region_word, Py_ssize_t partitions_word,
                 Py_ssize_t partition_slots):
        cdef uint64_t[::1] words = memoryview(buf).cast("Q")
        if region_word < 0 or region_word + LATENCY + API_SLOTS * N_PHASES * HIST_WORDS > words.shape[0]:
            raise IndexError("the region does not fit in the table")
        if partitions_word < 0 or partitions_word + partition_slots * PARTITION_WORDS > words.shape[0]:
            raise IndexError("the partition slots do not fit in the table")
        self._view = words   # holds the buffer (a mapping cannot be closed under us)
        self.base = &words[0]
        self.region = self.base + region_word
        self.partitions = self.base + partitions_word
        self.partition_slots = partition_slots

    cdef inline void _check(self) except *:
        if self._view is None:
            raise ValueError("metrics writer is released")

    def add(self, Py_ssize_t index, uint64_t value=1):
        self._check()
        if index < 0 or index >= C_SCALARS:
            raise IndexError(index)
        shmq_mx_add(self.region + index, value)

    def set(self, Py_ssize_t index, uint64_t value):
        self._check()
        if index < 0 or index >= C_SCALARS:
            raise IndexError(index)
        shmq_mx_set(self.region + index, value)

    def get(self, Py_ssize_t index):
        self._check()
        if index < 0 or index >= C_SCALARS:
            raise IndexError(index)
        return shmq_mx_get(self.region + index)

    def observe(self, Py_ssize_t hist, int64_t ns):
        self._check()
        if hist != C_FSYNC_HIST and hist != C_PRODUCE_WAIT_HIST and hist != C_FETCH_WAIT_HIST:
            raise IndexError(hist)
        _observe(self.region + hist, ns)

    def request(self, int api, int version, int64_t t_arrived, int64_t t_started,
                int64_t t_handled, int64_t t_sent, int64_t remote_ns):
        cdef uint64_t *h
        self._check()
        if api < 0 or api >= C_API_SLOTS:
            return
        if 0 <= version < C_VERSION_SLOTS:
            shmq_mx_add(self.region + C_REQUESTS + api * C_VERSION_SLOTS + version, 1)
        h = self.region + C_LATENCY + api * C_PHASES * C_HIST_WORDS
        _observe(h, t_sent - t_arrived)
        _observe(h + C_HIST_WORDS, t_started - t_arrived)
        _observe(h + 2 * C_HIST_WORDS, t_handled - t_started - remote_ns)
        _observe(h + 3 * C_HIST_WORDS, remote_ns)
        _observe(h + 4 * C_HIST_WORDS, t_sent - t_handled)

    def error(self, int api, int code):
        self._check()
        if 0 <= api < C_API_SLOTS and 0 <= code + 1 < C_ERROR_SLOTS:
            shmq_mx_add(self.region + C_ERRORS + api * C_ERROR_SLOTS + code + 1, 1)

    cdef inline uint64_t *_slot(self, Py_ssize_t slot) noexcept:
        if 0 <= slot < self.partition_slots:
            return self.partitions + slot * C_PARTITION_WORDS
        return NULL

    def produced(self, Py_ssize_t slot, uint64_t messages, uint64_t nbytes):
        cdef uint64_t *p
        self._check()
        p = self._slot(slot)
        if p != NULL:
            shmq_mx_add(p, messages)
            shmq_mx_add(p + 1, nbytes)
            shmq_mx_add(p + 4, 1)

    def fetched(self, Py_ssize_t slot, uint64_t messages, uint64_t nbytes):
        cdef uint64_t *p
        self._check()
        p = self._slot(slot)
        if p != NULL:
            shmq_mx_add(p + 2, messages)
            shmq_mx_add(p + 3, nbytes)
            shmq_mx_add(p + 5, 1)

    def produce_failed(self, Py_ssize_t slot):
        cdef uint64_t *p
        self._check()
        p = self._slot(slot)
        if p != NULL:
            shmq_mx_add(p + 4, 1)
            shmq_mx_add(p + 6, 1)
        else:
            shmq_mx_add(self.region + C_FAILED_PRODUCE_OTHER, 1)

    def fetch_failed(self, Py_ssize_t slot):
        cdef uint64_t *p
        self._check()
        p = self._slot(slot)
        if p != NULL:
            shmq_mx_add(p + 5, 1)
            shmq_mx_add(p + 7, 1)
        else:
            shmq_mx_add(self.region + C_FAILED_FETCH_OTHER, 1)

    def partition_gauges(self, Py_ssize_t slot, uint64_t size_bytes, uint64_t segments):
        cdef uint64_t *p
        self._check()
        p = self._slot(slot)
        if p != NULL:
            shmq_mx_set(p + 8, size_bytes)
            shmq_mx_set(p + 9, segments)

    def partition_value(self, Py_ssize_t slot, Py_ssize_t field):
        cdef uint64_t *p
        self._check()
        p = self._slot(slot)
        if p == NULL or field < 0 or field >= C_PARTITION_WORDS:
            return 0
        return shmq_mx_get(p + field)

    def release(self):
        self._view = None
        self.base = self.region = self.partitions = NULL
