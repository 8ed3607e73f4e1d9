"""A bounded cache of open segment files: descriptors independent of the number of segments.

Theory of operation
-------------------
Each ``LogSegment`` opens its ``.log`` file at first use (``LogSegment.handle``) and registers
with the process's ``CACHE``, a least-recently-used order of the segments holding a descriptor.
When more than ``capacity`` hold one, the least recently used drops its ``FileHandle``: the
descriptor closes once no ``FileSlice`` of a fetch in flight holds it either (``slices.py``),
and the segment reopens its file at its next use.  Index files hold no descriptor at all
(``index_file.py``), so a worker's descriptors are: the segments in the cache, connections
(``shmq.net.connection.Listener`` caps them), slices in flight and a reserve for its own files
(``shmq.limits``).  100,000 segments need no 100,000 descriptors: a worker under ``ulimit -n
1024`` keeps at most 448 segment files open and reopens the others as they are read or written,
slower (an ``open`` and an ``fstat``) but served.

The capacity is set from ``RLIMIT_NOFILE`` at a worker's start (``configure``).  A reopen that
still fails for want of descriptors (EMFILE, ENFILE: connections and slices took them) closes
half the cache and tries once more before the error reaches the request.

The cache holds weak references: a segment dropped without ``close`` (a log let go) is not kept
alive by it, and leaves the order when it is collected.

Threads: flushes run in the event loop's executor and may reopen a segment, so the order is kept
under a lock; a caller keeps the ``FileHandle`` it got in a local for as long as it uses the
descriptor number, so an eviction in another thread never closes a descriptor in use.
"""

from __future__ import annotations

import errno
import threading
import weakref
from collections import OrderedDict
from typing import Any

from shmq import limits

_OUT_OF_FDS = frozenset({errno.EMFILE, errno.ENFILE})


class DescriptorCache:
    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        # id(segment) -> weak reference, least recently used first
        self._open: OrderedDict[int, weakref.ref] = OrderedDict()
        self._lock = threading.Lock()
        self.opens = 0       # files opened (first use and reopens)
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._open)

    def configure(self, capacity: int) -> None:
        with self._lock:
            self.capacity = max(1, capacity)
            self._evict_locked(keep=None)

    def opened(self, segment: Any) -> None:
        """``segment`` now holds a descriptor: most recently used; evict past the capacity."""
        key = id(segment)
        opened = self._open
        with self._lock:
            self.opens += 1
            if key not in opened:
                # collected: leave the order (one C call, no lock: the callback may run anywhere)
                opened[key] = weakref.ref(segment, lambda _ref: opened.pop(key, None))
            opened.move_to_end(key)
            self._evict_locked(keep=key)

    def touch(self, segment: Any) -> None:
        try:
            self._open.move_to_end(id(segment))  # one C call: atomic under the GIL
        except KeyError:
            pass  # evicted meanwhile by another thread (the caller holds its handle)

    def forget(self, segment: Any) -> None:
        self._open.pop(id(segment), None)

    def shrink(self) -> int:
        """Out of descriptors: release the least recently used half; how many were released."""
        with self._lock:
            n = len(self._open) // 2
            for _ in range(n):
                self._release_oldest()
            self.evictions += n
            return n

    def _release_oldest(self) -> int | None:
        try:
            key, ref = self._open.popitem(last=False)
        except KeyError:
            return None
        seg = ref()
        if seg is not None:
            seg._release_handle()
        return key

    def _evict_locked(self, keep: int | None) -> None:
        while len(self._open) > self.capacity:
            key, ref = next(iter(self._open.items()))
            if key == keep:  # never the one just opened (capacity 1 would loop)
                return
            self._release_oldest()
            self.evictions += 1


CACHE = DescriptorCache(limits.segment_budget())


def open_with_retry(opener: Any) -> Any:
    """``opener()``; when it fails for want of descriptors, ``CACHE.shrink()`` and once more."""
    try:
        return opener()
    except OSError as exc:
        if exc.errno not in _OUT_OF_FDS or not CACHE.shrink():
            raise
    return opener()
