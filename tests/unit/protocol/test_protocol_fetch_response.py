"""fetch_response: pieces + file slices concatenate into a Fetch response kafka-python and kio read.

Slices are fake (``fd``, ``position``, ``length``) over a temp file holding real record batches;
they are expanded with ``os.pread`` the way ``sendfile`` would send them.
"""

from __future__ import annotations

import os
import struct
from typing import NamedTuple

import pytest
from _protocol_util import batch, kafka_python_class

from shmq.errors import LocalProtocolError
from shmq.protocol.codec import response_class
from shmq.protocol.fetch_response import FetchPartitionData, encode_fetch_response
from shmq.protocol.kio_guard import read_entity

VERSIONS = range(4, 13)


class FakeSlice(NamedTuple):
    fd: int
    position: int
    length: int


@pytest.fixture()
def segment(tmp_path):
    """A file of three batches; yields (fd, [(position, bytes), ...])."""
    batches = [batch(2, 1, base_offset=0), batch(1, 2, base_offset=2), batch(4, 3, base_offset=3)]
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"".join(batches))
    fd = os.open(path, os.O_RDONLY)
    positions = []
    pos = 0
    for b in batches:
        positions.append((pos, b))
        pos += len(b)
    yield fd, positions
    os.close(fd)


_BYTES_LIKE = (bytes, bytearray, memoryview)  # the compiled writer hands out memoryviews


def _concat(pieces) -> bytes:
    out = bytearray()
    for piece in pieces:
        if isinstance(piece, _BYTES_LIKE):
            out += piece
        else:
            data = os.pread(piece.fd, piece.length, piece.position)
            assert len(data) == piece.length
            out += data
    return bytes(out)


def _topics(fd, positions):
    (p0, b0), (p1, b1), (p2, b2) = positions
    whole = FakeSlice(fd, p0, len(b0) + len(b1))  # two batches in one slice
    return [
        ("orders", [
            FetchPartitionData(0, 0, 9, 8, 0, None, -1, [whole, FakeSlice(fd, p2, len(b2))]),
            FetchPartitionData(1, 0, 100, 90, 3, [(7, 11), (8, 12)], -1, [b1]),
            FetchPartitionData(2, 0, 5, 5, 5, [], -1, []),  # at the log end: empty records
        ]),
        ("é-topic", [
            FetchPartitionData(0, 1, -1, -1, -1, None, -1, []),  # OFFSET_OUT_OF_RANGE
            FetchPartitionData(3, 0, 7, 7, 0, None, 2, [b0, FakeSlice(fd, p2, len(b2)), b1]),
        ]),
        ("no-partitions", []),
    ], [b0 + b1 + b2, b1, b"", b"", b0 + b2 + b1]  # fmt: skip


def _expected_partitions(topics, records):
    flat = [(name, p) for name, parts in topics for p in parts]
    return [(name, p, r) for (name, p), r in zip(flat, records, strict=True)]


@pytest.mark.parametrize("version", VERSIONS)
def test_decodes_with_kafka_python(segment, version):
    topics, records = _topics(*segment)
    pieces = encode_fetch_response(
        version, 4242, topics, throttle_ms=17, error_code=0, session_id=0
    )
    wire = _concat(pieces)
    assert struct.unpack_from(">i", wire)[0] == len(wire) - 4
    decoded = kafka_python_class(1, "response")[version].decode(wire, header=True, framed=True)
    assert decoded.header.correlation_id == 4242
    assert decoded.throttle_time_ms == 17
    if version >= 7:
        assert (decoded.error_code, decoded.session_id) == (0, 0)
    got = [(t.topic, p) for t in decoded.responses for p in t.partitions]
    assert [t.topic for t in decoded.responses] == [name for name, _ in topics]
    for (name, p), (exp_name, exp, exp_records) in zip(
        got, _expected_partitions(topics, records), strict=True
    ):
        assert name == exp_name
        assert p.partition_index == exp.partition_index
        assert p.error_code == exp.error_code
        assert p.high_watermark == exp.high_watermark
        assert p.last_stable_offset == exp.last_stable_offset
        if version >= 5:
            assert p.log_start_offset == exp.log_start_offset
        if exp.aborted_transactions is None:
            assert p.aborted_transactions is None
        else:
            assert [(a.producer_id, a.first_offset) for a in p.aborted_transactions] == list(
                exp.aborted_transactions
            )
        if version >= 11:
            assert p.preferred_read_replica == exp.preferred_read_replica
        assert bytes(p.records) == exp_records  # empty partitions: zero-length, not null


@pytest.mark.parametrize("version", VERSIONS)
def test_decodes_with_kio(segment, version):
    topics, records = _topics(*segment)
    wire = _concat(encode_fetch_response(version, 1, topics, throttle_ms=5, session_id=0))
    header_size = 4 + 4 + (1 if version >= 12 else 0)
    body, size = read_entity(response_class(1, version), wire, header_size)
    assert header_size + size == len(wire)
    assert body.throttle_time.total_seconds() == 0.005
    got = [(t.topic, p) for t in body.responses for p in t.partitions]
    for (name, p), (exp_name, exp, exp_records) in zip(
        got, _expected_partitions(topics, records), strict=True
    ):
        assert name == exp_name
        assert (p.partition_index, p.error_code, p.high_watermark, p.last_stable_offset) == (
            exp.partition_index,
            exp.error_code,
            exp.high_watermark,
            exp.last_stable_offset,
        )
        if version >= 5:
            assert p.log_start_offset == exp.log_start_offset
        aborted = (
            None
            if p.aborted_transactions is None
            else [(a.producer_id, a.first_offset) for a in p.aborted_transactions]
        )
        assert aborted == (
            None if exp.aborted_transactions is None else list(exp.aborted_transactions)
        )
        if version >= 11:
            assert p.preferred_read_replica == exp.preferred_read_replica
        assert p.records == exp_records


def test_pieces_alternate_and_are_merged(segment):
    topics, _ = _topics(*segment)
    pieces = encode_fetch_response(12, 1, topics)
    kinds = [isinstance(p, _BYTES_LIKE) for p in pieces]
    assert kinds[0] and kinds[-1]
    assert all(a != b for a, b in zip(kinds, kinds[1:], strict=False))  # no two bytes in a row
    assert sum(not k for k in kinds) == 3  # exactly the slices, in order


def test_top_level_error_and_session(segment):
    wire = _concat(encode_fetch_response(7, 1, [], error_code=71, session_id=123))
    decoded = kafka_python_class(1, "response")[7].decode(wire, header=True, framed=True)
    assert (decoded.error_code, decoded.session_id, decoded.responses) == (71, 123, [])


@pytest.mark.parametrize("version", [4, 12])
def test_null_records(version):
    topics = [("t", [FetchPartitionData(0, 0, 0, 0, 0, records=None)])]
    wire = _concat(encode_fetch_response(version, 1, topics))
    header_size = 8 + (1 if version >= 12 else 0)
    body, _ = read_entity(response_class(1, version), wire, header_size)
    assert body.responses[0].partitions[0].records is None


def test_size_prefix_counts_slices_without_reading_them():
    huge = FakeSlice(-1, 0, 1_000_000_000)
    pieces = encode_fetch_response(
        12, 1, [("t", [FetchPartitionData(0, 0, 0, 0, 0, records=[huge])])]
    )
    assert pieces[1] is huge
    total = sum(len(p) if isinstance(p, _BYTES_LIKE) else p.length for p in pieces)
    assert struct.unpack_from(">i", pieces[0])[0] == total - 4
    with pytest.raises(LocalProtocolError, match="too large"):
        encode_fetch_response(
            12, 1, [("t", [FetchPartitionData(0, 0, 0, 0, 0, records=[huge, huge, huge])])]
        )


def test_bad_version_and_values():
    with pytest.raises(LocalProtocolError):
        encode_fetch_response(3, 1, [])
    with pytest.raises(LocalProtocolError):
        encode_fetch_response(13, 1, [])
    with pytest.raises(LocalProtocolError):
        encode_fetch_response(12, 1, [("t", [FetchPartitionData(2**31, 0, 0, 0, 0)])])


@pytest.mark.parametrize("version", VERSIONS)
def test_diverging_epoch_is_the_v12_tagged_field_kio_reads(segment, version):
    """KIP-595: ``diverging_epoch`` is tag 0 of a v12 partition (FetchResponse.json); earlier
    versions cannot carry it and send the partition as before."""
    fd, positions = segment
    topics = [("t", [FetchPartitionData(0, 0, 9, 9, 0, None, -1, [], (3, 42)),
                     FetchPartitionData(1, 0, 5, 5, 0, None, -1, [positions[1][1]]),
                     FetchPartitionData(2, 0, 9, 9, 0, [], -1, [], (0, 7))])]
    wire = _concat(encode_fetch_response(version, 1, topics))
    header_size = 4 + 4 + (1 if version >= 12 else 0)
    body, size = read_entity(response_class(1, version), wire, header_size)
    assert header_size + size == len(wire)
    parts = body.responses[0].partitions
    assert [p.records for p in parts] == [b"", positions[1][1], b""]
    if version >= 12:
        assert [(p.diverging_epoch.epoch, p.diverging_epoch.end_offset) for p in parts] == \
            [(3, 42), (-1, -1), (0, 7)]
    plain = [("t", [p._replace(diverging_epoch=None) for p in topics[0][1]])]
    if version < 12:  # nothing to carry it: the bytes are those of a partition without one
        assert wire == _concat(encode_fetch_response(version, 1, plain))
