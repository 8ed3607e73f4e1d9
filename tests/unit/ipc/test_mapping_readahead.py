"""``MappedFile.populate`` on a range the kernel evicted from the page cache: the pages are
asked for ahead (``MADV_WILLNEED`` in chunks) instead of one synchronous 4 KiB read per page,
which the mapping's ``MADV_RANDOM`` otherwise makes of every major fault (a local reader of a log
evicted seconds after it was written: 2,688 major faults per 100,000-record read)."""

from __future__ import annotations

import os
import resource

import numpy as np
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


def test_populate_at_a_files_tail_asks_for_no_resident_chunk(tmp_path) -> None:
    """A local reader at the tail reads the file's last, partial chunk on every read: measured to
    the mapping's end, that chunk's last page (past the file's end) is never resident, and each
    read asked for the chunk again (``MADV_WILLNEED``: ~7 us of a ~20 us one-record read).  The
    chunk ends at ``file_size``: a resident tail asks for nothing."""
    if not _fast.HAVE_FAST:
        pytest.skip("compiled extension not built")
    path = tmp_path / "seg.log"
    size = 100_000  # the first chunk, partial
    path.write_bytes(os.urandom(size))
    m = _map(_fast, path, 1 << 24)  # as a reader maps: far past the file's end
    try:
        assert m.populate(0, size) in (0, 1)  # resident now (just written), mapped
        assert m.populate(size - 170, 170, size) == 0
        assert m.populate(size - 170, 170) == 1  # measured to the mapping's end
        assert m.populate(size - 170, 170, 1 << 30) == 1  # a size past the mapping: ignored
        assert m.populate(size - 170, 170, 10) == 1  # a size below the range: ignored
        assert bytes(memoryview(m)[size - 170 : size]) == path.read_bytes()[-170:]
    finally:
        m.close()


def test_twin_populate_ends_its_chunks_at_the_files_size(tmp_path) -> None:
    path = tmp_path / "seg.log"
    size = 3 * (512 << 10) + 5000
    path.write_bytes(os.urandom(size))
    m = _map(_reference, path, size)
    try:
        assert m.populate(size - 170, 170, size) == 1
        assert m.populate(100, (512 << 10) + 10, size) == 2
        assert m.populate(100, 0, size) == 0
    finally:
        m.close()


def _map(module, path, length: int):
    """``module.MappedFile`` of ``path`` (read-only), the descriptor closed: the mapping keeps
    the file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return module.MappedFile(fd, length)
    finally:
        os.close(fd)


def _mapped_kib(address: int) -> int:
    """Rss (KiB) of this process's mapping that starts at ``address`` (/proc/self/smaps)."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                inside = int(head.split("-")[0], 16) == address
            elif inside and head == "Rss:":
                return int(line.split()[1])
    raise AssertionError("mapping not found")


def test_populate_leaves_a_resident_range_to_fault_around(tmp_path) -> None:
    """A range the page cache holds is not mapped by ``populate`` (the walk of every page cost
    more than the faults): the walker's faults map it, each the 16 pages around it, under the
    mapping's ``MADV_RANDOM`` too.  An evicted range is still mapped by the populate (above)."""
    if not _fast.HAVE_FAST:
        pytest.skip("compiled extension not built")
    path = tmp_path / "seg.log"
    path.write_bytes(os.urandom(SIZE))
    m = _map(_fast, path, SIZE)
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        m.populate(0, SIZE)
        assert _mapped_kib(_address(m)) == 0  # resident: nothing mapped yet
        pages = np.frombuffer(m, dtype=np.uint8, count=SIZE)[::PAGE]
        walked = int(pages.sum())  # the walk: a byte of each page, one fault per 16 pages
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        assert faults < SIZE // PAGE // 4, faults
        assert _mapped_kib(_address(m)) == SIZE // 1024
        assert walked == sum(path.read_bytes()[::PAGE])
        del pages
    finally:
        m.close()


def _address(m) -> int:
    return int(np.frombuffer(m, dtype=np.uint8, count=1).ctypes.data)
