"""framing: frames survive any split of the stream; hostile size prefixes fail before allocating."""

from __future__ import annotations

import struct
import time
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmq.errors import RemoteProtocolError
from shmq.protocol.framing import DEFAULT_MAX_FRAME_BYTES, FrameDecoder

PAYLOADS = [b"\x00\x12\x00\x03abcdefgh", b"x", bytes(range(256)) * 3, b"\x00\x00\x00\x00tail"]
STREAM = b"".join(struct.pack(">i", len(p)) + p for p in PAYLOADS)


def _feed_all(decoder: FrameDecoder, pieces) -> list[bytes]:
    out = []
    for piece in pieces:
        out.extend(bytes(frame) for frame in decoder.feed(piece))
    return out


def test_many_frames_in_one_feed():
    decoder = FrameDecoder()
    assert _feed_all(decoder, [STREAM]) == PAYLOADS
    assert decoder.buffered == 0


def test_split_at_every_byte_boundary():
    for i in range(len(STREAM) + 1):
        decoder = FrameDecoder()
        assert _feed_all(decoder, [STREAM[:i], STREAM[i:]]) == PAYLOADS, i
        assert decoder.buffered == 0


def test_split_at_every_pair_of_boundaries_in_the_first_frames():
    head = STREAM[: 4 + len(PAYLOADS[0]) + 4 + len(PAYLOADS[1]) + 6]
    for i in range(len(head) + 1):
        for j in range(i, len(head) + 1):
            pieces = [STREAM[:i], STREAM[i:j], STREAM[j:]]
            assert _feed_all(FrameDecoder(), pieces) == PAYLOADS, (i, j)


def test_byte_by_byte():
    decoder = FrameDecoder()
    assert _feed_all(decoder, [STREAM[i : i + 1] for i in range(len(STREAM))]) == PAYLOADS


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_random_splits(cuts):
    cuts = sorted(cuts)
    pieces = [STREAM[a:b] for a, b in zip([0] + cuts, cuts + [len(STREAM)], strict=True)]
    assert _feed_all(FrameDecoder(), pieces) == PAYLOADS


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_input_types(kind):
    decoder = FrameDecoder()
    assert (
        _feed_all(decoder, [kind(STREAM[:7]), kind(STREAM[7:300]), kind(STREAM[300:])]) == PAYLOADS
    )


def test_whole_frames_are_views_of_the_input():
    data = bytes(STREAM)
    frames = FrameDecoder().feed(data)
    assert all(frame.obj is data for frame in frames)


def test_partial_frame_from_a_reused_buffer_is_copied():
    decoder = FrameDecoder()
    buf = bytearray(STREAM[:10])
    assert decoder.feed(buf) == []
    buf[:] = b"\xee" * 10  # the caller reuses its receive buffer
    assert _feed_all(decoder, [STREAM[10:]]) == PAYLOADS


@pytest.mark.parametrize("size", [0x7FFFFFFF, -1, 0, DEFAULT_MAX_FRAME_BYTES + 1, -(2**31)])
def test_hostile_sizes(size):
    prefix = struct.pack(">i", size)
    with pytest.raises(RemoteProtocolError):
        FrameDecoder().feed(prefix)
    decoder = FrameDecoder()  # the prefix split across feeds
    decoder.feed(prefix[:1])
    decoder.feed(prefix[1:3])
    with pytest.raises(RemoteProtocolError):
        decoder.feed(prefix[3:])
    decoder = FrameDecoder()  # after a complete frame in the same feed
    with pytest.raises(RemoteProtocolError):
        decoder.feed(STREAM[: 4 + len(PAYLOADS[0])] + prefix)


def test_decoder_stays_failed():
    decoder = FrameDecoder()
    with pytest.raises(RemoteProtocolError):
        decoder.feed(struct.pack(">i", -1))
    with pytest.raises(RemoteProtocolError):
        decoder.feed(STREAM)


def test_custom_limit():
    decoder = FrameDecoder(max_frame_bytes=16)
    assert decoder.feed(struct.pack(">i", 16) + b"a" * 16) == [b"a" * 16]
    with pytest.raises(RemoteProtocolError):
        decoder.feed(struct.pack(">i", 17))


def _traced_peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_oversized_prefix_fails_without_allocating():
    prefix = struct.pack(">i", DEFAULT_MAX_FRAME_BYTES + 1) + b"abc"

    def run():
        with pytest.raises(RemoteProtocolError):
            FrameDecoder().feed(prefix)

    assert _traced_peak(run) < 1024 * 1024


def test_announced_size_is_not_allocated_up_front():
    decoder = FrameDecoder()
    data = struct.pack(">i", DEFAULT_MAX_FRAME_BYTES) + b"x" * 100

    def run():
        assert decoder.feed(data) == []
        assert decoder.feed(b"y" * 1000) == []

    assert _traced_peak(run) < 1024 * 1024
    assert decoder.buffered == 4 + 1100


def test_big_frame_in_pieces_is_assembled_once():
    size = 8 * 1024 * 1024
    payload = bytes(range(256)) * (size // 256)
    wire = struct.pack(">i", size) + payload
    pieces = [wire[i : i + 65536] for i in range(0, len(wire), 65536)]
    decoder = FrameDecoder()
    result: list = []

    def run():
        for piece in pieces:
            result.extend(decoder.feed(piece))

    # the input pieces already exist; a single join adds one frame's worth (plus the prefix)
    assert _traced_peak(run) < size * 1.1
    assert len(result) == 1 and result[0] == payload


def test_many_small_feeds_are_linear():
    size = 1024 * 1024
    wire = struct.pack(">i", size) + b"z" * size + struct.pack(">i", 1) + b"!"
    pieces = [wire[i : i + 16] for i in range(0, len(wire), 16)]
    decoder = FrameDecoder()
    frames: list = []
    start = time.perf_counter()

    def run():
        for piece in pieces:
            frames.extend(decoder.feed(piece))

    peak = _traced_peak(run)
    elapsed = time.perf_counter() - start
    assert [bytes(f) for f in frames] == [b"z" * size, b"!"]
    assert peak < 3 * size
    assert elapsed < 20  # 65 537 feeds; quadratic re-copying would move ~34 GiB
