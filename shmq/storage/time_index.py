"""The time index (Kafka ``TimeIndex``).

Entry layout (12 bytes, big-endian)::

    0  timestamp int64        largest timestamp seen up to (and in) the batch ending at ...
    8  relativeOffset int32   ... this offset, relative to the segment base offset

Entries are appended only when the timestamp grows, so both columns are monotonic.  When a
segment becomes inactive one last entry (max timestamp, its offset) is appended even if the
index is full, then the file is trimmed.
"""

from __future__ import annotations

import struct

import numpy as np

from shmq.errors import CorruptIndexError
from shmq.storage.index_file import IndexFile

_ENTRY = struct.Struct(">qi")


class TimeIndex(IndexFile):
    ENTRY_SIZE = 12

    def entry(self, slot: int) -> tuple[int, int]:
        """(timestamp, absolute offset) of entry ``slot``."""
        ts, rel = _ENTRY.unpack(self.entry_bytes(slot))
        return ts, self.base_offset + rel

    @property
    def last_entry(self) -> tuple[int, int]:
        last = self._last
        if last is None:
            last = self.entry(self.entries - 1) if self.entries else (-1, self.base_offset)
            self._last = last
        return last

    def maybe_append(self, timestamp: int, offset: int, skip_full_check: bool = False) -> None:
        """Append (timestamp, offset) if the timestamp grows; an empty index's last entry is
        (-1, base offset), so a batch without timestamps (-1) is never indexed."""
        last_ts, last_off = self.last_entry
        if timestamp <= last_ts:
            return
        if offset < last_off:
            raise CorruptIndexError(f"time index offset {offset} goes backwards ({last_off})")
        if self.is_full and not skip_full_check:
            raise CorruptIndexError(f"time index {self.path} is full")
        self._append_entry(_ENTRY, timestamp, offset - self.base_offset, skip_full_check)
        self._last = (timestamp, offset)

    def append_many(self, timestamps: np.ndarray, offsets: np.ndarray) -> None:
        """``maybe_append`` over non-decreasing timestamps (recovery), as far as there is room."""
        if len(timestamps) == 0:
            return
        last_ts, last_off = self.last_entry
        prev = np.concatenate(([last_ts], timestamps[:-1]))
        keep = timestamps > np.maximum(prev, last_ts)
        ts, offs = timestamps[keep], offsets[keep]
        room = self.max_entries - self.entries
        ts, offs = ts[:room], offs[:room]
        if len(ts) == 0:
            return
        if offs[0] < last_off or np.any(np.diff(offs) < 0):
            raise CorruptIndexError(f"time index offsets go backwards in {self.path}")
        dtype = np.dtype([("ts", ">i8"), ("rel", ">i4")])
        block = np.empty(len(ts), dtype=dtype)
        block["ts"] = ts
        block["rel"] = offs - self.base_offset
        self._append_block(block.tobytes(), len(ts))

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """Largest entry with timestamp <= ``timestamp``, or (-1, base offset)."""
        slot = self._search(0, 8, timestamp)
        return self.entry(slot) if slot >= 0 else (-1, self.base_offset)

    def truncate_to(self, offset: int) -> None:
        """Remove every entry with offset >= ``offset``."""
        slot = self._search(8, 4, offset - self.base_offset, upper=True)
        if slot >= 0:
            self.truncate_entries(slot)

    def sanity_check(self, max_offset: int) -> None:
        """Order and bounds of every entry; timestamps are never negative (an entry is only
        appended when the timestamp exceeds -1)."""
        if self.misaligned:
            raise CorruptIndexError(f"time index {self.path} is not a whole number of entries")
        if self.entries == 0:
            return
        with memoryview(self.buffer) as view:
            table = np.frombuffer(view, dtype=np.dtype([("ts", ">i8"), ("rel", ">i4")]),
                                  count=self.entries)
            ts, rel = table["ts"].astype(np.int64), table["rel"].astype(np.int64)
            del table  # no view of the mapping may outlive this block (it is remapped later)
        if (rel[0] < 0 or ts[0] < 0 or rel[-1] > max_offset - self.base_offset
                or (self.entries > 1 and (np.any(np.diff(ts) <= 0) or np.any(np.diff(rel) < 0)))):
            raise CorruptIndexError(f"corrupt time index {self.path}: entries out of order")
