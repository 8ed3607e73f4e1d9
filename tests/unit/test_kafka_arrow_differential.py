"""``kafka_arrow.sections_to_arrow`` against its previous version (``kafka_arrow_oracle_v1``,
kept verbatim): for random logs -- null, empty and binary keys and values, headers with null
values and non-UTF-8 keys, every codec, CreateTime, LogAppendTime and both mixed in one read,
control batches, one batch to many (the list and the numpy paths of ``meta``), read windows
that cut batches -- the Arrow batch is the same: schema, every column's type, values and
nulls, and the Arrow IPC bytes (without headers: the old headers column shipped uninitialised
bytes past its entries, now cut off); with a ``BufferPool`` (buffers reused while earlier batches
are held) and with plain pyarrow buffers.
"""

from __future__ import annotations

import kafka_arrow_oracle_v1 as oracle
import numpy as np
import pyarrow as pa
import pytest

from shmq.ipc.buffers import BufferPool
from shmq.protocol import kafka_arrow
from shmq.protocol import records as rec

CODECS = [rec.codecs.NONE, rec.codecs.GZIP, rec.codecs.LZ4, rec.codecs.ZSTD, rec.codecs.SNAPPY]


def _value(rng: np.random.Generator, top: int) -> bytes | None:
    r = rng.random()
    if r < 0.15:
        return None
    if r < 0.25:
        return b""
    return rng.bytes(int(rng.integers(1, top)))


def _random_log(rng: np.random.Generator, batches: int, most: int) -> tuple[bytes, int]:
    out, base = b"", 0
    for _ in range(batches):
        if rng.random() < 0.1:  # a transaction marker (control batch): never a row
            marker = bytes(rec.encode_batch([(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00")],
                                            base_offset=base, control=True, transactional=True,
                                            producer_id=7, producer_epoch=0))
            out += marker
            base += 1
            continue
        n = int(rng.integers(1, most + 1))
        items = []
        for i in range(n):
            heads = [] if rng.random() < 0.7 else [
                ([b"h", b"", "\u00e9t\u00e9".encode(), b"ok\xff", b"\xed\xa0\x80"][int(rng.integers(5))], None if rng.random() < 0.3 else rng.bytes(int(rng.integers(0, 5))))
                for _ in range(int(rng.integers(1, 3)))]
            items.append((_value(rng, 30), _value(rng, 200), 1_700_000_000_000 + 37 * i, heads))
        lat = rng.random() < 0.3
        out += bytes(rec.encode_batch(
            items, base_offset=base, compression_type=CODECS[int(rng.integers(len(CODECS)))],
            timestamp_type=rec.LOG_APPEND_TIME if lat else rec.CREATE_TIME,
            log_append_time=1_700_000_000_999 if lat else None))
        base += n
    return out, base


def _sections(log: bytes, lo: int, hi: int) -> tuple[list, np.ndarray]:
    return rec._records_sections(memoryview(log), verify_crc=True,
                                 max_decompressed=rec.codecs.DEFAULT_MAX_DECOMPRESSED_BYTES,
                                 min_offset=lo, max_offset=hi, skip_control=True)


def _same(new: pa.RecordBatch, old: pa.RecordBatch, ipc: bool = True) -> None:
    """``ipc``: the Arrow IPC bytes too.  They differ when the read window cuts a batch: the
    old code kept its buffers sized for every record of the sections (the rows before and
    after the window included), and IPC writes a whole buffer, bytes past the last row too;
    the new one slices each buffer to the rows it holds (checked by ``_exact``)."""
    assert new.schema.equals(old.schema, check_metadata=True)
    assert new.num_rows == old.num_rows
    for name in old.schema.names:
        a, b = new.column(name), old.column(name)
        assert a.type == b.type, name
        assert a.null_count == b.null_count, name
        assert a.equals(b), name
        assert a.to_pylist() == b.to_pylist(), name
    assert new.equals(old)
    _exact(new)
    if ipc and "headers" not in old.schema.names:
        assert new.serialize().to_pybytes() == old.serialize().to_pybytes()


def _exact(rb: pa.RecordBatch) -> None:
    """Every buffer of ``rb``'s columns holds its rows and no more."""
    n = rb.num_rows
    if "headers" in rb.schema.names:
        heads = rb.column("headers")
        valid, offsets = heads.buffers()[:2]
        assert valid is None or valid.size == n // 8 + 1
        assert offsets.size == 4 * (n + 1)
        entries = heads.values
        count = len(entries)
        for child in (entries.field("key"), entries.field("value")):
            valid, offsets, data = child.buffers()
            assert valid is None or valid.size == count // 8 + 1
            assert offsets.size == 4 * (count + 1)
            assert data.size == np.frombuffer(offsets, np.int32)[-1]
    for name in ("key", "value", "topic"):
        valid, offsets, data = rb.column(name).buffers()
        assert valid is None or valid.size == n // 8 + 1
        assert offsets.size == 4 * (n + 1)
        ends = np.frombuffer(offsets, np.int32)
        assert data.size == ends[-1] - ends[0] and ends[0] == 0
    for name, width in (("partition", 4), ("offset", 8), ("timestamp", 8), ("timestampType", 4)):
        assert rb.column(name).buffers()[1].size == width * n


@pytest.mark.parametrize("seed", range(12))
def test_new_equals_old_for_random_logs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    pool = BufferPool()
    kept = []
    for _ in range(8):
        shape = int(rng.integers(3))
        # one small batch (a waiting reader's read), a few, or many (> _FEW_SECTIONS)
        batches, most = [(1, 12), (int(rng.integers(2, 8)), 300), (int(rng.integers(17, 40)), 20)][shape]
        log, n = _random_log(rng, batches, most)
        lo = int(rng.integers(0, max(1, n // 3)))
        hi = int(rng.integers(lo, n + 2))
        headers = bool(rng.integers(2))
        bodies, meta = _sections(log, lo, hi)
        old = oracle.sections_to_arrow(bodies, meta, "topic-\u00e9", 5, min_offset=lo,
                                       max_offset=hi, include_headers=headers)
        for alloc, constants in ((None, None), (pool.take, pool.constants)):
            new = kafka_arrow.sections_to_arrow(bodies, meta, "topic-\u00e9", 5, min_offset=lo,
                                                max_offset=hi, include_headers=headers,
                                                alloc=alloc, constants=constants)
            _same(new, old, ipc=_whole(bodies, meta, lo, hi))
        kept.append((new, old, _whole(bodies, meta, lo, hi)))
        if len(kept) > 3:
            kept.pop(0)
    for new, old, whole in kept:  # pooled buffers reused by later reads never overwrote these
        _same(new, old, whole)


def _whole(bodies: list, meta: np.ndarray, lo: int, hi: int) -> bool:
    """Whether [lo, hi) takes every record of the sections (the old buffers were exact then)."""
    counts, bases = meta[0::4], meta[1::4]
    return bool(len(counts) == 0 or (bases[0] >= lo and (bases + counts).max() <= hi))


@pytest.mark.parametrize("lats", [[True], [False], [True, False], [False, True, True],
                                  [True] * 20, [False] * 19 + [True]])
def test_timestamp_type_mixes(lats: list[bool]) -> None:
    """Every combination of CreateTime / LogAppendTime batches in one read, on the list path
    (up to 16 sections) and the numpy one."""
    log, base = b"", 0
    for i, lat in enumerate(lats):
        log += bytes(rec.encode_batch(
            [(b"k", b"v", 1_700_000_000_000 + i), (None, None, 1_700_000_000_001 + i)],
            base_offset=base, timestamp_type=rec.LOG_APPEND_TIME if lat else rec.CREATE_TIME,
            log_append_time=1_700_000_009_000 + i if lat else None))
        base += 2
    pool = BufferPool()
    for lo, hi in ((0, base), (1, base - 1), (3, 3), (base, base + 5)):
        bodies, meta = _sections(log, lo, hi)
        old = oracle.sections_to_arrow(bodies, meta, "t", 0, min_offset=lo, max_offset=hi)
        for alloc, constants in ((None, None), (pool.take, pool.constants)):
            _same(kafka_arrow.sections_to_arrow(bodies, meta, "t", 0, min_offset=lo,
                                                max_offset=hi, alloc=alloc,
                                                constants=constants), old,
                  ipc=_whole(bodies, meta, lo, hi))


def test_empty_input() -> None:
    meta = np.zeros(0, dtype=np.int64)
    for headers in (False, True):
        _same(kafka_arrow.sections_to_arrow([], meta, "t", 0, min_offset=0, max_offset=10,
                                            include_headers=headers),
              oracle.sections_to_arrow([], meta, "t", 0, min_offset=0, max_offset=10,
                                       include_headers=headers))
