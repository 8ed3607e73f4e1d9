"""Checkpoint files in Kafka's text formats (``CheckpointFile``), replaced atomically.

    0                 version
    3                 number of entries
    orders 0 42       one entry per line: "<topic> <partition> <offset>"
    orders 1 17
    events 0 9

``leader-epoch-checkpoint`` uses the same frame with "<epoch> <start offset>" entries.  A write
goes to ``<file>.tmp``, is fsynced, renamed over the old file, and the directory is fsynced: a
crash leaves the old or the new file, never a torn one.  A file that does not parse reads as
missing, which makes the loader recover more, never less.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from shmq.storage import disk

VERSION = 0


def write_atomically(path: Path, text: str, *, sync: bool = True,
                     sync_directory: bool = True) -> None:
    """Replace ``path`` with ``text`` (tmp + rename); ``sync`` makes it durable first.
    ``sync_directory=False``: the caller fsyncs ``path``'s directory next (the rename's
    durability), covering this rename and its own new names with one fsync."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        view = memoryview(text.encode())
        while view:
            view = view[os.write(fd, view):]
        if sync:
            disk.fsync(fd)
    except OSError:
        # a full disk (ENOSPC, EDQUOT) or EIO: the old file stays, the partial one goes
        os.close(fd)
        _unlink_quietly(tmp)
        raise
    os.close(fd)
    os.rename(tmp, path)
    if sync and sync_directory:
        fsync_directory(path.parent)


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def fsync_directory(directory: Path) -> None:
    """Make the names in ``directory`` (new, renamed, removed files) durable."""
    dir_fd = os.open(directory, os.O_RDONLY)
    try:
        disk.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def fsync_file(path: Path) -> None:
    """Make a file's present content durable (a missing file: nothing to do)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        disk.fsync(fd)
    finally:
        os.close(fd)


def _write(path: Path, lines: list[str], sync: bool = True, sync_directory: bool = True) -> None:
    write_atomically(path, "\n".join([str(VERSION), str(len(lines)), *lines]) + "\n", sync=sync,
                     sync_directory=sync_directory)


def _read(path: Path, fields: int) -> list[list[str]] | None:
    try:
        text = path.read_text()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    lines = text.split("\n")
    try:
        if lines[0] != str(VERSION):
            return None
        count = int(lines[1])
        entries = [line.split(" ") for line in lines[2 : 2 + count]]
    except (IndexError, ValueError):
        return None
    if len(entries) != count or any(len(e) != fields for e in entries):
        return None
    return entries


def write_offsets(path: Path, offsets: dict[tuple[str, int], int]) -> None:
    """Write a "<topic> <partition> <offset>" checkpoint."""
    lines = [f"{t} {p} {o}" for (t, p), o in sorted(offsets.items())]
    _write(path, lines)


def read_offsets(path: Path) -> dict[tuple[str, int], int]:
    """Read a "<topic> <partition> <offset>" checkpoint; missing or malformed reads as empty."""
    entries = _read(path, 3)
    if entries is None:
        return {}
    try:
        return {(t, int(p)): int(o) for t, p, o in entries}
    except ValueError:
        return {}


def write_leader_epochs(path: Path, epochs: Iterable[tuple[int, int]], *,
                        sync: bool = True, sync_directory: bool = True) -> None:
    _write(path, [f"{e} {o}" for e, o in epochs], sync, sync_directory)


def read_leader_epochs(path: Path) -> list[tuple[int, int]] | None:
    entries = _read(path, 2)
    if entries is None:
        return None
    try:
        return [(int(e), int(o)) for e, o in entries]
    except ValueError:
        return None
