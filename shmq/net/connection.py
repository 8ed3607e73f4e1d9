"""One Kafka client connection: frames in, responses out in request order, records by sendfile.

Theory of operation
-------------------
The socket reads straight into the ``FrameReceiver``'s buffers (``asyncio.BufferedProtocol``:
no bytes object per read, no joining of frames that span reads); complete frames, read-only
views of those buffers that stay valid for as long as they are referenced, queue up and one task
per connection handles them strictly one after another, so responses leave in request order (Kafka
mutes a channel while a request is in flight; kafka-python and aiokafka match responses to the
oldest request and drop the connection otherwise).  A response is a list of pieces, bytes and
``FileSlice``s: they go straight to the socket (``send``, ``os.sendfile``: the record bytes go from
the page cache to the socket and never through a Python object) until it stops taking them, then
through the transport (``transport.write``, ``loop.sendfile``), which finishes the send.  Reading
pauses while more than ``MAX_QUEUED`` frames wait, so a client that pipelines without reading
answers cannot grow our memory without bound.  A protocol error closes this connection only.

A client that closes its connection: the request in hand is cancelled, unless requests read
before the close wait behind it; then, as Kafka's ``Selector`` keeps a closing channel until its
received requests are processed, it and they are handled in order, their answers dropped.  So a
consumer that gives up on its LeaveGroup (librdkafka waits 5 s while it is held behind a parked
JoinGroup) still leaves once the join completes, instead of waiting out its session timeout; and
a producer's last acks=0 batches are still appended.

Answers to pipelined quick requests leave together.  librdkafka resolves a new assignment's
offsets with one ListOffsets request per partition, all written at once, and fetches as soon as
an answer arrives: answered one write each, the first answer alone started a Fetch of that one
partition, and when it was empty the broker held it for fetch.wait.max.ms while the other
partitions' offsets were known and waited (64 partitions on two workers, kcat -C: 500 ms of a
0.6 s read).  So the answer to a request that is answered at once (``_QUICK_APIS``: ListOffsets,
ApiVersions, OffsetForLeaderEpoch) waits while the next queued request is another one, or while
bytes of more requests wait unread in the socket (``MSG_PEEK``; the event loop then turns to read
them), up to ``_MAX_HELD`` answers; then the run leaves in one write (Redis writes its replies
the same way, once per loop turn).  The run is the whole burst: with runs of 64 answers, a
kcat or confluent-kafka consumer starting on 1,000 partitions (500 ListOffsets to each of two
workers, all written at once) built its first Fetch from the first 64 partitions answered; when
none of them held data (a sticky-partitioned topic fills ~15 of 1,000) that Fetch was parked
for fetch.wait.max.ms, and so were the ListOffsets the client wrote after it (Kafka's rule too:
its ``SocketServer`` mutes a connection until the answer in flight is sent).  Answered in one
write, the burst reaches librdkafka's broker thread in one read, and its first Fetch names
most partitions (traced with ``debug=protocol,fetch``: 64/500 and 3/500 partitions before,
see perf/README "Consume at 1,000 partitions").  A lone request is answered at once, as before, and a slow
request (a Produce waiting for an fsync, a long-polling Fetch) never holds an earlier answer
back: the run is sent before it is handled.

Pipelined produces.  A Produce whose answer waits for an fsync (acks=all with ``flush.on.ack``)
is appended at once and its answer queued (``produce.append`` returns a future); the next
request, when it is a Produce too, is appended while that fsync runs, and the group commit that
follows covers it.  Handled strictly one at a time, each request was appended only after the
previous one's fsync: a librdkafka producer (up to 1,000,000 requests in flight, 5 with
idempotence) at 10,000 msg/s queued its requests behind fsyncs, and a consumer saw records
p99 115 ms after they were produced.  Appends stay in request order, answers leave in request
order, at most ``_MAX_PIPELINED`` wait at a time, and any other request waits until the answers
before it have left: a client sees what Kafka answers (Kafka's own acks=all answers wait for its
followers, not for an fsync, so its next append never waited on a disk).

Metrics (``metrics``, a ``MetricsWriter`` or None): each read stamps its frames with one clock
read (``perf_counter_ns``, vDSO: no system call); a request's count and its times (queue: read to
handled, local and remote: the handler, remote being what the handler reported waiting in
``router.remote_ns``, send: handled to written) go into the shared table with one call when its
answer leaves (held quick answers when their run leaves).
"""

from __future__ import annotations

import asyncio
import contextvars
import errno
import logging
import os
import socket
from collections import deque
from time import perf_counter_ns
from typing import Any

from shmq._fast._metrics_reference import CONNECTIONS_CLOSED, CONNECTIONS_OPENED, PROTOCOL_ERRORS
from shmq.errors import ProtocolError
from shmq.limits import Throttled, connection_budget, nofile, open_fds
from shmq.protocol.framing import FrameReceiver
from shmq.storage.slices import FileSlice

# The client's IP address while a request of its connection is handled (each connection's serving
# task has its own context): the group coordinator records it as a member's client host.
PEER: contextvars.ContextVar[str] = contextvars.ContextVar("shmq_peer", default="")

log = logging.getLogger(__name__)

MAX_QUEUED = 32
_MSG_MORE = getattr(socket, "MSG_MORE", 0)
# API keys whose requests are answered without waiting on anything (see "Answers to pipelined
# quick requests" above): ListOffsets, ApiVersions, OffsetForLeaderEpoch.
_QUICK_APIS = frozenset({2, 18, 23})
# Answers sent in one write at most: a consumer start at 1,000 partitions on two workers sends
# 500 ListOffsets to each at once (see "Answers to pipelined quick requests"); ~60 B an answer.
_MAX_HELD = 1024
# Produce requests of one connection appended while earlier ones wait for their fsync (see
# "Pipelined produces" above); the next one waits for the oldest answer
_MAX_PIPELINED = 32
# Answers a client has not read yet, buffered in the process, above which its connection handles
# no more requests until they drain (then its unread requests stop its reading: TCP pushes back).
# Kafka's broker goes further and mutes a connection until each answer is sent.
WRITE_BUFFER_HIGH = 1 << 20


def _produce(frame: memoryview) -> bool:
    return len(frame) >= 2 and frame[0] == 0 and frame[1] == 0


def _quick(frame: memoryview) -> bool:
    return len(frame) >= 2 and frame[0] == 0 and frame[1] in _QUICK_APIS


class _FdFile:
    """What ``loop.sendfile`` needs of a file: a descriptor, and for its fallback (taken when
    the first ``os.sendfile`` of a call fails, e.g. ENOMEM under a memory cgroup's limit) a
    position and ``readinto``; reads are ``pread``s, so the descriptor's offset is never used."""

    __slots__ = ("_fd", "_pos")
    mode = "rb"

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._pos = 0

    def fileno(self) -> int:
        return self._fd

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 0:
            self._pos = offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        n = os.preadv(self._fd, [buffer], self._pos)
        self._pos += n
        return n


class RequestBudget:
    """``queued.max.request.bytes`` for one process: bytes of requests read and not yet handled
    (queued, or in their handler: a produce waiting for its fsync holds its batch), across every
    connection.  Past the limit the connection that read the frame stops reading (TCP pushes
    back on its client) until the total falls to half; then every connection paused for it
    reads again.  Memory for requests is then bounded by the limit plus, per connection, the
    one frame it is receiving (at most ``socket.request.max.bytes``, mapped as it arrives)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.queued = 0
        self.peak = 0
        self.paused: set[KafkaConnection] = set()

    def take(self, conn: KafkaConnection, nbytes: int) -> None:
        self.queued += nbytes
        if self.queued > self.peak:
            self.peak = self.queued
        if self.limit > 0 and self.queued > self.limit and conn not in self.paused:
            self.paused.add(conn)
            conn._set_reading()

    def give(self, nbytes: int) -> None:
        self.queued -= nbytes
        if self.paused and self.queued <= self.limit // 2:
            paused, self.paused = self.paused, set()
            for conn in paused:
                conn._set_reading()


# The tasks of connections their clients closed that still handle the requests read before
# the close (a long-polling Fetch, a parked JoinGroup, then what waits behind it).
_DRAINING: set[asyncio.Task] = set()


async def stop_draining(timeout: float = 2.0) -> None:
    """At shutdown, before the process's tables close: cancel the closed connections' tasks and
    let their handlers clean up (a Fetch counts its wait in the metrics table as it ends)."""
    tasks = [t for t in _DRAINING if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=timeout)


class KafkaConnection(asyncio.BufferedProtocol):
    def __init__(self, router: Any, max_frame_bytes: int, stats: dict[str, int],
                 metrics: Any = None, budget: RequestBudget | None = None) -> None:
        self.router = router
        self.budget = budget if budget is not None else RequestBudget(0)
        self.held_bytes = 0  # of this connection's frames in the budget
        self.receiver = FrameReceiver(max_frame_bytes)
        self.stats = stats
        self.metrics = metrics
        self.queue: deque[memoryview] = deque()
        self.arrived: deque[int] = deque()  # perf_counter_ns of each queued frame's read
        self.transport: asyncio.Transport | None = None
        self.sock: socket.socket | None = None
        self.wakeup = asyncio.Event()
        self.writable = asyncio.Event()  # the transport's buffer is below its high-water mark
        self.writable.set()
        self.task: asyncio.Task | None = None
        self.paused = False
        self.closed = False
        self.closed_counted = False
        self.on_close: Any = None  # the listener's count of live connections
        # pipelined Produce answers, oldest first: (future, api, version, arrived, started)
        self.inflight: deque[tuple[asyncio.Future, int, int, int, int]] = deque()
        # a full socket waited on by ``_send_rest``: its descriptor (-1: none) and the waiter
        self._writer_fd = -1
        self._writer_loop: Any = None
        self._write_waiter: asyncio.Future | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        if self.metrics is not None:
            self.metrics.add(CONNECTIONS_OPENED)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # The selector transport's own socket, for direct sends (``_send_direct``); the public
        # ``get_extra_info("socket")`` wrapper deprecates ``send``.  Not there: transport only.
        raw = getattr(transport, "_sock", None)
        self.sock = raw if isinstance(raw, socket.socket) else None
        self.task = asyncio.ensure_future(self._serve())

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.receiver.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self.receiver.buffer_updated(nbytes)
        except ProtocolError as exc:
            log.info("closing connection: %s", exc)
            if self.metrics is not None:
                self.metrics.add(PROTOCOL_ERRORS)
            self._abort()
            return
        if frames:
            self.queue.extend(frames)
            if self.metrics is not None:
                self.arrived.extend([perf_counter_ns()] * len(frames))
            self.wakeup.set()
            nbytes = len(frames[0]) if len(frames) == 1 else sum(map(len, frames))
            self.held_bytes += nbytes
            self.budget.take(self, nbytes)
            if len(self.queue) > MAX_QUEUED and not self.paused:
                self.paused = True
                self._set_reading()

    def _set_reading(self) -> None:
        """Read or not: paused while too many frames wait here or the process's budget of
        queued request bytes is spent (``RequestBudget``)."""
        transport = self.transport
        if transport is None or self.closed or transport.is_closing():
            return
        if self.paused or self in self.budget.paused:
            if transport.is_reading():
                transport.pause_reading()
        elif not transport.is_reading():
            transport.resume_reading()

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.writable.set()
        self._drop_writer()  # before the transport closes the socket (its number is reused)
        if self.metrics is not None and not self.closed_counted:
            self.closed_counted = True
            self.metrics.add(CONNECTIONS_CLOSED)
        on_close, self.on_close = self.on_close, None
        if on_close is not None:
            on_close()
        self.closed = True
        self.wakeup.set()
        self.budget.paused.discard(self)
        if self.held_bytes:
            held, self.held_bytes = self.held_bytes, 0
            self.budget.give(held)
        if self.task is not None:
            if self.queue:  # requests read before the close are still handled, unanswered
                self.wakeup.set()
                _DRAINING.add(self.task)
                self.task.add_done_callback(_DRAINING.discard)
            else:
                self.task.cancel()

    def _abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    async def _serve(self) -> None:
        peer = self.transport.get_extra_info("peername") if self.transport else None
        PEER.set(str(peer[0]) if isinstance(peer, tuple) else "")
        held: list[Any] = []  # answers not yet sent: the pieces of ``held_count`` responses
        held_count = 0
        metrics = self.metrics
        timed: list[tuple[int, int, int, int, int, int]] = []  # requests of ``held``, for metrics
        inflight = self.inflight
        try:
            while not self.closed or self.queue:
                if inflight:  # answers of pipelined Produce requests first, in order
                    if self.queue:
                        keep = _MAX_PIPELINED - 1 if _produce(self.queue[0]) else 0
                    else:
                        keep = len(inflight)  # the ones done
                    await self._send_pipelined(keep)
                    if not self.queue and inflight:
                        self.wakeup.clear()  # set by the next frame or the oldest answer
                        if not inflight[0][0].done():
                            await self.wakeup.wait()
                        continue
                if not self.queue:
                    if held and held_count < _MAX_HELD and self._input_waiting():
                        # requests already in the socket join this write: the loop reads them
                        # within a turn or two (our step runs before its reader callbacks)
                        for _ in range(3):
                            await asyncio.sleep(0)
                            if self.queue:
                                break
                        if self.queue:
                            continue
                    if held:
                        await self._send(held)
                        held, held_count = [], 0
                        if timed:
                            self._record(timed)
                    self.wakeup.clear()
                    await self.wakeup.wait()
                    continue
                frame = self.queue.popleft()
                if metrics is not None:
                    arrived = self.arrived.popleft()
                    api = frame[0] << 8 | frame[1] if len(frame) >= 4 else -1
                    version = frame[2] << 8 | frame[3] if len(frame) >= 4 else -1
                    started = perf_counter_ns()
                if self.paused and len(self.queue) <= MAX_QUEUED // 2:
                    self.paused = False
                    self._set_reading()
                quick = _quick(frame)
                size = len(frame)
                try:
                    pieces = await self.router.handle(frame)
                except ProtocolError as exc:
                    log.info("closing connection: %s", exc)
                    log.debug("offending frame: %s", bytes(frame[:256]).hex())
                    if metrics is not None:
                        metrics.add(PROTOCOL_ERRORS)
                    # the requests before the bad one are answered, as they would be
                    await self._send_pipelined(0)
                    if held:
                        await self._send(held)
                    self._abort()
                    return
                finally:
                    if not self.closed:  # else connection_lost gives back all it held
                        self.held_bytes -= size
                        self.budget.give(size)
                # drop the frame now: its receive buffer is refilled once no frame view is left
                del frame
                if self.closed or self.transport is None:
                    continue
                if isinstance(pieces, asyncio.Future) or inflight:
                    # appended, answered once its fsync is done: the next Produce is appended
                    # meanwhile (``produce.append``); answers still leave in request order
                    if held:
                        await self._send(held)
                        held, held_count = [], 0
                        if timed:
                            self._record(timed)
                    self._pipeline(pieces, api if metrics is not None else -1,
                                   version if metrics is not None else -1,
                                   arrived if metrics is not None else 0,
                                   started if metrics is not None else 0)
                    continue
                if metrics is not None:
                    # the handler's wait, read before anything else can run on the loop
                    remote, self.router.remote_ns = self.router.remote_ns, 0
                    timed.append((api, version, arrived, started, perf_counter_ns(), remote))
                if pieces is not None:
                    held.extend(pieces)
                    held_count += 1
                    self.stats["responses"] += 1
                if quick and held_count < _MAX_HELD and (not self.queue
                                                         or _quick(self.queue[0])):
                    continue  # leaves with the quick requests behind it (top of the loop)
                if held:
                    if held_count == 1 and len(held) == 1 and self._send_one(held[0]):
                        # sent or handed to the transport without a coroutine (``_send_one``)
                        if not self.writable.is_set():
                            await self.writable.wait()
                    else:
                        await self._send(held)
                    held, held_count = [], 0
                if timed:
                    self._record(timed)
        except asyncio.CancelledError:
            pass
        except (ConnectionError, OSError) as exc:
            log.info("connection error: %s", exc)
            self._abort()
        except Exception:  # a bug in a handler: this connection dies, the broker stays up
            log.exception("internal error while serving a request")
            self._abort()

    def _pipeline(self, answer: Any, api: int, version: int, arrived: int,
                  started: int) -> None:
        """Queue a Produce's answer behind the pipelined ones: a future of ``(response,
        nanoseconds waited, when done)``, or an answer already made (pieces or None) that must
        wait for those before it."""
        if not isinstance(answer, asyncio.Future):
            self.router.remote_ns = 0
            done = asyncio.get_running_loop().create_future()
            done.set_result((answer, 0, perf_counter_ns()))
            answer = done
        else:
            answer.add_done_callback(self._answered)
        self.inflight.append((answer, api, version, arrived, started))

    def _answered(self, answer: asyncio.Future) -> None:
        self.wakeup.set()
        if self.closed and not answer.cancelled() and answer.exception() is not None:
            log.error("a pipelined Produce failed after its connection closed",
                      exc_info=answer.exception())

    async def _send_pipelined(self, keep: int) -> None:
        """Send the pipelined answers at the front, in order, until at most ``keep`` are left
        (waiting for them), then the ones after them that are done."""
        inflight = self.inflight
        while inflight and (len(inflight) > keep or inflight[0][0].done()):
            answer, api, version, arrived, started = inflight[0]
            out, remote, handled = await answer
            inflight.popleft()
            if self.closed or self.transport is None:
                continue  # dropped, as any answer of a closed connection
            if out is not None:
                self.stats["responses"] += 1
                await self._send(out if isinstance(out, list) else [out])
            if self.metrics is not None and api >= 0:
                self.metrics.request(api, version, arrived, started, handled,
                                     perf_counter_ns(), remote)

    def _record(self, timed: list[tuple[int, int, int, int, int, int]]) -> None:
        """Count the requests whose answers just left (acks=0 ones: when handled)."""
        sent = perf_counter_ns()
        request = self.metrics.request
        for api, version, arrived, started, handled, remote in timed:
            request(api, version, arrived, started, handled, sent, remote)
        timed.clear()

    def _input_waiting(self) -> bool:
        """Whether bytes we have not read yet wait in the socket."""
        if self.sock is None:
            return False
        try:
            return bool(self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except OSError:  # BlockingIOError: nothing waiting
            return False

    def _send_one(self, piece: Any) -> bool:
        """One answer of one bytes piece (a Produce's, most requests'), sent as ``_send`` would
        (one ``send``; what the socket does not take goes to the transport) without creating
        and running its coroutine: ~1 us of a ~30 us small Produce request.  False, having done
        nothing: not bytes, or the transport still holds earlier bytes; ``_send`` then."""
        sock = self.sock
        transport = self.transport
        if type(piece) is not bytes or sock is None or transport is None \
                or transport.get_write_buffer_size():
            return False
        self.stats["response_writes"] += 1
        try:
            sent = sock.send(piece)
        except BlockingIOError:
            sent = 0
        if sent != len(piece):
            transport.write(memoryview(piece)[sent:])
        return True

    async def _send(self, pieces: list[Any]) -> None:
        """Bytes and file slices, in order: straight to the socket while it takes them, the rest
        through the transport (``loop.sendfile`` for slices)."""
        transport = self.transport
        assert transport is not None
        self.stats["response_writes"] += 1
        first = 0
        sock = self.sock
        loop = asyncio.get_running_loop()
        if sock is not None and not transport.get_write_buffer_size():
            if len(pieces) == 1 and type(pieces[0]) is bytes:
                # one answer in one piece (a Produce's, a run of quick ones): one send, no
                # scan for the last non-empty piece (``_send_direct``)
                piece = pieces[0]
                try:
                    sent = sock.send(piece)
                except BlockingIOError:
                    sent = 0
                if sent == len(piece):
                    if not self.writable.is_set():
                        await self.writable.wait()
                    return
                pieces = [memoryview(piece)[sent:]]
            else:
                first = self._send_direct(sock, pieces)
                if first < len(pieces) and hasattr(loop, "_add_writer"):
                    first = await self._send_rest(loop, sock, pieces, first)
                    if self.closed or transport.is_closing():
                        return  # dropped, as any answer of a closed connection
        for piece in pieces[first:]:
            if isinstance(piece, FileSlice):
                if piece.length:
                    sent = await loop.sendfile(transport, _FdFile(piece.fd),  # type: ignore[arg-type]
                                               piece.position, piece.length)
                    self.stats["sendfile_bytes"] += sent
                    self.stats["sendfile_calls"] += 1
            else:
                transport.write(piece)
        if not self.writable.is_set():  # a client that does not read its answers waits for them
            await self.writable.wait()

    async def _send_rest(self, loop: Any, sock: socket.socket, pieces: list[Any],
                         first: int) -> int:
        """The rest of ``pieces`` from ``first`` with ``_send_direct``, waiting for the full
        socket to take more in between; returns ``len(pieces)``, or where it stopped when the
        connection closed.

        The transport's buffer is empty here, so it has no writer of its own on the socket and
        the one registered here (``_add_writer``: the public ``add_writer`` refuses a
        transport's descriptor) is the only one.  Before, each slice left after the socket
        filled went through ``loop.sendfile``: per slice it paused and resumed reading, took
        the transport off the loop and back, ``fstat``ed the file and registered a writer, 18 %
        of a worker's busy samples in a 1,000-partition keyed consume (py-spy), where a Fetch
        answer holds a slice per partition and fills the socket early."""
        fd = sock.fileno()
        while first < len(pieces):
            waiter = loop.create_future()
            self._write_waiter = waiter
            self._writer_fd, self._writer_loop = fd, loop
            loop._add_writer(fd, self._socket_writable)
            self.stats["send_waits"] = self.stats.get("send_waits", 0) + 1
            try:
                await waiter
            finally:
                self._drop_writer()
            if self.closed or self.transport is None or self.transport.is_closing():
                return first
            first = self._send_direct(sock, pieces, first)
        return first

    def _socket_writable(self) -> None:
        """The writer callback of ``_send_rest`` (one shot)."""
        waiter = self._write_waiter
        self._drop_writer()
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _drop_writer(self) -> None:
        """Unregister ``_send_rest``'s writer, if any, and wake its waiter."""
        fd, self._writer_fd = self._writer_fd, -1
        waiter, self._write_waiter = self._write_waiter, None
        if fd >= 0:
            self._writer_loop._remove_writer(fd)
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _send_direct(self, sock: socket.socket, pieces: list[Any], start: int = 0) -> int:
        """Send ``pieces`` from index ``start`` with plain syscalls until the socket buffer is
        full; returns the index of the first piece not wholly sent (rewritten in ``pieces`` to
        its unsent rest).

        Why not ``loop.sendfile`` for every slice: per call it pauses and resumes reading (two
        ``epoll_ctl``), ``fstat``s the file and waits on futures, ~11 % of a consuming worker's
        samples in py-spy.  ``MSG_MORE`` on the byte pieces lets the kernel put a partition's
        header and its records into the same segments (TCP_NODELAY is on).
        """
        sock_fd = sock.fileno()
        last = len(pieces) - 1  # the last piece with bytes (no MSG_MORE on it)
        while last >= start and not (pieces[last].length if isinstance(pieces[last], FileSlice)
                                     else len(pieces[last])):
            last -= 1
        for i in range(start, len(pieces)):
            piece = pieces[i]
            if isinstance(piece, FileSlice):
                if not piece.length:
                    continue
                try:
                    sent = os.sendfile(sock_fd, piece.fd, piece.position, piece.length)
                except BlockingIOError:
                    sent = 0
                else:
                    if sent == 0:  # end of file inside the slice: the stream would be corrupt
                        raise OSError(f"segment file shorter than {piece}")
                    self.stats["sendfile_bytes"] += sent
                    self.stats["sendfile_calls"] += 1
                if sent < piece.length:
                    pieces[i] = FileSlice(piece.handle, piece.position + sent, piece.length - sent)
                    return i
            else:
                if not len(piece):
                    continue
                try:
                    sent = sock.send(piece, _MSG_MORE if i < last else 0)
                except BlockingIOError:
                    sent = 0
                if sent < len(piece):
                    pieces[i] = memoryview(piece)[sent:]
                    return i
        return len(pieces)


_OUT_OF_RESOURCE = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_ACCEPTS_PER_TURN = 64
_REFUSED = "refused"


class Listener:
    """Accepts Kafka connections (in place of ``loop.create_server``, see "Out of descriptors").

    Out of descriptors.  asyncio's server logs "socket.accept() out of system resource" for each
    of up to ``backlog`` failed accepts per turn and retries every second: with ``ulimit -n``
    1024 and 1,500 partitions that was ~18,000 identical lines a minute while every client
    waited in the backlog until its request timed out.  Here a listener keeps one descriptor in
    reserve (``/dev/null``): when ``accept`` fails for want of descriptors it closes the reserve,
    accepts the waiting connections one at a time and closes each at once (the client sees the
    connection closed and retries after its backoff, instead of hanging), reopens the reserve and
    writes one line per ``limits.INTERVAL_S`` with the count refused.  Connections already
    accepted are untouched, and the next accept that succeeds is served as usual: the broker
    recovers on its own once descriptors free up, and says so in one line.

    Before that happens, connections are capped at ``limits.connection_budget()`` (what the
    descriptor limit leaves after the segment files' budget and the process's own reserve):
    one more is refused the same way, so the process keeps descriptors for its own files (with
    every descriptor taken by clients, the next import, checkpoint or segment roll failed).
    """

    def __init__(self, sock: socket.socket, factory: Any,
                 max_connections: int | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        self.sockets = [sock]
        self._sock = sock
        self._factory = factory
        self.max_connections = connection_budget() if max_connections is None else max_connections
        self.live = 0
        self.connections: set[KafkaConnection] = set()  # made and not yet lost
        self.budget: RequestBudget | None = None  # set by serve()
        self._pending: set[asyncio.Task] = set()  # accepted, transport not made yet
        self._reserve = self._open_reserve()
        self._refused = 0           # connections refused since the last accept that worked
        self._throttled = Throttled(log)
        self._serving = True
        sock.setblocking(False)
        self.loop.add_reader(sock.fileno(), self._accept)

    @staticmethod
    def _open_reserve() -> int:
        try:
            return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return -1

    def _accept(self) -> None:
        for _ in range(_ACCEPTS_PER_TURN):
            try:
                conn, _addr = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCE:
                    self._refuse(exc)
                else:
                    self._throttled(logging.WARNING, exc.errno, "accept failed: %s", exc)
                return
            if self.live >= self.max_connections:
                conn.close()
                self._refused += 1
                self._throttled(logging.ERROR, _REFUSED,
                                "too many connections (%d, what %d file descriptors allow): "
                                "refusing new connections, %d refused so far; existing "
                                "connections are served", self.live, nofile(), self._refused)
                continue
            if self._refused:
                log.warning("accepting connections again (%d refused)", self._refused)
                self._refused = 0
                self._throttled.reset(_REFUSED)
            conn.setblocking(False)
            self.live += 1
            task = self.loop.create_task(self._connect(conn))
            self._pending.add(task)
            task.add_done_callback(self._pending.discard)

    def _make(self) -> Any:
        protocol = self._factory()
        protocol.on_close = lambda: self._closed(protocol)
        self.connections.add(protocol)
        return protocol

    def _closed(self, protocol: Any) -> None:
        self.live -= 1
        self.connections.discard(protocol)

    async def _connect(self, conn: socket.socket) -> None:
        if not self._serving:  # closed meanwhile: the process is stopping
            conn.close()
            return
        try:
            await self.loop.connect_accepted_socket(self._make, conn)
        except OSError as exc:
            conn.close()
            self.live -= 1
            self._throttled(logging.WARNING, "connect", "connection dropped at accept: %s", exc)

    def _refuse(self, exc: OSError) -> None:
        """Out of descriptors: close every waiting connection at once (see the class)."""
        refused = 0
        in_use = -1
        if self._reserve >= 0:
            os.close(self._reserve)
            self._reserve = -1
            in_use = open_fds()  # the reserve's descriptor lets /proc/self/fd be listed
            while refused < 1024:
                try:
                    conn, _addr = self._sock.accept()
                except OSError:
                    break  # nothing waiting (or the descriptor went elsewhere already)
                conn.close()
                refused += 1
            self._reserve = self._open_reserve()
        if self._reserve < 0 or not refused:
            # no reserve to refuse with: the listening socket stays readable, so stop watching
            # it a moment rather than spin (the waiting clients stay in the backlog meanwhile)
            self.loop.remove_reader(self._sock.fileno())
            self.loop.call_later(0.1, self._resume)
        self._refused += refused
        self._throttled(logging.ERROR, _REFUSED,
                        "out of file descriptors (%s; %s open, limit %d): refusing new "
                        "connections, %d refused so far; existing connections are served",
                        exc.strerror, in_use if in_use >= 0 else "all", nofile(), self._refused)

    def _resume(self) -> None:
        if self._serving:
            if self._reserve < 0:
                self._reserve = self._open_reserve()
            self.loop.add_reader(self._sock.fileno(), self._accept)

    async def stop(self, timeout: float = 2.0) -> None:
        """At shutdown, before the process's tables close: stop accepting, close every client
        connection (as Kafka's broker does when it stops) and let their handlers end: a parked
        Fetch counts its wait in the metrics table as it ends, and a connection counts its
        close."""
        self.close()
        tasks = []
        for conn in list(self.connections):
            if conn.task is not None and not conn.task.done():
                conn.task.cancel()
                tasks.append(conn.task)
            conn._abort()
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        await asyncio.sleep(0)  # the transports' connection_lost callbacks

    def close(self) -> None:
        if not self._serving:
            return
        self._serving = False
        for task in self._pending:
            task.cancel()
        self.loop.remove_reader(self._sock.fileno())
        self._sock.close()
        if self._reserve >= 0:
            os.close(self._reserve)
            self._reserve = -1


async def serve(router: Any, host: str, port: int, max_frame_bytes: int,
                stats: dict[str, int], metrics: Any = None,
                sock: socket.socket | None = None, queued_max_bytes: int = 0) -> Listener:
    """Serve on ``host:port``, or on ``sock``, a socket already bound and listening (a worker's:
    the controller binds it and keeps it across the worker's restarts).  ``queued_max_bytes``:
    ``queued.max.request.bytes`` (0: no cap)."""
    if sock is None:
        sock = listening_socket(host, port)
    budget = RequestBudget(queued_max_bytes)
    listener = Listener(sock, lambda: KafkaConnection(router, max_frame_bytes, stats, metrics,
                                                      budget))
    listener.budget = budget
    return listener


def listening_socket(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a free port) and listening, not yet served."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock
