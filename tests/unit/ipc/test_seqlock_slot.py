"""The seqlock slot: compiled ``shmq._fast.seqlock`` against its twin ``_seqlock_reference``.

The twin's ``struct`` format is the oracle for the byte layout: both must write the very same 64
bytes, read each other's bytes, reject the same bad arguments, and give up on a seq stuck odd.
"""

from __future__ import annotations

import mmap
import struct
import time
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmq._fast import _seqlock_reference as ref

try:
    from shmq._fast import seqlock as compiled
except ImportError:  # not built
    compiled = None

IMPLS = [
    pytest.param(ref, id="reference"),
    pytest.param(
        compiled,
        id="compiled",
        marks=pytest.mark.skipif(compiled is None, reason="shmq._fast.seqlock is not built"),
    ),
]

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(-(2**63), 2**63 - 1)
u32 = st.integers(0, 2**32 - 1)
slot_values = st.tuples(i32, i32, i64, i64, i64, i64, u32, u32)


def fresh(size: int = 4 * 64) -> mmap.mmap:
    return mmap.mmap(-1, size)  # anonymous: page aligned and zeroed, like a new shm object


@pytest.mark.parametrize("impl", IMPLS)
def test_round_trip_and_layout(impl: ModuleType) -> None:
    buf = fresh()
    values = (3, 7, 100, 250, 240, 260, 9, 0x8000_0001)
    impl.write_slot(buf, 64, *values)
    assert impl.read_slot(buf, 64) == values
    assert impl.slot_seq(buf, 64) == 2
    # The documented layout, field by field (native byte order).
    assert struct.unpack_from("=QiiqqqqIIQ", buf, 64) == (2, *values, 0)
    assert bytes(buf[:64]) == bytes(64) and bytes(buf[128:]) == bytes(128)  # neighbours untouched


@pytest.mark.skipif(compiled is None, reason="shmq._fast.seqlock is not built")
@settings(max_examples=200, deadline=None)
@given(st.lists(slot_values, min_size=1, max_size=4), st.integers(0, 3))
def test_compiled_and_twin_write_identical_bytes(writes: list[tuple[int, ...]], slot: int) -> None:
    a, b = fresh(), fresh()
    for values in writes:
        compiled.write_slot(a, slot * 64, *values)
        ref.write_slot(b, slot * 64, *values)
    assert a[:] == b[:]
    assert compiled.read_slot(b, slot * 64) == ref.read_slot(a, slot * 64) == writes[-1]
    assert compiled.slot_seq(a, slot * 64) == 2 * len(writes)


@pytest.mark.parametrize("impl", IMPLS)
def test_bad_arguments(impl: ModuleType) -> None:
    buf = fresh(128)
    values = (0,) * 8
    for offset in (-8, 65, 128, 1 << 40):
        with pytest.raises(IndexError):
            impl.read_slot(buf, offset)
        with pytest.raises(IndexError):
            impl.write_slot(buf, offset, *values)
    with pytest.raises(ValueError, match="aligned"):
        impl.read_slot(buf, 4)
    with pytest.raises(ValueError, match="aligned"):
        impl.write_slot(buf, 4, *values)
    with pytest.raises(IndexError):
        impl.read_slot(bytearray(63), 0)
    with pytest.raises(ValueError):
        impl.read_slot(buf, 0, 0)
    for bad in (
        (2**31, 0, 0, 0, 0, 0, 0, 0),
        (0, 0, 0, 0, 0, 0, -1, 0),
        (0, 0, 2**63, 0, 0, 0, 0, 0),
    ):
        with pytest.raises(OverflowError):
            impl.write_slot(buf, 0, *bad)
    assert bytes(buf) == bytes(128)  # nothing was written by a refused call
    with pytest.raises(BufferError):
        impl.write_slot(memoryview(bytes(128)), 0, *values)
    assert impl.read_slot(bytes(128), 64) == values  # a read-only buffer is fine for readers


@pytest.mark.parametrize("impl", IMPLS)
def test_reader_gives_up_on_a_seq_stuck_odd(impl: ModuleType) -> None:
    """A writer killed mid-update leaves seq odd: readers return None within a bounded time."""
    buf = fresh()
    impl.write_slot(buf, 64, 1, 1, 1, 1, 1, 1, 1, 1)
    struct.pack_into("=Q", buf, 64, 3)  # the writer died between "seq odd" and "seq even"
    start = time.perf_counter()
    assert impl.read_slot(buf, 64) is None
    elapsed = time.perf_counter() - start
    assert elapsed < 0.05, f"giving up took {elapsed * 1e3:.1f} ms"
    assert impl.read_slot(buf, 64, 1) is None
    assert impl.read_slot(buf, 0) == (0,) * 8  # other slots are unaffected
    # The next writer finishes the dead one's update: seq goes 3 -> 4, never to an even value
    # while the fields are being written.
    impl.write_slot(buf, 64, 2, 2, 2, 2, 2, 2, 2, 2)
    assert impl.slot_seq(buf, 64) == 4
    assert impl.read_slot(buf, 64) == (2,) * 8


@pytest.mark.parametrize("impl", IMPLS)
def test_seq_wraps_around(impl: ModuleType) -> None:
    buf = fresh()
    struct.pack_into("=Q", buf, 0, 2**64 - 2)
    impl.write_slot(buf, 0, 5, 5, 5, 5, 5, 5, 5, 5)
    assert impl.slot_seq(buf, 0) == 0
    assert impl.read_slot(buf, 0) == (5,) * 8


def test_constants_agree() -> None:
    if compiled is None:
        pytest.skip("shmq._fast.seqlock is not built")
    assert compiled.SLOT_SIZE == ref.SLOT_SIZE == 64
    assert compiled.DEFAULT_MAX_SPINS == ref.DEFAULT_MAX_SPINS
    assert struct.calcsize(ref.SLOT_FORMAT) + 8 == ref.SLOT_SIZE
