"""Records as Arrow in the schema of Spark's Kafka source, with Spark's exact Arrow types.

    key binary | value binary | topic string | partition int32 | offset int64
    | timestamp timestamp[us, tz=UTC] | timestampType int32
    [| headers list<element: struct<key: string, value: binary>>]   (includeHeaders)

The types are what ``pyspark.sql.pandas.types.to_arrow_schema`` makes of Spark's Kafka schema
(``KafkaRecordToRowConverter.kafkaSchema``), every field nullable: Spark (>= 4.2) refuses a
Python data source's batch whose Arrow schema differs in any way (``binary`` not
``large_binary``, microseconds with the UTC zone).  ``timestamp`` is Kafka's milliseconds times
1000 (Spark's ``fromJavaTimestamp``); ``timestampType`` 0 is CreateTime, 1 LogAppendTime (the
batch's max timestamp is then every record's); ``headers`` is null, not empty, for a record
without headers, as Spark's converter makes it.  Header keys that are not UTF-8 are decoded with
replacement characters (Java's ``new String(bytes, UTF_8)``).

Keys, values and headers go from the records sections into the Arrow buffers in one Cython pass
each (``_fast.fill_columns``, ``_fast.fill_headers``); nothing is built per record in Python.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa

from shmq import _fast

HEADERS_TYPE = pa.list_(pa.field("element", pa.struct([pa.field("key", pa.string()),
                                                        pa.field("value", pa.binary())])))
_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
]
SCHEMA = pa.schema(_FIELDS)
SCHEMA_WITH_HEADERS = pa.schema([*_FIELDS, pa.field("headers", HEADERS_TYPE)])
# the same as Spark DDL (DataSource.schema())
DDL = ("key binary, value binary, topic string, partition int, offset bigint, "
       "timestamp timestamp, timestampType int")
DDL_WITH_HEADERS = DDL + ", headers array<struct<key: string, value: binary>>"
# fill_columns copies fields in blocks that may run up to 32 bytes past the last one
_SLACK = 64


def kafka_schema(include_headers: bool = False) -> pa.Schema:
    return SCHEMA_WITH_HEADERS if include_headers else SCHEMA


def empty_batch(include_headers: bool = False) -> pa.RecordBatch:
    # pa.nulls, not pa.array: pa.array (and Array.to_numpy) import pandas on first use, 0.3 s
    # and ~8,000 page faults in a reader's first call (see _int_column)
    schema = kafka_schema(include_headers)
    return pa.RecordBatch.from_arrays([pa.nulls(0, f.type) for f in schema], schema=schema)


def _int_column(values: np.ndarray, kind: Any) -> pa.Array:
    """``values`` (a contiguous numpy array of ``kind``'s width) as an Arrow array, without
    ``pa.array``: that looks for pandas objects and so imports pandas once per process (~0.3 s
    here), which the decode paths must not pay in a reader's first call."""
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(kind, len(values), [None, pa.py_buffer(values)])


class ConstantColumns:
    """The columns that hold one value in every row of a read -- topic, partition and (unless a
    topic's ``message.timestamp.type`` changed within the read) timestampType -- as read-only
    buffers shared by every batch of up to as many rows: a reader decoding chunk after chunk
    fills (and faults in) them once instead of once a chunk, ~27 of the ~150 bytes a 100 B
    record takes in Arrow.  The buffers are made from read-only numpy arrays and never written
    again, so a batch that still holds one sees the same bytes for ever.  The ``entries`` most
    recently used columns are kept (the rest stay alive as long as a batch holds them)."""

    def __init__(self, entries: int = 32) -> None:
        self.entries = entries
        self._cache: OrderedDict[tuple[Any, ...], tuple[int, Any]] = OrderedDict()
        self._lock = threading.Lock()

    def _get(self, key: tuple[Any, ...], rows: int, build: Callable[[int], Any]) -> Any:
        with self._lock:
            got = self._cache.get(key)
            if got is not None and got[0] >= rows:
                self._cache.move_to_end(key)
                return got[1]
        cap = max(1024, 1 << max(rows - 1, 0).bit_length())
        made = build(cap)
        with self._lock:
            self._cache[key] = (cap, made)
            self._cache.move_to_end(key)
            while len(self._cache) > self.entries:
                self._cache.popitem(last=False)
        return made

    def int32(self, value: int, n: int) -> pa.Buffer:
        """``n`` int32 of ``value``."""
        def build(cap: int) -> pa.Buffer:
            a = np.full(cap, value, dtype=np.int32)
            a.setflags(write=False)
            return pa.py_buffer(a)
        return self._get(("int32", value), n, build).slice(0, 4 * n)

    def string(self, text: str, n: int) -> pa.Array:
        """``n`` rows of ``text`` as a ``string`` array."""
        ends, data = self.string_buffers(text, n)
        return pa.Array.from_buffers(pa.string(), n, [None, ends, data])

    def string_buffers(self, text: str, n: int) -> tuple[pa.Buffer, pa.Buffer]:
        """``string``'s two buffers (offsets, bytes), without the array."""
        raw = text.encode()

        def build(cap: int) -> tuple[pa.Buffer, pa.Buffer]:
            ends = np.arange(cap + 1, dtype=np.int64) * len(raw)
            if ends[-1] > 0x7FFFFFFF:
                raise ValueError("a constant string column over 2 GiB")
            e32 = ends.astype(np.int32)
            data = np.frombuffer(raw * cap, dtype=np.uint8)  # read-only: bytes
            e32.setflags(write=False)
            return pa.py_buffer(e32), pa.py_buffer(data)
        ends, data = self._get(("string", text), n, build)
        return ends.slice(0, 4 * (n + 1)), data.slice(0, len(raw) * n)


# the Arrow types, made once (``pa.timestamp("us", tz="UTC")`` costs ~0.25 us a call)
_BINARY, _STRING, _INT32, _INT64 = pa.binary(), pa.string(), pa.int32(), pa.int64()
_TIMESTAMP = pa.timestamp("us", tz="UTC")
_NAMES = SCHEMA.names
_IMPORT = pa.RecordBatch._import_from_c  # the Arrow C data interface (import_spark_batch)
_NAMES_WITH_HEADERS = SCHEMA_WITH_HEADERS.names
# Up to this many sections the meta table is read as a Python list: numpy's slicing, compares
# and reductions cost ~1 us each on a handful of values
_FEW_SECTIONS = 16


def _align(n: int) -> int:
    return (n + 63) & ~63


def sections_to_arrow(bodies: list[Any], meta: np.ndarray, topic: str, partition: int, *,
                      min_offset: int, max_offset: int, include_headers: bool = False,
                      alloc: Callable[[int], pa.Buffer] | None = None,
                      constants: ConstantColumns | None = None) -> pa.RecordBatch:
    """The records of ``bodies`` (uncompressed records sections, ``meta`` as for
    ``_fast.fill_columns``) with offsets in [min_offset, max_offset), as one Arrow batch.
    ``alloc(n)`` gives the column buffers (default ``pyarrow.allocate_buffer``; a local reader
    passes its ``shmq.ipc.buffers.BufferPool``, whose pages it keeps); ``constants`` shares the
    topic, partition and timestampType columns between batches (``ConstantColumns``).

    Its fixed cost is what a waiting reader's small reads pay each (~30 us a call on ~10
    records before): so one ``alloc`` for the eight filled buffers, sliced at 64-byte
    boundaries; the Arrow types made once; a short ``meta`` read as a list."""
    meta = np.ascontiguousarray(meta, dtype=np.int64).reshape(-1)
    if len(meta) <= 4 * _FEW_SECTIONS:
        listed = meta.tolist()
        rows = sum(listed[0::4])
        lats = listed[3::4]
    else:
        listed = None
        rows = int(meta[0::4].sum())
        lats = None
    data = _align(sum(len(b) for b in bodies) + _SLACK)
    if alloc is None:
        alloc = pa.allocate_buffer
    r8 = _align(8 * rows)
    r4 = _align(4 * (rows + 1))
    bits = _align(rows // 8 + 1)
    # offsets, stamps | koff, voff | kdata, vdata | kvalid, vvalid
    block = alloc(2 * (r8 + r4 + data + bits))
    at_koff = 2 * r8
    at_kdata = at_koff + 2 * r4
    at_kvalid = at_kdata + 2 * data
    mv = memoryview(block).cast("B")
    n, klen, vlen, knulls, vnulls = _fast.fill_columns(
        bodies, meta, mv[0 : 8 * rows].cast("q"), mv[r8 : r8 + 8 * rows].cast("q"),
        mv[at_koff : at_koff + 4 * (rows + 1)].cast("i"), mv[at_kdata : at_kdata + data],
        mv[at_kvalid : at_kvalid + rows // 8 + 1],
        mv[at_koff + r4 : at_koff + r4 + 4 * (rows + 1)].cast("i"),
        mv[at_kdata + data : at_kdata + 2 * data],
        mv[at_kvalid + bits : at_kvalid + bits + rows // 8 + 1],
        min_offset, max_offset, 1000)
    del mv
    # The usual read: one C call hands pyarrow the whole batch (Arrow C data interface).  Not
    # when a validity bitmap's size would differ: pyarrow sizes an imported bitmap ceil(n / 8)
    # bytes, this module n // 8 + 1 (the same bytes but for n a multiple of 8 with nulls).
    if constants is not None and not include_headers and lats is not None and (
            n & 7 or not (knulls or vnulls)):
        kind = _uniform_kind(lats, n)
        if kind is not None:
            ends, text = constants.string_buffers(topic, n)
            return _fast.import_spark_batch(
                _IMPORT, SCHEMA, n, block, at_koff, at_kdata, at_kvalid, r4, data, bits, r8,
                knulls, vnulls, ends, text, constants.int32(partition, n),
                constants.int32(kind, n))
    sl = block.slice
    offsets = sl(0, 8 * n)
    offset_array = pa.Array.from_buffers(_INT64, n, [None, offsets])
    if constants is not None:
        topics = constants.string(topic, n)
        partitions = constants.int32(partition, n)
    else:
        topics = _repeated_string(topic, n, alloc)
        partitions = _filled_int32(n, partition, alloc)
    arrays = [
        _binary(n, sl(at_koff, 4 * (n + 1)), sl(at_kdata, klen),
                sl(at_kvalid, n // 8 + 1), knulls),
        _binary(n, sl(at_koff + r4, 4 * (n + 1)), sl(at_kdata + data, vlen),
                sl(at_kvalid + bits, n // 8 + 1), vnulls),
        topics,
        pa.Array.from_buffers(_INT32, n, [None, partitions]),
        offset_array,
        pa.Array.from_buffers(_TIMESTAMP, n, [None, sl(r8, 8 * n)]),
        _timestamp_types(meta, n, offset_array, alloc, constants, lats),
    ]
    if include_headers:
        arrays.append(_headers(bodies, meta, n, min_offset, max_offset))
        return pa.RecordBatch.from_arrays(arrays, names=_NAMES_WITH_HEADERS)
    # names, not the schema: the same schema (every field nullable, no metadata), without
    # comparing each column's type to it (~0.7 us)
    return pa.RecordBatch.from_arrays(arrays, names=_NAMES)


def _binary(n: int, off: Any, data: Any, valid: Any, nulls: int) -> pa.Array:
    return pa.Array.from_buffers(_BINARY, n, [valid if nulls else None, off, data],
                                 null_count=nulls)


def _filled_int32(n: int, value: int, alloc: Callable[[int], pa.Buffer]) -> pa.Buffer:
    buf = alloc(4 * n)
    np.frombuffer(buf, dtype=np.int32, count=n).fill(value)
    return buf


def _repeated_string(text: str, n: int,
                     alloc: Callable[[int], pa.Buffer] = pa.allocate_buffer) -> pa.Array:
    raw = text.encode()
    ends, data = alloc(4 * (n + 1)), alloc(len(raw) * n)
    e = np.frombuffer(ends, dtype=np.int32, count=n + 1)
    e[:] = np.arange(n + 1, dtype=np.int32)
    e *= len(raw)
    if raw and n:
        np.frombuffer(data, dtype=np.uint8, count=len(raw) * n).reshape(n, len(raw))[:] = \
            np.frombuffer(raw, dtype=np.uint8)
    return pa.Array.from_buffers(pa.string(), n, [None, ends, data])


def _uniform_kind(lats: list[int], n: int) -> int | None:
    """The timestampType of every row (0 CreateTime, 1 LogAppendTime) when all the sections
    agree (``lats``: ``meta[3::4]`` as a list), None when they do not; 0 for no rows."""
    if not n:
        return 0
    no = _fast.NO_LOG_APPEND_TIME
    with_lat = sum(1 for t in lats if t != no)
    if with_lat == 0:
        return 0
    return 1 if with_lat == len(lats) else None


def _timestamp_types(meta: np.ndarray, n: int, offsets: pa.Array,
                     alloc: Callable[[int], pa.Buffer] = pa.allocate_buffer,
                     constants: ConstantColumns | None = None,
                     lats: list[int] | None = None) -> pa.Array:
    """``lats``: ``meta[3::4]`` as a list when the caller has it (a few sections)."""
    if lats is not None:
        no = _fast.NO_LOG_APPEND_TIME
        with_lat = sum(1 for t in lats if t != no)
        same = with_lat in (0, len(lats))
        kind = 1 if with_lat and same else 0
    else:
        lat = meta[3::4] != _fast.NO_LOG_APPEND_TIME
        same = not lat.any() or bool(lat.all())
        kind = 1 if same and lat.any() else 0
    if n == 0 or same:
        kind = kind if n else 0
        filled = constants.int32(kind, n) if constants is not None else \
            _filled_int32(n, kind, alloc)
        return pa.Array.from_buffers(_INT32, n, [None, filled])
    lat = meta[3::4] != _fast.NO_LOG_APPEND_TIME
    # mixed batches (a topic whose message.timestamp.type changed): each row's batch by offset
    bases = meta[1::4]
    rows = np.frombuffer(offsets.buffers()[1], np.int64, len(offsets), 8 * offsets.offset)
    which = np.searchsorted(bases, rows, side="right") - 1
    return _int_column(lat[which].astype(np.int32), pa.int32())


def _headers(bodies: list[Any], meta: np.ndarray, n: int, lo: int, hi: int) -> pa.Array:
    data = sum(len(b) for b in bodies)
    heads = data // 2 + 1  # a header takes at least two bytes (two length varints)
    alloc = pa.allocate_buffer
    loff, lvalid = alloc(4 * (n + 1)), alloc(n // 8 + 1)
    koff, voff = alloc(4 * (heads + 1)), alloc(4 * (heads + 1))
    kdata, vdata = alloc(max(data, 1)), alloc(max(data, 1))
    vvalid = alloc(heads // 8 + 1)
    mv = memoryview
    rows, count, klen, vlen, list_nulls, value_nulls, bad_keys = _fast.fill_headers(
        bodies, meta, mv(loff).cast("i"), mv(lvalid).cast("B"), mv(koff).cast("i"),
        mv(kdata).cast("B"), mv(voff).cast("i"), mv(vdata).cast("B"), mv(vvalid).cast("B"),
        lo, hi)
    assert rows == n, (rows, n)
    # the entries' buffers cut to the ``count`` entries: sized for ``heads``, their tails are
    # uninitialised memory that Arrow IPC (a Spark batch) would otherwise ship
    koff, voff = koff.slice(0, 4 * (count + 1)), voff.slice(0, 4 * (count + 1))
    vvalid = vvalid.slice(0, count // 8 + 1)
    if bad_keys:
        raw = pa.Array.from_buffers(pa.binary(), count, [None, koff, kdata.slice(0, klen)])
        keys = pa.array([k.decode("utf-8", "replace") for k in raw.to_pylist()], pa.string())
    else:
        keys = pa.Array.from_buffers(pa.string(), count, [None, koff, kdata.slice(0, klen)])
    values = pa.Array.from_buffers(pa.binary(), count,
                                   [vvalid if value_nulls else None, voff, vdata.slice(0, vlen)],
                                   null_count=value_nulls)
    entries = pa.StructArray.from_arrays([keys, values], fields=list(HEADERS_TYPE.value_type))
    return pa.Array.from_buffers(HEADERS_TYPE, n, [lvalid if list_nulls else None, loff],
                                 null_count=list_nulls, children=[entries])
