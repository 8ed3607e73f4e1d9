"""Produce request parsing and Produce response encoding, by hand: the data plane's hot path.

kio decodes Produce too, but copies every records blob into ``bytes``; here each partition's
records are a zero-copy memoryview slice of the request frame, handed as-is to the log (which
validates the batches, stamps offsets and copies once into the segment).

Request, v3–v12 (flexible from v9: compact strings/arrays/bytes + tagged fields, skipped)::

    transactional_id   nullable string          v3–8 int16 len (-1 null) | v9+ uvarint(len+1)
    acks               int16
    timeout_ms         int32
    topic_data         array                    v3–8 int32 count | v9+ uvarint(count+1)
      name             string
      partition_data   array
        index          int32
        records        nullable bytes           v3–8 int32 len (-1 null) | v9+ uvarint(len+1)
        [tagged fields]                         v9+
      [tagged fields]                           v9+
    [tagged fields]                             v9+

Response, v3–v12 (header v0, or v1 = + empty tagged fields from v9)::

    responses                array
      name                   string
      partition_responses    array
        index                int32
        error_code           int16
        base_offset          int64
        log_append_time_ms   int64              -1 unless the topic uses LogAppendTime
        log_start_offset     int64              v5+
        record_errors        array              v8+ of (batch_index int32,
                                                        batch_index_error_message nullable string)
        error_message        nullable string    v8+
        [tagged fields]                         v9+ (current_leader, tag 0, v10+: not sent)
      [tagged fields]                           v9+
    throttle_time_ms         int32
    [tagged fields]                             v9+ (node_endpoints, tag 0, v10+: not sent)

Hostile input: every length and count is checked against the bytes that are left before it is
used, and lists grow by appending, so nothing is ever allocated from a count.  Any malformed
request raises ``RemoteProtocolError``.

The code here is the pure-Python twin of ``shmq._fast.wire`` (STYLE.md §4): the compiled parser
and encoder run unless ``SHMQ_PURE=1`` or the extension is not built; the twin is their oracle in
``tests/unit/test_wire_parity.py``.  Both build the NamedTuples of ``shmq._fast._wire_types``.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from shmq import _fast
from shmq._fast._wire_types import ProducePartition, ProduceRequest, ProduceTopic
from shmq.errors import LocalProtocolError, RemoteProtocolError
from shmq.protocol.frame_reader import FrameReader
from shmq.protocol.kio_guard import write_uvarint

MIN_VERSION = 3
MAX_VERSION = 12  # v12: v11's layout (transaction version 2 adds partitions implicitly)
FIRST_FLEXIBLE_VERSION = 9

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_ACKS_TIMEOUT = struct.Struct(">hi")
_PARTITION_HEAD = struct.Struct(">ihqq")  # index, error_code, base_offset, log_append_time
_INT64 = struct.Struct(">q")
_SIZE_CORRELATION = struct.Struct(">ii")

# The fewest bytes one array item can take (used to reject counts the frame cannot hold).
_MIN_TOPIC = {False: 2 + 4, True: 1 + 1 + 1}  # name, partition count, [tags]
_MIN_PARTITION = {False: 4 + 4, True: 4 + 1 + 1}  # index, records length, [tags]


def parse_produce_request_py(frame: memoryview, header_size: int, version: int) -> ProduceRequest:
    """Parse the Produce body that starts at ``header_size`` in ``frame`` (v3..v12).

    ``records`` are memoryview slices of ``frame`` (they keep it alive).  Malformed input raises
    ``RemoteProtocolError``; a version outside 3..12 is the caller's bug (``ValueError``).
    """
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ValueError(f"Produce v{version} is not parsed here (v{MIN_VERSION}..v{MAX_VERSION})")
    buf = frame if isinstance(frame, memoryview) else memoryview(frame)
    flexible = version >= FIRST_FLEXIBLE_VERSION
    r = FrameReader(buf, header_size, flexible, "Produce")
    transactional_id = r.nullable_string()
    acks, timeout_ms = r.fixed(_ACKS_TIMEOUT)
    topics: list[ProduceTopic] = []
    for _ in range(r.count(_MIN_TOPIC[flexible])):
        name = r.string()
        partitions: list[ProducePartition] = []
        for _ in range(r.count(_MIN_PARTITION[flexible])):
            index = r.int32()
            length = r.length(4)
            records = r.blob(length) if length >= 0 else None
            r.skip_tags()
            partitions.append(ProducePartition(index, records))
        r.skip_tags()
        topics.append(ProduceTopic(name, partitions))
    r.skip_tags()
    if r.pos != r.end:
        raise RemoteProtocolError(
            f"{r.end - r.pos} unexpected bytes after a Produce v{version} body"
        )
    return ProduceRequest(transactional_id, acks, timeout_ms, topics)


# --- response ---------------------------------------------------------------------------------


def _put_length(out: bytearray, n: int, flexible: bool, legacy: struct.Struct) -> None:
    out += write_uvarint(n + 1) if flexible else legacy.pack(n)


def _put_string(out: bytearray, s: str | None, flexible: bool) -> None:
    if s is None:
        _put_length(out, -1, flexible, _INT16)
        return
    data = s.encode()
    _put_length(out, len(data), flexible, _INT16)
    out += data


def encode_produce_response_py(
    version: int,
    correlation_id: int,
    throttle_ms: int,
    results: Sequence[tuple[str, Sequence[Sequence[Any]]]],
) -> bytes:
    """The framed Produce response (size prefix, header, body) for v3..v12.

    ``results`` holds ``(topic, [(partition, error_code, base_offset, log_append_time,
    log_start_offset, error_message[, record_errors]), ...])``; ``log_append_time`` is -1 unless
    the topic uses LogAppendTime, ``record_errors`` (optional, v8+) is ``[(batch_index,
    message | None), ...]``.
    """
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise LocalProtocolError(f"cannot encode a Produce v{version} response")
    flexible = version >= FIRST_FLEXIBLE_VERSION
    tags = b"\x00" if flexible else b""
    out = bytearray(8)
    try:
        out += tags  # response header v1
        _put_length(out, len(results), flexible, _INT32)
        for topic, partitions in results:
            _put_string(out, topic, flexible)
            _put_length(out, len(partitions), flexible, _INT32)
            for p in partitions:
                out += _PARTITION_HEAD.pack(p[0], p[1], p[2], p[3])
                if version >= 5:
                    out += _INT64.pack(p[4])
                if version >= 8:
                    record_errors = p[6] if len(p) > 6 else ()
                    _put_length(out, len(record_errors), flexible, _INT32)
                    for batch_index, message in record_errors:
                        out += _INT32.pack(batch_index)
                        _put_string(out, message, flexible)
                        out += tags
                    _put_string(out, p[5], flexible)
                out += tags
            out += tags
        out += _INT32.pack(throttle_ms)
        out += tags
        _SIZE_CORRELATION.pack_into(out, 0, len(out) - 4, correlation_id)
    except struct.error as exc:
        raise LocalProtocolError(f"cannot encode Produce v{version} response: {exc}") from exc
    return bytes(out)


if _fast.HAVE_FAST:
    from shmq._fast import wire as _wire

    parse_produce_request = _wire.parse_produce_request
    encode_produce_response = _wire.encode_produce_response
else:
    parse_produce_request = parse_produce_request_py
    encode_produce_response = encode_produce_response_py  # type: ignore[assignment]
