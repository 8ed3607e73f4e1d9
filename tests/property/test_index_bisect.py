"""Index lookups agree with a ``bisect`` oracle on random data (Hypothesis).

``shmq._fast.largest_lower_bound`` / ``smallest_upper_bound`` run Kafka's warm-section search:
the last 8 KiB of entries first, then the whole file.  Both paths and the seam between them are
exercised: indexes of 0..5000 entries (the warm section is 1024 ``.index`` entries or 682
``.timeindex`` entries), targets below, between, on and above the keys.  Runs against whichever
implementation ``shmq._fast`` exports (the twin under ``SHMQ_PURE=1``).
"""

from __future__ import annotations

import bisect
import random
import struct
import tempfile
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from shmq import _fast
from shmq.storage.offset_index import OffsetIndex
from shmq.storage.time_index import TimeIndex

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
WARM = 8192
# sizes at the warm-section seam for both entry sizes, and a cold-path size
SIZES = [0, 1, 2, 3, WARM // 12 - 1, WARM // 12, WARM // 12 + 1, WARM // 12 + 2,
         WARM // 8 - 1, WARM // 8, WARM // 8 + 1, WARM // 8 + 2, 3000, 5000]
PROPS = settings(max_examples=100 if _fast.HAVE_FAST else 30, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow])
# the twin is a linear scan: ask it fewer questions
TARGETS = 12 if _fast.HAVE_FAST else 3


def sorted_keys(rng: random.Random, n: int, width: int, dense: bool, distinct: bool) -> list[int]:
    lo, hi = (INT32_MIN, INT32_MAX) if width == 4 else (INT64_MIN, INT64_MAX)
    span = (3 * n + 1) if dense else min(hi - lo, 2**62)
    start = rng.randint(lo, hi - span)
    if distinct:
        return sorted(rng.sample(range(start, start + span), n))
    return sorted(rng.randrange(start, start + span // 3 + 1) for _ in range(n))


def pick_targets(rng: random.Random, keys: list[int], width: int) -> list[int]:
    lo, hi = (INT32_MIN, INT32_MAX) if width == 4 else (INT64_MIN, INT64_MAX)
    fixed = {lo, hi, INT64_MIN, INT64_MAX, 0}
    picked: set[int] = set()
    if keys:
        fixed |= {keys[0] - 1, keys[0], keys[-1], keys[-1] + 1}
        # on the warm-section seam: the first warm entry and its neighbours
        for slot in (len(keys) - 1 - WARM // 8, len(keys) - 1 - WARM // 12):
            if 0 <= slot < len(keys):
                fixed |= {keys[slot] - 1, keys[slot], keys[slot] + 1}
        for _ in range(TARGETS):
            key = rng.choice(keys)
            picked |= {key + rng.choice([-1, 0, 1]), rng.randint(keys[0] - 3, keys[-1] + 3)}
    return sorted(t for t in fixed | picked if INT64_MIN <= t <= INT64_MAX)


def oracle_lower(keys: list[int], target: int) -> int:
    return bisect.bisect_right(keys, target) - 1


def oracle_upper(keys: list[int], target: int) -> int:
    i = bisect.bisect_left(keys, target)
    return i if i < len(keys) else -1


def check(buf: bytes, n: int, entry_size: int, key_offset: int, width: int, keys: list[int],
          targets: list[int]) -> None:
    for t in targets:
        args = (buf, n, entry_size, key_offset, width, t)
        assert _fast.largest_lower_bound(*args) == oracle_lower(keys, t), ("lower", t)
        assert _fast.smallest_upper_bound(*args) == oracle_upper(keys, t), ("upper", t)


@PROPS
@given(
    n=st.one_of(st.sampled_from(SIZES), st.integers(0, 5000)),
    seed=st.integers(0, 2**32),
    dense=st.booleans(),
    distinct=st.booleans(),
    slack=st.sampled_from([0, 0, 1, 100]),
)
@example(n=WARM // 8 + 1, seed=0, dense=True, distinct=True, slack=0)
@example(n=WARM // 8, seed=1, dense=True, distinct=True, slack=0)
def test_offset_index_lookup_matches_bisect(n: int, seed: int, dense: bool, distinct: bool,
                                            slack: int) -> None:
    """8-byte ``.index`` entries: relativeOffset int32 at 0, position int32 at 4."""
    rng = random.Random(seed)
    rel = sorted_keys(rng, n, 4, dense, distinct)
    pos = sorted_keys(rng, n, 4, dense, distinct)
    table = np.empty(n + slack, dtype=[("rel", ">i4"), ("pos", ">i4")])
    table["rel"][:n], table["pos"][:n] = rel, pos
    table[n:] = 0  # a preallocated file's zero tail is not searched
    buf = table.tobytes()
    check(buf, n, 8, 0, 4, rel, pick_targets(rng, rel, 4))
    check(buf, n, 8, 4, 4, pos, pick_targets(rng, pos, 4))


@PROPS
@given(
    n=st.one_of(st.sampled_from(SIZES), st.integers(0, 5000)),
    seed=st.integers(0, 2**32),
    dense=st.booleans(),
    distinct=st.booleans(),
    slack=st.sampled_from([0, 0, 1, 100]),
)
@example(n=WARM // 12 + 1, seed=0, dense=True, distinct=True, slack=0)
@example(n=WARM // 12, seed=1, dense=False, distinct=True, slack=3)
def test_time_index_lookup_matches_bisect(n: int, seed: int, dense: bool, distinct: bool,
                                          slack: int) -> None:
    """12-byte ``.timeindex`` entries: timestamp int64 at 0, relativeOffset int32 at 8."""
    rng = random.Random(seed)
    ts = sorted_keys(rng, n, 8, dense, distinct)
    rel = sorted_keys(rng, n, 4, dense, distinct)
    table = np.empty(n + slack, dtype=[("ts", ">i8"), ("rel", ">i4")])
    table["ts"][:n], table["rel"][:n] = ts, rel
    table[n:] = 0
    buf = table.tobytes()
    assert len(buf) == 12 * (n + slack)
    check(buf, n, 12, 0, 8, ts, pick_targets(rng, ts, 8))
    check(buf, n, 12, 8, 4, rel, pick_targets(rng, rel, 4))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.one_of(st.sampled_from([0, 1, 2, 1024, 1025, 1500]), st.integers(0, 1500)),
    seed=st.integers(0, 2**32),
    base=st.sampled_from([0, 1000, 2**40]),
)
def test_offset_and_time_index_files_match_bisect(n: int, seed: int, base: int) -> None:
    """The index classes over real preallocated mmapped files (zero tail past the entries)."""
    rng = random.Random(seed)
    rel = sorted(rng.sample(range(0, 4 * n + 1), n))
    positions = sorted(rng.sample(range(0, 100 * n + 1), n))
    stamps = sorted(rng.sample(range(10**12, 10**12 + 5 * n + 1), n))
    with tempfile.TemporaryDirectory() as tmp:
        oi = OffsetIndex(Path(tmp) / "0.index", base, 8 * (n + 64), writable=True)
        ti = TimeIndex(Path(tmp) / "0.timeindex", base, 12 * (n + 64), writable=True)
        try:
            for r, p, t in zip(rel, positions, stamps, strict=True):
                oi.append(base + r, p)
                ti.maybe_append(t, base + r)
            assert oi.entries == ti.entries == n
            for t in pick_targets(rng, rel, 4)[:40]:
                slot = oracle_lower(rel, t)
                want = (base + rel[slot], positions[slot]) if slot >= 0 else (base, 0)
                assert oi.lookup(base + t) == want, t
            for p in pick_targets(rng, positions, 4)[:40]:
                slot = oracle_lower(positions, p)
                want = (base + rel[slot], positions[slot]) if slot >= 0 else (base, 0)
                assert oi.lookup_position(p) == want, p
            for t in pick_targets(rng, stamps, 8)[:40]:
                slot = oracle_lower(stamps, t)
                want = (stamps[slot], base + rel[slot]) if slot >= 0 else (-1, base)
                assert ti.lookup(t) == want, t
            # truncate_to keeps exactly the entries below the offset (smallest_upper_bound)
            if n:
                cut = rng.randint(rel[0], rel[-1] + 1)
                oi.truncate_to(base + cut)
                ti.truncate_to(base + cut)
                keep = bisect.bisect_left(rel, cut)
                assert oi.entries == ti.entries == keep
        finally:
            oi.close()
            ti.close()


def test_lookup_on_hand_built_entries() -> None:
    # A readable case: offsets 10, 20, 30 at positions 0, 100, 200.
    buf = b"".join(struct.pack(">ii", o, p) for o, p in [(10, 0), (20, 100), (30, 200)])
    lower = [(_fast.largest_lower_bound(buf, 3, 8, 0, 4, t)) for t in (5, 10, 15, 20, 30, 99)]
    upper = [(_fast.smallest_upper_bound(buf, 3, 8, 0, 4, t)) for t in (5, 10, 15, 20, 30, 99)]
    assert lower == [-1, 0, 0, 1, 2, 2]
    assert upper == [0, 0, 1, 1, 2, -1]
