"""``shmq.storage.reader``: a partition read from its files while its writer keeps the log open.

Logs are written by ``PartitionLog`` from kafka-python-built batches (small segments, small index
interval, so reads cross rolls and use index entries); what the reader returns is checked
against kafka-python's decoder over the files (``_storage_util``), for random windows.
"""

from __future__ import annotations

import os
import random
import struct
from pathlib import Path

import numpy as np
import pytest
from _storage_util import all_records, kbatch

from shmq import _fast
from shmq.errors import CorruptRecordError
from shmq.protocol import compression as codecs
from shmq.protocol.records import encode_batch
from shmq.storage import PartitionLog
from shmq.storage.log_config import LogConfig
from shmq.storage.reader import PartitionReader, _index_lookup

CONFIG = LogConfig(segment_bytes=6000, index_interval_bytes=300)


def write_log(path: Path, batches: int = 60, seed: int = 1, compression: int = 0) -> PartitionLog:
    rng = random.Random(seed)
    log = PartitionLog.open(path, CONFIG)
    for b in range(batches):
        values = [None if rng.random() < 0.1 else rng.randbytes(rng.randint(0, 60))
                  for _ in range(rng.randint(1, 12))]
        log.append(kbatch(values, [1_700_000_000_000 + 100 * b + i for i in range(len(values))],
                          key=b"k%d" % b, compression=compression))
    log.update_high_watermark(log.log_end_offset)
    return log


def read_rows(reader: PartitionReader, start: int, end: int, chunk: int = 7,
              gaps: list | None = None, chunk_bytes: int = 1 << 30) -> list[tuple]:
    rows = []
    for ch in reader.read(start, end, chunk_records=chunk, chunk_bytes=chunk_bytes,
                          on_gap=None if gaps is None else lambda a, b: gaps.append((a, b))):
        records = _fast.decode_sections(ch.bodies, ch.meta)
        rows += [(r[0], r[1], r[2], r[3]) for r in records
                 if ch.first_offset <= r[0] < ch.next_offset]
    return rows


@pytest.mark.parametrize("compression", [0, codecs.GZIP, codecs.LZ4])
def test_random_windows_match_kafka_python(tmp_path: Path, compression: int) -> None:
    log = write_log(tmp_path / "t-0", compression=compression)
    try:
        assert len(log.segments) >= 3 and log.active_segment.offset_index.entries
        want = all_records(tmp_path / "t-0")
        end = log.high_watermark
        reader = PartitionReader(tmp_path / "t-0")
        assert read_rows(reader, 0, end) == want
        rng = random.Random(5)
        for _ in range(40):
            a = rng.randint(0, end)
            b = rng.randint(a, end)
            assert read_rows(reader, a, b, chunk=rng.choice([1, 5, 1000]),
                             chunk_bytes=rng.choice([1, 200, 1 << 30])) == \
                [r for r in want if a <= r[0] < b]
    finally:
        log.close()


def test_chunks_are_bounded_by_records_and_by_bytes(tmp_path: Path) -> None:
    log = write_log(tmp_path / "t-0", batches=200)
    try:
        end = log.high_watermark
        reader = PartitionReader(tmp_path / "t-0")
        for records, nbytes in ((10**9, 500), (20, 10**9), (20, 500), (1, 1)):
            chunks = list(reader.read(0, end, chunk_records=records, chunk_bytes=nbytes))
            # section bytes are the batches less their 61-byte headers (uncompressed here)
            for ch in chunks:
                batches = len(ch.meta) // 4
                assert batches == 1 or (ch.records <= records
                                        and ch.data_bytes + 61 * batches <= nbytes), (records, nbytes)
            assert sum(ch.records for ch in chunks) == end
            assert len(chunks) > 1
    finally:
        log.close()


def test_index_lookup_on_the_active_segment_preallocated_index(tmp_path: Path) -> None:
    log = write_log(tmp_path / "t-0", batches=12)
    try:
        log.flush()  # a new log's first index files exist from its first flush (index_file.py)
        seg = log.active_segment
        index_path = tmp_path / "t-0" / f"{seg.base_offset:020d}.index"
        size = index_path.stat().st_size
        assert size == CONFIG.segment_index_bytes  # preallocated: a zero tail after the entries
        entries = [seg.offset_index.entry(i) for i in range(seg.offset_index.entries)]
        assert entries
        fd = os.open(index_path, os.O_RDONLY)
        try:
            for target in range(seg.base_offset, seg.next_offset + 3):
                below = [e for e in entries if e[0] <= target]
                want = (below[-1][0] - seg.base_offset, below[-1][1]) if below else (0, 0)
                assert _index_lookup(fd, target - seg.base_offset) == want
        finally:
            os.close(fd)
    finally:
        log.close()


def test_garbled_index_entries_are_only_hints(tmp_path: Path) -> None:
    log = write_log(tmp_path / "t-0")
    end = log.high_watermark
    log.close()
    want = all_records(tmp_path / "t-0")
    for index in (tmp_path / "t-0").glob("*.index"):
        data = bytearray(index.read_bytes())
        for i in range(0, len(data) - 7, 8):  # every position off by 13 bytes
            rel, pos = struct.unpack_from(">ii", data, i)
            struct.pack_into(">ii", data, i, rel, pos + 13)
        index.write_bytes(bytes(data))
    reader = PartitionReader(tmp_path / "t-0")
    for a in (0, 17, end // 2, end - 1):
        assert read_rows(reader, a, end) == [r for r in want if r[0] >= a]


def test_bytes_past_the_bound_are_never_read(tmp_path: Path) -> None:
    # The writer is mid-append after the high watermark: a torn batch (a header that promises
    # more bytes than there are, then garbage) must not disturb a read bounded below it.
    log = write_log(tmp_path / "t-0", batches=20)
    hw = log.high_watermark
    try:
        active = tmp_path / "t-0" / f"{log.active_segment.base_offset:020d}.log"
        with open(active, "ab") as f:
            torn = bytearray(kbatch([b"x" * 500]))
            struct.pack_into(">q", torn, 0, hw)
            f.write(bytes(torn[:200]))
        want = [r for r in all_records(tmp_path / "t-0") if r[0] < hw]
        assert read_rows(PartitionReader(tmp_path / "t-0"), 0, hw) == want
        # ...but a bound past the written data is corruption, named with file and position
        with pytest.raises(CorruptRecordError, match=r"\.log: invalid record batch at byte"):
            read_rows(PartitionReader(tmp_path / "t-0"), 0, hw + 1)
    finally:
        log.close()


def test_corrupt_batch_is_an_error_naming_file_and_position(tmp_path: Path) -> None:
    log = write_log(tmp_path / "t-0", batches=10)
    hw = log.high_watermark
    log.close()
    path = sorted((tmp_path / "t-0").glob("*.log"))[0]
    data = bytearray(path.read_bytes())
    data[200] ^= 0x40  # inside the first or second batch's records
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptRecordError) as info:
        read_rows(PartitionReader(tmp_path / "t-0"), 0, hw)
    assert str(path) in str(info.value) and "CRC" in str(info.value)
    # without CRC checks the corruption would have come out as rows: the check is what stops it
    assert PartitionReader(tmp_path / "t-0", verify_crc=False) is not None


def test_deleted_segments_are_gaps(tmp_path: Path) -> None:
    log = write_log(tmp_path / "t-0")
    hw = log.high_watermark
    second = log.segments[2].base_offset
    log.delete_records_before(second)
    log.close()
    want = all_records(tmp_path / "t-0")
    gaps: list = []
    assert read_rows(PartitionReader(tmp_path / "t-0"), 0, hw, gaps=gaps) == want
    assert gaps == [(0, second)] and want[0][0] == second
    gaps.clear()
    assert read_rows(PartitionReader(tmp_path / "t-0"), 1, 5, gaps=gaps) == []
    assert gaps == [(1, 5)]


def test_a_lost_tail_is_a_gap_and_a_deleted_partition_raises(tmp_path: Path) -> None:
    log = write_log(tmp_path / "t-0", batches=5)
    hw = log.high_watermark
    log.close()
    gaps: list = []
    rows = read_rows(PartitionReader(tmp_path / "t-0"), 0, hw + 10, gaps=gaps)
    assert len(rows) == hw and gaps == [(hw, hw + 10)]
    with pytest.raises(FileNotFoundError):
        read_rows(PartitionReader(tmp_path / "gone-0"), 0, 1)


def test_control_batches_are_skipped(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", CONFIG)
    try:
        log.append(encode_batch([(b"k", b"v1"), (b"k", b"v2")]))
        marker = encode_batch([(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00")],
                              control=True, transactional=True, producer_id=7,
                              producer_epoch=0)
        log.append(marker, validate=False)
        log.append(encode_batch([(None, b"v3")]))
        log.update_high_watermark(log.log_end_offset)
        rows = read_rows(PartitionReader(tmp_path / "t-0"), 0, log.high_watermark)
        assert [(r[0], r[3]) for r in rows] == [(0, b"v1"), (1, b"v2"), (3, b"v3")]
        meta = [ch.meta for ch in PartitionReader(tmp_path / "t-0").read(0, 4)]
        assert int(np.concatenate(meta)[0::4].sum()) == 3
    finally:
        log.close()
