"""Output buffers that a local reader reuses once the caller has let go of them.

Why
---
``read_arrow`` decodes into new column buffers at every call.  Fresh anonymous pages cost a page
fault and a zero-fill each, and on a VM whose guest hands freed memory back to the host (free
page reporting) a fresh page costs a fault in the host too: 4-15 us per 4 KiB page measured
here (``perf/probe_pages.py``, quiet to loaded), against ~0.3 us for a page the process already
has.  A reader that decodes chunk after chunk
into the same memory pays that once.  pyarrow's allocator does not promise it (mimalloc purges
freed memory back to the kernel after ~10 ms), so the reader keeps its own buffers.

How
---
A buffer is lent as ``pyarrow.py_buffer`` over a slice of a pooled ``numpy`` array.  Arrow holds
a Python reference to that slice for as long as any array, batch or slice of a batch uses the
buffer, and the slice holds its base array, so a pooled array whose reference count is back to
the pool's own is free again: reuse never overwrites data a caller can still see.  Arrays are
sized in powers of two (at least 64 KiB) so that chunks of varying sizes fit the same arrays;
at most ``max_bytes`` are kept (beyond that a request gets an ordinary pyarrow buffer).  One lock
makes ``take`` safe from several threads.

The columns that hold one value in every row (topic, partition, timestampType) are not filled
per read at all: ``constants`` (``kafka_arrow.ConstantColumns``) lends the same read-only
buffers to every batch.

New arrays are faulted in from two sides
----------------------------------------
A reader's first reads still get new arrays (two sets when the caller keeps each batch while it
asks for the next), and their first touch is most of those calls' time: ~2 us a page when the
guest has the page, ~9 us when the host took it back (``perf/README.md``, "Fresh memory on this
VM"; 100,000 records a call: 5-60 ms against ~2 ms once the arrays are reused).  ``take(n,
prefault=True)`` -- for a buffer the caller will write through -- hands the new array's pages to
a helper thread, which asks the kernel to fault them in (``MADV_POPULATE_WRITE``: zero-filled
pages for the missing ones, present pages left as they are, so the decoder's writes can never
be lost) from the top down, 1 MiB at a time, while the decoder writes from the bottom up on
the calling thread: the faults are split between two CPUs, and nothing waits for the helper.
While the helper works on an array the pool holds it once more (``_busy``), and counts that
reference when it looks for a free array; so no array is unmapped under the helper.  A kernel without ``MADV_POPULATE_WRITE`` (< 5.14) turns it off.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import queue
import sys
import threading
from typing import Any

import numpy as np

MIN_ARRAY = 64 << 10
DEFAULT_MAX_BYTES = 1 << 30
# new arrays of at least this many bytes to prefault are handed to the helper (below it a
# thread hand-off costs about what the faults do)
PREFAULT_MIN = 256 << 10
PREFAULT_STEP = 1 << 20
_MADV_POPULATE_WRITE = 23


class _Prefaulter:
    """One daemon thread that populates address ranges (``MADV_POPULATE_WRITE``), top down."""

    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._madvise = libc.madvise
        self._madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self._madvise.restype = ctypes.c_int
        self._jobs: queue.SimpleQueue[tuple[int, int, Any] | None] = queue.SimpleQueue()
        self._idle = threading.Condition()
        self._pending = 0
        self.works = True
        self.pid = os.getpid()  # a forked child has no helper thread: it makes its own
        self._thread = threading.Thread(target=self._run, name="shmq-prefault", daemon=True)
        self._thread.start()

    def submit(self, address: int, length: int, done: Any) -> None:
        """Populate ``[address, address + length)``, then call ``done()``."""
        with self._idle:
            self._pending += 1
        self._jobs.put((address, length, done))

    def _run(self) -> None:
        page = 4096
        while True:
            job = self._jobs.get()
            if job is None:
                return
            address, length, done = job
            try:
                lo = address & ~(page - 1)
                end = address + length
                while self.works and end > lo:
                    start = max(lo, (end - PREFAULT_STEP) & ~(page - 1))
                    if self._madvise(start, end - start, _MADV_POPULATE_WRITE) != 0 \
                            and ctypes.get_errno() == errno.EINVAL:
                        self.works = False  # a kernel without it
                    end = start
            finally:
                done()
                with self._idle:
                    self._pending -= 1
                    if not self._pending:
                        self._idle.notify_all()

    def drain(self, timeout: float = 5.0) -> None:
        """Wait until every submitted range is done."""
        with self._idle:
            self._idle.wait_for(lambda: not self._pending, timeout)

    def stop(self) -> None:
        self.drain()
        self._jobs.put(None)
        self._thread.join(timeout=5.0)


class BufferPool:
    """``take(n)`` -> a ``pyarrow.Buffer`` of ``n`` bytes (uninitialised), from a pooled array
    that nothing references any more, or a new one."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, prefault: bool = True) -> None:
        self.max_bytes = max_bytes
        self.prefault = prefault and sys.platform.startswith("linux")
        self._prefaulter: _Prefaulter | None = None
        self._arrays: list[np.ndarray] = []    # sorted by size
        self._bytes = 0
        self._lock = threading.Lock()
        self.reused = 0                          # counters, for tests and diagnostics
        self.created = 0
        self.prefaulted = 0
        self._busy: dict[int, np.ndarray] = {}  # arrays the helper is faulting in, by id
        self._constants: Any = None

    @property
    def constants(self) -> Any:
        """The shared constant columns (``kafka_arrow.ConstantColumns``), made on first use."""
        if self._constants is None:
            from shmq.protocol.kafka_arrow import ConstantColumns

            self._constants = ConstantColumns()
        return self._constants

    @property
    def pooled_bytes(self) -> int:
        return self._bytes

    def take(self, n: int, prefault: bool = False) -> Any:
        """``prefault``: the caller will write the buffer through (a decoder's output column):
        a new array's pages are faulted in by the helper meanwhile (module docstring)."""
        import pyarrow as pa

        n = max(int(n), 0)
        with self._lock:
            helper = self._prefaulter
            if self.prefault and (helper is None or helper.pid != os.getpid()):
                self._prefaulter = _Prefaulter()  # a reader's first read starts it
            arrays = self._arrays
            busy = self._busy
            for i in range(len(arrays)):
                a = arrays[i]
                # references: the list, ``a`` and getrefcount's argument (and ``_busy``'s while
                # the helper faults it in); any more is a lent slice still alive (an Arrow
                # buffer somewhere)
                if a.nbytes >= n and sys.getrefcount(a) == 3 + (id(a) in busy):
                    self.reused += 1
                    return pa.py_buffer(a[:n])
            size = max(MIN_ARRAY, 1 << max(n - 1, 0).bit_length())
            if self._bytes + size > self.max_bytes:
                return pa.allocate_buffer(n)
            a = np.empty(size, dtype=np.uint8)
            arrays.append(a)
            arrays.sort(key=lambda x: x.nbytes)
            self._bytes += size
            self.created += 1
            if prefault and self._prefaulter is not None and n >= PREFAULT_MIN:
                if self._prefaulter.works:
                    key = id(a)
                    busy[key] = a
                    self._prefaulter.submit(a.ctypes.data, n, functools.partial(self._done, key))
                    self.prefaulted += 1
            return pa.py_buffer(a[:n])

    def take_written(self, n: int) -> Any:
        """``take(n, prefault=True)``."""
        return self.take(n, True)

    def _done(self, key: int) -> None:
        with self._lock:
            self._busy.pop(key, None)

    def in_use(self) -> int:
        """How many pooled arrays a caller still holds."""
        with self._lock:
            return sum(1 for a in self._arrays
                       if sys.getrefcount(a) > 3 + (id(a) in self._busy))

    def clear(self) -> None:
        """Forget the arrays (those still lent stay alive with their users, those the helper
        works on with ``_busy`` until it is done) and stop the helper."""
        with self._lock:
            helper, self._prefaulter = self._prefaulter, None
        if helper is not None:
            helper.stop()  # outside the lock: the helper's done() takes it
        with self._lock:
            self._arrays = []
            self._bytes = 0
            self._constants = None
