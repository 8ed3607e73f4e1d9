"""``BufferPool``: read_arrow's column buffers are reused once released, never while a caller
can still see them (a batch, a slice of it, a column, a numpy view)."""

from __future__ import annotations

import gc

import numpy as np
import pyarrow as pa
import pytest

from shmq.ipc.buffers import MIN_ARRAY, BufferPool
from shmq.ipc.reader import batches_to_spark_arrow
from shmq.protocol import records as rec


def _log(n: int, tag: bytes, batch: int = 100) -> bytes:
    out = b""
    for base in range(0, n, batch):
        out += bytes(rec.encode_batch([(b"k%d" % i, tag + b"%06d" % i, 1_700_000_000_000 + i, [])
                                       for i in range(base, min(n, base + batch))],
                                      base_offset=base))
    return out


def _decode(pool: BufferPool, buf: bytes, n: int) -> pa.RecordBatch:
    return batches_to_spark_arrow(memoryview(buf), "t", 0, 0, n, alloc=pool.take)


def _addresses(rb: pa.RecordBatch) -> set[int]:
    return {b.address for col in rb.columns for b in col.buffers() if b is not None}


def test_released_buffers_are_reused() -> None:
    pool = BufferPool()
    a = _decode(pool, _log(2000, b"a"), 2000)
    first = _addresses(a)
    created = pool.created
    del a
    gc.collect()
    b = _decode(pool, _log(2000, b"b"), 2000)
    assert pool.created == created and pool.reused >= created
    assert _addresses(b) & first  # the same memory, written again
    assert b.column("value")[0].as_py() == b"b000000"


def test_buffers_in_use_are_never_overwritten() -> None:
    pool = BufferPool()
    n = 3000
    a = _decode(pool, _log(n, b"a"), n)
    holders = {
        "slice": a.slice(10, 5),                                   # a slice of the batch
        "column": a.column("value"),                               # one column
        "numpy": a.column("offset").to_numpy(zero_copy_only=True),  # a view of one buffer
    }

    def now(v: object) -> list:
        return v.tolist() if isinstance(v, np.ndarray) else v.to_pylist()  # type: ignore[union-attr]

    want = {k: now(v) for k, v in holders.items()}
    del a
    for name in list(holders):
        for tag in (b"x", b"y"):  # reads whose results are dropped at once (their buffers free)
            _decode(pool, _log(n, tag), n)
        assert {k: now(v) for k, v in holders.items()} == want
        del holders[name], want[name]
    gc.collect()
    assert pool.in_use() == 0


def test_sizes_and_cap() -> None:
    pool = BufferPool(max_bytes=4 * MIN_ARRAY)
    b1 = pool.take(10)
    assert b1.size == 10 and pool.pooled_bytes == MIN_ARRAY
    b2 = pool.take(MIN_ARRAY + 1)            # next power of two
    assert b2.size == MIN_ARRAY + 1 and pool.pooled_bytes == 3 * MIN_ARRAY
    b3 = pool.take(2 * MIN_ARRAY)            # over the cap: an ordinary buffer, not pooled
    assert b3.size == 2 * MIN_ARRAY and pool.pooled_bytes == 3 * MIN_ARRAY
    assert pool.in_use() == 2
    del b1, b2, b3
    assert pool.in_use() == 0
    small = pool.take(100)                   # the smallest free array that fits
    assert pool.created == 2 and pool.reused == 1 and small.size == 100
    pool.clear()
    assert pool.pooled_bytes == 0 and small.to_pybytes() is not None


def test_constant_columns_are_shared_and_equal_the_filled_ones() -> None:
    """topic / partition / timestampType come from read-only buffers shared by every read of up
    to as many rows (``pool.constants``): each batch equals the one decoded without sharing,
    a batch kept across reads of more rows (the cache grows) and of other topics keeps its
    values, and nobody can write into the shared memory."""
    pool = BufferPool()
    kept = []
    for n, topic, part in ((10, "t", 0), (3000, "t", 0), (5, "other", 7), (2999, "t", 0),
                           (0, "t", 0), (5000, "t", 1), (1, "", 0)):
        log = memoryview(_log(max(n, 1), b"c"))
        shared = batches_to_spark_arrow(log, topic, part, 0, n, alloc=pool.take,
                                        constants=pool.constants)
        plain = batches_to_spark_arrow(log, topic, part, 0, n)
        assert shared.equals(plain), (n, topic, part)
        kept.append((shared, plain))
    for shared, plain in kept:  # every earlier batch is intact
        assert shared.equals(plain)
    a, b = kept[1][0], kept[3][0]  # 3000 and 2999 rows of "t": the same memory
    assert a.column("topic").buffers()[2].address == b.column("topic").buffers()[2].address
    assert a.column("partition").buffers()[1].address == \
        b.column("partition").buffers()[1].address
    view = a.column("partition").to_numpy(zero_copy_only=True)
    with pytest.raises(ValueError):
        view[0] = 1
    arr = np.frombuffer(a.column("topic").buffers()[1], dtype=np.int32)
    with pytest.raises(ValueError):
        arr[1] = 0


def test_constant_columns_keep_a_few_entries() -> None:
    from shmq.protocol.kafka_arrow import ConstantColumns

    cc = ConstantColumns(entries=2)
    first = cc.int32(1, 10)
    cc.int32(2, 10)
    cc.int32(3, 10)  # 1 is dropped from the cache (its buffer lives on with its users)
    assert np.frombuffer(first, dtype=np.int32).tolist() == [1] * 10
    assert cc.int32(1, 10).address != first.address
    assert cc.int32(3, 2000).size == 8000  # grows past its first capacity


def _random_log(rng: np.random.Generator, batches: int) -> tuple[bytes, int]:
    """Batches of random records: keys and null keys, null and empty values, headers (null
    header values too), each codec, CreateTime and LogAppendTime."""
    codecs = [rec.codecs.NONE, rec.codecs.GZIP, rec.codecs.LZ4, rec.codecs.ZSTD,
              rec.codecs.SNAPPY]
    out, base = b"", 0
    for _ in range(batches):
        n = int(rng.integers(1, 3000))
        items = []
        for i in range(n):
            key = None if rng.random() < 0.5 else rng.bytes(int(rng.integers(0, 40)))
            value = None if rng.random() < 0.05 else rng.bytes(int(rng.integers(0, 300)))
            heads = [] if rng.random() < 0.8 else [
                (f"h{j}", None if rng.random() < 0.3 else rng.bytes(3)) for j in range(2)]
            items.append((key, value, 1_700_000_000_000 + i, heads))
        lat = rng.random() < 0.2
        out += bytes(rec.encode_batch(
            items, base_offset=base, compression_type=codecs[int(rng.integers(len(codecs)))],
            timestamp_type=rec.LOG_APPEND_TIME if lat else rec.CREATE_TIME,
            log_append_time=1_700_000_000_999 if lat else None))
        base += n
    return out, base


@pytest.mark.parametrize("seed", range(4))
def test_pooled_output_is_byte_identical_to_plain_and_twin(seed: int,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads decoded into the pool's buffers (new arrays, then reused ones, with earlier
    batches still held) equal, buffer for buffer (Arrow IPC bytes), the same reads decoded into
    plain pyarrow buffers and those decoded by the pure-Python twin of ``fill_columns``."""
    from shmq._fast import _reference

    rng = np.random.default_rng(seed)
    pool = BufferPool()
    kept = []
    for _ in range(6):
        log, n = _random_log(rng, int(rng.integers(1, 6)))
        lo = int(rng.integers(0, max(1, n // 3)))
        hi = int(rng.integers(lo, n + 2))
        headers = bool(rng.integers(2))
        pooled = batches_to_spark_arrow(memoryview(log), "t", 1, lo, hi, include_headers=headers,
                                        alloc=pool.take, constants=pool.constants)
        plain = batches_to_spark_arrow(memoryview(log), "t", 1, lo, hi, include_headers=headers)
        with monkeypatch.context() as m:
            m.setattr("shmq.protocol.kafka_arrow._fast.fill_columns", _reference.fill_columns)
            twin = batches_to_spark_arrow(memoryview(log), "t", 1, lo, hi,
                                          include_headers=headers)
        assert pooled.num_rows == max(0, min(hi, n) - lo)
        for other in (plain, twin):
            assert pooled.equals(other)
            assert pooled.serialize().to_pybytes() == other.serialize().to_pybytes()
        kept.append((pooled, plain))
        if len(kept) > 2:
            kept.pop(0)
    for pooled, plain in kept:  # still intact after the later reads
        assert pooled.equals(plain)


def test_a_small_read_goes_through_the_arrow_c_data_interface(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A pooled read (no headers, one timestampType) is handed to pyarrow as one ArrowArray
    (``_fast.import_spark_batch``, ~6 us less than building the seven arrays in Python): the
    same batch as the twin's, byte for byte; its buffers stay alive as long as any column of
    it does and go back to the pool after; n a multiple of 8 with nulls keeps the Python path
    (pyarrow would size the bitmap differently)."""
    from shmq import _fast
    from shmq._fast import _reference

    calls: list[int] = []
    real = _fast.import_spark_batch

    def spy(*args: object) -> pa.RecordBatch:
        calls.append(int(args[2]))  # type: ignore[call-overload]
        return real(*args)

    monkeypatch.setattr("shmq.protocol.kafka_arrow._fast.import_spark_batch", spy)
    log = b"".join(bytes(rec.encode_batch([(None, b"v%d" % i, 5), (b"k", None, 6)],
                                          base_offset=2 * i)) for i in range(8))
    pool = BufferPool()
    rb = batches_to_spark_arrow(memoryview(log), "t", 3, 1, 4, alloc=pool.take,
                                constants=pool.constants)
    assert calls == [3]
    with monkeypatch.context() as m:
        m.setattr("shmq.protocol.kafka_arrow._fast.import_spark_batch",
                  _reference.import_spark_batch)
        twin = batches_to_spark_arrow(memoryview(log), "t", 3, 1, 4, alloc=pool.take,
                                      constants=pool.constants)
    plain = batches_to_spark_arrow(memoryview(log), "t", 3, 1, 4)
    for other in (twin, plain):
        assert rb.equals(other)
        assert rb.serialize().to_pybytes() == other.serialize().to_pybytes()
    assert rb.column("value").to_pylist() == [None, b"v1", None]
    del twin, plain
    gc.collect()
    assert pool.in_use() == 1
    value = rb.column("value")
    del rb
    gc.collect()
    assert pool.in_use() == 1 and value.to_pylist() == [None, b"v1", None]  # still alive
    del value
    gc.collect()
    assert pool.in_use() == 0  # the release callback let go of the block
    eight = batches_to_spark_arrow(memoryview(log), "t", 3, 0, 8, alloc=pool.take,
                                   constants=pool.constants)
    assert calls == [3] and eight.num_rows == 8  # nulls in 8 rows: the Python path
