"""The broker's state table: one seqlocked slot per partition in a POSIX shared-memory object.

Layout (DESIGN.md §4), native byte order because every party is on this host::

    header  64 B at 0
       0  magic        8 B  b"SHMQST01"
       8  version      u32  1
      12  slot_size    u32  64
      16  slot_count   u32
      20  boot_id      16 B random per broker run (a reader can tell a new broker from the old)
      36  reserved     28 B zero
    slot i  64 B at 64 + 64*i   (seqlock; field offsets in shmq/_fast/seqlock.pyx)
       seq u64 | leader i32 | leader_epoch i32 | log_start i64 | high_watermark i64
       | last_stable i64 | log_end i64 | segments_gen u32 | flags u32 | reserved 8 B

Theory of operation:

* **One owner.**  The controller calls ``StateTable.create``: exclusive create (``O_CREAT |
  O_EXCL``), mode 0600 re-applied with ``fchmod`` so the umask cannot weaken or break it, an
  unguessable name ``/shmq-st-<128 random bits in hex>``, every slot published as "unknown"
  (leader -1, offsets -1), then the header, magic last.  It lists the name, its pid and start time
  in ``<data-dir>/run/broker.json`` (``ShmTracker.to_json``) and is the only one that unlinks.
* **One writer per slot.**  A partition's leader worker attaches read-write and writes only its
  partitions' slots.  A writer that dies mid-update leaves seq odd; the next ``write`` (or
  ``clear``) of that slot by the controller or the new leader completes it.
* **Readers** (clients, spark_bridge) attach read-only.  ``read`` returns ``None`` when it saw no
  stable snapshot within its spin budget: the caller falls back to the socket path.  A slot whose
  ``leader`` is -1 has not been published: the socket path answers for it too.
* ``attach`` refuses an object that is not a regular file owned by this uid with no group or
  other permission bits, a bad magic or version, a slot size other than 64, or a size that does
  not match the header (reliability.md §5, §6).  The header is written last at create, so an
  attach that races the creator fails with ``StateTableError`` and may simply be retried.
* ``close`` (unmap) and ``unlink`` (remove the name; owner only) are separate: mappings outlive
  the name.  As a context manager the owner unlinks and closes; others only close.
* **No leftovers.**  ``ShmTracker`` records the names this process created (with pid and process
  start time, which guards against pid reuse).  After a crash, the next broker start reads the
  old records, keeps those whose owner is dead (``stale_names``) and ``remove_stale``-s them.

``posix_ipc`` provides ``shm_open``/``shm_unlink`` (glibc adds ``O_NOFOLLOW | O_CLOEXEC``); its
exceptions are translated to ``OSError`` subclasses, as OS failures stay ``OSError`` in shmq.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
import struct
from collections.abc import Iterable, Iterator, Mapping
from types import TracebackType
from typing import Any, NamedTuple

import posix_ipc

from shmq._fast import (  # the compiled seqlock, or its twin with SHMQ_PURE=1
    DEFAULT_MAX_SPINS,
    SLOT_SIZE,
    MappedFile,
    read_slot,
    slot_seq,
    write_slot,
)
from shmq.errors import ShmqError

MAGIC = b"SHMQST01"
VERSION = 1
HEADER_SIZE = 64
HEADER = struct.Struct("=8sIII16s")  # magic, version, slot_size, slot_count, boot_id
NAME_PREFIX = "/shmq-"
STATE_TABLE_PREFIX = "/shmq-st-"
MODE = 0o600
_U32_MAX = 2**32 - 1
# A POSIX shm name: one leading slash, then a file name in /dev/shm (NAME_MAX 255, no slash).
_NAME_RE = re.compile(r"/[A-Za-z0-9._-]{1,254}")

_FLAGS_WORD = 52 // 4  # the slot's flags: byte 52 (shmq/_fast/seqlock.pyx)

assert HEADER.size <= HEADER_SIZE and SLOT_SIZE == 64


class StateTableError(ShmqError):
    """The state table cannot be used as asked: a bad header, a size that does not match, another
    broker run's table, or an unlink by a process that does not own it."""


class PartitionState(NamedTuple):
    """One partition's published state (leader -1 and offsets -1: not published yet)."""

    leader: int
    leader_epoch: int
    log_start: int
    high_watermark: int
    last_stable: int
    log_end: int
    segments_gen: int = 0
    flags: int = 0


UNKNOWN = PartitionState(-1, -1, -1, -1, -1, -1, 0, 0)

# ``flags``: bit 0 set while the partition's last write failed (a full disk, an I/O error), with
# the errno in bits 8..23; the leader still serves reads, appends are answered
# KAFKA_STORAGE_ERROR until one succeeds.  Metadata lists the leader as an offline replica.
STORAGE_ERROR = 0x1
_ERRNO_SHIFT = 8


def storage_flags(errno_: int | None) -> int:
    """The ``flags`` of a partition whose last write failed with ``errno_`` (None: it did not)."""
    if errno_ is None:
        return 0
    return STORAGE_ERROR | (min(max(errno_, 0), 0xFFFF) << _ERRNO_SHIFT)


def storage_errno(flags: int) -> int | None:
    """The errno of a partition's storage error from its ``flags``, or None (no error)."""
    return (flags >> _ERRNO_SHIFT) & 0xFFFF if flags & STORAGE_ERROR else None


def new_name(prefix: str = STATE_TABLE_PREFIX) -> str:
    """An unguessable shm name: ``prefix`` + 128 random bits in hex."""
    return prefix + secrets.token_hex(16)


def _check_name(name: str) -> None:
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name) or name in ("/.", "/.."):
        raise ValueError(f"not a POSIX shared memory name: {name!r}")


def _open(name: str, flags: int, *, size: int = 0, read_only: bool = False) -> Any:
    """``posix_ipc.SharedMemory`` with its errors as ``OSError`` subclasses."""
    try:
        return posix_ipc.SharedMemory(name, flags, mode=MODE, size=size, read_only=read_only)
    except posix_ipc.ExistentialError as exc:
        code = errno.EEXIST if flags & posix_ipc.O_EXCL else errno.ENOENT
        raise OSError(code, os.strerror(code), name) from exc
    except posix_ipc.PermissionsError as exc:
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), name) from exc


def _unlink(name: str) -> bool:
    """shm_unlink; False if the name did not exist."""
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        return False
    except posix_ipc.PermissionsError as exc:
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), name) from exc
    return True


def _check_owner(st: os.stat_result, name: str) -> None:
    """Refuse an object another user could read or write (a squatter's, or a wrong umask's)."""
    if not stat.S_ISREG(st.st_mode):
        raise PermissionError(errno.EACCES, "not a regular shared memory object", name)
    if st.st_uid != os.geteuid():
        raise PermissionError(errno.EACCES, f"owned by uid {st.st_uid}, not by us", name)
    if st.st_mode & 0o077:
        raise PermissionError(
            errno.EACCES, f"mode {stat.S_IMODE(st.st_mode):04o} is not 0600", name
        )


class StateTable:
    """A mapped state table; build one with ``create`` (owner) or ``attach``."""

    def __init__(
        self,
        name: str,
        mapping: MappedFile,
        slot_count: int,
        boot_id: bytes,
        *,
        owner: bool,
        readonly: bool,
        tracker: ShmTracker | None = None,
    ) -> None:
        self.name = name
        self.slot_count = slot_count
        self.boot_id = boot_id
        self.owner = owner
        self.readonly = readonly
        self._map: MappedFile | None = mapping
        self._view: memoryview | None = memoryview(mapping)
        self._tracker = tracker
        self._unlinked = False

    # -- construction -------------------------------------------------------------------------

    @classmethod
    def create(
        cls, slot_count: int, *, name: str | None = None, tracker: ShmTracker | None = None
    ) -> StateTable:
        """Create a new table (we are its owner); ``name`` defaults to an unguessable one.

        Raises ``FileExistsError`` if the name exists: an object we did not create is never
        reused (a squatter may hold a mapping of it)."""
        if not 0 <= slot_count <= _U32_MAX:
            raise ValueError(f"slot_count {slot_count} is out of range")
        name = new_name() if name is None else name
        _check_name(name)
        size = HEADER_SIZE + SLOT_SIZE * slot_count
        shm = _open(name, posix_ipc.O_CREX, size=size)
        mapping = None
        try:
            try:
                os.fchmod(shm.fd, MODE)  # the umask may have taken bits away; 0600 exactly
                st = os.fstat(shm.fd)
                _check_owner(st, name)
                if st.st_size != size:
                    raise StateTableError(f"{name}: size {st.st_size} after create, not {size}")
                mapping = MappedFile(shm.fd, size, True)
            finally:
                shm.close_fd()
            boot_id = secrets.token_bytes(16)
            with memoryview(mapping) as view:
                for slot in range(slot_count):
                    write_slot(view, HEADER_SIZE + SLOT_SIZE * slot, *UNKNOWN)
                # The header last, magic last of all: an attacher seeing the magic sees the rest.
                HEADER.pack_into(view, 0, b"\0" * 8, VERSION, SLOT_SIZE, slot_count, boot_id)
                view[0:8] = MAGIC
        except BaseException:
            if mapping is not None:
                mapping.close()
            _unlink(name)
            raise
        table = cls(name, mapping, slot_count, boot_id, owner=True, readonly=False)
        if tracker is not None:
            tracker.add(name)
            table._tracker = tracker
        return table

    @classmethod
    def attach(
        cls,
        name: str,
        *,
        readonly: bool = True,
        slot_count: int | None = None,
        boot_id: bytes | None = None,
    ) -> StateTable:
        """Map an existing table after checking owner, mode, header and size; optionally also
        that it has ``slot_count`` slots and belongs to the broker run ``boot_id``."""
        _check_name(name)
        shm = _open(name, 0, read_only=readonly)
        try:
            st = os.fstat(shm.fd)
            _check_owner(st, name)
            size = st.st_size
            if size < HEADER_SIZE:
                raise StateTableError(f"{name}: {size} bytes is too small for a state table")
            mapping = MappedFile(shm.fd, size, not readonly)
        finally:
            shm.close_fd()
        try:
            magic, version, slot_size, count, run = HEADER.unpack_from(mapping, 0)
            if magic != MAGIC:
                raise StateTableError(f"{name}: bad magic {magic!r}")
            if version != VERSION:
                raise StateTableError(f"{name}: version {version}, expected {VERSION}")
            if slot_size != SLOT_SIZE:
                raise StateTableError(f"{name}: slot size {slot_size}, expected {SLOT_SIZE}")
            if size != HEADER_SIZE + SLOT_SIZE * count:
                raise StateTableError(f"{name}: {size} bytes do not hold {count} slots")
            if slot_count is not None and count != slot_count:
                raise StateTableError(f"{name}: {count} slots, expected {slot_count}")
            if boot_id is not None and run != boot_id:
                raise StateTableError(f"{name}: belongs to another broker run")
        except BaseException:
            mapping.close()
            raise
        return cls(name, mapping, count, run, owner=False, readonly=readonly)

    # -- slots --------------------------------------------------------------------------------

    def _slot_offset(self, slot: int) -> int:
        if not 0 <= slot < self.slot_count:
            raise IndexError(f"slot {slot} is not in [0, {self.slot_count})")
        return HEADER_SIZE + SLOT_SIZE * slot

    def _buffer(self) -> memoryview:
        if self._view is None:
            raise ValueError("state table is closed")
        return self._view

    def write(
        self,
        slot: int,
        leader: int,
        leader_epoch: int,
        log_start: int,
        high_watermark: int,
        last_stable: int,
        log_end: int,
        segments_gen: int = 0,
        flags: int = 0,
    ) -> None:
        """Publish a partition's state (``table.write(slot, *state)`` works too).  Only the
        slot's one writer may call this."""
        buf = self._view  # ``_buffer`` and ``_slot_offset`` inline: once per appended batch
        if buf is None:
            raise ValueError("state table is closed")
        if self.readonly:
            raise StateTableError(f"{self.name} is attached read-only")
        if not 0 <= slot < self.slot_count:
            raise IndexError(f"slot {slot} is not in [0, {self.slot_count})")
        write_slot(
            buf,
            HEADER_SIZE + SLOT_SIZE * slot,
            leader,
            leader_epoch,
            log_start,
            high_watermark,
            last_stable,
            log_end,
            segments_gen,
            flags,
        )

    def clear(self, slot: int) -> None:
        """Publish "unknown" (also completes an update a dead writer left half done)."""
        self.write(slot, *UNKNOWN)

    def read(self, slot: int, max_spins: int = DEFAULT_MAX_SPINS) -> PartitionState | None:
        """A consistent snapshot of the slot, or ``None``: use the socket path instead."""
        # Inlined checks: this is the local fetch path's per-request cost (~1 us less than
        # calling _buffer/_slot_offset and PartitionState._make).
        view = self._view
        if view is None:
            raise ValueError("state table is closed")
        if not 0 <= slot < self.slot_count:
            raise IndexError(f"slot {slot} is not in [0, {self.slot_count})")
        values = read_slot(view, HEADER_SIZE + SLOT_SIZE * slot, max_spins)
        return None if values is None else tuple.__new__(PartitionState, values)

    def flagged(self, mask: int) -> set[int]:
        """The slots whose ``flags`` have a bit of ``mask`` set (one vectorised pass over the
        table, no seqlock: each flags word is read whole)."""
        import numpy as np

        words = np.frombuffer(self._buffer(), dtype=np.uint32, offset=HEADER_SIZE,
                              count=self.slot_count * (SLOT_SIZE // 4))
        flags = words.reshape(self.slot_count, SLOT_SIZE // 4)[:, _FLAGS_WORD]
        return {int(i) for i in np.flatnonzero(flags & mask)}

    def seq(self, slot: int) -> int:
        """The slot's seqlock counter: the number of completed writes times two (odd mid-write)."""
        return int(slot_seq(self._buffer(), self._slot_offset(slot)))

    # -- lifetime -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._map is None

    def close(self) -> None:
        """Unmap (idempotent).  Does not remove the name: see ``unlink``."""
        if self._view is not None:
            self._view.release()
            self._view = None
        if self._map is not None:
            self._map.close()
            self._map = None

    def unlink(self) -> None:
        """Remove the name (owner only, idempotent); existing mappings stay valid."""
        if not self.owner:
            raise StateTableError(f"{self.name}: only the process that created it unlinks it")
        if not self._unlinked:
            _unlink(self.name)  # already gone (a sweep raced us) is fine: the goal is no name
            self._unlinked = True
            if self._tracker is not None:
                self._tracker.discard(self.name)

    def __enter__(self) -> StateTable:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self.owner:
                self.unlink()
        finally:
            self.close()

    def __repr__(self) -> str:
        role = "owner" if self.owner else "read-only" if self.readonly else "writer"
        state = "closed" if self.closed else f"{self.slot_count} slots"
        return f"<StateTable {self.name} {role} {state}>"


# -- leftovers --------------------------------------------------------------------------------


class ShmRecord(NamedTuple):
    """A shm object and the process that created it (``start_time`` guards against pid reuse:
    /proc/<pid>/stat field 22, clock ticks since boot; 0 when unknown)."""

    name: str
    pid: int
    start_time: int


def process_start_time(pid: int) -> int | None:
    """The start time of ``pid`` (/proc/<pid>/stat field 22), or None if it does not exist or
    has already exited.

    A process killed but not yet reaped by its parent is a zombie (state ``Z``, or ``X`` while
    it is being reaped): its pid and start time stay in /proc until then, but it runs no more
    code and will never unlink anything, so it counts as gone.  (A controller SIGKILLed under a
    test runner or a shell that has not waited for it yet is exactly that.)"""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:  # no /proc: fall back to "exists", without the pid-reuse guard
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return 0
    # comm (field 2) may hold spaces and parentheses: fields 3.. start after the last ")".
    fields = data.rsplit(b")", 1)[1].split()
    if fields[0] in (b"Z", b"X"):  # field 3, the state: exited, not reaped (yet)
        return None
    return int(fields[19])


def owner_alive(pid: int, start_time: int = 0) -> bool:
    """Whether the process that created an object still runs (same pid *and* start time)."""
    if pid <= 0:
        return False
    now = process_start_time(pid)
    return now is not None and (start_time == 0 or now == 0 or now == start_time)


class ShmTracker:
    """The shm names this process created and has not unlinked yet (one per broker process).

    The broker writes ``to_json()`` into ``<data-dir>/run/broker.json``; if it crashes, the next
    start (or the supervising parent) passes those records to ``stale_names`` and the result to
    ``remove_stale``.  Unlike CPython's ``resource_tracker`` it never unlinks on its own when
    some process exits (cpython gh-82300): the owner decides.
    """

    def __init__(self) -> None:
        self._records: dict[str, ShmRecord] = {}

    def add(self, name: str) -> ShmRecord:
        _check_name(name)
        pid = os.getpid()
        record = ShmRecord(name, pid, process_start_time(pid) or 0)
        self._records[name] = record
        return record

    def discard(self, name: str) -> None:
        self._records.pop(name, None)

    def records(self) -> list[ShmRecord]:
        return list(self._records.values())

    def to_json(self) -> list[dict[str, Any]]:
        """``[{"name": ..., "pid": ..., "start_time": ...}, ...]`` for broker.json."""
        return [r._asdict() for r in self._records.values()]

    def unlink_all(self) -> list[str]:
        """Unlink every tracked name (clean shutdown); returns the names that existed."""
        removed = remove_stale(self._records)
        self._records.clear()
        return removed

    def __contains__(self, name: object) -> bool:
        return name in self._records

    def __iter__(self) -> Iterator[ShmRecord]:
        return iter(self.records())

    def __len__(self) -> int:
        return len(self._records)


def stale_names(records: Iterable[ShmRecord | Mapping[str, Any]]) -> list[str]:
    """The names among ``records`` (ShmRecords or their JSON dicts) whose creator is dead."""
    names = []
    for r in records:
        rec = (
            r
            if isinstance(r, ShmRecord)
            else ShmRecord(r["name"], r["pid"], r.get("start_time", 0))
        )
        if not owner_alive(int(rec.pid), int(rec.start_time)):
            names.append(rec.name)
    return names


def remove_stale(names: Iterable[str]) -> list[str]:
    """Unlink the shmq objects named in ``names`` that exist; returns those that were removed.

    Every name is checked before anything is unlinked: only ``/shmq-...`` names are accepted, so
    a damaged broker.json cannot make us remove another program's objects."""
    names = list(names)
    for name in names:
        _check_name(name)
        if not name.startswith(NAME_PREFIX):
            raise ValueError(f"not a shmq shared memory name: {name!r}")
    return [name for name in names if _unlink(name)]
