"""ListOffsets (2) v1–v8 parsed and answered by hand: librdkafka sends one request per partition
when a consumer starts (a kcat consumer of 1,000 partitions sent 1,000), and kio took ~0.4 ms to
decode one and encode its answer, the largest broker cost of such a consumer's start.

Request (v6+ flexible: compact strings/arrays, tagged fields; request header v2)::

    replica_id              int32                -1 for consumers
    isolation_level         int8                 v2+ (else 0)
    topics                  array
      name                  string
      partitions            array
        partition_index     int32
        current_leader_epoch int32               v4+ (else -1)
        timestamp           int64
        [tagged fields]                          v6+
      [tagged fields]                            v6+
    [tagged fields]                              v6+

Response (response header v1 from v6: one empty tag byte after the correlation id)::

    throttle_time_ms        int32                v2+
    topics                  array
      name                  string
      partitions            array
        partition_index     int32
        error_code          int16
        timestamp           int64
        offset              int64
        leader_epoch        int32                v4+
        [tagged fields]                          v6+
      [tagged fields]                            v6+
    [tagged fields]                              v6+

v0 (``max_num_offsets`` / ``old_style_offsets``) stays on kio.  Strings and arrays are
non-nullable here (a null one is malformed); bytes after the body are ignored, as Kafka's parser
and ``codec.decode_request`` do.  Every count is checked against the bytes left before a loop;
malformed input raises ``RemoteProtocolError``.  kio is the oracle in
``tests/unit/protocol/test_list_offsets_codec.py``: same fields parsed, byte-identical answers.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from shmq.errors import LocalProtocolError
from shmq.protocol.frame_reader import FrameReader
from shmq.protocol.kio_guard import write_uvarint

MIN_VERSION = 1
MAX_VERSION = 8
FIRST_FLEXIBLE_VERSION = 6

_REPLICA = struct.Struct(">i")
_REPLICA_ISOLATION = struct.Struct(">ib")
_PARTITION_V1 = struct.Struct(">iq")     # partition_index, timestamp
_PARTITION_V4 = struct.Struct(">iiq")    # partition_index, current_leader_epoch, timestamp
_ANSWER_V1 = struct.Struct(">ihqq")      # partition_index, error_code, timestamp, offset
_ANSWER_V4 = struct.Struct(">ihqqi")     # ... leader_epoch
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_SIZE_CORRELATION = struct.Struct(">ii")


class ListOffsetsPartition(NamedTuple):
    partition_index: int
    current_leader_epoch: int
    timestamp: int


class ListOffsetsRequest(NamedTuple):
    replica_id: int
    isolation_level: int
    topics: list[tuple[str, list[ListOffsetsPartition]]]


def parse_list_offsets_request(frame: memoryview, header_size: int,
                               version: int) -> ListOffsetsRequest:
    """Parse the ListOffsets body that starts at ``header_size`` in ``frame`` (v1..v8)."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ValueError(f"ListOffsets v{version} is not parsed here")
    flexible = version >= FIRST_FLEXIBLE_VERSION
    r = FrameReader(frame, header_size, flexible, "ListOffsets")
    if version >= 2:
        replica_id, isolation_level = r.fixed(_REPLICA_ISOLATION)
    else:
        (replica_id,), isolation_level = r.fixed(_REPLICA), 0
    layout = _PARTITION_V4 if version >= 4 else _PARTITION_V1
    min_topic = 3 if flexible else 6  # name, partition count[, tags]
    min_partition = layout.size + flexible
    topics: list[tuple[str, list[ListOffsetsPartition]]] = []
    for _ in range(r.count(min_topic)):
        name = r.string()
        partitions = []
        for _ in range(r.count(min_partition)):
            if version >= 4:
                partition = ListOffsetsPartition(*r.fixed(layout))
            else:
                index, timestamp = r.fixed(layout)
                partition = ListOffsetsPartition(index, -1, timestamp)
            r.skip_tags()
            partitions.append(partition)
        r.skip_tags()
        topics.append((name, partitions))
    r.skip_tags()
    return ListOffsetsRequest(replica_id, isolation_level, topics)


def encode_list_offsets_response(
        version: int, correlation_id: int,
        topics: list[tuple[str, list[tuple[int, int, int, int, int]]]]) -> bytes:
    """The framed response: ``topics`` is ``[(name, [(partition_index, error_code, timestamp,
    offset, leader_epoch), ...]), ...]``."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise LocalProtocolError(f"cannot encode a ListOffsets v{version} response")
    flexible = version >= FIRST_FLEXIBLE_VERSION
    out = bytearray(8)
    try:
        if flexible:
            out += b"\x00"  # response header v1
        if version >= 2:
            out += b"\x00\x00\x00\x00"  # throttle_time_ms
        out += write_uvarint(len(topics) + 1) if flexible else _INT32.pack(len(topics))
        for name, partitions in topics:
            raw = name.encode()
            out += write_uvarint(len(raw) + 1) if flexible else _INT16.pack(len(raw))
            out += raw
            out += (write_uvarint(len(partitions) + 1) if flexible
                    else _INT32.pack(len(partitions)))
            for index, code, timestamp, offset, epoch in partitions:
                if version >= 4:
                    out += _ANSWER_V4.pack(index, code, timestamp, offset, epoch)
                else:
                    out += _ANSWER_V1.pack(index, code, timestamp, offset)
                if flexible:
                    out += b"\x00"
            if flexible:
                out += b"\x00"
        if flexible:
            out += b"\x00"
        _SIZE_CORRELATION.pack_into(out, 0, len(out) - 4, correlation_id)
    except struct.error as exc:
        raise LocalProtocolError(f"cannot encode ListOffsets v{version} response: {exc}") from exc
    return bytes(out)
