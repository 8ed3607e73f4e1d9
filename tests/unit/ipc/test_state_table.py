"""StateTable: exclusive 0600 creation, attach checks, slots, close/unlink, and the leftover sweep."""

from __future__ import annotations

import errno
import json
import mmap
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import time

import posix_ipc
import pytest

from shmq.errors import ShmqError
from shmq.ipc import (
    UNKNOWN,
    PartitionState,
    ShmRecord,
    ShmTracker,
    StateTable,
    StateTableError,
    owner_alive,
    remove_stale,
    stale_names,
)
from shmq.ipc.state_table import HEADER_SIZE, MAGIC, new_name, process_start_time


def dev_shm(name: str) -> str:
    return "/dev/shm" + name


def exists(name: str) -> bool:
    return os.path.exists(dev_shm(name))


@pytest.fixture
def table():
    with StateTable.create(8) as t:
        yield t


def raw_object(name: str, data: bytes, mode: int = 0o600) -> None:
    """An object made behind StateTable's back (a squatter, a damaged table)."""
    shm = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=mode, size=max(len(data), 1))
    try:
        os.fchmod(shm.fd, mode)
        os.ftruncate(shm.fd, len(data))
        os.pwrite(shm.fd, data, 0)
    finally:
        shm.close_fd()


def unlink_quietly(name: str) -> None:
    try:
        posix_ipc.unlink_shared_memory(name)
    except posix_ipc.ExistentialError:
        pass


# -- create ---------------------------------------------------------------------------------


def test_create_makes_a_private_object_with_an_unguessable_name(table: StateTable) -> None:
    assert re.fullmatch(r"/shmq-st-[0-9a-f]{32}", table.name)
    st = os.stat(dev_shm(table.name))
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert st.st_uid == os.geteuid()
    assert st.st_size == 64 + 64 * 8
    assert table.owner and not table.readonly and table.slot_count == 8
    assert len(table.boot_id) == 16
    assert table.name != new_name() != new_name()


def test_create_is_0600_whatever_the_umask() -> None:
    old = os.umask(0o777)  # would give mode 0000 without the fchmod
    try:
        t = StateTable.create(1)
    finally:
        os.umask(old)
    with t:
        assert stat.S_IMODE(os.stat(dev_shm(t.name)).st_mode) == 0o600
    old = os.umask(0)  # would give 0600 anyway: posix_ipc asks for 0600, never more
    try:
        t = StateTable.create(1)
    finally:
        os.umask(old)
    with t:
        assert stat.S_IMODE(os.stat(dev_shm(t.name)).st_mode) == 0o600


def test_header_layout(table: StateTable) -> None:
    with open(dev_shm(table.name), "rb") as f:
        header = f.read(HEADER_SIZE)
    magic, version, slot_size, slot_count, boot_id = struct.unpack_from("=8sIII16s", header)
    assert (magic, version, slot_size, slot_count, boot_id) == (MAGIC, 1, 64, 8, table.boot_id)
    assert header[36:] == bytes(28)


def test_create_refuses_a_squatted_name() -> None:
    """Someone pre-created the name (mode 0666, ready to read our state): we must not use it."""
    name = new_name()
    raw_object(name, b"squatter", mode=0o666)
    try:
        with pytest.raises(FileExistsError):
            StateTable.create(4, name=name)
        with open(dev_shm(name), "rb") as f:
            assert f.read() == b"squatter"  # untouched, and create did not unlink it either
    finally:
        unlink_quietly(name)


def test_create_rejects_bad_names_and_counts() -> None:
    for name in ("noslash", "/a/b", "/", "/..", "/" + "x" * 300, "/sp ace"):
        with pytest.raises(ValueError):
            StateTable.create(1, name=name)
    with pytest.raises(ValueError):
        StateTable.create(-1)
    with pytest.raises(ValueError):
        StateTable.create(2**32)


def test_new_table_publishes_unknown_everywhere(table: StateTable) -> None:
    for slot in range(table.slot_count):
        assert table.read(slot) == UNKNOWN
        assert table.seq(slot) == 2


# -- slots ----------------------------------------------------------------------------------


def test_write_then_read_from_another_mapping(table: StateTable) -> None:
    state = PartitionState(2, 5, 0, 1000, 990, 1001, segments_gen=3, flags=1)
    table.write(7, *state)
    with StateTable.attach(table.name) as reader:
        assert reader.read(7) == state
        assert reader.read(6) == UNKNOWN
        table.write(7, 2, 5, 10, 1100, 1100, 1200)  # seen by an existing mapping at once
        assert reader.read(7) == PartitionState(2, 5, 10, 1100, 1100, 1200, 0, 0)
        assert reader.seq(7) == 6
    table.clear(7)
    assert table.read(7) == UNKNOWN


def test_slot_index_is_checked(table: StateTable) -> None:
    for slot in (-1, 8, 1 << 40):
        with pytest.raises(IndexError):
            table.read(slot)
        with pytest.raises(IndexError):
            table.write(slot, *UNKNOWN)


def test_read_only_attach_cannot_write(table: StateTable) -> None:
    with StateTable.attach(table.name) as reader:
        with pytest.raises(StateTableError, match="read-only"):
            reader.write(0, *UNKNOWN)
    with StateTable.attach(table.name, readonly=False) as writer:
        writer.write(0, 1, 1, 0, 0, 0, 0)
        assert not writer.owner
    assert table.read(0) == PartitionState(1, 1, 0, 0, 0, 0)


def test_read_returns_none_while_a_dead_writer_left_seq_odd(table: StateTable) -> None:
    table.write(3, 1, 1, 0, 10, 10, 10)
    shm = posix_ipc.SharedMemory(table.name)
    try:
        m = mmap.mmap(shm.fd, shm.size)
    finally:
        shm.close_fd()
    with m:
        struct.pack_into("=Q", m, HEADER_SIZE + 3 * 64, 5)  # killed between odd and even
        with StateTable.attach(table.name) as reader:
            assert reader.read(3) is None  # the client falls back to the socket path
            assert reader.read(3, max_spins=1) is None
            assert reader.read(2) == UNKNOWN
            table.clear(3)  # the controller resets the dead leader's slot
            assert reader.read(3) == UNKNOWN
            assert reader.seq(3) == 6


# -- attach checks ----------------------------------------------------------------------------


def test_attach_checks_slot_count_and_boot_id(table: StateTable) -> None:
    with StateTable.attach(table.name, slot_count=8, boot_id=table.boot_id) as r:
        assert r.slot_count == 8 and r.boot_id == table.boot_id
    with pytest.raises(StateTableError, match="slots"):
        StateTable.attach(table.name, slot_count=9)
    with pytest.raises(StateTableError, match="another broker run"):
        StateTable.attach(table.name, boot_id=bytes(16))


def test_attach_missing_name() -> None:
    with pytest.raises(FileNotFoundError):
        StateTable.attach(new_name())


def good_header(slot_count: int) -> bytes:
    return struct.pack("=8sIII16s", MAGIC, 1, 64, slot_count, b"b" * 16).ljust(64, b"\0")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "too small"),
        (b"\0" * 63, "too small"),
        (b"\0" * (64 + 64), "bad magic"),  # a creator that has not finished: retry later
        (b"SHMQST02" + good_header(1)[8:] + bytes(64), "bad magic"),
        (struct.pack("=8sIII", MAGIC, 2, 64, 1).ljust(128, b"\0"), "version"),
        (struct.pack("=8sIII", MAGIC, 1, 32, 1).ljust(128, b"\0"), "slot size"),
        (good_header(2) + bytes(64), "do not hold"),  # truncated: 1 slot's bytes, 2 claimed
        (good_header(1) + bytes(128), "do not hold"),  # grown
        (good_header(2**32 - 1) + bytes(64), "do not hold"),  # a huge claim maps nothing more
    ],
)
def test_attach_validates_the_header_and_size(data: bytes, message: str) -> None:
    name = new_name()
    raw_object(name, data)
    try:
        for readonly in (True, False):
            with pytest.raises(StateTableError, match=message) as info:
                StateTable.attach(name, readonly=readonly)
            assert isinstance(info.value, ShmqError)
    finally:
        unlink_quietly(name)


def test_attach_refuses_an_object_others_can_access() -> None:
    name = new_name()
    raw_object(name, good_header(1) + bytes(64), mode=0o644)
    try:
        with pytest.raises(PermissionError, match="0644"):
            StateTable.attach(name)
    finally:
        unlink_quietly(name)


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("cat") is None,
    reason="needs root (to run a command as another user) and cat",
)
def test_another_user_cannot_open_the_table(table: StateTable) -> None:
    """reliability.md S1: no shmq object is openable by another uid."""
    path = dev_shm(table.name)
    for argv in (["cat", path], ["sh", "-c", f"echo x >> {path}"]):
        done = subprocess.run(argv, user=65534, group=65534, capture_output=True, timeout=10)
        assert done.returncode != 0
        assert b"Permission denied" in done.stderr
    assert table.read(0) == UNKNOWN


# -- lifetime -------------------------------------------------------------------------------


def test_close_and_unlink_are_separate() -> None:
    t = StateTable.create(2)
    name = t.name
    reader = StateTable.attach(name)
    t.write(1, 1, 1, 1, 1, 1, 1)
    t.unlink()  # the name goes, the mappings stay
    assert not exists(name)
    assert reader.read(1) == PartitionState(1, 1, 1, 1, 1, 1)
    t.write(1, 2, 2, 2, 2, 2, 2)
    assert reader.read(1) == PartitionState(2, 2, 2, 2, 2, 2)
    t.unlink()  # idempotent
    with pytest.raises(FileNotFoundError):
        StateTable.attach(name)
    t.close()
    t.close()  # idempotent
    assert t.closed and not reader.closed
    with pytest.raises(ValueError, match="closed"):
        t.read(0)
    reader.close()

    t = StateTable.create(2)
    t.close()  # unmapped, but the name stays until the owner unlinks it
    assert exists(t.name)
    with StateTable.attach(t.name) as again:
        assert again.read(0) == UNKNOWN
    t.unlink()
    assert not exists(t.name)


def test_only_the_owner_unlinks(table: StateTable) -> None:
    with StateTable.attach(table.name, readonly=False) as other:
        with pytest.raises(StateTableError, match="only the process that created it"):
            other.unlink()
    assert exists(table.name)


def test_context_manager_owner_unlinks_attacher_only_closes() -> None:
    with StateTable.create(1) as t:
        with StateTable.attach(t.name) as r:
            pass
        assert r.closed and exists(t.name)
    assert t.closed and not exists(t.name)
    with pytest.raises(RuntimeError):
        with StateTable.create(1) as t:
            raise RuntimeError("boom")
    assert not exists(t.name)


# -- tracker and stale sweep --------------------------------------------------------------------


def test_tracker_records_and_forgets() -> None:
    tracker = ShmTracker()
    t = StateTable.create(1, tracker=tracker)
    assert t.name in tracker and len(tracker) == 1
    (record,) = tracker.records()
    assert record.name == t.name and record.pid == os.getpid() and record.start_time > 0
    assert tracker.to_json() == [
        {"name": t.name, "pid": os.getpid(), "start_time": record.start_time}
    ]
    assert stale_names(tracker.to_json()) == []  # we are alive
    t.unlink()
    assert t.name not in tracker
    t.close()

    a, b = StateTable.create(1, tracker=tracker), StateTable.create(1, tracker=tracker)
    a.close()
    b.close()
    assert sorted(tracker.unlink_all()) == sorted([a.name, b.name])
    assert len(tracker) == 0 and not exists(a.name) and not exists(b.name)


def test_owner_alive_guards_against_pid_reuse() -> None:
    pid = os.getpid()
    start_time = process_start_time(pid)
    assert start_time
    assert owner_alive(pid, start_time)
    assert owner_alive(pid)  # start time unknown: pid only
    assert not owner_alive(pid, start_time + 1)  # same pid, another process
    assert not owner_alive(0) and not owner_alive(-1)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert not owner_alive(dead.pid)


def test_crashed_owner_is_swept_by_the_next_start() -> None:
    """A broker killed -9 leaves its table; the next start finds its record in broker.json,
    sees the creator is dead, and removes it."""
    child = (
        "import json, os, sys\n"
        "from shmq.ipc import ShmTracker, StateTable\n"
        "tracker = ShmTracker()\n"
        "t = StateTable.create(4, tracker=tracker)\n"
        "print(json.dumps(tracker.to_json()), flush=True)\n"
        "os.kill(os.getpid(), 9)\n"
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, timeout=60, text=True)
    assert done.returncode == -9, done.stderr
    records = json.loads(done.stdout)
    (name,) = [r["name"] for r in records]
    try:
        assert exists(name)  # the leak this sweep exists for
        with StateTable.create(1) as live:
            alive = ShmRecord(live.name, os.getpid(), process_start_time(os.getpid()) or 0)
            stale = stale_names([*records, alive])
            assert stale == [name]  # our own live table is not stale
            assert remove_stale(stale) == [name]
            assert not exists(name) and exists(live.name)
            assert remove_stale(stale) == []  # already gone: nothing to do, no error
    finally:
        unlink_quietly(name)


def test_a_zombie_owner_is_swept_too() -> None:
    """A predecessor killed but not yet reaped by its parent is a zombie: its pid and start time
    are still in /proc, yet it will never unlink its table.  The sweep must treat it as dead
    (issue 21 item 6: it used to count as alive and its table stayed in /dev/shm)."""
    child = (
        "import json, sys, time\n"
        "from shmq.ipc import ShmTracker, StateTable\n"
        "tracker = ShmTracker()\n"
        "t = StateTable.create(4, tracker=tracker)\n"
        "print(json.dumps(tracker.to_json()), flush=True)\n"
        "time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, text=True)
    name = ""
    try:
        assert proc.stdout is not None
        records = json.loads(proc.stdout.readline())
        (name,) = [r["name"] for r in records]
        os.kill(proc.pid, signal.SIGKILL)
        # not reaped: the child stays a zombie until we wait for it
        deadline = time.monotonic() + 10
        while True:
            with open(f"/proc/{proc.pid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
            if state == b"Z" or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert state == b"Z"
        assert exists(name)
        assert not owner_alive(records[0]["pid"], records[0]["start_time"])
        assert stale_names(records) == [name]
        assert remove_stale(stale_names(records)) == [name] and not exists(name)
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if name:
            unlink_quietly(name)


def test_remove_stale_only_touches_shmq_names() -> None:
    name = new_name()
    raw_object(name, b"x")
    try:
        with pytest.raises(ValueError):
            remove_stale([name, "/not-ours"])  # checked before anything is unlinked
        assert exists(name)
        for bad in ("/shmq-../../etc", "shmq-st-x", "/shmq-a/b"):
            with pytest.raises(ValueError):
                remove_stale([bad])
        assert remove_stale([name, new_name()]) == [name]
    finally:
        unlink_quietly(name)


# -- the storage-error flag (issue 19) ---------------------------------------------------------


def test_storage_flags_round_trip_and_clamp() -> None:
    from shmq.ipc.state_table import STORAGE_ERROR, storage_errno, storage_flags

    assert storage_flags(None) == 0 and storage_errno(0) is None
    for code in (errno.ENOSPC, errno.EIO, errno.EDQUOT, 0, 0xFFFF):
        flags = storage_flags(code)
        assert flags & STORAGE_ERROR and storage_errno(flags) == code
    assert storage_errno(storage_flags(-5)) == 0         # nonsense is clamped, never raises
    assert storage_errno(storage_flags(1 << 20)) == 0xFFFF
    assert storage_errno(errno.ENOSPC << 8) is None      # the errno bits alone mean nothing


def test_flagged_finds_exactly_the_slots_with_a_storage_error(table: StateTable) -> None:
    from shmq.ipc.state_table import STORAGE_ERROR, storage_flags

    assert table.flagged(STORAGE_ERROR) == set()
    failing = {0, 3, table.slot_count - 1}
    for slot in range(table.slot_count):
        flags = storage_flags(errno.ENOSPC) if slot in failing else 0
        table.write(slot, 1, 0, 0, 10, 10, 10, 1, flags)
    assert table.flagged(STORAGE_ERROR) == failing
    reader = StateTable.attach(table.name)
    try:
        assert reader.flagged(STORAGE_ERROR) == failing
        table.write(3, 1, 0, 0, 11, 11, 11, 1, 0)        # an append succeeded: cleared
        assert reader.flagged(STORAGE_ERROR) == {0, table.slot_count - 1}
        state = reader.read(0)
        assert state is not None and state.flags == storage_flags(errno.ENOSPC)
    finally:
        reader.close()
