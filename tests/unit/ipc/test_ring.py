"""The SPSC rings and the ring encoder (``shmq.ipc.ring``, ``shmq._fast.ring``).

Oracles: the pure-Python twin ``_ring_reference`` (same bytes), kafka-python's record decoder and
the ``crc32c`` package (independent of both), and a plain list of the entries sent.
"""

from __future__ import annotations

import os
import stat
import struct
import threading
import time
from typing import Any

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch

import shmq._fast as fast
from shmq._fast import _ring_reference, _seqlock_reference
from shmq.ipc import ring as rings

IMPLS = [_ring_reference] + ([fast.ring] if fast.HAVE_FAST else [])
SEQLOCK_IMPLS = [_seqlock_reference] + (
    [__import__("shmq._fast.seqlock", fromlist=["x"])] if fast.HAVE_FAST else [])
PROPS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

blob = st.binary(max_size=300)
header = st.tuples(st.text(max_size=10), st.one_of(st.none(), st.binary(max_size=20)))
record = st.one_of(
    blob,
    st.tuples(st.one_of(st.none(), blob), st.one_of(st.none(), blob)),
    st.tuples(st.one_of(st.none(), blob), st.one_of(st.none(), blob),
              st.one_of(st.none(), st.integers(0, 2**41)), st.lists(header, max_size=3)),
)


def _decode(buf: bytes) -> list[tuple]:
    batch = DefaultRecordBatch(buf)
    assert batch.validate_crc()
    return [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]


@PROPS
@given(st.lists(record, min_size=1, max_size=30), st.integers(0, 2**41),
       st.integers(-1, 2**40), st.integers(-1, 300), st.integers(-1, 2**31 - 1))
def test_encode_batch_into_twin_and_kafka_python_agree(records, ts, pid, epoch, seq) -> None:
    outs = []
    for impl in IMPLS:
        buf = bytearray(64 * 1024)
        size = -impl.encode_batch_into(buf, 0, 0, records, ts, pid, epoch, seq)  # size only
        assert size > 61 and not any(buf)
        assert impl.encode_batch_into(buf, 8, size - 1, records, ts, pid, epoch, seq) == -size
        assert impl.encode_batch_into(buf, 8, size, records, ts, pid, epoch, seq) == size
        assert not any(buf[:8]) and not any(buf[8 + size :])
        outs.append(bytes(buf[8 : 8 + size]))
    assert len(set(outs)) == 1
    batch = outs[0]
    assert struct.unpack_from(">I", batch, 17)[0] == crc32c.crc32c(batch[21:])
    fields = struct.unpack_from(">qqhi", batch, 35)  # max ts, pid, epoch, seq
    assert fields[1:] == (pid, epoch, seq)
    decoded = _decode(batch)
    assert [d[0] for d in decoded] == list(range(len(records)))
    for d, r in zip(decoded, records, strict=True):
        if isinstance(r, bytes):
            r = (None, r)
        key, value = r[0], r[1]
        when = r[2] if len(r) > 2 and r[2] is not None else ts
        hdrs = [(k, v) for k, v in r[3]] if len(r) > 3 else []
        assert (d[2], d[3], d[1]) == (key, value, when)
        assert d[4] == hdrs


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
def test_encode_batch_into_refuses_bad_input(impl) -> None:
    buf = bytearray(1024)
    with pytest.raises(ValueError):
        impl.encode_batch_into(buf, 0, 1024, [], 0)
    with pytest.raises((ValueError, TypeError)):
        impl.encode_batch_into(buf, 0, 1024, [(b"only-one",)], 0)
    with pytest.raises(IndexError):
        impl.encode_batch_into(buf, 1000, 100, [b"x"], 0)
    with pytest.raises(ValueError):
        impl.encode_batch_into(buf, 0, 1024, [(None, b"v", None, [(None, b"x")])], 0)
    with pytest.raises((BufferError, TypeError)):
        impl.encode_batch_into(bytes(1024), 0, 1024, [b"x"], 0)


@PROPS
@given(st.lists(record, min_size=1, max_size=30), st.booleans(), st.integers(0, 2**41),
       st.integers(-1, 2**40), st.integers(-1, 300), st.integers(-1, 2**31 - 1))
def test_encode_values_into_writes_what_encode_batch_into_writes(records, values_only, ts, pid,
                                                                 epoch, seq) -> None:
    """``encode_values_into`` (a batch of known size written with no size pass: send_batch's
    values straight into the ring) writes the bytes of ``encode_batch_into``, in both
    implementations, for values only and for any other record form; a size that is not the
    batch's is ValueError, a window outside the buffer IndexError."""
    if values_only:
        records = [r if isinstance(r, bytes) else b"v" * len(r) for r in records]
    want = bytearray(64 * 1024)
    size = _ring_reference.encode_batch_into(want, 0, len(want), records, ts, pid, epoch, seq)
    for impl in IMPLS:
        assert -impl.encode_batch_into(bytearray(), 0, 0, records, ts, pid, epoch, seq) == size
        buf = bytearray(b"\xee" * (size + 24))
        assert impl.encode_values_into(buf, 16, size, records, ts, pid, epoch, seq) == size
        assert bytes(buf[16 : 16 + size]) == bytes(want[:size]), impl.__name__
        assert buf[:16] == b"\xee" * 16 and buf[16 + size :] == b"\xee" * 8
        for wrong in (size - 1, size + 1, size + 8):
            with pytest.raises(ValueError):
                impl.encode_values_into(bytearray(size + 64), 0, wrong, records, ts, pid,
                                        epoch, seq)
        with pytest.raises(IndexError):
            impl.encode_values_into(bytearray(size + 7), 8, size, records, ts)
        with pytest.raises(ValueError):
            impl.encode_values_into(buf, 0, size, [], ts)


maybe_blob = st.one_of(st.none(), blob)


@PROPS
@given(st.lists(st.tuples(maybe_blob, maybe_blob, st.integers(0, 2**41)), min_size=1,
                max_size=30),
       st.integers(-1, 2**40), st.integers(-1, 300), st.integers(-1, 2**31 - 1))
def test_encode_columns_into_matches_encode_batch_into(rows, pid, epoch, seq) -> None:
    """The producer's column encoder writes the bytes encode_batch_into writes for the same
    records as tuples (and kafka-python reads them back), compiled and twin."""
    keys, values, stamps = (list(col) for col in zip(*rows, strict=True))
    want = bytearray(64 * 1024)
    size = _ring_reference.encode_batch_into(want, 0, len(want), list(rows), stamps[0], pid,
                                             epoch, seq)
    for impl in IMPLS:
        buf = bytearray(64 * 1024)
        assert impl.encode_columns_into(buf, 8, size - 1, keys, values, stamps, pid, epoch,
                                        seq) == -size
        assert not any(buf)
        assert impl.encode_columns_into(buf, 8, size, keys, values, stamps, pid, epoch,
                                        seq) == size
        assert bytes(buf[8 : 8 + size]) == bytes(want[:size]), impl.__name__
    decoded = _decode(bytes(want[:size]))
    assert [(d[2], d[3], d[1]) for d in decoded] == rows


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
def test_encode_columns_into_refuses_bad_input(impl) -> None:
    buf = bytearray(1024)
    with pytest.raises(ValueError):
        impl.encode_columns_into(buf, 0, 1024, [], [], [])
    with pytest.raises(ValueError):
        impl.encode_columns_into(buf, 0, 1024, [None], [b"v", b"w"], [0, 0])
    with pytest.raises(TypeError):
        impl.encode_columns_into(buf, 0, 1024, ["str key"], [b"v"], [0])
    with pytest.raises(TypeError):
        impl.encode_columns_into(buf, 0, 1024, [None], [b"v"], ["not a time"])
    with pytest.raises(IndexError):
        impl.encode_columns_into(buf, 1000, 100, [None], [b"x"], [0])


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
def test_atomics(impl) -> None:
    buf = bytearray(64)
    impl.store_u64(buf, 8, 2**64 - 2)
    assert impl.load_u64(buf, 8) == 2**64 - 2
    assert struct.unpack_from("=Q", buf, 8)[0] == 2**64 - 2
    assert impl.exchange_u32(buf, 20, 7) == 0 and impl.exchange_u32(buf, 20, 1) == 7
    assert impl.load_u32(buf, 20) == 1
    impl.full_fence()
    for bad in (-8, 60, 12):  # outside, or misaligned
        with pytest.raises(IndexError):
            impl.load_u64(buf, bad)


@pytest.mark.parametrize("impl", IMPLS, ids=lambda m: m.__name__)
def test_publish_u64_stores_then_takes_the_flag(impl) -> None:
    buf = bytearray(64)
    assert impl.publish_u64(buf, 8, 12345, 16) is False  # no sleeper: the flag stays 0
    assert struct.unpack_from("=Q", buf, 8)[0] == 12345 and impl.load_u32(buf, 16) == 0
    impl.exchange_u32(buf, 16, 1)  # the peer announced its sleep
    assert impl.publish_u64(buf, 8, 2**64 - 8, 16) is True
    assert impl.load_u64(buf, 8) == 2**64 - 8 and impl.load_u32(buf, 16) == 0  # taken
    assert impl.publish_u64(buf, 8, 9, 16) is False  # once
    for off, flag in ((60, 16), (8, 62), (12, 16), (8, 18)):  # outside, or misaligned
        with pytest.raises(IndexError):
            impl.publish_u64(buf, off, 1, flag)
    assert impl.load_u64(buf, 8) == 9  # a refused call stored nothing
    with pytest.raises((BufferError, TypeError, ValueError)):
        impl.publish_u64(bytes(64), 8, 1, 16)


@pytest.fixture
def region():
    layout = rings.Layout(4096, 4096)
    fd = rings.create_region(layout, 7)
    try:
        mapping, got, pid, session = rings.map_region(fd)
        yield fd, mapping, got
    finally:
        os.close(fd)


def test_region_is_sealed_0600_and_checked(region) -> None:
    fd, mapping, layout = region
    st_ = os.fstat(fd)
    assert stat.S_IMODE(st_.st_mode) == 0o600 and st_.st_uid == os.geteuid()
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 10)  # sealed: the worker's mapping can never lose pages (no SIGBUS)
    assert layout == rings.Layout(4096, 4096)
    plain = os.memfd_create("not-a-ring")
    try:
        os.ftruncate(plain, layout.size)
        os.fchmod(plain, 0o600)
        with pytest.raises(rings.RingCorruptError):
            rings.map_region(plain)  # not sealed
        os.fchmod(plain, 0o644)
        with pytest.raises(PermissionError):
            rings.map_region(plain)
    finally:
        os.close(plain)


@PROPS
@given(st.lists(st.integers(1, 1500), min_size=1, max_size=200), st.randoms(use_true_random=False))
def test_ring_delivers_every_entry_in_order_across_wraps(sizes, rnd) -> None:
    layout = rings.Layout(4096, 4096)
    fd = rings.create_region(layout, 1)
    try:
        mapping, _, _, _ = rings.map_region(fd)
    finally:
        os.close(fd)
    with memoryview(mapping) as view:
        producer, _ = rings.session_rings(view, layout)
        consumer, _ = rings.session_rings(view, layout)
        sent, got = [], []
        pending = list(sizes)
        while pending or len(got) < len(sent):
            if pending and rnd.random() < 0.6:
                size = pending[0] + 8
                at = producer.reserve(size)
                if at >= 0:
                    payload = bytes([len(sent) % 251]) * pending.pop(0)
                    rings.ENTRY_HEADER.pack_into(view, at, size, rings.PRODUCE, len(sent) % 65536)
                    view[at + 8 : at + size] = payload
                    producer.commit(size, at)
                    sent.append(payload)
                    continue
            entry = consumer.peek()
            if entry is not None:
                at, length, kind, flags = entry
                got.append(bytes(view[at + 8 : at + length]))
                consumer.advance(length)
                if rnd.random() < 0.5:
                    consumer.release()
            else:
                consumer.release()
        assert got == sent
        del producer, consumer
    mapping.close()


def test_hostile_counters_and_lengths_raise_instead_of_reading_out_of_bounds(region) -> None:
    _, mapping, layout = region
    with memoryview(mapping) as view:
        for poison in ("tail far ahead", "tail misaligned", "len too big", "len too small",
                       "bad pad"):
            _, _ = rings.session_rings(view, layout)
            view[rings.SUBMIT_CONTROL : rings.DATA + 4096] = bytes(rings.DATA + 4096
                                                                    - rings.SUBMIT_CONTROL)
            consumer, _ = rings.session_rings(view, layout)
            base = rings.SUBMIT_CONTROL
            if poison == "tail far ahead":
                fast.ring.store_u64(view, base + rings.TAIL, 1 << 40)
            elif poison == "tail misaligned":
                fast.ring.store_u64(view, base + rings.TAIL, 12)
            else:
                length = {"len too big": 5000, "len too small": 3, "bad pad": 16}[poison]
                kind = rings.PAD if poison == "bad pad" else rings.PRODUCE
                rings.ENTRY_HEADER.pack_into(view, rings.DATA, length, kind, 0)
                fast.ring.store_u64(view, base + rings.TAIL, 64)
            with pytest.raises(rings.RingCorruptError):
                consumer.peek()
            del consumer


def _slot_page() -> fast.MappedFile:
    """A 4 KiB shared mapping (memfd) holding a state-table slot at byte 64."""
    fd = os.memfd_create("slot")
    try:
        os.ftruncate(fd, 4096)
        return fast.MappedFile(fd, 4096, True)
    finally:
        os.close(fd)


@pytest.mark.parametrize("impl", SEQLOCK_IMPLS, ids=lambda m: m.__name__)
def test_wait_slot_sleeps_until_a_write_and_times_out(impl) -> None:
    """The futex wait on a state-table slot: woken by the writer's publish within milliseconds,
    else back after its timeout; the twin speaks the same protocol."""
    mapping = _slot_page()
    with memoryview(mapping) as view:
        impl.write_slot(view, 64, 1, 0, 0, 5, 5, 5, 0, 0)
        seq = impl.slot_seq(view, 64)
        t0 = time.monotonic()
        assert impl.wait_slot(view, 64, seq, 0.05) is False
        assert 0.04 <= time.monotonic() - t0 < 1
        assert impl.wait_slot(view, 64, seq + 2, 1.0) is True  # already changed: no sleep
        woke = []

        def writer() -> None:
            time.sleep(0.05)
            woke.append(time.monotonic())
            impl.write_slot(view, 64, 1, 0, 0, 6, 6, 6, 0, 0)

        th = threading.Thread(target=writer)
        th.start()
        assert impl.wait_slot(view, 64, seq, 5.0) is True
        done = time.monotonic()
        th.join()
        assert done - woke[0] < 0.02
        assert struct.unpack_from("=I", view, 64 + 56)[0] == 0  # the writer cleared the flag
        del th
    mapping.close()


@pytest.mark.parametrize("impl", SEQLOCK_IMPLS, ids=lambda m: m.__name__)
def test_wait_slot_spins_before_it_sleeps(impl) -> None:
    """With ``spin`` the waiter first watches seq without raising the waiters flag (no futex,
    no wake-up system call for the writer); the spin counts against the timeout."""
    mapping = _slot_page()
    with memoryview(mapping) as view:
        impl.write_slot(view, 64, 1, 0, 0, 5, 5, 5, 0, 0)
        seq = impl.slot_seq(view, 64)
        t0 = time.monotonic()
        assert impl.wait_slot(view, 64, seq, 0.06, 0.03) is False
        assert 0.05 <= time.monotonic() - t0 < 1  # 60 ms in all, not 60 + 30
        impl.write_slot(view, 64, 1, 0, 0, 5, 5, 5, 0, 0)  # clears the flag that wait raised
        seq = impl.slot_seq(view, 64)
        assert struct.unpack_from("=I", view, 64 + 56)[0] == 0
        got = []
        th = threading.Thread(target=lambda: got.append(impl.wait_slot(view, 64, seq, 10.0, 5.0)))
        th.start()
        time.sleep(0.05)
        assert struct.unpack_from("=I", view, 64 + 56)[0] == 0  # spinning, not asleep
        t1 = time.monotonic()
        impl.write_slot(view, 64, 1, 0, 0, 6, 6, 6, 0, 0)
        th.join()
        assert got == [True] and time.monotonic() - t1 < 1.0
        del th
    mapping.close()


@pytest.mark.parametrize("impl", SEQLOCK_IMPLS, ids=lambda m: m.__name__)
def test_wait_slot_spin_never_outlasts_the_timeout(impl) -> None:
    """A spin longer than the timeout is cut to it: a reader asking for 20 ms with the usual
    spin is back after 20 ms, not after the spin (it spun a whole ``spin`` before)."""
    mapping = _slot_page()
    with memoryview(mapping) as view:
        impl.write_slot(view, 64, 1, 0, 0, 5, 5, 5, 0, 0)
        seq = impl.slot_seq(view, 64)
        t0 = time.monotonic()
        assert impl.wait_slot(view, 64, seq, 0.02, 2.0) is False
        assert time.monotonic() - t0 < 1.0
        assert impl.wait_slot(view, 64, seq, 0.0, 2.0) is False  # no wait at all
        assert time.monotonic() - t0 < 1.0
    mapping.close()


def test_reader_waits_out_a_preempted_writer_and_gives_up_on_a_dead_one() -> None:
    """A slot whose seq is odd (a writer mid-update): the reader waits for it, briefly when the
    writer finishes, and reports NotReadableError when it never does (a writer that died)."""
    from shmq.ipc.reader import NotReadableError, PartitionReader
    from shmq.ipc.state_table import HEADER_SIZE, StateTable

    with StateTable.create(2) as table:
        table.write(1, 1, 0, 0, 7, 7, 7, 3, 0)
        at = HEADER_SIZE + 64
        view = table._buffer()
        seq = fast.ring.load_u64(view, at)
        fast.ring.store_u64(view, at, seq + 1)  # odd: "being written"

        def finish() -> None:
            time.sleep(0.05)
            fast.ring.store_u64(view, at, seq + 2)

        th = threading.Thread(target=finish)
        reader = PartitionReader(table, 1, lambda node: "/nonexistent")
        t0 = time.monotonic()  # before the thread starts: a preemption after it cannot shorten
        th.start()             # the 50 ms seen (it failed at 0.032 s on a box at load 12)
        assert reader.state().high_watermark == 7
        assert 0.04 < time.monotonic() - t0 < 0.5
        th.join()
        fast.ring.store_u64(view, at, seq + 3)  # odd for good
        with pytest.raises(NotReadableError):
            reader.state(patience=0.1)
        table.clear(1)


def test_reader_sleeps_at_once_after_a_long_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first wait looks at the slot for WAIT_SPIN_S before it sleeps; after a wait that
    lasted longer than SPIN_GAP_S (here a 20 ms timeout) the next one sleeps at once: records
    that come that far apart cost less CPU woken than spun for."""
    from shmq.ipc import reader as reader_mod
    from shmq.ipc.reader import SPIN_GAP_S, WAIT_SPIN_S, PartitionReader
    from shmq.ipc.state_table import StateTable

    spins: list[float] = []
    real = reader_mod._fast.wait_bound

    def spy(buf: Any, at: int, offset: int, committed: bool, left: float, spin: float,
            slice_us: float) -> Any:
        spins.append(spin)
        return real(buf, at, offset, committed, left, spin, slice_us)

    monkeypatch.setattr(reader_mod._fast, "wait_bound", spy)
    with StateTable.create(2) as table:
        table.write(1, 1, 0, 0, 7, 7, 7, 3, 0)  # high watermark 7
        reader = PartitionReader(table, 1, lambda node: "/nonexistent")
        reader.wait(7, 0.02)  # nothing past 7: waits out its 20 ms
        assert spins and spins[0] == WAIT_SPIN_S
        assert 0.02 > SPIN_GAP_S
        spins.clear()
        reader.wait(7, 0.005)
        assert spins and all(s == 0.0 for s in spins), spins
        table.clear(1)


@pytest.mark.parametrize("impl", SEQLOCK_IMPLS, ids=lambda m: m.__name__)
def test_wait_bound_returns_the_snapshot_that_ends_the_wait(impl) -> None:
    """``wait_bound``, a local reader's whole wait in one call: back at once (waited -1) when
    the bound (hw, or lso when committed) is past the offset, the offset is below the log start
    or the slot has no leader; else after ``timeout`` with the last snapshot, or woken by the
    publish that passes the offset; None for a slot stuck odd."""
    mapping = _slot_page()
    with memoryview(mapping) as view:
        impl.write_slot(view, 64, 1, 0, 3, 9, 5, 9, 2, 0)  # log start 3, hw 9, lso 5
        now = impl.wait_bound(view, 64, 8, False, 5.0)
        assert now == ((1, 0, 3, 9, 5, 9, 2, 0), -1.0)
        assert impl.wait_bound(view, 64, 2, True, 5.0)[1] == -1.0  # below the log start
        t0 = time.monotonic()
        values, waited = impl.wait_bound(view, 64, 5, True, 0.05)  # lso 5: nothing past 5
        assert values == (1, 0, 3, 9, 5, 9, 2, 0) and 0.04 <= waited < 1
        assert 0.04 <= time.monotonic() - t0 < 1
        assert impl.wait_bound(view, 64, 5, True, 0.0) == ((1, 0, 3, 9, 5, 9, 2, 0), -1.0)

        def publish() -> None:
            time.sleep(0.05)
            impl.write_slot(view, 64, 1, 0, 3, 9, 6, 9, 2, 0)  # still not past 6
            time.sleep(0.02)
            impl.write_slot(view, 64, 1, 0, 3, 9, 7, 9, 2, 0)

        th = threading.Thread(target=publish)
        th.start()
        values, waited = impl.wait_bound(view, 64, 6, True, 5.0, 0.01)
        th.join()
        assert values == (1, 0, 3, 9, 7, 9, 2, 0) and 0.05 <= waited < 1
        impl.write_slot(view, 64, -1, -1, -1, -1, -1, -1, 0, 0)  # unpublished: back at once
        assert impl.wait_bound(view, 64, 100, False, 5.0)[1] == -1.0
        seq = impl.slot_seq(view, 64)
        struct.pack_into("=Q", view, 64, seq + 1)  # a writer that died mid-update
        assert impl.wait_bound(view, 64, 100, False, 5.0, 0.0, 0.0, 10) == (None, -1.0)
        del th
    mapping.close()


def test_a_wait_the_spin_ends_leaves_the_slice_alone() -> None:
    """The waiting thread asks for short slices only when it goes to sleep on the futex: while
    it spins (and so in a wait the spin ends) its own slice stays, with no scheduler call;
    asleep it has ``WAIT_SLICE_US``; back, its own again."""
    from shmq.ipc import reader as reader_mod
    from shmq.ipc import sched
    from shmq.ipc.reader import PartitionReader
    from shmq.ipc.state_table import StateTable

    took: list[bool] = []
    probe = threading.Thread(target=lambda: took.append(sched.request_slice(100)))
    probe.start()
    probe.join()
    if took != [True]:
        pytest.skip("this kernel takes no custom slice for SCHED_OTHER threads")
    assert reader_mod.WAIT_SLICE_US == 100.0
    seen: dict[str, Any] = {}
    tid: list[int] = []
    with StateTable.create(2) as table:
        table.write(1, 1, 0, 0, 7, 7, 7, 3, 0)
        reader = PartitionReader(table, 1, lambda node: "/nonexistent")

        def waits() -> None:
            assert sched.request_slice(3000)
            tid.append(threading.get_native_id())
            seen["st"] = reader.wait(7, 0.6, spin=0.25)  # spins 250 ms, then sleeps
            seen["after"] = sched.slice_ns()

        th = threading.Thread(target=waits)
        th.start()
        while not tid:
            time.sleep(0.001)
        spinning, asleep = [], []
        t0 = time.monotonic()
        while th.is_alive():
            (spinning if time.monotonic() - t0 < 0.15 else asleep).append(sched.slice_ns(tid[0]))
            time.sleep(0.01)
        th.join()
        assert spinning and set(spinning) == {3_000_000}, spinning
        assert 100_000 in asleep, asleep
        assert seen["after"] == 3_000_000 and seen["st"].high_watermark == 7
        table.clear(1)


def test_a_signal_ends_a_long_wait_through_its_handler() -> None:
    """A signal that arrives while a reader sleeps in ``wait`` runs its Python handler at once
    (Ctrl-C during ``read(timeout=30)`` raises KeyboardInterrupt then, not after 30 s), and a
    handler that returns lets the wait go on to its end."""
    import signal

    from shmq.ipc.reader import PartitionReader
    from shmq.ipc.state_table import StateTable

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers run in the main thread only")

    class Stop(Exception):
        pass

    calls: list[float] = []

    def quiet(signum: int, frame: Any) -> None:
        calls.append(time.monotonic())

    def stop(signum: int, frame: Any) -> None:
        raise Stop

    old = signal.signal(signal.SIGALRM, quiet)
    try:
        with StateTable.create(2) as table:
            table.write(1, 1, 0, 0, 7, 7, 7, 3, 0)
            reader = PartitionReader(table, 1, lambda node: "/nonexistent")
            reader._last_wait = 1.0  # no spin: straight into the futex
            t0 = time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            assert reader.wait(7, 0.3).high_watermark == 7  # the handler ran, the wait went on
            assert len(calls) == 1 and calls[0] - t0 < 0.25
            assert time.monotonic() - t0 >= 0.29
            signal.signal(signal.SIGALRM, stop)
            t0 = time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, 0.05)
            with pytest.raises(Stop):
                reader.wait(7, 10.0)
            assert time.monotonic() - t0 < 2.0
            table.clear(1)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
