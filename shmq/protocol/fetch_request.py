"""Fetch request parsing by hand: the consumer's hot path (kio took ~47 us a request).

Request, v4–v12 (flexible from v12: compact strings/arrays + tagged fields, all skipped)::

    replica_id              int32                -1 for consumers
    max_wait_ms             int32
    min_bytes               int32
    max_bytes               int32
    isolation_level         int8                 0 read_uncommitted, 1 read_committed
    session_id              int32                v7+ (else 0)
    session_epoch           int32                v7+ (else -1)
    topics                  array                v4–11 int32 count | v12 uvarint(count+1)
      topic                 string               v4–11 int16 len | v12 uvarint(len+1)
      partitions            array
        partition           int32
        current_leader_epoch int32               v9+ (else -1)
        fetch_offset        int64
        last_fetched_epoch  int32                v12+ (else -1)
        log_start_offset    int64                v5+ (else -1)
        partition_max_bytes int32
        [tagged fields]                          v12
      [tagged fields]                            v12
    forgotten_topics_data   array                v7+ (else empty)
      topic                 string
      partitions            array of int32
      [tagged fields]                            v12
    rack_id                 string               v11+ (else "")
    [tagged fields]                              v12 (cluster_id, tag 0: skipped like any tag)

Strings and arrays are non-nullable here (a null one is malformed).  Bytes after the body are
ignored, as Kafka's parser and ``codec.decode_request`` (the kio path this replaces) do.

Hostile input: every count is checked against the bytes left (times the fewest bytes an item
takes) before any loop, lists grow by appending, so nothing is allocated from a count.  Any
malformed request raises ``RemoteProtocolError``.

The code here is the pure-Python twin of ``shmq._fast.wire.parse_fetch_request`` (STYLE.md §4),
which runs unless ``SHMQ_PURE=1`` or the extension is not built; the twin is its oracle in
``tests/unit/test_wire_fetch_request.py``.  Both build the NamedTuples of
``shmq._fast._wire_types``.
"""

from __future__ import annotations

import struct

from shmq import _fast
from shmq._fast._wire_types import FetchPartition, FetchRequest, FetchTopic, ForgottenTopic
from shmq.errors import RemoteProtocolError
from shmq.protocol.frame_reader import FrameReader

__all__ = ["FetchPartition", "FetchRequest", "FetchTopic", "ForgottenTopic",
           "parse_fetch_request", "parse_fetch_request_py"]

MIN_VERSION = 4
MAX_VERSION = 12
FIRST_FLEXIBLE_VERSION = 12

_HEAD = struct.Struct(">iiiib")  # replica_id, max_wait_ms, min_bytes, max_bytes, isolation
_SESSION = struct.Struct(">ii")  # session_id, session_epoch (v7+)
# partition fields by version: v4, v5-8, v9-11, v12
_PARTITION = {4: struct.Struct(">iqi"), 5: struct.Struct(">iqqi"), 9: struct.Struct(">iiqqi"),
              12: struct.Struct(">iiqiqi")}


def _partition_struct(version: int) -> struct.Struct:
    return _PARTITION[12 if version >= 12 else 9 if version >= 9 else 5 if version >= 5 else 4]


def parse_fetch_request_py(frame: memoryview, header_size: int, version: int) -> FetchRequest:
    """Parse the Fetch body that starts at ``header_size`` in ``frame`` (v4..v12).

    Fields the version lacks hold kio's defaults.  Malformed input raises
    ``RemoteProtocolError``; a version outside 4..12 is the caller's bug (``ValueError``).
    """
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ValueError(f"Fetch v{version} is not parsed here (v{MIN_VERSION}..v{MAX_VERSION})")
    buf = frame if isinstance(frame, memoryview) else memoryview(frame)
    flexible = version >= FIRST_FLEXIBLE_VERSION
    if not 0 <= header_size <= len(buf):
        raise RemoteProtocolError("Fetch request header runs past the frame")
    r = FrameReader(buf, header_size, flexible, "Fetch")
    replica_id, max_wait_ms, min_bytes, max_bytes, isolation_level = r.fixed(_HEAD)
    session_id, session_epoch = r.fixed(_SESSION) if version >= 7 else (0, -1)
    layout = _partition_struct(version)
    min_topic = 3 if flexible else 6  # name, partition count, [tags]
    min_partition = layout.size + flexible  # fixed fields, [tags]
    topics: list[FetchTopic] = []
    for _ in range(r.count(min_topic)):
        name = r.string()
        partitions: list[FetchPartition] = []
        for _ in range(r.count(min_partition)):
            fields = r.fixed(layout)
            if version >= 12:
                partition, leader_epoch, offset, last_epoch, start, limit = fields
            elif version >= 9:
                (partition, leader_epoch, offset, start, limit), last_epoch = fields, -1
            elif version >= 5:
                (partition, offset, start, limit), leader_epoch, last_epoch = fields, -1, -1
            else:
                (partition, offset, limit), leader_epoch, last_epoch, start = fields, -1, -1, -1
            r.skip_tags()
            partitions.append(
                FetchPartition(partition, leader_epoch, offset, last_epoch, start, limit))
        r.skip_tags()
        topics.append(FetchTopic(name, partitions))
    forgotten: list[ForgottenTopic] = []
    if version >= 7:
        for _ in range(r.count(min_topic)):
            name = r.string()
            indexes = [r.int32() for _ in range(r.count(4))]
            r.skip_tags()
            forgotten.append(ForgottenTopic(name, indexes))
    rack_id = r.string() if version >= 11 else ""
    r.skip_tags()
    return FetchRequest(replica_id, max_wait_ms, min_bytes, max_bytes, isolation_level,
                        session_id, session_epoch, topics, forgotten, rack_id)


if _fast.HAVE_FAST:
    from shmq._fast import wire as _wire

    parse_fetch_request = _wire.parse_fetch_request
else:
    parse_fetch_request = parse_fetch_request_py
