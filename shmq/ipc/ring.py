"""Single-producer single-consumer rings in a memfd: the shared-memory produce path (DESIGN §4).

A session (one client process, one worker) shares one memory region, created by the worker with
``memfd_create`` (no name anywhere to guess or leave behind: it is freed when the last mapping
and descriptor go), mode 0600, sealed against shrinking and growing (a client cannot truncate it
under the worker: no SIGBUS), and passed to the client over the worker's Unix socket with the
two eventfds (``shmq.ipc.session``).  Native byte order: both parties are on this host.

Region layout::

    0      header 64 B: magic b"SHMQRG01" | version u32 | submit_capacity u32
                        | completion_capacity u32 | worker pid u32 | session id u64 | zero
    64     submit ring control (client -> worker)       192 B, see below
    256    completion ring control (worker -> client)   192 B
    4096   submit ring data        (submit_capacity bytes, a power of two)
    4096 + submit_capacity         completion ring data (completion_capacity bytes)

Ring control (each counter alone on its cache line, so producer and consumer never share one)::

    +0    tail u64        bytes ever published by the producer (release store)
    +64   head u64        bytes ever consumed by the consumer (release store)
    +128  consumer_sleeping u32   set by the consumer before it sleeps on its eventfd
    +132  producer_waiting  u32   set by the producer before it sleeps waiting for space

Entries are contiguous and 8-byte aligned: ``len u32 | kind u16 | flags u16 | payload``, ``len``
counting the 8 header bytes and the payload, not the padding.  An entry that would cross the end
is preceded by a PAD entry that fills the rest of the ring.  Kinds and payloads::

    PRODUCE (1), client -> worker:
       8  correlation u32 | 12 partition i32 | 16 topic_len u16 | 18 acks i8 | 19 zero u8
      20  zero u32 | 24 topic (utf-8) | RecordBatch v2 bytes (one batch)
    COMPLETION (2), worker -> client:
       8  correlation u32 | 12 error_code i16 | 14 zero u16 | 16 base_offset i64
      24  log_append_time i64 | 32 log_start_offset i64 | 40 error message (utf-8, optional)

Changes from the sketch in DESIGN.md §4, and why:

* A PRODUCE entry names its partition by topic and partition, not by state-table slot: a slot
  is reused after a topic is deleted, a client's slot directory can be stale, and the wire path's
  answers (UNKNOWN_TOPIC_OR_PARTITION for a topic the worker does not know, INVALID_TOPIC for an
  internal one) need the name.  The name costs a few bytes against a batch of kilobytes.
* A COMPLETION also carries the log start offset and the error message (Produce v5+/v8+ answer
  both), so the two paths' answers are the same field for field.
* One memfd holds both rings (one descriptor to pass and seal), and the client's kick channel is
  an eventfd per direction rather than bytes on the socket: the socket stays free for the
  session's few control messages and for death notices.

Theory of operation:

* **Publication.**  The producer writes an entry (PAD included) past ``tail``, then stores the
  new ``tail`` with release; the consumer loads ``tail`` with acquire and reads only below it.
  An entry is visible whole or not at all: a client killed in the middle of writing one leaves
  ``tail`` where it was, and the worker never sees the half-written bytes.
* **Space.**  The consumer releases space by storing ``head`` (release) once it is done with the
  bytes (the worker after the append has copied them into the log).  A full ring is
  back-pressure: the producer waits (``producer_waiting`` + its eventfd, with a timeout).
* **Wake-ups are hints.**  A consumer with nothing to read sets ``consumer_sleeping`` (seq_cst
  exchange), looks at ``tail`` once more, and only then sleeps on its eventfd; a producer looks at
  the flag after publishing (seq_cst fence) and writes the eventfd only when it was set, so under
  load neither side makes a system call per entry.  Every wait has a timeout and re-checks the
  ring, so a lost hint costs a delay, never an entry.
* **Distrust.**  The worker reads ``tail``, ``len`` and ``kind`` from memory the client can
  write: each is checked against the ring's bounds (``RingCorruptError`` ends the session; the
  worker's own state is untouched) and never followed as a pointer.
"""

from __future__ import annotations

import fcntl
import os
import struct
from typing import Any, NamedTuple

from shmq import _fast
from shmq.errors import ShmqError

MAGIC = b"SHMQRG01"
VERSION = 1
REGION_HEADER = struct.Struct("=8sIIIIQ")  # magic, version, submit cap, completion cap, pid, session
SUBMIT_CONTROL, COMPLETION_CONTROL, DATA = 64, 256, 4096
TAIL, HEAD, CONSUMER_SLEEPING, PRODUCER_WAITING = 0, 64, 128, 132
MODE = 0o600

ENTRY_HEADER = struct.Struct("=IHH")
PAD, PRODUCE, COMPLETION = 0, 1, 2
PRODUCE_HEADER = struct.Struct("=IHHIiHbBI")  # len kind flags | corr partition topic_len acks 0 0
PRODUCE_HEADER_SIZE = PRODUCE_HEADER.size
COMPLETION_HEADER = struct.Struct("=IHHIhHqqq")
COMPLETION_HEADER_SIZE = COMPLETION_HEADER.size
assert PRODUCE_HEADER_SIZE == 24 and COMPLETION_HEADER_SIZE == 40

MIN_CAPACITY, MAX_CAPACITY = 1 << 12, 1 << 30
_SEALS = getattr(fcntl, "F_SEAL_SHRINK", 2) | getattr(fcntl, "F_SEAL_GROW", 4) | getattr(
    fcntl, "F_SEAL_SEAL", 1)


class RingCorruptError(ShmqError):
    """A ring's counters or an entry's header are outside the ring: the peer wrote garbage."""


def align8(n: int) -> int:
    return (n + 7) & ~7


class Layout(NamedTuple):
    submit_capacity: int
    completion_capacity: int

    @property
    def size(self) -> int:
        return DATA + self.submit_capacity + self.completion_capacity


def check_capacity(capacity: int) -> int:
    if not MIN_CAPACITY <= capacity <= MAX_CAPACITY or capacity & (capacity - 1):
        raise ValueError(f"ring capacity {capacity} is not a power of two in "
                         f"[{MIN_CAPACITY}, {MAX_CAPACITY}]")
    return capacity


def create_region(layout: Layout, session_id: int) -> int:
    """A sealed 0600 memfd holding a fresh session region; returns its descriptor."""
    fd = os.memfd_create("shmq-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.fchmod(fd, MODE)
        os.ftruncate(fd, layout.size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
        header = REGION_HEADER.pack(MAGIC, VERSION, layout.submit_capacity,
                                    layout.completion_capacity, os.getpid(), session_id)
        os.pwrite(fd, header, 0)
    except BaseException:
        os.close(fd)
        raise
    return fd


def map_region(fd: int, expected: Layout | None = None) -> tuple[Any, Layout, int, int]:
    """Map a session region (client side): checks seals, owner, mode, header and size.

    Returns ``(mapping, layout, worker_pid, session_id)``; the caller may close ``fd``."""
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise PermissionError(f"ring region owned by uid {st.st_uid} with mode "
                              f"{st.st_mode & 0o777:04o}, expected ours and 0600")
    seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    if seals & _SEALS != _SEALS:
        raise RingCorruptError("ring region is not sealed against resizing")
    head = os.pread(fd, REGION_HEADER.size, 0)
    magic, version, submit, completion, pid, session = REGION_HEADER.unpack(head)
    if magic != MAGIC or version != VERSION:
        raise RingCorruptError(f"not a shmq ring region (magic {magic!r}, version {version})")
    layout = Layout(check_capacity(submit), check_capacity(completion))
    if st.st_size != layout.size or (expected is not None and expected != layout):
        raise RingCorruptError(f"ring region of {st.st_size} bytes does not match its header")
    return _fast.MappedFile(fd, layout.size, True), layout, pid, session


class Ring:
    """One direction of a session: ``control`` and ``data`` are byte offsets into ``view``.

    Each side uses only its half of the methods: ``reserve`` / ``commit`` / ``wait_for_space``
    bookkeeping for the producer, ``peek`` / ``advance`` / ``release`` for the consumer.
    """

    __slots__ = ("view", "control", "data", "capacity", "mask", "tail", "head", "_seen",
                 "_reserved")

    def __init__(self, view: memoryview, control: int, data: int, capacity: int) -> None:
        self.view = view
        self.control = control
        self.data = data
        self.capacity = capacity
        self.mask = capacity - 1
        # the producer's tail and the consumer's head are private copies of what we published;
        # _seen caches the other side's counter (reloaded only when it might help)
        self.tail = _fast.ring.load_u64(view, control + TAIL)
        self.head = _fast.ring.load_u64(view, control + HEAD)
        self._seen = 0
        self._reserved = (0, 0)

    # -- producer ---------------------------------------------------------------------------------

    def free_space(self) -> int:
        self._seen = _fast.ring.load_u64(self.view, self.control + HEAD)
        return self.capacity - (self.tail - self._seen)

    def contiguous(self) -> tuple[int, int]:
        """(offset in view, bytes) free from the tail to the ring's end or to the head."""
        idx = self.tail & self.mask
        free = self.capacity - (self.tail - self._seen)
        if free < self.capacity - idx:
            self._seen = _fast.ring.load_u64(self.view, self.control + HEAD)
            free = self.capacity - (self.tail - self._seen)
        return self.data + idx, min(free, self.capacity - idx)

    def reserve(self, size: int) -> int:
        """Offset in ``view`` of ``size`` contiguous free bytes (a PAD entry is written first
        when they would cross the end), or -1 while the ring is too full.  Nothing is visible to
        the consumer before ``commit``."""
        n = align8(size)
        if n > self.capacity:
            raise ValueError(f"entry of {size} bytes does not fit a ring of {self.capacity}")
        idx = self.tail & self.mask
        room = self.capacity - idx
        need = n if n <= room else room + n
        if need > self.capacity - (self.tail - self._seen):
            self._seen = _fast.ring.load_u64(self.view, self.control + HEAD)
            if need > self.capacity - (self.tail - self._seen):
                return -1
        start = self.tail
        if n > room:
            ENTRY_HEADER.pack_into(self.view, self.data + idx, room, PAD, 0)
            start += room
            idx = 0
        self._reserved = (start, self.data + idx)
        return self.data + idx

    def commit(self, size: int, at: int) -> bool:
        """Publish the entry of ``size`` bytes reserved at ``at``; True when the consumer is
        asleep and must be woken (the caller writes its eventfd)."""
        start, where = self._reserved
        if where != at:
            raise ValueError("commit of an entry that was not reserved")
        self.tail = start + align8(size)
        return _fast.ring.publish_u64(self.view, self.control + TAIL, self.tail,
                                      self.control + CONSUMER_SLEEPING)

    def set_waiting(self) -> None:
        """The producer is about to sleep until the consumer frees space."""
        _fast.ring.exchange_u32(self.view, self.control + PRODUCER_WAITING, 1)

    # -- consumer ---------------------------------------------------------------------------------

    def published(self) -> int:
        """The producer's tail (acquire), checked against the ring's bounds."""
        tail = _fast.ring.load_u64(self.view, self.control + TAIL)
        if tail & 7 or not 0 <= tail - self.head <= self.capacity:
            raise RingCorruptError(f"ring tail {tail} is not within a ring of {self.capacity} "
                                   f"bytes ahead of head {self.head}")
        self._seen = tail
        return tail

    def peek(self) -> tuple[int, int, int, int] | None:
        """``(offset in view, len, kind, flags)`` of the next entry, or None when empty."""
        while True:
            if self.head == self._seen and self.published() == self.head:
                return None
            idx = self.head & self.mask
            length, kind, flags = ENTRY_HEADER.unpack_from(self.view, self.data + idx)
            if length < 8 or length > self.capacity - idx or align8(length) > self._seen - self.head:
                raise RingCorruptError(f"ring entry of {length} bytes at {idx} does not fit")
            if kind == PAD:
                if length != self.capacity - idx:
                    raise RingCorruptError(f"PAD entry of {length} bytes at {idx}")
                self.head += length
                continue
            return self.data + idx, length, kind, flags

    def advance(self, length: int) -> None:
        """Done with the entry ``peek`` returned (its space is released at ``release``)."""
        self.head += align8(length)

    def release(self, upto: int | None = None) -> bool:
        """Give the space below ``upto`` (default: every entry read) back to the producer;
        True when the producer waits for space and must be woken."""
        return _fast.ring.publish_u64(self.view, self.control + HEAD,
                                      self.head if upto is None else upto,
                                      self.control + PRODUCER_WAITING)

    def set_sleeping(self) -> bool:
        """Announce that the consumer sleeps; False if entries arrived meanwhile (do not sleep)."""
        ring = _fast.ring
        ring.exchange_u32(self.view, self.control + CONSUMER_SLEEPING, 1)
        if self.published() != self.head:
            ring.exchange_u32(self.view, self.control + CONSUMER_SLEEPING, 0)
            return False
        return True

    def clear_sleeping(self) -> None:
        _fast.ring.exchange_u32(self.view, self.control + CONSUMER_SLEEPING, 0)


def session_rings(view: memoryview, layout: Layout) -> tuple[Ring, Ring]:
    """(submit ring, completion ring) of a mapped session region."""
    submit = Ring(view, SUBMIT_CONTROL, DATA, layout.submit_capacity)
    completion = Ring(view, COMPLETION_CONTROL, DATA + layout.submit_capacity,
                      layout.completion_capacity)
    return submit, completion
