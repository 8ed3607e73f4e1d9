"""Fetch response encoding as byte pieces and file slices, for ``sendmsg`` + ``sendfile``.

The records of a Fetch response come from segment files and are never read into memory: the
response is a list ``[bytes, slice, bytes, slice, ..., bytes]`` whose concatenation (each slice
expanded to its file bytes) is the framed response.  The size prefix is computed up front from the
byte pieces and the slices' ``length``; adjacent byte pieces are merged, so a response has about
one ``bytes`` piece per partition plus one per slice.

Layout, v4–v12 (flexible v12: compact strings/arrays/records, tagged fields; header v1)::

    int32 size                                   everything after this field
    int32 correlation_id                         response header v0
    [tagged fields]                              response header v1 (v12)
    throttle_time_ms          int32
    error_code                int16              v7+
    session_id                int32              v7+ (0: no fetch session, KIP-227)
    responses                 array
      topic                   string
      partitions              array
        partition_index       int32
        error_code            int16
        high_watermark        int64
        last_stable_offset    int64
        log_start_offset      int64              v5+
        aborted_transactions  nullable array     null for read_uncommitted
          producer_id         int64
          first_offset        int64
          [tagged fields]                        v12
        preferred_read_replica int32             v11+ (-1)
        records               nullable records   v4–11 int32 len | v12 uvarint(len+1);
                                                 an empty partition sends length 0, not null
        [tagged fields]                          v12: diverging_epoch (tag 0) when set;
                                                 current_leader, snapshot_id never
          0: diverging_epoch      uvarint tag 0, uvarint size 13,
                                  int32 epoch, int64 end_offset, [tagged fields]
      [tagged fields]                            v12
    [tagged fields]                              v12

Arrays and strings: int32 count / int16 length (-1 = null) before v12, uvarint(n+1) (0 = null)
in v12.

The code here is the pure-Python twin of ``shmq._fast.wire.encode_fetch_response`` (STYLE.md §4),
which runs unless ``SHMQ_PURE=1`` or the extension is not built.  The compiled writer puts every
non-slice byte into one ``bytearray`` and hands out memoryviews of it between the slices; this one
returns ``bytes`` pieces.  ``tests/unit/test_wire_parity.py`` checks they send the same bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from shmq import _fast
from shmq.errors import LocalProtocolError
from shmq.protocol.kio_guard import write_uvarint

MIN_VERSION = 4
MAX_VERSION = 12
FIRST_FLEXIBLE_VERSION = 12
_MAX_SIZE = 0x7FFFFFFF

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_ABORTED = struct.Struct(">qq")
# partition_index, error_code, high_watermark, last_stable_offset[, log_start_offset (v5+)]
_PARTITION_HEAD_V4 = struct.Struct(">ihqq")
_PARTITION_HEAD_V5 = struct.Struct(">ihqqq")
_SIZE_CORRELATION = struct.Struct(">ii")
_SESSION = struct.Struct(">hi")  # error_code, session_id
# one tagged field: count 1, tag 0 (diverging_epoch), size 13, EpochEndOffset, its empty tags
_DIVERGING_EPOCH = struct.Struct(">BBBiqB")
_BYTES_LIKE = (bytes, bytearray, memoryview)


class FetchPartitionData(NamedTuple):
    """One partition of a Fetch response.  ``records`` holds file slices (objects with
    ``length``, ``fd`` and ``position``, e.g. ``shmq.storage.FileSlice``) and/or bytes, sent in
    order; ``None`` sends null records."""

    partition_index: int
    error_code: int
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    aborted_transactions: Sequence[tuple[int, int]] | None = None
    preferred_read_replica: int = -1
    records: Sequence[Any] | None = ()
    diverging_epoch: tuple[int, int] | None = None  # (epoch, end offset), v12 (KIP-595)


def _compact_length(n: int) -> bytes:
    return write_uvarint(n + 1)


def encode_fetch_response_py(
    version: int,
    correlation_id: int,
    topics: Sequence[tuple[str, Sequence[FetchPartitionData]]],
    throttle_ms: int = 0,
    error_code: int = 0,
    session_id: int = 0,
) -> list[Any]:
    """The framed Fetch response (v4..v12) as ``bytes`` pieces and file slices, in send order."""
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise LocalProtocolError(f"cannot encode a Fetch v{version} response")
    flexible = version >= FIRST_FLEXIBLE_VERSION
    tags = b"\x00" if flexible else b""
    count = _compact_length if flexible else _INT32.pack  # array counts and records lengths
    string_length = _compact_length if flexible else _INT16.pack
    null = b"\x00" if flexible else b"\xff\xff\xff\xff"  # null array / null records
    head, head_fields = (_PARTITION_HEAD_V5, 5) if version >= 5 else (_PARTITION_HEAD_V4, 4)
    pieces: list[Any] = []
    out = bytearray(8)  # size and correlation id, packed at the end
    total = 0  # bytes in pieces, slices included
    try:
        out += tags  # response header v1
        out += _INT32.pack(throttle_ms)
        if version >= 7:
            out += _SESSION.pack(error_code, session_id)
        out += count(len(topics))
        for topic, partitions in topics:
            name = topic.encode()
            out += string_length(len(name))
            out += name
            out += count(len(partitions))
            for p in partitions:
                out += head.pack(*p[:head_fields])  # the leading FetchPartitionData fields
                aborted = p.aborted_transactions
                if aborted is None:
                    out += null
                else:
                    out += count(len(aborted))
                    for producer_id, first_offset in aborted:
                        out += _ABORTED.pack(producer_id, first_offset)
                        out += tags
                if version >= 11:
                    out += _INT32.pack(p.preferred_read_replica)
                records = p.records
                if records is None:
                    out += null
                else:
                    length = 0
                    for piece in records:
                        length += len(piece) if isinstance(piece, _BYTES_LIKE) else piece.length
                    out += count(length)
                    for piece in records:
                        if isinstance(piece, _BYTES_LIKE):
                            out += piece
                        elif piece.length:
                            total += len(out) + piece.length
                            pieces.append(out)
                            pieces.append(piece)
                            out = bytearray()
                diverging = p.diverging_epoch if len(p) > 8 else None
                if flexible and diverging is not None:
                    out += _DIVERGING_EPOCH.pack(1, 0, 13, diverging[0], diverging[1], 0)
                else:
                    out += tags
            out += tags
        out += tags
        total += len(out)
        pieces.append(out)
        if total - 4 > _MAX_SIZE:
            raise LocalProtocolError(f"Fetch response of {total} bytes is too large to frame")
        _SIZE_CORRELATION.pack_into(pieces[0], 0, total - 4, correlation_id)
    except struct.error as exc:
        raise LocalProtocolError(f"cannot encode Fetch v{version} response: {exc}") from exc
    return [bytes(piece) if type(piece) is bytearray else piece for piece in pieces]


if _fast.HAVE_FAST:
    from shmq._fast import wire as _wire

    encode_fetch_response = _wire.encode_fetch_response
else:
    encode_fetch_response = encode_fetch_response_py  # type: ignore[assignment]
