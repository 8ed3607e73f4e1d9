"""The sparse offset index on real files (Kafka ``OffsetIndex`` / ``AbstractIndex``)."""

from __future__ import annotations

import bisect
import os
import random
import struct

import pytest

from shmq.errors import CorruptIndexError
from shmq.storage.offset_index import OffsetIndex

BASE = 1000


def make(path, max_size=8 * 1024, base=BASE, writable=True) -> OffsetIndex:
    return OffsetIndex(path, base, max_size, writable=writable)


def file_entries(path, base=BASE) -> list[tuple[int, int]]:
    data = path.read_bytes()
    return [(base + r, p) for r, p in struct.iter_unpack(">ii", data[: len(data) // 8 * 8])]


def test_new_index_is_preallocated_rounded_down_to_whole_entries(tmp_path) -> None:
    # AbstractIndex: raf.setLength(roundDownToExactMultiple(maxIndexSize, entrySize))
    path = tmp_path / "00000000000000001000.index"
    idx = make(path, max_size=100)
    try:
        assert os.path.getsize(path) == 96
        assert idx.max_entries == 12
        assert idx.entries == 0
        assert not idx.is_full
    finally:
        idx.close()
    # closed with no entries: trimmed to nothing
    assert os.path.getsize(path) == 0


def test_append_and_entry_layout(tmp_path) -> None:
    path = tmp_path / "i.index"
    idx = make(path)
    idx.append(BASE, 0)
    idx.append(BASE + 5, 4200)
    idx.append(BASE + 9, 9000)
    assert idx.entries == 3
    assert idx.entry(1) == (BASE + 5, 4200)
    assert idx.last_entry == (BASE + 9, 9000)
    idx.flush()
    # big-endian int32 relative offset, int32 position
    assert path.read_bytes()[:24] == struct.pack(">iiiiii", 0, 0, 5, 4200, 9, 9000)
    idx.close()
    assert path.read_bytes() == struct.pack(">iiiiii", 0, 0, 5, 4200, 9, 9000)


def test_empty_index_lookups(tmp_path) -> None:
    idx = make(tmp_path / "i.index")
    try:
        assert idx.last_entry == (BASE, 0)
        assert idx.lookup(BASE + 100) == (BASE, 0)
        assert idx.lookup_position(12345) == (BASE, 0)
    finally:
        idx.close()


@pytest.mark.parametrize("prev", [0, 3])
def test_append_non_increasing_offset_raises(tmp_path, prev: int) -> None:
    idx = make(tmp_path / "i.index")
    try:
        idx.append(BASE + 3, 100)
        with pytest.raises(CorruptIndexError):
            idx.append(BASE + prev, 200)  # OffsetIndex.append: InvalidOffsetException
        assert idx.entries == 1
    finally:
        idx.close()


def test_append_offset_outside_segment_raises(tmp_path) -> None:
    idx = make(tmp_path / "i.index")
    try:
        with pytest.raises(CorruptIndexError):
            idx.append(BASE - 1, 0)
        with pytest.raises(CorruptIndexError):
            idx.append(BASE + 2**31, 0)  # relative offset must fit an int32
        assert idx.entries == 0
    finally:
        idx.close()


def test_is_full_and_append_to_full_index_raises(tmp_path) -> None:
    idx = make(tmp_path / "i.index", max_size=4 * 8 + 5)
    try:
        for i in range(4):
            assert not idx.is_full
            idx.append(BASE + i, i * 10)
        assert idx.is_full
        with pytest.raises(CorruptIndexError):
            idx.append(BASE + 10, 100)
        assert idx.entries == 4
    finally:
        idx.close()


def random_entries(rng: random.Random, n: int) -> list[tuple[int, int]]:
    offsets = sorted(rng.sample(range(BASE, BASE + 50 * n), n))
    positions = sorted(rng.sample(range(0, 200 * n), n))
    return list(zip(offsets, positions, strict=True))


def test_lookups_match_bisect_oracle(tmp_path) -> None:
    rng = random.Random(1234)
    for trial in range(6):
        n = rng.choice([1, 2, 3, 17, 256, 1500])
        entries = random_entries(rng, n)
        path = tmp_path / f"{trial}.index"
        idx = make(path, max_size=n * 8)
        try:
            for off, pos in entries:
                idx.append(off, pos)
            assert idx.is_full
            offs = [o for o, _ in entries]
            poss = [p for _, p in entries]
            probes = [BASE - 1, BASE, offs[0], offs[-1], offs[-1] + 1, 2**31 + BASE - 1]
            probes += [rng.randrange(BASE - 10, offs[-1] + 10) for _ in range(300)]
            for t in probes:
                i = bisect.bisect_right(offs, t) - 1
                expected = entries[i] if i >= 0 else (BASE, 0)
                assert idx.lookup(t) == expected, (n, t)
            for p in [-1, 0, poss[0], poss[-1], poss[-1] + 1] + [
                    rng.randrange(0, poss[-1] + 10) for _ in range(300)]:
                i = bisect.bisect_right(poss, p) - 1
                expected = entries[i] if i >= 0 else (BASE, 0)
                assert idx.lookup_position(p) == expected, (n, p)
        finally:
            idx.close()


def test_truncate_to_removes_entries_at_or_above(tmp_path) -> None:
    rng = random.Random(7)
    entries = random_entries(rng, 64)
    offs = [o for o, _ in entries]
    for target in [BASE, offs[0], offs[0] + 1, offs[31], offs[31] + 1, offs[-1], offs[-1] + 1,
                   offs[-1] + 100]:
        path = tmp_path / f"{target}.index"
        idx = make(path)
        for off, pos in entries:
            idx.append(off, pos)
        idx.truncate_to(target)
        keep = [e for e in entries if e[0] < target]
        assert idx.entries == len(keep)
        assert [idx.entry(i) for i in range(idx.entries)] == keep
        # appending after a truncation continues after the kept entries
        nxt = (keep[-1][0] + 1) if keep else BASE
        idx.append(nxt, 10**6)
        idx.close()
        assert file_entries(path) == [*keep, (nxt, 10**6)]


def test_trim_to_valid_size(tmp_path) -> None:
    path = tmp_path / "i.index"
    idx = make(path, max_size=800)
    for i in range(7):
        idx.append(BASE + i * 2, i * 100)
    assert os.path.getsize(path) == 800
    idx.trim_to_valid_size()
    assert os.path.getsize(path) == 7 * 8
    assert idx.lookup(BASE + 7) == (BASE + 6, 300)
    idx.close()
    assert os.path.getsize(path) == 7 * 8


def test_close_and_reopen_derive_entries_from_file_length(tmp_path) -> None:
    path = tmp_path / "i.index"
    idx = make(path)
    entries = [(BASE + i * 3, i * 77) for i in range(25)]
    for off, pos in entries:
        idx.append(off, pos)
    idx.close()
    # AbstractIndex: an existing index holds length / entrySize entries
    assert os.path.getsize(path) == 25 * 8
    ro = make(path, writable=False)
    try:
        assert ro.entries == 25
        assert [ro.entry(i) for i in range(ro.entries)] == entries
        assert ro.lookup(BASE + 40) == (BASE + 39, 13 * 77)
        with pytest.raises(CorruptIndexError):
            ro.append(BASE + 100, 5000)  # read-only
    finally:
        ro.close()
    assert os.path.getsize(path) == 25 * 8  # a read-only index is not touched by close

    rw = make(path, max_size=4096)  # reopened writable: regrown, entries kept
    try:
        assert rw.entries == 25
        assert os.path.getsize(path) == 4096
        rw.append(BASE + 100, 5000)
    finally:
        rw.close()
    assert file_entries(path) == [*entries, (BASE + 100, 5000)]


def test_untrimmed_index_reopens_with_zero_entries_counted(tmp_path) -> None:
    # why indexes must be trimmed: Kafka derives the entry count from the file length, so an
    # untrimmed (crashed) index reads its zero tail as entries.  shmq has the same rule.
    path = tmp_path / "i.index"
    idx = make(path, max_size=80)
    idx.append(BASE + 1, 10)
    idx.close_untrimmed()
    assert os.path.getsize(path) == 80
    ro = make(path, writable=False)
    try:
        assert ro.entries == 10
        with pytest.raises(CorruptIndexError):
            ro.sanity_check(log_size=1000)  # the zero entries are not increasing
    finally:
        ro.close()


def test_sanity_check_accepts_a_good_index(tmp_path) -> None:
    idx = make(tmp_path / "i.index")
    try:
        idx.sanity_check(log_size=0)  # empty is fine
        for i in range(10):
            idx.append(BASE + i, i * 100)
        idx.sanity_check(log_size=901)
    finally:
        idx.close()


@pytest.mark.parametrize(
    "garble",
    [
        lambda e: e.__setitem__(3, (e[2][0], e[3][1])),      # repeated offset
        lambda e: e.__setitem__(5, (e[4][0] - 1, e[5][1])),  # offset goes backwards
        lambda e: e.__setitem__(6, (e[6][0], e[5][1])),      # repeated position
        lambda e: e.__setitem__(0, (BASE - 5, e[0][1])),     # offset below the segment base
        lambda e: e.__setitem__(9, (e[9][0], 10**6)),        # position past the end of the log
        lambda e: e.__setitem__(2, (e[2][0], -1)),           # negative position
    ],
)
def test_sanity_check_catches_garbled_entries(tmp_path, garble) -> None:
    path = tmp_path / "i.index"
    good = [(BASE + i * 4, i * 100) for i in range(10)]
    bad = list(good)
    garble(bad)
    path.write_bytes(b"".join(struct.pack(">ii", o - BASE, p) for o, p in bad))
    idx = make(path, writable=False)
    try:
        assert idx.entries == 10
        with pytest.raises(CorruptIndexError):
            idx.sanity_check(log_size=1000)
    finally:
        idx.close()


def test_sanity_check_catches_random_bytes(tmp_path) -> None:
    rng = random.Random(99)
    path = tmp_path / "i.index"
    path.write_bytes(rng.randbytes(8 * 64))
    idx = make(path, writable=False)
    try:
        with pytest.raises(CorruptIndexError):
            idx.sanity_check(log_size=64 * 100)
    finally:
        idx.close()


def test_reset_zeroes_entries(tmp_path) -> None:
    path = tmp_path / "i.index"
    idx = make(path, max_size=80)
    for i in range(5):
        idx.append(BASE + i, i)
    idx.reset()
    assert idx.entries == 0
    idx.flush()
    assert path.read_bytes() == bytes(80)
    idx.append(BASE + 3, 7)
    idx.close()
    assert file_entries(path) == [(BASE + 3, 7)]


def _vm_flags(path) -> list[str]:
    """The VmFlags of this process's mapping of ``path`` (from /proc/self/smaps)."""
    flags: list[str] = []
    current = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
                current = head[5] if len(head) > 5 else None
            elif line.startswith("VmFlags:") and current == str(path):
                flags.append(line.split(":", 1)[1].strip())
    return flags


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs /proc/self/smaps")
@pytest.mark.parametrize("impl", ["fast", "reference"])
def test_index_mapping_is_advised_random(tmp_path, impl, monkeypatch) -> None:
    # A new index is a sparse preallocated file: without MADV_RANDOM the first write fault reads
    # around the page and zero-fills a large window of holes (milliseconds per new segment).
    from shmq import _fast
    from shmq._fast import _reference

    if impl == "fast" and not _fast.HAVE_FAST:
        pytest.skip("compiled extensions not loaded")
    if impl == "reference":
        monkeypatch.setattr(_fast, "MappedFile", _reference.MappedFile)
    path = tmp_path / "00000000000000001000.index"
    idx = make(path, max_size=1 << 20)
    try:
        idx.append(BASE + 1, 0)
        flags = _vm_flags(path)
        assert flags, "index file not mapped"
        assert all("rr" in f.split() for f in flags), flags
    finally:
        idx.close()
