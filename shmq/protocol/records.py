"""RecordBatch v2: a flyweight view, an encoder, and decoders into tuples or Arrow columns.

The broker keeps batches opaque (STYLE.md §3): it reads the 61-byte header through fixed-offset
accessors, validates size, magic and CRC, stamps base offset and leader epoch, and appends the
bytes as the client sent them.  Records are decoded only where something needs records: clients,
``dump-log`` and the Spark bridge.  Byte layouts are drawn at the top of ``shmq/_fast/batch.pyx``.

Compressed batches hold one compressed stream after the header; decoding decompresses it with a
size cap (``max_decompressed``) so a compression bomb is a ``CorruptRecordError``, not an OOM.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from shmq import _fast
from shmq.errors import CorruptRecordError
from shmq.protocol import compression as codecs

HEADER_SIZE = 61

# attribute bits (RecordBatch.java)
COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
DELETE_HORIZON_FLAG = 0x40

CREATE_TIME = 0
LOG_APPEND_TIME = 1

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1

_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_U32 = struct.Struct(">I")


class Record(NamedTuple):
    """One decoded record; ``headers`` is a tuple of ``(str, bytes | None)``."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


class RecordBatchView:
    """Fixed-offset accessors over one batch in a larger buffer (Kafka ``DefaultRecordBatch``).

    The view does not copy: ``buf`` may be a memoryview of a receive buffer or an mmap.  Nothing
    is checked until ``validate()``; accessors only need the 61 header bytes to be present.
    """

    __slots__ = ("_buf", "_pos")

    def __init__(self, buf: Any, pos: int = 0) -> None:
        mv = buf if isinstance(buf, memoryview) else memoryview(buf)
        if len(mv) - pos < HEADER_SIZE:
            raise CorruptRecordError(f"record batch header at byte {pos} is truncated")
        self._buf = mv
        self._pos = pos

    # header fields, in layout order
    @property
    def base_offset(self) -> int:
        return _I64.unpack_from(self._buf, self._pos)[0]

    @property
    def batch_length(self) -> int:
        return _I32.unpack_from(self._buf, self._pos + 8)[0]

    @property
    def size(self) -> int:
        """Bytes the whole batch occupies (batchLength + 12)."""
        return self.batch_length + 12

    @property
    def partition_leader_epoch(self) -> int:
        return _I32.unpack_from(self._buf, self._pos + 12)[0]

    @property
    def magic(self) -> int:
        return self._buf[self._pos + 16]

    @property
    def crc(self) -> int:
        return _U32.unpack_from(self._buf, self._pos + 17)[0]

    @property
    def attributes(self) -> int:
        return _I16.unpack_from(self._buf, self._pos + 21)[0]

    @property
    def last_offset_delta(self) -> int:
        return _I32.unpack_from(self._buf, self._pos + 23)[0]

    @property
    def base_timestamp(self) -> int:
        return _I64.unpack_from(self._buf, self._pos + 27)[0]

    @property
    def max_timestamp(self) -> int:
        return _I64.unpack_from(self._buf, self._pos + 35)[0]

    @property
    def producer_id(self) -> int:
        return _I64.unpack_from(self._buf, self._pos + 43)[0]

    @property
    def producer_epoch(self) -> int:
        return _I16.unpack_from(self._buf, self._pos + 51)[0]

    @property
    def base_sequence(self) -> int:
        return _I32.unpack_from(self._buf, self._pos + 53)[0]

    @property
    def records_count(self) -> int:
        return _I32.unpack_from(self._buf, self._pos + 57)[0]

    # derived
    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def last_sequence(self) -> int:
        """baseSequence + lastOffsetDelta, wrapping at Int.MAX (DefaultRecordBatch)."""
        base = self.base_sequence
        if base == NO_SEQUENCE:
            return NO_SEQUENCE
        return (base + self.last_offset_delta) % 0x80000000

    @property
    def compression_type(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def timestamp_type(self) -> int:
        return LOG_APPEND_TIME if self.attributes & TIMESTAMP_TYPE_MASK else CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_FLAG)

    @property
    def buffer(self) -> memoryview:
        """The batch's bytes (header and records)."""
        return self._buf[self._pos : self._pos + self.size]

    def validate(self, *, strict: bool = False) -> int:
        """Check size, magic and CRC (and, if ``strict``, the produce rules); return the size."""
        return _fast.validate_batch(self._buf, self._pos, -1, True, strict)

    def is_valid(self) -> bool:
        try:
            self.validate()
        except CorruptRecordError:
            return False
        return True

    def stamp(self, base_offset: int, leader_epoch: int) -> None:
        """Overwrite baseOffset and partitionLeaderEpoch in place (needs a writable buffer)."""
        _fast.stamp_batch(self._buf, self._pos, base_offset, leader_epoch)

    def records_section(
        self, max_decompressed: int = codecs.DEFAULT_MAX_DECOMPRESSED_BYTES
    ) -> Any:
        """The uncompressed records section (a zero-copy view when the batch is uncompressed)."""
        size = self.size
        if size < HEADER_SIZE:
            raise CorruptRecordError(f"batch length {size - 12} is smaller than the header")
        end = self._pos + size
        if end > len(self._buf):
            raise CorruptRecordError("record batch runs past the end of the buffer")
        raw = self._buf[self._pos + HEADER_SIZE : end]
        codec = self.compression_type
        if codec == codecs.NONE:
            return raw
        return codecs.decompress(codec, raw, max_decompressed)

    def records(
        self, max_decompressed: int = codecs.DEFAULT_MAX_DECOMPRESSED_BYTES
    ) -> list[Record]:
        """Decode every record of the batch."""
        body = self.records_section(max_decompressed)
        lat = self.max_timestamp if self.timestamp_type == LOG_APPEND_TIME else _fast.NO_LOG_APPEND_TIME
        return _fast.decode_records(body, self.records_count, self.base_offset,
                                    self.base_timestamp, lat, Record)

    def __repr__(self) -> str:
        return (
            f"RecordBatchView(base_offset={self.base_offset}, last_offset={self.last_offset}, "
            f"count={self.records_count}, size={self.size}, codec="
            f"{codecs.CODEC_NAMES.get(self.compression_type, '?')})"
        )


def iter_batches(buf: Any, start: int = 0, end: int = -1, *, verify_crc: bool = True,
                 strict: bool = False) -> Iterator[RecordBatchView]:
    """Yield a view of every batch in ``buf[start:end]``; a bad or partial batch raises."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if end < 0:
        end = len(mv)
    pos = start
    while pos < end:
        size = _fast.validate_batch(mv, pos, end, verify_crc, strict)
        yield RecordBatchView(mv, pos)
        pos += size


def encode_batch(
    records: Iterable[Any],
    *,
    compression_type: int = codecs.NONE,
    base_offset: int = 0,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    timestamp_type: int = CREATE_TIME,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    control: bool = False,
    log_append_time: int | None = None,
) -> bytearray:
    """Build one RecordBatch v2 from ``(key, value[, timestamp[, headers]])`` items.

    A missing or None timestamp means now.  ``log_append_time`` (LogAppendTime topics) replaces
    the batch's maxTimestamp.  The result is a writable ``bytearray`` with a valid CRC.
    """
    now = int(time.time() * 1000)
    items = []
    for rec in records:
        key, value = rec[0], rec[1]
        ts = rec[2] if len(rec) > 2 and rec[2] is not None else now
        headers = rec[3] if len(rec) > 3 and rec[3] else ()
        items.append((key, value, ts, headers))
    if not items:
        raise ValueError("a record batch holds at least one record")
    base_ts = items[0][2]
    max_ts = max(r[2] for r in items)
    body = _fast.encode_records(items, base_ts)
    if compression_type != codecs.NONE:
        body = codecs.compress(compression_type, body)
    attributes = compression_type & COMPRESSION_MASK
    if timestamp_type == LOG_APPEND_TIME:
        attributes |= TIMESTAMP_TYPE_MASK
        if log_append_time is not None:
            max_ts = log_append_time
    if transactional:
        attributes |= TRANSACTIONAL_FLAG
    if control:
        attributes |= CONTROL_FLAG
    return _fast.build_batch(
        body, len(items), len(items) - 1, attributes, base_offset, partition_leader_epoch,
        base_ts, max_ts, producer_id, producer_epoch, base_sequence,
    )


def decode_batches(buf: Any, *, max_decompressed: int = codecs.DEFAULT_MAX_DECOMPRESSED_BYTES,
                   verify_crc: bool = True) -> list[Record]:
    """Every record of every batch in ``buf`` (control batches included).

    One Cython pass over the headers (sizes, magic, CRC), then one call that decodes every
    records section into a single list (no list per batch to build and extend).
    """
    bodies, meta = _records_sections(buf, verify_crc=verify_crc,
                                     max_decompressed=max_decompressed)
    return _fast.decode_sections(bodies, meta, Record)


def scan_headers(buf: Any, start: int = 0, end: int = -1, *, verify_crc: bool = True) -> Any:
    """Headers of every batch in ``buf[start:end]`` as an int64 table (``_fast.COL_*`` columns).

    One Cython pass; a corrupt or partial batch raises CorruptRecordError.
    """
    import numpy as np

    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if end < 0:
        end = len(mv)
    cols = _fast.SCAN_COLUMNS
    chunks = []
    pos = start
    # rows for every batch that can fit (each has a 61-byte header), at most 4,096 a pass: a
    # read of one batch (a waiting reader's usual read) allocated 4,096 rows, 320 KiB, a
    # malloc above the mmap threshold whose pages faulted in on each call (~15 us of 25)
    rows = min(4096, max(0, end - start) // HEADER_SIZE + 1)
    while True:
        out = np.empty(cols * rows, dtype=np.int64)
        n, pos, status, reason = _fast.scan_batches(mv, pos, end, out, verify_crc, False)
        chunks.append(out[: n * cols].reshape(n, cols))
        if status == _fast.SCAN_FULL:
            continue
        if status != _fast.SCAN_END:
            raise CorruptRecordError(f"invalid record batch at byte {pos}: {reason}")
        return np.concatenate(chunks) if len(chunks) > 1 else chunks[0]


def _records_sections(buf: Any, *, verify_crc: bool, max_decompressed: int,
                      min_offset: int | None = None, max_offset: int | None = None,
                      skip_control: bool = False) -> tuple[list[Any], Any]:
    """The uncompressed records sections of the batches in ``buf`` and their ``meta`` (count,
    base offset, base timestamp, log append time per section), as ``_fast.decode_sections``
    and ``_fast.fill_columns`` take them.

    Batches wholly outside ``[min_offset, max_offset)`` and, with ``skip_control``, control
    batches are left out.  A bad batch (size, magic, CRC) raises CorruptRecordError, as does a
    records count that cannot fit in its section (a record takes at least 7 bytes: a lying
    count must not size the allocations that follow).
    """
    import numpy as np

    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    table = scan_headers(mv, verify_crc=verify_crc)
    if len(table) <= _FEW_BATCHES:
        return _few_records_sections(mv, table.tolist(), max_decompressed, min_offset,
                                     max_offset, skip_control)
    if min_offset is not None or max_offset is not None or skip_control:
        lo = -0x7FFFFFFFFFFFFFFF if min_offset is None else min_offset
        hi = 0x7FFFFFFFFFFFFFFF if max_offset is None else max_offset
        keep = (table[:, _fast.COL_LAST_OFFSET] >= lo) & (table[:, _fast.COL_BASE_OFFSET] < hi)
        if skip_control:
            keep &= (table[:, _fast.COL_ATTRIBUTES] & CONTROL_FLAG) == 0
        table = table[keep]
    attrs = table[:, _fast.COL_ATTRIBUTES]
    lat = np.where(attrs & TIMESTAMP_TYPE_MASK, table[:, _fast.COL_MAX_TIMESTAMP],
                   _fast.NO_LOG_APPEND_TIME)
    meta = np.column_stack([table[:, _fast.COL_RECORDS_COUNT], table[:, _fast.COL_BASE_OFFSET],
                            table[:, _fast.COL_BASE_TIMESTAMP], lat]).ravel()
    positions = table[:, _fast.COL_POSITION].tolist()
    sizes = table[:, _fast.COL_SIZE].tolist()
    bodies = []
    for pos, size, attr in zip(positions, sizes, attrs.tolist(), strict=True):
        raw = mv[pos + HEADER_SIZE : pos + size]
        codec = attr & COMPRESSION_MASK
        bodies.append(raw if codec == codecs.NONE else codecs.decompress(codec, raw, max_decompressed))
    for count, body in zip(table[:, _fast.COL_RECORDS_COUNT].tolist(), bodies, strict=True):
        if count < 0 or 7 * count > len(body):
            raise CorruptRecordError(f"record count {count} cannot fit in {len(body)} bytes")
    return bodies, np.ascontiguousarray(meta, dtype=np.int64)


# Up to this many batches ``_records_sections`` works on Python lists: its numpy passes cost
# ~15 us whatever the count, ~1 us a batch this way (`python -m timeit`, one 1-record batch:
# 4.0-5.0 us against 19.3-21.6; 8 batches 10.7 us; even at 16, 21.7 against 21.0).  A waiting
# local reader's usual read is one batch.
_FEW_BATCHES = 8


def _few_records_sections(mv: memoryview, rows: list[list[int]], max_decompressed: int,
                          min_offset: int | None, max_offset: int | None,
                          skip_control: bool) -> tuple[list[Any], Any]:
    """``_records_sections`` for a few batches (``rows``: ``scan_headers``' table as lists);
    the same sections and meta."""
    import numpy as np

    lo = -0x7FFFFFFFFFFFFFFF if min_offset is None else min_offset
    hi = 0x7FFFFFFFFFFFFFFF if max_offset is None else max_offset
    bodies = []
    meta: list[int] = []
    for row in rows:
        attr = row[_fast.COL_ATTRIBUTES]
        if row[_fast.COL_LAST_OFFSET] < lo or row[_fast.COL_BASE_OFFSET] >= hi or (
                skip_control and attr & CONTROL_FLAG):
            continue
        count, pos, size = row[_fast.COL_RECORDS_COUNT], row[_fast.COL_POSITION], row[_fast.COL_SIZE]
        raw = mv[pos + HEADER_SIZE : pos + size]
        codec = attr & COMPRESSION_MASK
        body = raw if codec == codecs.NONE else codecs.decompress(codec, raw, max_decompressed)
        bodies.append(body)
        meta += (count, row[_fast.COL_BASE_OFFSET], row[_fast.COL_BASE_TIMESTAMP],
                 row[_fast.COL_MAX_TIMESTAMP] if attr & TIMESTAMP_TYPE_MASK
                 else _fast.NO_LOG_APPEND_TIME)
    for count, body in zip(meta[::4], bodies, strict=True):
        if count < 0 or 7 * count > len(body):
            raise CorruptRecordError(f"record count {count} cannot fit in {len(body)} bytes")
    return bodies, np.array(meta, dtype=np.int64)


ARROW_FIELDS = ("offset", "timestamp", "key", "value")


def batches_to_arrow(
    buf: Any,
    *,
    min_offset: int | None = None,
    max_offset: int | None = None,
    skip_control: bool = True,
    max_decompressed: int = codecs.DEFAULT_MAX_DECOMPRESSED_BYTES,
    verify_crc: bool = True,
    timestamp_unit: str = "ms",
) -> Any:
    """Decode the batches in ``buf`` into a ``pyarrow.RecordBatch`` (offset, timestamp, key, value).

    Records go from the batch bytes into Arrow buffers in one Cython pass (no Python object per
    record).  The buffers come from pyarrow's memory pool: it reuses freed memory, so a reader
    decoding chunk after chunk does not page-fault on fresh allocations (which measured as 30 % of
    the decode time with plain ``malloc``).  Offsets outside ``[min_offset, max_offset)`` are
    dropped (a fetch may start mid-batch).  ``timestamp_unit`` is "ms" or "us" (Spark's unit).
    """
    import pyarrow as pa

    lo = -0x7FFFFFFFFFFFFFFF if min_offset is None else min_offset
    hi = 0x7FFFFFFFFFFFFFFF if max_offset is None else max_offset
    bodies, meta = _records_sections(buf, verify_crc=verify_crc, max_decompressed=max_decompressed,
                                     min_offset=lo, max_offset=hi, skip_control=skip_control)
    rows = int(meta[0::4].sum())
    # fill_columns copies fields in blocks that may run up to 32 bytes past the last one
    data = sum(len(b) for b in bodies) + 64
    scale = {"ms": 1, "us": 1000}[timestamp_unit]
    alloc = pa.allocate_buffer
    offsets, stamps = alloc(8 * rows), alloc(8 * rows)
    koff, voff = alloc(4 * (rows + 1)), alloc(4 * (rows + 1))
    kdata, vdata = alloc(data), alloc(data)
    kvalid, vvalid = alloc(rows // 8 + 1), alloc(rows // 8 + 1)
    mv = memoryview
    n, klen, vlen, knulls, vnulls = _fast.fill_columns(
        bodies, meta, mv(offsets).cast("q"), mv(stamps).cast("q"),
        mv(koff).cast("i"), mv(kdata).cast("B"), mv(kvalid).cast("B"), mv(voff).cast("i"),
        mv(vdata).cast("B"), mv(vvalid).cast("B"),
        lo, hi, scale)

    def binary(off: Any, data: Any, valid: Any, nulls: int, used: int) -> Any:
        return pa.Array.from_buffers(
            pa.binary(), n, [valid if nulls else None, off, data.slice(0, used)], null_count=nulls)

    arrays = [
        pa.Array.from_buffers(pa.int64(), n, [None, offsets]),
        pa.Array.from_buffers(pa.timestamp(timestamp_unit), n, [None, stamps]),
        binary(koff, kdata, kvalid, knulls, klen),
        binary(voff, vdata, vvalid, vnulls, vlen),
    ]
    return pa.RecordBatch.from_arrays(arrays, names=list(ARROW_FIELDS))
