"""The time index on real files (Kafka ``TimeIndex`` / ``AbstractIndex``)."""

from __future__ import annotations

import bisect
import os
import random
import struct

import pytest

from shmq.errors import CorruptIndexError
from shmq.storage.time_index import TimeIndex

BASE = 500
T0 = 1_700_000_000_000


def make(path, max_size=12 * 1024, base=BASE, writable=True) -> TimeIndex:
    return TimeIndex(path, base, max_size, writable=writable)


def file_entries(path, base=BASE) -> list[tuple[int, int]]:
    data = path.read_bytes()
    return [(ts, base + r) for ts, r in struct.iter_unpack(">qi", data[: len(data) // 12 * 12])]


def test_new_index_is_preallocated_rounded_down_to_whole_entries(tmp_path) -> None:
    path = tmp_path / "00000000000000000500.timeindex"
    idx = make(path, max_size=100)
    try:
        assert os.path.getsize(path) == 96
        assert idx.max_entries == 8
        assert idx.entries == 0
    finally:
        idx.close()
    assert os.path.getsize(path) == 0


def test_entry_layout(tmp_path) -> None:
    path = tmp_path / "t.timeindex"
    idx = make(path)
    idx.maybe_append(T0, BASE + 3)
    idx.maybe_append(T0 + 10, BASE + 8)
    idx.close()
    # big-endian int64 timestamp, int32 relative offset
    assert path.read_bytes() == struct.pack(">qiqi", T0, 3, T0 + 10, 8)


def test_only_appends_on_growing_timestamps(tmp_path) -> None:
    path = tmp_path / "t.timeindex"
    idx = make(path)
    try:
        idx.maybe_append(T0, BASE + 1)
        idx.maybe_append(T0, BASE + 2)        # same timestamp: ignored (TimeIndex.maybeAppend)
        idx.maybe_append(T0 - 5, BASE + 3)    # smaller timestamp: never appended
        assert idx.entries == 1
        idx.maybe_append(T0 + 1, BASE + 4)
        assert idx.entries == 2
        assert [idx.entry(i) for i in range(2)] == [(T0, BASE + 1), (T0 + 1, BASE + 4)]
        assert idx.last_entry == (T0 + 1, BASE + 4)
    finally:
        idx.close()


def test_offset_going_backwards_raises(tmp_path) -> None:
    idx = make(tmp_path / "t.timeindex")
    try:
        idx.maybe_append(T0, BASE + 10)
        with pytest.raises(CorruptIndexError):  # Kafka: InvalidOffsetException
            idx.maybe_append(T0 + 1, BASE + 9)
        assert idx.entries == 1
    finally:
        idx.close()


def test_no_timestamp_is_never_indexed(tmp_path) -> None:
    # TimeIndex: the last entry of an empty index is (NO_TIMESTAMP=-1, baseOffset), and an entry is
    # only appended when timestamp > lastEntry.timestamp, so -1 never enters the index
    idx = make(tmp_path / "t.timeindex")
    try:
        idx.maybe_append(-1, BASE)
        assert idx.entries == 0
        assert idx.last_entry == (-1, BASE)
    finally:
        idx.close()


def test_full_index_rejects_but_final_entry_skips_full_check(tmp_path) -> None:
    path = tmp_path / "t.timeindex"
    idx = make(path, max_size=3 * 12 + 7)
    for i in range(3):
        idx.maybe_append(T0 + i, BASE + i)
    assert idx.is_full
    with pytest.raises(CorruptIndexError):
        idx.maybe_append(T0 + 10, BASE + 10)
    assert idx.entries == 3
    # LogSegment.onBecomeInactiveSegment: timeIndex.maybeAppend(maxTs, offsetOfMax, true)
    idx.maybe_append(T0 + 10, BASE + 10, skip_full_check=True)
    assert idx.entries == 4
    assert idx.last_entry == (T0 + 10, BASE + 10)
    idx.close()
    assert file_entries(path) == [(T0, BASE), (T0 + 1, BASE + 1), (T0 + 2, BASE + 2),
                                  (T0 + 10, BASE + 10)]
    assert os.path.getsize(path) == 4 * 12


def test_final_entry_equal_to_last_is_not_duplicated(tmp_path) -> None:
    path = tmp_path / "t.timeindex"
    idx = make(path)
    idx.maybe_append(T0, BASE + 4)
    idx.maybe_append(T0, BASE + 4, skip_full_check=True)
    idx.close()
    assert file_entries(path) == [(T0, BASE + 4)]


def random_entries(rng: random.Random, n: int) -> list[tuple[int, int]]:
    stamps = sorted(rng.sample(range(T0, T0 + 1000 * n), n))
    offsets = sorted(rng.choices(range(BASE, BASE + 20 * n), k=n))  # non-decreasing is allowed
    return list(zip(stamps, offsets, strict=True))


def test_lookup_matches_bisect_oracle(tmp_path) -> None:
    rng = random.Random(4321)
    for trial in range(6):
        n = rng.choice([1, 2, 5, 64, 700, 2000])
        entries = random_entries(rng, n)
        idx = make(tmp_path / f"{trial}.timeindex", max_size=n * 12)
        try:
            for ts, off in entries:
                idx.maybe_append(ts, off)
            assert idx.entries == n
            assert idx.is_full
            stamps = [t for t, _ in entries]
            probes = [-1, 0, T0 - 1, stamps[0], stamps[-1], stamps[-1] + 1, 2**62]
            probes += [rng.randrange(T0 - 10, stamps[-1] + 10) for _ in range(300)]
            for t in probes:
                i = bisect.bisect_right(stamps, t) - 1
                expected = entries[i] if i >= 0 else (-1, BASE)
                assert idx.lookup(t) == expected, (n, t)
        finally:
            idx.close()


def test_truncate_to_removes_entries_at_or_above_offset(tmp_path) -> None:
    entries = [(T0 + i * 10, BASE + i * 3) for i in range(30)]
    for target in [BASE, BASE + 1, BASE + 3, BASE + 44, BASE + 45, BASE + 87, BASE + 88, BASE + 500]:
        path = tmp_path / f"{target}.timeindex"
        idx = make(path)
        for ts, off in entries:
            idx.maybe_append(ts, off)
        idx.truncate_to(target)
        keep = [e for e in entries if e[1] < target]
        assert [idx.entry(i) for i in range(idx.entries)] == keep
        idx.close()
        assert file_entries(path) == keep


def test_trim_close_and_reopen(tmp_path) -> None:
    path = tmp_path / "t.timeindex"
    idx = make(path, max_size=1200)
    entries = [(T0 + i, BASE + i) for i in range(9)]
    for ts, off in entries:
        idx.maybe_append(ts, off)
    assert os.path.getsize(path) == 1200
    idx.trim_to_valid_size()
    assert os.path.getsize(path) == 9 * 12
    idx.close()
    ro = make(path, writable=False)
    try:
        assert ro.entries == 9  # length / 12
        assert ro.lookup(T0 + 4) == (T0 + 4, BASE + 4)
        assert ro.last_entry == entries[-1]
        ro.sanity_check(BASE + 100)
    finally:
        ro.close()
    rw = make(path, max_size=1200)
    try:
        assert rw.entries == 9
        rw.maybe_append(T0 + 100, BASE + 50)
    finally:
        rw.close()
    assert file_entries(path) == [*entries, (T0 + 100, BASE + 50)]


@pytest.mark.parametrize(
    "garble",
    [
        lambda e: e.__setitem__(4, (e[3][0], e[4][1])),      # repeated timestamp
        lambda e: e.__setitem__(4, (e[3][0] - 1, e[4][1])),  # timestamp goes backwards
        lambda e: e.__setitem__(6, (e[6][0], e[5][1] - 1)),  # offset goes backwards
        lambda e: e.__setitem__(0, (e[0][0], BASE - 1)),     # offset below the base
    ],
)
def test_sanity_check_catches_garbled_entries(tmp_path, garble) -> None:
    path = tmp_path / "t.timeindex"
    entries = [(T0 + i * 10, BASE + i * 2) for i in range(10)]
    garble(entries)
    path.write_bytes(b"".join(struct.pack(">qi", t, o - BASE) for t, o in entries))
    idx = make(path, writable=False)
    try:
        with pytest.raises(CorruptIndexError):
            idx.sanity_check(BASE + 1000)
    finally:
        idx.close()


def test_sanity_check_catches_random_bytes(tmp_path) -> None:
    path = tmp_path / "t.timeindex"
    path.write_bytes(random.Random(5).randbytes(12 * 50))
    idx = make(path, writable=False)
    try:
        with pytest.raises(CorruptIndexError):
            idx.sanity_check(BASE + 10**6)
    finally:
        idx.close()
