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
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np

MIN_ARRAY = 64 << 10
DEFAULT_MAX_BYTES = 1 << 30
_pyarrow: Any = None


def _import_pyarrow() -> Any:
    """pyarrow, imported at the first ``take`` (importing this module does not import it)."""
    global _pyarrow
    import pyarrow

    _pyarrow = pyarrow
    return pyarrow


class BufferPool:
    """``take(n)`` -> a ``pyarrow.Buffer`` of ``n`` bytes (uninitialised), from a pooled array
    that nothing references any more, or a new one."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._arrays: list[np.ndarray] = []    # sorted by size
        self._bytes = 0
        self._lock = threading.Lock()
        self.reused = 0                          # counters, for tests and diagnostics
        self.created = 0
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

    def take(self, n: int) -> Any:
        # one take a ``to_arrow`` (``sections_to_arrow`` slices its eight filled buffers out of
        # one block; it took eight), part of the fixed cost a waiting reader's small reads pay
        # each (2.4 -> ~1 us a take: pyarrow looked up once, no index loop)
        pa = _pyarrow or _import_pyarrow()
        n = max(int(n), 0)
        getrefcount = sys.getrefcount
        with self._lock:
            arrays = self._arrays
            for a in arrays:
                # references: the list, ``a`` and getrefcount's argument; any more is a lent
                # slice still alive (an Arrow buffer somewhere)
                if a.nbytes >= n and getrefcount(a) == 3:
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
            return pa.py_buffer(a[:n])

    def in_use(self) -> int:
        """How many pooled arrays a caller still holds."""
        with self._lock:
            return sum(1 for a in self._arrays if sys.getrefcount(a) > 3)

    def clear(self) -> None:
        """Forget the arrays (those still lent stay alive with their users)."""
        with self._lock:
            self._arrays = []
            self._bytes = 0
            self._constants = None
