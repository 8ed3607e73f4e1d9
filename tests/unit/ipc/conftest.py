"""Every ipc test leaves /dev/shm as it found it (DESIGN.md §1: no leftover shm objects).

Only the objects these tests create are watched: every ``shm_open`` with ``O_CREAT`` in this
process (``StateTable.create``, ``MetricsTable.create``, the tests' raw objects) is recorded by
name, and a recorded name still in /dev/shm after its test is a leak.  Other brokers on the host
(another engineer's suite, a broker killed -9 whose objects wait for its next start) create and
leave ``shmq-*`` names too; those are not this suite's, so they neither fail it nor get removed.
A test's child processes print the names they created, and that test unlinks and checks them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import posix_ipc
import pytest

SHM_DIR = "/dev/shm"

_created: list[str] = []  # every name this process created, in order


def _recording(real: Any) -> Any:
    def shared_memory(name: Any, flags: int = 0, *args: Any, **kwargs: Any) -> Any:
        shm = real(name, flags, *args, **kwargs)
        if flags & posix_ipc.O_CREAT:
            _created.append(shm.name.lstrip("/"))
        return shm

    return shared_memory


def remove(names: set[str]) -> None:
    """Unlink what a failing test left, so one failure does not leak into the next run."""
    for name in names:
        try:
            posix_ipc.unlink_shared_memory("/" + name)
        except posix_ipc.ExistentialError:
            pass


def still_there(names: list[str]) -> set[str]:
    return {n for n in names if os.path.exists(os.path.join(SHM_DIR, n))}


@pytest.fixture(scope="session", autouse=True)
def no_leftovers_after_run() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(posix_ipc, "SharedMemory", _recording(posix_ipc.SharedMemory))
        yield
    left = still_there(_created)
    remove(left)
    assert not left, f"the ipc tests left shm objects behind: {sorted(left)}"


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    first = len(_created)
    yield
    left = still_there(_created[first:])
    remove(left)
    assert not left, f"this test left shm objects behind: {sorted(left)}"
