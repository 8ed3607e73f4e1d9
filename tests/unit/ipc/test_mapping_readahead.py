"""``MappedFile.populate`` on a range the kernel evicted from the page cache: the pages are
asked for ahead (``MADV_WILLNEED`` in chunks) instead of one synchronous 4 KiB read per page,
which the mapping's ``MADV_RANDOM`` otherwise makes of every major fault (a local reader of a log
evicted seconds after it was written: 2,688 major faults per 100,000-record read)."""

from __future__ import annotations

import os
import resource

import pytest

from shmq import _fast
from shmq._fast import _reference

SIZE = 8 << 20
PAGE = 4096


def _evicted_file(path) -> int:
    data = os.urandom(SIZE)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    os.fsync(fd)  # clean pages: DONTNEED drops them
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    return fd


def _major_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_majflt


@pytest.mark.parametrize("impl", ["compiled", "twin"])
def test_populate_reads_an_evicted_range_ahead(tmp_path, impl: str) -> None:
    if impl == "compiled" and not _fast.HAVE_FAST:
        pytest.skip("compiled extension not built")
    cls = _fast.MappedFile if impl == "compiled" else _reference.MappedFile
    path = tmp_path / "seg.log"
    fd = _evicted_file(path)
    try:
        m = cls(fd, SIZE)
    finally:
        os.close(fd)
    try:
        # two reads, the second starting inside the chunk where the first ends (as a reader's
        # next read starts at the batch where the last one stopped)
        before = _major_faults()
        m.populate(100, SIZE // 2 - 1000)
        m.populate(SIZE // 2 - 3000, SIZE // 2 + 3000 - 100)
        faults = _major_faults() - before
        # without the readahead every page is a major fault of its own (2,048 here); with it a
        # fault may still wait on a page whose read is in flight
        assert faults < SIZE // PAGE // 8, faults
        assert bytes(memoryview(m)[: SIZE]) == path.read_bytes()
    finally:
        m.close()


def test_populate_checks_its_range(tmp_path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 3 * PAGE)
    fd = os.open(path, os.O_RDONLY)
    try:
        for cls in {_fast.MappedFile, _reference.MappedFile}:
            m = cls(fd, 3 * PAGE)
            m.populate(0, 3 * PAGE)
            m.populate(PAGE + 5, 0)  # nothing to do
            with pytest.raises(ValueError):
                m.populate(PAGE, 3 * PAGE)
            with pytest.raises(ValueError):
                m.populate(-1, 10)
            m.close()
    finally:
        os.close(fd)
