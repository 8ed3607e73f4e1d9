"""Split a byte stream into Kafka frames: ``int32 size`` + ``size`` bytes of payload.

Theory of operation
-------------------
``FrameDecoder.feed(data)`` returns the payloads of every frame completed by ``data``, in order,
as memoryviews without the size prefix.  The decoder holds at most one incomplete frame:

* frames that lie wholly inside ``data`` are returned as zero-copy slices of ``data`` (so the
  common case, one recv holding whole requests, copies nothing; when ``data`` is a mutable buffer
  the caller must not reuse it while those views are alive);
* the bytes of an incomplete frame are kept as a list of chunks (small pieces coalesced into one
  ``bytearray``) and joined exactly once, when the last byte arrives.  No buffer is ever sized
  from the size prefix: memory grows only with bytes actually received.

The size prefix is checked as soon as its 4 bytes are in: below 1 (a request needs a header) or
above ``max_frame_bytes`` (Kafka's ``socket.request.max.bytes``, 100 MiB) raises
``RemoteProtocolError``, after which the connection must be closed (the decoder stays failed).
"""

from __future__ import annotations

from typing import Any

from shmq.errors import RemoteProtocolError

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
_SMALL_CHUNK = 4096  # pieces below this are coalesced instead of listed


class FrameDecoder:
    """Incremental frame splitter for one connection (sans-io: bytes in, frames out)."""

    __slots__ = ("max_frame_bytes", "_chunks", "_buffered", "_need", "_failed")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._chunks: list[Any] = []  # the incomplete frame, size prefix included
        self._buffered = 0  # bytes in _chunks
        self._need = -1  # 4 + size once the prefix is known, else -1
        self._failed: RemoteProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held by the decoder."""
        return self._buffered

    def feed(self, data: Any) -> list[memoryview]:
        """Consume ``data``; return the payloads of the frames it completes, in order."""
        if self._failed is not None:
            raise self._failed
        mv = memoryview(data)
        if mv.ndim != 1 or mv.itemsize != 1:
            mv = mv.cast("B")
        frames: list[memoryview] = []
        pos = self._complete_pending(mv, frames) if self._buffered else 0
        end = len(mv)
        while not self._buffered and end - pos >= 4:
            size = self._check_size(mv[pos : pos + 4])
            if end - pos - 4 < size:
                break
            frames.append(mv[pos + 4 : pos + 4 + size])
            pos += 4 + size
        if pos < end and not self._buffered:
            # a partial frame starts here; a prefix already checked stays checked
            if end - pos >= 4:
                self._need = 4 + int.from_bytes(mv[pos : pos + 4], "big", signed=True)
            self._stash(mv[pos:], immutable=isinstance(mv.obj, bytes))
        return frames

    def _check_size(self, prefix: Any) -> int:
        size = int.from_bytes(prefix, "big", signed=True)
        if size < 1 or size > self.max_frame_bytes:
            self._failed = RemoteProtocolError(
                f"frame size {size} outside [1, {self.max_frame_bytes}]"
            )
            raise self._failed
        return size

    def _stash(self, piece: memoryview, immutable: bool) -> None:
        """Keep ``piece`` for later; views of immutable ``bytes`` are kept without copying."""
        n = len(piece)
        last = self._chunks[-1] if self._chunks else None
        if n < _SMALL_CHUNK:
            if isinstance(last, bytearray) and len(last) < 16 * _SMALL_CHUNK:
                last += piece
            else:
                self._chunks.append(bytearray(piece))
        else:
            self._chunks.append(piece if immutable else bytes(piece))
        self._buffered += n

    def _complete_pending(self, mv: memoryview, frames: list[memoryview]) -> int:
        """Move bytes from ``mv`` into the pending frame; emit it if complete.  Returns the
        number of bytes of ``mv`` used."""
        pos = 0
        immutable = isinstance(mv.obj, bytes)
        if self._need < 0:
            take = min(4 - self._buffered, len(mv))
            self._stash(mv[:take], immutable)
            pos = take
            if self._buffered < 4:
                return pos
            prefix = b"".join(self._chunks)
            self._chunks = [bytearray(prefix)]
            self._need = 4 + self._check_size(prefix)
        take = min(self._need - self._buffered, len(mv) - pos)
        if take:
            self._stash(mv[pos : pos + take], immutable)
            pos += take
        if self._buffered == self._need:
            frame = self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
            frames.append(memoryview(frame)[4:])
            self._chunks = []
            self._buffered = 0
            self._need = -1
        return pos
