"""File slices: what a read returns and what ``net/`` hands to ``os.sendfile``.

A ``FileSlice`` keeps its ``FileHandle`` alive, so a segment deleted by retention while a slice
is still being sent does not close the descriptor under the sender (and its number cannot be
reused for another file): the descriptor closes when the last slice and the segment let go.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple


class FileHandle:
    """An owned file descriptor, closed when the last reference goes away or on ``close()``."""

    __slots__ = ("fd", "path", "__weakref__")

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self, _close: Any = os.close) -> None:  # os.close bound: usable at exit
        if self.fd >= 0:
            try:
                _close(self.fd)
            except OSError:
                pass
            self.fd = -1

    def __repr__(self) -> str:
        return f"FileHandle(fd={self.fd}, path={self.path!r})"


class FileSlice(NamedTuple):
    """``length`` bytes of a file starting at ``position``; always whole record batches."""

    handle: FileHandle
    position: int
    length: int

    @property
    def fd(self) -> int:
        return self.handle.fd

    def read(self) -> bytes:
        """The slice's bytes (tests and tools; the broker sends slices with sendfile)."""
        data = os.pread(self.handle.fd, self.length, self.position)
        if len(data) != self.length:
            raise EOFError(f"slice {self} was truncated under the reader")
        return data
