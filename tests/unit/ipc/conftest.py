"""Every ipc test leaves /dev/shm as it found it (DESIGN.md §1: no leftover shm objects).

Only ``shmq-st-*`` names are watched: every object these tests create has that prefix, and other
suites (rings, brokers) running at the same time on this host may own other ``shmq-*`` names.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import posix_ipc
import pytest

SHM_DIR = "/dev/shm"
WATCHED = "shmq-st-"


def remove(names: set[str]) -> None:
    """Unlink what a failing test left, so one failure does not leak into the next run."""
    for name in names:
        try:
            posix_ipc.unlink_shared_memory("/" + name)
        except posix_ipc.ExistentialError:
            pass


def _mapped_by_live_processes() -> set[str]:
    """Names some other process maps or holds open right now: a broker running beside the
    tests owns those (a controller opens its table before it maps it), and they are neither
    this suite's leftovers nor ours to remove."""
    names: set[str] = set()
    me = str(os.getpid())
    prefix = os.path.join(SHM_DIR, WATCHED)
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or pid == me:  # our own mappings are leaks, not a broker's
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    if prefix in line:
                        names.add(line.rsplit("/", 1)[-1].split()[0])
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(prefix):
                    names.add(os.path.basename(target))
        except OSError:
            continue
    return names


def shm_names() -> set[str]:
    try:
        found = {n for n in os.listdir(SHM_DIR) if n.startswith(WATCHED)}
    except FileNotFoundError:
        return set()
    return found - _mapped_by_live_processes() if found else found


@pytest.fixture(scope="session", autouse=True)
def no_leftovers_after_run() -> Iterator[None]:
    before = shm_names()
    yield
    left = shm_names() - before
    remove(left)
    assert not left, f"the ipc tests left shm objects behind: {sorted(left)}"


@pytest.fixture(autouse=True)
def no_leftovers() -> Iterator[None]:
    before = shm_names()
    yield
    left = shm_names() - before
    remove(left)
    assert not left, f"this test left shm objects behind: {sorted(left)}"
