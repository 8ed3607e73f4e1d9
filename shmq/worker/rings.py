"""The worker's side of the shared-memory produce path: the Unix socket, sessions, draining.

Theory of operation
-------------------
* ``RingServer`` listens on ``<data-dir>/run/worker-<id>.sock`` (0600, in the 0700 ``run/``).
  A connecting process whose ``SO_PEERCRED`` uid is not ours is refused with a message.  A
  ``hello`` creates a ``RingSession``: a sealed 0600 memfd with the submit and completion rings
  (``shmq.ipc.ring``) and two eventfds, all passed to the client; the worker keeps the mapping
  and the eventfds, closes the memfd at once, and watches its eventfd and the socket.
* **Draining** runs on the event loop, like a connection's requests: each PRODUCE entry goes
  through ``produce.produce_partition`` (the very function the wire handler calls: validation,
  idempotence, append, high watermark, state table, long-poll wake-ups), then its COMPLETION is
  written: at once for acks=1, never for acks=0, and for acks=all after the group commit that
  covers it: after the drain's last entry it asks for one flush a log (``_flush_then_answer``,
  ``RingServer.commit``).  A log's flushes run in rounds on a commit thread (``_LogCommit``):
  a request made while a round runs joins the next, which starts as that one ends and covers
  all appended by then, so a round costs one hand-off to a thread and one wake-up of the loop
  however many drains asked; an entry appended while a round runs has its disk writes started
  at its append (``PartitionLog.start_writeback``), one appended with none running is written
  by the round its drain starts at once.  An
  entry's ring space is released when its completion is written (acks=0: when appended), in ring
  order, so an entry without an answer is still in the ring when the worker dies and the client
  can resend it exactly.  A drain handles at most ``DRAIN_BATCH`` entries, then yields to the loop.
* **Back-pressure, never blocking.**  An entry is taken only while the completion ring has room
  for the answers of every entry taken and not yet answered; otherwise the session waits for the
  client to read its completions (``producer_waiting`` on the completion ring).  A client that
  stops reading stalls only its own ring.
* **Sleeping.**  With nothing to drain the session keeps looking for ``IDLE_SPIN_S`` (entries
  usually follow each other closely under load, and a sleeping worker costs the client a write to
  the eventfd per entry), then sets ``consumer_sleeping`` and waits for the eventfd.  It spins
  only while entries have been coming less than ``SPIN_GAP_S`` apart: at a paced rate (10,000
  entries/s) a spin through every gap cost more CPU than the wake-ups it saved.  Each spin
  turn (a ``sched_yield`` and a loop turn) counts in the worker's ``ring_spins``.
* **What is trusted.**  The worker validates the batch where it lies in the ring and appends it
  from there (no copy).  A client of the same uid that rewrote an entry after publishing it,
  between the CRC check and the ``pwritev``, could store a batch whose CRC fails; that client
  could as well write the segment files themselves (same uid, 0600 files), so the ring does not
  pretend to guard against it.  What it does guarantee against any content: every length and
  counter is checked against the ring's bounds before use, so garbage ends the session, never
  the worker, and never reads outside the mapping.
* **Clients that die.**  EOF on the socket: the entries the client published are drained (they
  are whole: half-written ones were never published), then the mapping and the eventfds are
  released; the memfd is gone once the client's mapping is too.  Garbage in a ring
  (``RingCorruptError``) or a malformed message ends that session only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import socket
import threading
import time
import weakref
from collections import deque
from functools import partial
from pathlib import Path
from typing import Any

from shmq._fast._metrics_reference import (
    PRODUCE_WAIT_HIST,
    PRODUCE_WAITS_DONE,
    PRODUCE_WAITS_STARTED,
)
from shmq.broker.handlers.produce import (
    KAFKA_STORAGE_ERROR,
    Durable,
    PartitionResult,
    produce_partition,
)
from shmq.ipc import ring as rings
from shmq.ipc.session import (
    VERSION,
    AttachError,
    ShortPath,
    peer_credentials,
    receive_message,
    send_message,
)
from shmq.limits import Throttled

log = logging.getLogger("shmq.worker.rings")
_throttled = Throttled(log)

DEFAULT_SUBMIT_BYTES = 8 << 20
DEFAULT_COMPLETION_BYTES = 1 << 20
MAX_REGION_BYTES = 256 << 20
DRAIN_BATCH = 256
IDLE_SPIN_S = 0.0002
# The idle spin runs only while entries come closer together than this (the idle time between
# the last two drains that took entries, a drain's own work not counted: a client sending 100 KB
# batches back to back leaves gaps of microseconds, though each drain takes ~100 us): a longer
# wait costs more CPU spun than the eventfd wake-up it saves.  At 10,000 entries/s (a gap of 100 us) the 200 us spin never ended, and
# its loop turns (sched_yield + an epoll_wait a turn) were most of the worker's CPU: 57-60 us
# a record against 43 without a spin (bench_shm --trace, shared box).  The idle time at that
# rate is 100 us less the drain (~40 us cold) and the wake-up, 30-60 us, so this bound still
# spins after many entries there (0.5-0.8 turns a record on a loaded box, ``ring_spins``); a
# lower one (20 us) made pipelined batches wake the worker per entry
# (``test_no_wakeup_per_batch_under_load``): the two loads leave the same gaps.  A spin's CPU
# is bounded by its time, not its turns (with a CPU free, each turn's sched_yield returns at
# once): a cheaper turn only makes more turns (i14n).
SPIN_GAP_S = 0.00005
# an acks=all entry at least this long has its disk writes started at its append even when no
# group-commit round of its log runs (a smaller one is left to the round its drain starts)
WRITEBACK_AT_ONCE_BYTES = 16 << 10
COMMIT_THREADS = 8                # RingServer.committer: group commits of this many logs at once
MAX_MESSAGE_BYTES = 512           # an error message in a completion is cut to this
COMPLETION_ROOM = rings.align8(rings.COMPLETION_HEADER_SIZE + MAX_MESSAGE_BYTES)
UNKNOWN_TOPIC_OR_PARTITION = 3
# Diagnostics (``perf/bench_shm.py --trace``): with ``SHMQ_RING_TRACE=<dir>`` a session records,
# per entry, when its drain took it and when its answer was ready (``time.monotonic_ns``, after
# the append and the state table's publish), with the partition and the base offset, and writes
# them to ``<dir>/ring-trace-<worker pid>-<session>.txt`` when it ends.
TRACE_DIR = os.environ.get("SHMQ_RING_TRACE") or None
# With ``SHMQ_RING_TRACE_STAGES=1`` too (``bench_shm --stages``), each entry's line also says
# when its drain began, whether a kick (the eventfd) began it, its place in the drain, and the
# worker thread's CPU (``thread_time``) and run-queue time (``/proc/thread-self/schedstat``;
# its CPU field lags: it moves at context switches and ticks) at the drain's start
# and at the previous drain's end: where a late drain's time went.  Two preads a drain.
TRACE_STAGES = bool(TRACE_DIR and os.environ.get("SHMQ_RING_TRACE_STAGES"))
# ... and the worker's other work on the loop, (kind, start ns, end ns): 0 a gc collection
# (its generation + 10 as the kind), 1 a housekeeping turn (``worker.main``)
EVENTS: list[tuple[int, int, int]] = []


def note_event(kind: int, start_ns: int, end_ns: int) -> None:
    if TRACE_STAGES and len(EVENTS) < 1_000_000:
        EVENTS.append((kind, start_ns, end_ns))


def _gc_event(phase: str, info: dict[str, Any], _began: list[int] = [0]) -> None:  # noqa: B006
    if phase == "start":
        _began[0] = time.monotonic_ns()
    else:
        note_event(10 + int(info.get("generation", 0)), _began[0], time.monotonic_ns())


if TRACE_STAGES:
    import gc

    gc.callbacks.append(_gc_event)


class _Group:
    """A drain's acks=all entries and their group commit: flushes not done yet, failures."""

    __slots__ = ("durable", "left", "failed", "started", "flushed")

    def __init__(self, durable: list, left: int, started: int) -> None:
        self.durable = durable
        self.left = left
        self.failed: dict[int, BaseException] = {}
        self.started = started
        self.flushed = 0


class _LogCommit:
    """One log's group commits for the ring sessions (``RingServer.commit``): the answers
    waiting for an fsync, and whether a commit thread is running rounds for them.

    The loop adds waiters (``request``); the thread (``run``) takes the highest offset asked
    for, fsyncs (``PartitionLog.flush``, which covers the log's end as it finds it), hands the
    waiters that fsync covered to the loop in one ``call_soon_threadsafe``, and goes on while
    more are waiting; it stops (``running`` False) only under ``lock`` with none left, so a
    request either joins a running round or hands a new one to a thread, never neither."""

    __slots__ = ("server", "lock", "waiters", "running")

    def __init__(self, server: RingServer) -> None:
        self.server = server  # (not the log: the server's table of these is weak on the log)
        self.lock = threading.Lock()
        self.waiters: list[tuple[int, Any]] = []  # (offset it needs durable, done)
        self.running = False

    def request(self, upto: int, done: Any) -> bool:
        """(the loop) Whether a thread must be started for it (none is running rounds)."""
        with self.lock:
            self.waiters.append((upto, done))
            if self.running:
                return False
            self.running = True
            return True

    def run(self, plog: Any) -> None:
        """(a commit thread) Rounds until no waiter is left."""
        loop, stats = self.server.loop, self.server.stats
        while True:
            with self.lock:
                if not self.waiters:
                    self.running = False
                    return
                target = max(upto for upto, _ in self.waiters)
            exc: BaseException | None = None
            try:
                plog.flush(target, checkpoint=False)
            except BaseException as e:  # noqa: BLE001 - its waiters are answered with it
                exc = e
            with self.lock:  # the waiters this round covered (all it found, any added since
                # that need no more than it made durable)
                covered = [w for w in self.waiters if w[0] <= target]
                self.waiters = [w for w in self.waiters if w[0] > target]
            try:
                loop.call_soon_threadsafe(_deliver, stats, covered, exc)
            except RuntimeError:  # the loop is closed: the worker is going away
                with self.lock:
                    self.waiters, self.running = [], False
                return


def _deliver(stats: dict[str, int], covered: list[tuple[int, Any]],
             exc: BaseException | None) -> None:
    """(the loop) A round's end to the answers it covered, in the order they asked."""
    stats["ring_commit_rounds"] += 1
    for _, done in covered:
        done(exc)


class RingSession:
    """One client process's rings on this worker."""

    def __init__(self, server: RingServer, sock: socket.socket, peer_pid: int, sid: int) -> None:
        self.server = server
        self.ctx = server.ctx
        self.sock = sock
        self.peer_pid = peer_pid
        self.id = sid
        self.loop = server.loop
        self.mapping: Any = None
        self.view: memoryview | None = None
        # the worker's half of both rings (``_fast.WorkerRings``: one call a step), once attached
        self.rings: Any = None
        self.worker_efd = -1
        self.client_efd = -1
        # entries taken from the submit ring and not released yet: [end position, answered]
        self.pending: deque[list] = deque()
        self.unanswered = 0
        self.scheduled = False
        self.closed = False
        self.last_entry = 0.0
        self.gap = 0.0  # idle time between the last two drains that took entries
        self.stats = server.stats
        self.trace: list[tuple[int, ...]] | None = [] if TRACE_DIR else None
        self._sched = -1
        if TRACE_STAGES:
            self._sched = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
        self._kicked = 0
        self._ended = (0, 0, 0)  # the previous drain's end: monotonic ns, CPU ns, run-queue ns
        # (base offset, its flush handed to the executor, its flush returned, its answer
        # written) of every acks=all entry
        self.answer_trace: list[tuple[int, int, int, int]] = []
        # the acks=all entries waiting for their group commits, a group a drain: answered in
        # ring order, as a Kafka connection's responses are (a later fsync can finish first)
        self.groups: deque[_Group] = deque()

    # -- set-up -----------------------------------------------------------------------------

    def start(self) -> None:
        self.sock.setblocking(False)
        self.loop.add_reader(self.sock.fileno(), self._on_message)

    def _on_message(self) -> None:
        try:
            message, fds = receive_message(self.sock)
        except BlockingIOError:
            return
        except (AttachError, OSError) as exc:
            log.info("ring session %d: %s", self.id, exc)
            self.close()
            return
        for fd in fds:  # a client has no descriptors to give us
            os.close(fd)
        if message is None:
            self.close()
            return
        op = message["op"]
        try:
            if op == "hello" and self.view is None:
                self._welcome(message)
            elif op == "init_producer_id":
                asyncio.ensure_future(self._init_producer_id(message.get("id")))
            else:
                raise AttachError(f"unexpected {op!r}")
        except (AttachError, ValueError, TypeError, OSError) as exc:
            log.info("ring session %d refused: %s", self.id, exc)
            try:
                send_message(self.sock, {"op": "refused", "error": str(exc)})
            except OSError:
                pass
            self.close()

    def _welcome(self, hello: dict[str, Any]) -> None:
        if hello.get("version") != VERSION:
            raise AttachError(f"session version {hello.get('version')!r}, this worker speaks {VERSION}")
        submit = rings.check_capacity(int(hello.get("submit_bytes", DEFAULT_SUBMIT_BYTES)))
        completion = rings.check_capacity(int(hello.get("completion_bytes",
                                                        DEFAULT_COMPLETION_BYTES)))
        layout = rings.Layout(submit, completion)
        if layout.size > MAX_REGION_BYTES or completion < 4 * COMPLETION_ROOM:
            raise AttachError(f"rings of {submit} + {completion} bytes are out of bounds")
        fd = rings.create_region(layout, self.id)
        try:
            from shmq import _fast

            self.mapping = _fast.MappedFile(fd, layout.size, True)
            self.worker_efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self.client_efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            send_message(self.sock, {
                "op": "welcome", "node_id": self.ctx.node_id, "worker_pid": os.getpid(),
                "session": self.id, "submit_bytes": submit, "completion_bytes": completion,
                "max_entry": submit // 2}, [fd, self.worker_efd, self.client_efd])
        finally:
            os.close(fd)
        self.view = memoryview(self.mapping)
        self.rings = _fast.WorkerRings(
            self.view, rings.SUBMIT_CONTROL, rings.DATA, submit, rings.COMPLETION_CONTROL,
            rings.DATA + submit, completion, rings.RingCorruptError)
        self.loop.add_reader(self.worker_efd, self._on_kick)
        self.stats["ring_sessions"] += 1
        self.stats["ring_sessions_open"] += 1
        self._schedule()

    async def _init_producer_id(self, rid: Any) -> None:
        try:
            pid = await self.ctx.next_producer_id()
            reply = {"op": "producer_id", "id": rid, "producer_id": pid, "producer_epoch": 0}
        except Exception as exc:  # noqa: BLE001 - the controller could not answer
            reply = {"op": "producer_id", "id": rid, "error": str(exc)}
        if not self.closed:
            try:
                send_message(self.sock, reply)
            except OSError:
                self.close()

    # -- draining ---------------------------------------------------------------------------

    def _on_kick(self) -> None:
        try:
            os.eventfd_read(self.worker_efd)
        except BlockingIOError:
            pass
        self.stats["ring_wakeups"] += 1
        if not self.scheduled and not self.closed:
            self._kicked = 1
            self._drain()  # now: a scheduled drain would wait for the loop's next turn

    def _schedule(self) -> None:
        if not self.scheduled and not self.closed:
            self.scheduled = True
            self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        self.scheduled = False
        if self.closed or self.rings is None:
            return
        began = time.monotonic()
        try:
            taken, more = self.drain()
        except rings.RingCorruptError as exc:
            log.warning("ring session %d (pid %d): %s; closing it", self.id, self.peer_pid, exc)
            self.close()
            return
        now = time.monotonic()
        if taken:  # the gap: idle time from the end of the last drain that took entries
            self.gap, self.last_entry = began - self.last_entry, now
        if more:
            self._schedule()
        elif now - self.last_entry < IDLE_SPIN_S and self.gap < SPIN_GAP_S:
            # entries usually follow closely: look again on the next loop turn, after giving
            # the CPU to whatever waits for it here (the client, a local reader: with fewer
            # idle CPUs than spinners, a spin that keeps its CPU makes them wait a slice)
            os.sched_yield()
            self.stats["ring_spins"] += 1
            self._schedule()
        elif self._completion_full():
            self.rings.set_waiting()  # the client's completion reads will kick us
            if not self._completion_full():
                self._schedule()
        elif not self.rings.set_sleeping():
            self._schedule()

    def _completion_full(self) -> bool:
        return bool(self.rings.free_space() < (self.unanswered + 1) * COMPLETION_ROOM)

    def drain(self, limit: int = DRAIN_BATCH) -> tuple[int, bool]:
        """Take up to ``limit`` entries; (entries taken, whether more may be waiting)."""
        ring, view = self.rings, self.view
        assert ring is not None and view is not None
        durable: list[tuple[list, int, PartitionResult, Durable]] = []
        taken = 0
        more = False
        trace, ctx, pending, server = self.trace, self.ctx, self.pending, self.server
        stages: tuple[int, ...] = ()
        if trace is not None and self._sched >= 0:
            began_ns = time.monotonic_ns()
            cpu_ns, queued_ns = time.thread_time_ns(), int(os.pread(self._sched, 80, 0).split()[1])
            stages = (began_ns, self._kicked, *self._ended, cpu_ns, queued_ns)
        self._kicked = 0
        take = ring.next_produce
        # The completion ring's free space, read once a drain: the client only ever frees more,
        # so it is re-read only when this count (less what this drain's answers took) says
        # the next entry's answer might not fit (``_completion_full``, without a load an entry)
        free = ring.free_space()
        released = -1  # the end of the last entry answered while none waited before it
        while True:
            if taken == limit:
                more = True
                break
            if free < (self.unanswered + 1) * COMPLETION_ROOM:
                free = ring.free_space()
                if free < (self.unanswered + 1) * COMPLETION_ROOM:
                    break
            entry = take()  # every bound checked (RingCorruptError), PAD entries skipped
            if entry is None:
                break
            if trace is not None:
                taken_ns = time.monotonic_ns()
            at, length, corr, partition, tlen, acks = entry
            body = at + rings.PRODUCE_HEADER_SIZE
            try:
                topic = str(view[body : body + tlen], "utf-8")
            except UnicodeDecodeError:
                topic = None
            records = view[body + tlen : at + length]
            if topic is None:
                result = PartitionResult(partition, UNKNOWN_TOPIC_OR_PARTITION, -1, -1, -1, None)
                done = None
            else:
                result, done = produce_partition(ctx, topic, partition, records, acks)
            if trace is not None:
                trace.append((partition, result.base_offset, taken_ns, time.monotonic_ns(),
                              *stages, taken))
            del records
            ring.advance(length)
            taken += 1
            if done is None and not pending:
                # answered now (acks=0: nothing to answer) with no earlier entry waiting for its
                # answer: its space goes back at the end of this drain, without a pending slot
                released = ring.head
                if acks:
                    self.unanswered += 1
                    free -= self._answer(None, corr, result)
                continue
            slot = [ring.head, acks == 0]
            pending.append(slot)
            if acks == 0:
                continue
            self.unanswered += 1
            if done is None:
                free -= self._answer(slot, corr, result)
            else:
                durable.append((slot, corr, result, done))
                # while a round of its log's group commit runs, its disk writes start now,
                # not when the next round's fsync gets to them: that fsync then waits for
                # less.  With none running, the round this drain hands off starts them at
                # once (``PartitionLog.flush``): a start here would be a system call (and a
                # hand-over of the GIL to the commit thread) on the loop for nothing.
                # A big entry's start pays even then: the disk writes it while this drain
                # appends the next ones (skipping them cost produce_batch acks=all ~23 %).
                if length >= WRITEBACK_AT_ONCE_BYTES or server.committing(done.log):
                    done.log.start_writeback(done.upto)
        self.stats["ring_entries"] += taken
        if trace is not None and self._sched >= 0:
            queued_ns = int(os.pread(self._sched, 80, 0).split()[1])
            self._ended = (time.monotonic_ns(), time.thread_time_ns(), queued_ns)
        if durable:
            self._flush_then_answer(durable)
        self._release(released)
        return taken, more

    def _flush_then_answer(self, durable: list) -> None:
        """Ask for the group commit of these acks=all entries now (one flush a log, to its
        highest offset: ``RingServer.commit``); they are answered once every log's is done
        (``_flushed``), after every earlier entry."""
        logs: dict[int, Durable] = {}
        for _, _, _, d in durable:
            seen = logs.get(id(d.log))
            if seen is None or d.upto > seen.upto:
                logs[id(d.log)] = d
        metrics = self.ctx.metrics
        if metrics is not None:  # Kafka's produce purgatory: acks=all waits here (RemoteTimeMs)
            metrics.add(PRODUCE_WAITS_STARTED)
        group = _Group(durable, len(logs), time.monotonic_ns())
        self.groups.append(group)
        commit = self.server.commit
        for key, d in logs.items():
            commit(d.log, d.upto, partial(self._flushed, group, key))

    def _flushed(self, group: _Group, key: int, exc: BaseException | None) -> None:
        """One flush of ``group`` is done (on the loop; ``exc``: it failed): once all are, the
        groups at the front whose flushes are all done are answered, in ring order."""
        if self.closed:
            return
        if exc is not None:
            if not isinstance(exc, OSError):
                log.error("flush for acks=all raised", exc_info=exc)
            group.failed[key] = exc
        group.left -= 1
        if group.left:
            return
        group.flushed = time.monotonic_ns()
        metrics = self.ctx.metrics
        if metrics is not None:
            metrics.add(PRODUCE_WAITS_DONE)
            metrics.observe(PRODUCE_WAIT_HIST, group.flushed - group.started)
        groups = self.groups
        while groups and not groups[0].left:
            self._answer_group(groups.popleft())

    def _answer_group(self, group: _Group) -> None:
        durable, failed = group.durable, group.failed
        if failed:  # the fsync failed: the answer says so (Kafka: KAFKA_STORAGE_ERROR)
            durable = [(slot, corr, result._replace(
                            error_code=KAFKA_STORAGE_ERROR, base_offset=-1,
                            error_message=f"fsync failed: {failed[id(d.log)]}"), d)
                       if id(d.log) in failed else (slot, corr, result, d)
                       for slot, corr, result, d in durable]
            _throttled(logging.ERROR, "flush", "flush for acks=all failed: %s; answering "
                       "KAFKA_STORAGE_ERROR", next(iter(failed.values())))
        if self.closed:
            return
        for slot, corr, result, _ in durable:
            self._answer(slot, corr, result)
        if self.trace is not None:
            answered = time.monotonic_ns()
            self.answer_trace.extend((r.base_offset, group.started, group.flushed, answered)
                                     for _, _, r, _ in durable)
        self._release()

    def _answer(self, slot: list | None, corr: int, result: PartitionResult) -> int:
        """Write one completion; returns the bytes of the completion ring it took."""
        ring = self.rings
        error = result.error_message
        message = error.encode("utf-8", "replace")[:MAX_MESSAGE_BYTES] if error else b""
        before = ring.completion_tail
        kick = ring.answer(corr, result.error_code, result.base_offset, result.log_append_time,
                           result.log_start_offset, message)
        if kick < 0:  # cannot happen: the drain kept room for every unanswered entry
            raise rings.RingCorruptError("completion ring full despite the reservation")
        if kick:
            self._kick_client()
        if slot is not None:
            slot[1] = True
        self.unanswered -= 1
        return int(ring.completion_tail - before)  # a PAD entry at the ring's end included

    def _release(self, end: int = -1) -> None:
        """Give back the ring space of the answered entries at the front, in ring order (and
        up to ``end``, the end of entries answered without a pending slot)."""
        ring = self.rings
        assert ring is not None
        pending = self.pending
        while pending and pending[0][1]:
            end = pending.popleft()[0]
        if end < 0:
            return
        if ring.release(end):
            self._kick_client()

    def _kick_client(self) -> None:
        try:
            os.eventfd_write(self.client_efd, 1)
        except (BlockingIOError, OSError):
            pass
        self.stats["ring_kicks"] += 1

    # -- end --------------------------------------------------------------------------------

    def close(self) -> None:
        if self.closed:
            return
        if self.rings is not None:
            try:  # what the client published before it went is whole: append it
                while self.drain()[1]:
                    pass
            except rings.RingCorruptError:
                pass
        self.closed = True
        if self.trace:
            self._write_trace()
        if self._sched >= 0:  # the stage trace's schedstat
            os.close(self._sched)
            self._sched = -1
        if self.view is not None:
            self.stats["ring_sessions_open"] -= 1
        self.server.sessions.pop(self.id, None)
        for fd in (self.sock.fileno(), self.worker_efd):
            if fd >= 0:
                self.loop.remove_reader(fd)
        self.sock.close()
        for fd in (self.worker_efd, self.client_efd):
            if fd >= 0:
                os.close(fd)
        self.worker_efd = self.client_efd = -1
        if self.rings is not None:
            self.rings.close()  # lets go of the view
            self.rings = None
        if self.view is not None:
            self.view.release()
            self.view = None
        if self.mapping is not None:
            try:
                self.mapping.close()
            except BufferError:  # a view is still referenced somewhere: unmapped when it goes
                pass
            self.mapping = None

    def _write_trace(self) -> None:
        assert TRACE_DIR is not None and self.trace is not None
        path = Path(TRACE_DIR) / f"ring-trace-{os.getpid()}-{self.id}.txt"
        try:
            with open(path.with_suffix(".tmp"), "w") as f:
                f.writelines(" ".join(map(str, t)) + "\n" for t in self.trace)
            os.replace(path.with_suffix(".tmp"), path)
            if TRACE_STAGES:
                events = Path(TRACE_DIR) / f"ring-events-{os.getpid()}-{self.id}.txt"
                events.write_text("".join(f"{k} {a} {b}\n" for k, a, b in EVENTS))
            # the acks=all answers and the fsyncs (``PartitionLog.flush_trace``), if any
            from shmq.storage.log import PartitionLog

            flushes, PartitionLog.flush_trace = PartitionLog.flush_trace or [], []
            if self.answer_trace or flushes:
                with open(Path(TRACE_DIR) / f"answer-trace-{os.getpid()}-{self.id}.txt",
                          "w") as f:
                    f.writelines(f"A {b} {t0} {t1} {t2}\n" for b, t0, t1, t2 in self.answer_trace)
                    f.writelines(f"F {a} {b} {c} {d}\n" for a, b, c, d in flushes)
        except OSError as exc:
            log.warning("ring trace not written: %s", exc)
        self.trace = []
        self.answer_trace = []


class RingServer:
    """The worker's Unix socket for local clients."""

    def __init__(self, ctx: Any, path: Path, stats: dict[str, int]) -> None:
        self.ctx = ctx
        self.path = path
        self.stats = stats
        for key in ("ring_sessions", "ring_sessions_open", "ring_entries", "ring_wakeups", "ring_kicks", "ring_spins",
                    "ring_refused", "ring_commit_handoffs", "ring_commit_rounds"):
            stats.setdefault(key, 0)
        self.loop = asyncio.get_running_loop()
        self.sessions: dict[int, RingSession] = {}
        self.next_id = 1
        self.sock: socket.socket | None = None
        self._committer: concurrent.futures.ThreadPoolExecutor | None = None
        # each log's group commit rounds (weak: a deleted log's go with it)
        self._commits: weakref.WeakKeyDictionary[Any, _LogCommit] = weakref.WeakKeyDictionary()

    def committer(self) -> concurrent.futures.ThreadPoolExecutor:
        """The threads that run the group commits (``_LogCommit.run``: one at a time a log,
        any number of logs at once), made at the first."""
        if self._committer is None:
            self._committer = concurrent.futures.ThreadPoolExecutor(
                COMMIT_THREADS, thread_name_prefix="shmq-commit")
        return self._committer

    def committing(self, plog: Any) -> bool:
        """Whether a commit thread is running rounds of ``plog``'s group commit."""
        commit = self._commits.get(plog)
        return commit is not None and commit.running

    def commit(self, plog: Any, upto: int, done: Any) -> None:
        """(the loop) Call ``done(None)`` on the loop once ``plog`` is fsynced below ``upto``
        (``done(exc)`` if the fsync that was to cover it failed).  A log's fsyncs run one
        round at a time on a commit thread: a request made while a round runs joins the next,
        which starts as that one ends and covers everything appended by then, so a round costs
        one hand-off to a thread and one wake-up of the loop however many drains it covers."""
        commit = self._commits.get(plog)
        if commit is None:
            commit = self._commits[plog] = _LogCommit(self)
        if commit.request(upto, done):
            self.stats["ring_commit_handoffs"] += 1
            self.committer().submit(commit.run, plog)

    def start(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        with ShortPath(self.path) as where:
            try:
                os.unlink(where)  # a socket left by this worker's previous life
            except FileNotFoundError:
                pass
            old = os.umask(0o177)
            try:
                sock.bind(where)
            finally:
                os.umask(old)
            os.chmod(where, 0o600)
        sock.listen(128)
        sock.setblocking(False)
        self.sock = sock
        self.loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        assert self.sock is not None
        while True:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("ring socket accept: %s", exc)
                return
            pid, uid, _ = peer_credentials(conn)
            if uid != os.geteuid():
                self.stats["ring_refused"] += 1
                log.warning("refused a ring session from pid %d: uid %d is not the broker's "
                            "uid %d", pid, uid, os.geteuid())
                self._refuse(conn, f"uid {uid} may not attach: this broker runs as uid "
                                   f"{os.geteuid()} and serves only that uid")
                continue
            sid = self.next_id
            self.next_id += 1
            session = RingSession(self, conn, pid, sid)
            self.sessions[sid] = session
            session.start()

    def _refuse(self, conn: socket.socket, why: str) -> None:
        """Send the refusal, then close once the client has read it: closing a Unix socket with
        the client's hello still unread would reset the connection and drop the message."""
        try:
            send_message(conn, {"op": "refused", "error": why})
            conn.shutdown(socket.SHUT_WR)
        except OSError:
            conn.close()
            return
        conn.setblocking(False)
        fd = conn.fileno()

        def done() -> None:
            if conn.fileno() >= 0:
                self.loop.remove_reader(fd)
                conn.close()

        def readable() -> None:
            try:
                while conn.recv(65536):  # whatever it sent; EOF once it closed
                    pass
            except BlockingIOError:
                return
            except OSError:
                pass
            done()

        self.loop.add_reader(fd, readable)
        self.loop.call_later(2.0, done)

    def close(self) -> None:
        for session in list(self.sessions.values()):
            session.close()
        if self._committer is not None:
            self._committer.shutdown(wait=False)
            self._committer = None
        if self.sock is not None:
            self.loop.remove_reader(self.sock.fileno())
            self.sock.close()
            self.sock = None
            try:
                with ShortPath(self.path) as where:
                    os.unlink(where)
            except FileNotFoundError:
                pass
