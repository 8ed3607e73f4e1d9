"""A bound on the index mappings of inactive segments: memory maps independent of the log size.

Theory of operation
-------------------
A segment maps its ``.index`` and ``.timeindex`` when they are first used (``LogSegment``, "Lazy
loading") and, like Kafka's, kept them mapped until it was closed.  Linux allows a process
``vm.max_map_count`` mappings (65,530 by default): a consumer reading a 100,000-segment
partition from its start would have had every segment's two indexes mapped, and the mmap after
the 32,000th segment fails.  So the inactive segments whose indexes are mapped are kept in a
least-recently-used order (``INDEXES``), and past ``capacity`` the least recently used one
releases its mappings (``LogSegment._release_indexes``: msync, unmap) and maps them again at
its next use, without the checks of its first load (they passed).  Active segments are never
counted: appends write through their mappings.

The capacity is an eighth of ``vm.max_map_count`` in segments (a quarter of the mappings; the
rest is for active segments, the recovery-point files, the interpreter's own and the local
readers' maps), at least ``MIN_CAPACITY``.  Weak references, as in ``descriptors.py``: a segment
dropped without ``close`` leaves the order when it is collected.  Opening (and so evicting) runs
on the event loop and in the start's loader threads, hence the lock; a flush in another thread
meanwhile msyncs whatever is still mapped (``IndexFile.flush`` reads the mapping once), and the
release msyncs before it unmaps, so a flush never misses an index's dirty pages.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any

MIN_CAPACITY = 64


def default_capacity() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read())
    except (OSError, ValueError):
        limit = 65530
    return max(MIN_CAPACITY, limit // 8)


class IndexMappings:
    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._open: OrderedDict[int, weakref.ref] = OrderedDict()
        self._lock = threading.Lock()
        self.releases = 0

    def __len__(self) -> int:
        return len(self._open)

    def configure(self, capacity: int) -> None:
        with self._lock:
            self.capacity = max(1, capacity)
        self._evict(keep=None)

    def opened(self, segment: Any) -> None:
        """``segment`` (inactive) mapped its indexes: most recently used; evict past capacity."""
        key = id(segment)
        opened = self._open
        with self._lock:
            if key not in opened:
                opened[key] = weakref.ref(segment, lambda _ref: opened.pop(key, None))
            opened.move_to_end(key)
        self._evict(keep=key)

    def touch(self, segment: Any) -> None:
        try:
            self._open.move_to_end(id(segment))  # one C call: atomic under the GIL
        except KeyError:
            pass

    def forget(self, segment: Any) -> None:
        self._open.pop(id(segment), None)

    def _evict(self, keep: int | None) -> None:
        busy: list[tuple[int, weakref.ref]] = []  # cannot release now (rebuilding, a view)
        try:
            while True:
                with self._lock:
                    if len(self._open) <= self.capacity:
                        return
                    key, ref = next(iter(self._open.items()))
                    if key == keep:
                        return
                    del self._open[key]
                seg = ref()
                if seg is None:
                    continue
                if seg._release_indexes():
                    self.releases += 1
                elif not seg.active and seg._opened_indexes():
                    busy.append((key, ref))
        finally:
            with self._lock:  # tried again at the next eviction, as the most recent
                for key, ref in busy:
                    self._open.setdefault(key, ref)


INDEXES = IndexMappings(default_capacity())
