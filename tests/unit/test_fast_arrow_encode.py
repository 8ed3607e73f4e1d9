"""``encode_arrow_batch_into``: rows of Arrow binary columns as one RecordBatch v2 (the Spark
sink's shared-memory path).  The compiled function and its twin give the same bytes, and
kafka-python's decoder (an independent one) reads back exactly the rows asked for."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shmq._fast as fast
from shmq._fast import _reference as ref

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatch

IMPLS = [ref] + ([__import__("shmq._fast.batch", fromlist=["batch"])] if fast.HAVE_FAST else [])
TS = 1_700_000_000_123


def buffers(arr: pa.Array | None) -> tuple[Any, Any, Any]:
    if arr is None:
        return None, None, None
    valid, offsets, data = arr.buffers()
    bits = None
    if arr.null_count:  # realigned to the slice's first row
        all_bits = np.unpackbits(np.frombuffer(valid, np.uint8), bitorder="little")
        bits = np.packbits(all_bits[arr.offset: arr.offset + len(arr)], bitorder="little")
    return (np.frombuffer(offsets, np.int32)[arr.offset: arr.offset + len(arr) + 1],
            np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8), bits)


def encode(impl: Any, keys: pa.Array | None, values: pa.Array, rows: list[int],
           limit: int = 1 << 20) -> tuple[int, bytes]:
    out = bytearray(limit + 8)
    size = impl.encode_arrow_batch_into(out, 8, limit, np.array(rows, np.int64), *buffers(keys),
                                        *buffers(values), TS, 77, 3, 1000)
    return size, bytes(out[8: 8 + max(size, 0)])


@settings(max_examples=120, deadline=None)
@given(rows=st.lists(st.tuples(st.one_of(st.none(), st.binary(max_size=30)),
                               st.one_of(st.none(), st.binary(max_size=300))),
                     min_size=1, max_size=40),
       with_keys=st.booleans(), data=st.data())
def test_parity_and_kafka_python_reads_it(rows: list, with_keys: bool, data: Any) -> None:
    keys = pa.array([k for k, _ in rows], pa.binary()) if with_keys else None
    values = pa.array([v for _, v in rows], pa.binary())
    pick = data.draw(st.lists(st.integers(0, len(rows) - 1), min_size=1, max_size=60))
    results = [encode(impl, keys, values, pick) for impl in IMPLS]
    assert all(r == results[0] for r in results)
    size, raw = results[0]
    assert size == len(raw)
    batch = DefaultRecordBatch(raw)
    assert batch.validate_crc()
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (77, 3, 1000)
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]
    assert got == [(i, TS, rows[p][0] if with_keys else None, rows[p][1], [])
                   for i, p in enumerate(pick)]


@pytest.mark.parametrize("impl", IMPLS)
def test_limits_and_bad_input(impl: Any) -> None:
    values = pa.array([b"x" * 100, b"y"])
    size, _ = encode(impl, None, values, [0, 1])
    assert encode(impl, None, values, [0, 1], limit=size - 1) == (-size, b"")
    with pytest.raises(ValueError):
        encode(impl, None, values, [])
    with pytest.raises(IndexError):
        encode(impl, None, values, [2])
    out = bytearray(1000)
    bad = np.array([0, 50, 60], np.int32)  # past the data
    with pytest.raises(ValueError):
        impl.encode_arrow_batch_into(out, 0, 1000, np.array([1], np.int64), None, None, None,
                                     bad, np.zeros(10, np.uint8), None, TS)
    with pytest.raises(ValueError):  # offsets going backwards
        impl.encode_arrow_batch_into(out, 0, 1000, np.array([0], np.int64), None, None, None,
                                     np.array([5, 4], np.int32), np.zeros(10, np.uint8), None,
                                     TS)
    # a sliced column (Arrow offset) encodes the slice's rows
    sliced = pa.array([b"a", b"bb", b"ccc", None])[1:]
    batch = DefaultRecordBatch(encode(impl, sliced, sliced, [0, 2, 1])[1])
    assert batch.validate_crc()
    assert [(r.key, r.value) for r in batch] == [(b"bb", b"bb"), (None, None), (b"ccc", b"ccc")]
