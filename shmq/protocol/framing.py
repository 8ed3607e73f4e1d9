"""Split a byte stream into Kafka frames: ``int32 size`` + ``size`` bytes of payload.

Two splitters: ``FrameReceiver`` (the broker's: the socket reads straight into its buffers) and
``FrameDecoder`` (bytes fed in; kept for clients and tools that get bytes objects).

FrameReceiver: theory of operation
----------------------------------
It serves ``asyncio.BufferedProtocol``: ``get_buffer()`` hands the transport a writable view to
``recv_into``, ``buffer_updated(n)`` returns every frame those ``n`` bytes complete, as read-only
memoryviews of the receive buffer (zero copy; kio needs read-only buffers)::

    buffer   [ frames handed out | pending frame (start..end) | free space (end..capacity) ]

* **Handed-out bytes are never written while a view of them lives.**  A buffer is filled
  forward; when the pending frame does not fit in what is left, the receiver drops its own
  read-only view and asks the buffer how many views of it remain (``ReceiveBuffer.exports``,
  counted by the compiled leaf: a frame, or any slice cut from one, keeps its buffer export
  alive).  None left: the pending bytes move to the front and the same buffer is filled again
  (its pages are already mapped: no page faults).  Some frame still in use (a queued request,
  a produce append waiting on a flush): a *new* buffer takes over and the old one lives on until
  its last view dies.  Without the compiled leaf (``SHMQ_PURE=1``) there is no count, so every
  renewal takes a new buffer.
* **Buffers are anonymous private mappings** (``mmap``): a page costs memory only once bytes are
  received into it, and the mapping goes back to the kernel when its last view dies.  So
  a frame's buffer is sized from its size prefix, once the prefix is checked against
  ``max_frame_bytes``, without a hostile prefix costing resident memory: a 100 MiB prefix
  followed by silence maps 100 MiB of address space and touches one page.  A dead buffer of
  at most 1 MiB (the usual size) is kept instead, ``MADV_FREE``d, in a pool of 8 per process
  for the next one (``ReceiveBuffer``): a new connection, or a renewal while queued frames hold
  the old buffer, then writes pages already mapped instead of faulting in fresh ones.
* **Little is ever copied.**  While a frame is pending, reads stop at most ``READ_AHEAD`` bytes
  past its end, and with no frame pending a read takes at most ``READ_AHEAD``; so when the next
  frame turns out not to fit, at most ``READ_AHEAD`` bytes of it move to the new buffer.  (The
  chunk list this replaced joined every frame that spanned two reads: ~7.5 % of the produce
  path's samples were that memmove.)

FrameDecoder: theory of operation
---------------------------------
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

import mmap
from typing import Any

from shmq import _fast
from shmq.errors import RemoteProtocolError

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
_SMALL_CHUNK = 4096  # pieces below this are coalesced instead of listed

BUFFER_BYTES = 1024 * 1024  # the smallest receive buffer (address space; pages on first use)
READ_AHEAD = 64 * 1024  # the most a read takes beyond the pending frame's end (see above)
_MIN_FREE = 4096  # less free space than this: start a new buffer rather than read a sliver
# Larger buffers (made for one large frame) are not refilled: their touched pages would stay
# resident for the connection's life; they are unmapped when their last frame view dies.
MAX_REUSED_BYTES = 8 * BUFFER_BYTES


def _map(size: int) -> Any:
    if _fast.HAVE_FAST:
        from shmq._fast.wire import ReceiveBuffer

        return ReceiveBuffer(size)
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)


class FrameReceiver:
    """Frames received straight into mapped buffers, for ``asyncio.BufferedProtocol``."""

    __slots__ = ("max_frame_bytes", "_buffer", "_view", "_frames", "_start", "_end", "_need",
                 "_failed", "renewed", "reused")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buffer: Any = None  # a ReceiveBuffer (or, pure Python, an mmap)
        self._view: memoryview | None = None  # the current buffer, writable
        self._frames: memoryview | None = None  # the same, read-only: frames are cut from it
        self._start = 0  # the pending frame's first byte (its size prefix)
        self._end = 0  # bytes received into the current buffer
        self._need = -1  # 4 + size of the pending frame once its prefix is in, else -1
        self._failed: RemoteProtocolError | None = None
        self.renewed = 0  # buffers mapped (counters for tests and profiles)
        self.reused = 0  # buffers filled again from the front

    @property
    def buffered(self) -> int:
        """Bytes of an incomplete frame held by the receiver."""
        return self._end - self._start

    def get_buffer(self, sizehint: int = -1) -> memoryview:
        """Where the next read goes (never empty)."""
        if self._failed is not None:
            raise self._failed
        view = self._view
        need = self._need
        if need >= 0:
            if view is None or self._start + need > len(view):
                view = self._renew(max(BUFFER_BYTES, need))
            stop = self._start + need + READ_AHEAD
        else:
            if view is None or len(view) - self._end < _MIN_FREE:
                view = self._renew(BUFFER_BYTES)
            stop = self._end + READ_AHEAD
        return view[self._end : min(stop, len(view))]

    def buffer_updated(self, nbytes: int) -> list[memoryview]:
        """``nbytes`` were read into the last ``get_buffer()``; the frames they complete."""
        self._end += nbytes
        frames: list[memoryview] = []
        frames_view = self._frames
        assert frames_view is not None
        start, end, need = self._start, self._end, self._need
        while True:
            if need < 0:
                if end - start < 4:
                    break
                size = int.from_bytes(frames_view[start : start + 4], "big", signed=True)
                if size < 1 or size > self.max_frame_bytes:
                    self._failed = RemoteProtocolError(
                        f"frame size {size} outside [1, {self.max_frame_bytes}]")
                    raise self._failed
                need = 4 + size
            if end - start < need:
                break
            frames.append(frames_view[start + 4 : start + need])
            start += need
            need = -1
        self._start, self._need = start, need
        return frames

    def _renew(self, size: int) -> memoryview:
        """A buffer of at least ``size`` bytes that starts with the pending bytes: the current
        one if no view of it is left (and it is large enough), else a new one."""
        pending = self._end - self._start
        old = self._view
        self._frames = None  # our own read-only view: now only frames count as exports
        if (old is not None and size <= len(old) <= MAX_REUSED_BYTES
                and getattr(self._buffer, "exports", 0) == 1):
            if pending:
                old[:pending] = old[self._start : self._end]  # memmove; nothing reads there
            view = old
            self.reused += 1
        else:
            self._buffer = _map(size)
            view = memoryview(self._buffer)
            if pending:
                assert old is not None
                view[:pending] = old[self._start : self._end]
            self.renewed += 1
        self._view = view
        self._frames = memoryview(self._buffer).toreadonly()  # a second export: frames only
        self._start, self._end = 0, pending
        return view


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
