"""The sparse offset index (Kafka ``OffsetIndex``).

Entry layout (8 bytes, big-endian)::

    0  relativeOffset int32   offset - segment base offset
    4  position int32         byte position of a batch in the .log file

An entry (O, P) says: the batch starting at byte P of the log ends at offset O (its lastOffset).
One entry is added whenever more than ``index.interval.bytes`` were appended since the previous
one.  To find offset T: take the largest entry with offset <= T, then scan batches forward from
its position for the first batch whose lastOffset >= T.
"""

from __future__ import annotations

import struct

import numpy as np

from shmq.errors import CorruptIndexError
from shmq.storage.index_file import IndexFile

_ENTRY = struct.Struct(">ii")


class OffsetIndex(IndexFile):
    ENTRY_SIZE = 8

    def entry(self, slot: int) -> tuple[int, int]:
        """(absolute offset, position) of entry ``slot``."""
        rel, pos = _ENTRY.unpack(self.entry_bytes(slot))
        return self.base_offset + rel, pos

    @property
    def last_entry(self) -> tuple[int, int]:
        last = self._last
        if last is None:
            last = self.entry(self.entries - 1) if self.entries else (self.base_offset, 0)
            self._last = last
        return last

    def append(self, offset: int, position: int) -> None:
        rel = offset - self.base_offset
        if not 0 <= rel <= 0x7FFFFFFF:
            raise CorruptIndexError(f"offset {offset} does not fit segment {self.base_offset}")
        if self.entries and offset <= self.last_entry[0]:
            raise CorruptIndexError(
                f"offset {offset} is not larger than the last index entry {self.last_entry[0]}"
            )
        self._append_entry(_ENTRY, rel, position)
        self._last = (offset, position)

    def append_many(self, offsets: np.ndarray, positions: np.ndarray) -> None:
        """``append`` for many entries at once (recovery), as far as the index has room."""
        room = self.max_entries - self.entries
        offsets, positions = offsets[:room], positions[:room]
        if len(offsets) == 0:
            return
        rel = offsets - self.base_offset
        prev = self.last_entry[0] if self.entries else self.base_offset - 1
        if rel[0] < 0 or rel[-1] > 0x7FFFFFFF or offsets[0] <= prev or np.any(np.diff(offsets) <= 0):
            raise CorruptIndexError(f"offsets {offsets[0]}..{offsets[-1]} do not fit index {self.path}")
        block = np.column_stack([rel, positions]).astype(">i4").tobytes()
        self._append_block(block, len(offsets))

    def lookup(self, offset: int) -> tuple[int, int]:
        """Largest entry with offset <= ``offset``, or (base offset, 0)."""
        slot = self._search(0, 4, offset - self.base_offset)
        return self.entry(slot) if slot >= 0 else (self.base_offset, 0)

    def lookup_position(self, position: int) -> tuple[int, int]:
        """Largest entry with position <= ``position``, or (base offset, 0)."""
        slot = self._search(4, 4, position)
        return self.entry(slot) if slot >= 0 else (self.base_offset, 0)

    def truncate_to(self, offset: int) -> None:
        """Remove every entry with offset >= ``offset``."""
        slot = self._search(0, 4, offset - self.base_offset, upper=True)
        if slot >= 0:
            self.truncate_entries(slot)

    def sanity_check(self, log_size: int) -> None:
        """Kafka's checks plus order and bounds of every entry (a garbled file fails them)."""
        if self.misaligned:
            raise CorruptIndexError(f"index {self.path} is not a whole number of entries")
        if self.entries == 0:
            return
        with memoryview(self.buffer) as view:
            table = np.frombuffer(view, dtype=">i4", count=self.entries * 2).reshape(-1, 2)
            rel, pos = table[:, 0].astype(np.int64), table[:, 1].astype(np.int64)
            del table  # no view of the mapping may outlive this block (it is remapped later)
        if (rel[0] < 0 or pos[0] < 0 or pos[-1] >= log_size
                or (self.entries > 1 and (np.any(np.diff(rel) <= 0) or np.any(np.diff(pos) <= 0)))):
            raise CorruptIndexError(
                f"corrupt index {self.path}: entries out of order or past the log ({log_size} bytes)"
            )
