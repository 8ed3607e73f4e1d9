"""FrameReceiver (the broker's BufferedProtocol splitter): frames survive any read sizes, views
handed out are never overwritten, hostile prefixes fail at once and cost no resident memory."""

from __future__ import annotations

import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shmq._fast as fast
from shmq.errors import RemoteProtocolError
from shmq.protocol.framing import (
    BUFFER_BYTES,
    DEFAULT_MAX_FRAME_BYTES,
    MAX_REUSED_BYTES,
    READ_AHEAD,
    FrameReceiver,
)

PAYLOADS = [b"\x00\x12\x00\x03abcdefgh", b"x", bytes(range(256)) * 3, b"\x00\x00\x00\x00tail"]


def _stream(payloads) -> bytes:
    return b"".join(struct.pack(">i", len(p)) + p for p in payloads)


def _receive(receiver: FrameReceiver, data: bytes, reads) -> list[memoryview]:
    """Deliver ``data`` the way a transport does: each read fills at most the buffer it was
    given and at most the size the kernel had (the next item of ``reads``, cycled)."""
    frames: list[memoryview] = []
    pos, i = 0, 0
    while pos < len(data):
        buf = receiver.get_buffer(-1)
        assert len(buf) > 0 and not buf.readonly
        n = min(len(buf), len(data) - pos, reads[i % len(reads)])
        i += 1
        buf[:n] = data[pos : pos + n]
        pos += n
        frames += receiver.buffer_updated(n)
    return frames


@pytest.mark.parametrize("read", [1, 2, 3, 5, 7, 64, 4096, 1 << 20])
def test_fixed_read_sizes(read):
    frames = _receive(FrameReceiver(), _stream(PAYLOADS), [read])
    assert [bytes(f) for f in frames] == PAYLOADS


@settings(max_examples=200, deadline=None)
@given(payloads=st.lists(st.binary(min_size=1, max_size=3000), min_size=1, max_size=30),
       reads=st.lists(st.integers(1, 5000), min_size=1, max_size=20))
def test_random_reads(payloads, reads):
    receiver = FrameReceiver()
    frames = _receive(receiver, _stream(payloads), reads)
    assert [bytes(f) for f in frames] == payloads
    assert receiver.buffered == 0


def test_frames_are_read_only_and_never_overwritten():
    """Every frame handed out keeps its bytes while the receiver goes through many buffers
    (the produce handler may still hold one while later requests arrive)."""
    rnd = random.Random(7)
    payloads = [rnd.randbytes(rnd.choice([10, 3000, 70_000, 300_000, 1_500_000]))
                for _ in range(60)]
    receiver = FrameReceiver()
    frames = _receive(receiver, _stream(payloads), [65536, 100, 200_000, 7])
    assert all(f.readonly for f in frames)
    assert [bytes(f) for f in frames] == payloads
    assert len({id(f.obj) for f in frames}) > 2  # went through several buffers
    assert receiver.reused == 0  # every buffer still had a live frame


@pytest.mark.skipif(not fast.HAVE_FAST, reason="buffer reuse needs the compiled export count")
def test_buffers_are_reused_once_no_frame_is_left():
    rnd = random.Random(3)
    payloads = [rnd.randbytes(rnd.choice([10, 3000, 70_000])) for _ in range(300)]
    data = _stream(payloads)
    receiver = FrameReceiver()
    kept = []
    pos = 0
    got = []
    while pos < len(data):
        buf = receiver.get_buffer(-1)
        n = min(len(buf), len(data) - pos, 50_000)
        buf[:n] = data[pos : pos + n]
        pos += n
        frames = receiver.buffer_updated(n)
        while frames:
            frame = frames.pop(0)
            got.append(bytes(frame))
            if len(got) % 50 == 0:
                kept.append((frame, bytes(frame)))  # a few frames stay in use
            del frame
    assert got == payloads
    assert receiver.reused > 0
    assert all(bytes(view) == copy for view, copy in kept)  # never overwritten


def test_big_frames_are_not_copied_whole():
    """A frame larger than the buffer gets a buffer of its own, sized from its prefix: at most
    READ_AHEAD of its bytes were read before that and moved."""
    big = bytes(range(256)) * (3 * BUFFER_BYTES // 256)
    data = _stream([b"a" * 100, big, b"b" * 5])
    receiver = FrameReceiver()
    frames = _receive(receiver, data, [1 << 30])
    assert [len(f) for f in frames] == [100, len(big), 5]
    assert bytes(frames[1]) == big
    # reads stop READ_AHEAD past a pending frame: the first read cannot swallow the big frame
    receiver = FrameReceiver()
    first = receiver.get_buffer(-1)
    assert len(first) == READ_AHEAD


@pytest.mark.parametrize("size", [0, -1, -(2**31), DEFAULT_MAX_FRAME_BYTES + 1, 2**31 - 1])
def test_bad_prefixes_fail_and_stay_failed(size):
    receiver = FrameReceiver()
    with pytest.raises(RemoteProtocolError):
        _receive(receiver, struct.pack(">i", size) + b"abc", [1 << 20])
    with pytest.raises(RemoteProtocolError):
        receiver.get_buffer(-1)


def test_prefix_split_across_reads_is_checked():
    receiver = FrameReceiver(max_frame_bytes=16)
    with pytest.raises(RemoteProtocolError):
        _receive(receiver, struct.pack(">i", 17) + b"x" * 17, [1])


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_a_huge_valid_prefix_costs_no_resident_memory():
    receivers = []
    before = _rss_kib()
    for _ in range(20):  # 20 clients each announcing 100 MiB and sending 64 KiB
        receiver = FrameReceiver()
        assert _receive(receiver, struct.pack(">i", DEFAULT_MAX_FRAME_BYTES) + b"x" * 65536,
                        [1 << 20]) == []
        assert receiver.buffered == 4 + 65536
        assert len(receiver.get_buffer(-1)) > 0
        receivers.append(receiver)
    assert _rss_kib() - before < 20 * 1024  # 20 x ~2 MiB of address space touched at most


def test_a_buffer_made_for_a_huge_frame_is_not_kept():
    """After a frame larger than MAX_REUSED_BYTES the receiver goes back to normal buffers (the
    huge one is unmapped with its last frame view)."""
    huge = b"h" * (MAX_REUSED_BYTES + 1)
    receiver = FrameReceiver()
    frames = _receive(receiver, _stream([huge] + [b"s" * 100] * 3), [1 << 20])
    assert [len(f) for f in frames] == [len(huge), 100, 100, 100]
    del frames
    data = _stream([b"t" * 5000] * 400)  # 2 MB of small frames: forces renewals
    for frame in _receive(receiver, data, [65536]):
        assert bytes(frame) == b"t" * 5000
    assert len(receiver.get_buffer(-1).obj) <= MAX_REUSED_BYTES


def _minor_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@pytest.mark.skipif(not fast.HAVE_FAST, reason="the pool is the compiled ReceiveBuffer's")
def test_a_dead_buffer_is_pooled_and_the_next_one_writes_no_fresh_page():
    """A receiver's buffer that dies (its connection closed, or renewed while frames held it)
    leaves its mapping in the process's pool: the next connection's receiver fills pages
    already there (no page fault each), and its frames are what was sent, never stale bytes."""
    from shmq._fast import wire

    payload = bytes(range(256)) * 1024  # 256 KiB
    data = _stream([payload] * 3)
    for _ in range(wire.POOL_MAX + 1):  # fill the pool
        frames = _receive(FrameReceiver(), data, [65536])
        assert [bytes(f) for f in frames] == [payload] * 3
        del frames
    assert wire.pooled_buffers() >= 1
    other = bytes(reversed(payload))
    again = _stream([other] * 3)
    faults = _minor_faults()
    receiver = FrameReceiver()
    frames = _receive(receiver, again, [65536])
    faults = _minor_faults() - faults
    assert [bytes(f) for f in frames] == [other] * 3
    assert faults < len(again) // 4096 // 4, faults  # ~190 fresh pages without the pool
    assert receiver.renewed == 1


@pytest.mark.skipif(not fast.HAVE_FAST, reason="the pool is the compiled ReceiveBuffer's")
def test_the_pool_is_bounded_and_keeps_no_big_buffer():
    from shmq._fast import wire

    buffers = [wire.ReceiveBuffer(wire.POOL_BYTES) for _ in range(wire.POOL_MAX + 3)]
    big = wire.ReceiveBuffer(wire.POOL_BYTES + 4096)
    del buffers
    assert wire.pooled_buffers() == wire.POOL_MAX
    del big  # unmapped: the pool is full, and it was too big anyway
    assert wire.pooled_buffers() == wire.POOL_MAX
    taken = [wire.ReceiveBuffer(wire.POOL_BYTES) for _ in range(wire.POOL_MAX)]
    assert wire.pooled_buffers() == 0
    view = memoryview(taken[0])
    assert len(view) == wire.POOL_BYTES and not view.readonly and taken[0].exports == 1
    view[-1] = 7
    assert view[-1] == 7
    del view
    assert taken[0].exports == 0
