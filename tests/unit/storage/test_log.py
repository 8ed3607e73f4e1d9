"""The partition log on real files: reads, timestamps, retention, truncation, validation, flush.

Kafka classes whose behaviour is pinned: ``LogSegment.read`` / ``LocalLog.read`` (reads),
``UnifiedLog.fetchOffsetByTimestamp`` (ListOffsets), ``UnifiedLog.deleteOldSegments`` /
``deletableSegments`` (retention), ``LogValidator`` (validation, LogAppendTime), ``UnifiedLog.flush``.
"""

from __future__ import annotations

import os
import random
import struct
import threading
import time

import crc32c
import pytest
from _storage_util import (
    all_records,
    attributes,
    base_offset,
    batch_rows,
    crc_ok,
    decode,
    kbatch,
    last_offset,
    log_batches,
    max_timestamp,
    offset_index_entries,
    split_batches,
)

from shmq.errors import CorruptRecordError, OffsetOutOfRangeError
from shmq.storage import LogConfig, PartitionLog, RecordTooLargeError
from shmq.storage.layout import segment_paths

T0 = 1_700_000_000_000


def open_log(tmp_path, **cfg) -> PartitionLog:
    return PartitionLog.open(tmp_path / "topic-0", LogConfig(**cfg))


def fill(log: PartitionLog, rng: random.Random, batches: int, *, max_records: int = 4,
         max_value: int = 300, ts_spread: int = 0) -> None:
    for _ in range(batches):
        n = rng.randrange(1, max_records + 1)
        stamps = [T0 + rng.randrange(-ts_spread, ts_spread + 1) for _ in range(n)]
        log.append(kbatch([rng.randbytes(rng.randrange(0, max_value)) for _ in range(n)], stamps))
    log.update_high_watermark(log.log_end_offset)


def disk_segments(log: PartitionLog) -> list[tuple[int, list[tuple[int, int, int, int, int]]]]:
    """(base, [(position, base offset, last offset, size, index in file)]) per segment file."""
    out = []
    for seg in log.segments:
        rows = []
        for i, (pos, b) in enumerate(log_batches(seg.log_path)):
            rows.append((pos, base_offset(b), last_offset(b), len(b), i))
        out.append((seg.base_offset, rows))
    return out


def expected_read(segments, offset: int, max_bytes: int, bound: int,
                  min_one: bool = True) -> tuple[int, int] | None:
    """Kafka LocalLog.read: (position, length) within the segment holding ``offset``."""
    rows = next(rows for base, rows in reversed(segments) if base <= offset)
    eligible = [r for r in rows if r[2] >= offset and r[2] < bound]
    if not eligible:
        return None
    start = eligible[0][0]
    total = 0
    for r in eligible:
        if total + r[3] > max_bytes:
            break
        total += r[3]
    if total == 0:
        if not min_one:
            return None
        total = eligible[0][3]
    return start, total


def slice_of(result) -> tuple[int, int] | None:
    assert len(result.slices) <= 1
    if not result.slices:
        return None
    s = result.slices[0]
    return s.position, s.length


# -- reads ----------------------------------------------------------------------------------------


def test_read_returns_whole_batches_from_the_containing_batch(tmp_path) -> None:
    log = open_log(tmp_path)
    for n in [3, 1, 5, 2, 4]:
        log.append(kbatch([b"r%d" % i for i in range(n)]))
    log.update_high_watermark(log.log_end_offset)
    rows = batch_rows(log.active_segment.log_path)
    first = 0
    for pos, last, _, _ in rows:
        for off in range(first, last + 1):  # every offset, mid-batch ones included
            res = log.read(off, 10**6)
            data = res.slices[0].read()
            batches = split_batches(data)
            assert res.slices[0].position == pos
            assert base_offset(batches[0][1]) == first <= off <= last_offset(batches[0][1])
            assert sum(len(b) for _, b in batches) == len(data)  # only whole batches
            assert all(crc_ok(b) for _, b in batches)
            assert decode(batches[0][1])[off - first][0] == off
            assert (res.log_start_offset, res.high_watermark, res.log_end_offset) == (0, 15, 15)
        first = last + 1
    log.close()


def test_read_never_passes_the_high_watermark(tmp_path) -> None:
    log = open_log(tmp_path)
    for _ in range(6):
        log.append(kbatch([b"a", b"b", b"c"]))  # batches [0-2] [3-5] ... [15-17]
    assert log.high_watermark == 0  # the HW is the caller's business
    assert log.read(0, 10**6).slices == []
    log.update_high_watermark(9)
    res = log.read(0, 10**6)
    data = res.slices[0].read()
    assert [last_offset(b) for _, b in split_batches(data)] == [2, 5, 8]
    assert res.high_watermark == 9 and res.log_end_offset == 18
    # at the HW and between HW and LEO: empty, not an error (Kafka returns no records)
    assert log.read(9, 10**6).slices == []
    assert log.read(17, 10**6).slices == []
    assert log.read(18, 10**6).slices == []
    # an explicit upper bound (LSO) in the middle of a batch excludes that batch
    res = log.read(0, 10**6, upper_bound=7)
    assert [last_offset(b) for _, b in split_batches(res.slices[0].read())] == [2, 5]
    assert log.read(6, 10**6, upper_bound=7).slices == []
    # the bound never exceeds the LEO
    res = log.read(3, 10**6, upper_bound=100)
    assert [last_offset(b) for _, b in split_batches(res.slices[0].read())] == [5, 8, 11, 14, 17]
    log.close()


def test_read_out_of_range(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(kbatch([b"a", b"b"]))
    log.update_high_watermark(2)
    with pytest.raises(OffsetOutOfRangeError) as exc:
        log.read(3, 100)
    assert (exc.value.offset, exc.value.log_start, exc.value.log_end) == (3, 0, 2)
    with pytest.raises(OffsetOutOfRangeError):
        log.read(-1, 100)
    log.close()


def test_read_first_batch_whole_when_larger_than_max_bytes(tmp_path) -> None:
    # KIP-74 / LogSegment.read(minOneMessage): a consumer with a small fetch size must not stall
    log = open_log(tmp_path)
    log.append(kbatch([b"B" * 5000]))
    log.append(kbatch([b"s"]))
    log.update_high_watermark(2)
    rows = batch_rows(log.active_segment.log_path)
    res = log.read(0, 100)
    assert slice_of(res) == (0, rows[0][3])
    assert res.slices[0].read() == log_batches(log.active_segment.log_path)[0][1]
    assert log.read(0, 100, min_one_batch=False).slices == []
    assert slice_of(log.read(1, 100)) == (rows[1][0], rows[1][3])  # the small one fits
    log.close()


def probe_reads(log: PartitionLog, rng: random.Random, probes: int,
                min_ones: tuple[bool, ...] = (True,)) -> list[str]:
    segments = disk_segments(log)
    sizes = [r[3] for _, rows in segments for r in rows]
    leo, hw = log.log_end_offset, log.high_watermark
    failures = []
    for _ in range(probes):
        off = rng.randrange(0, leo)
        max_bytes = rng.randrange(1, 4 * max(sizes) + 2)
        bound = rng.choice([None, rng.randrange(0, leo + 1)])
        for min_one in min_ones:
            got = slice_of(log.read(off, max_bytes, upper_bound=bound, min_one_batch=min_one))
            want = expected_read(segments, off, max_bytes, hw if bound is None else bound,
                                 min_one) if off < (hw if bound is None else bound) else None
            if got != want:
                failures.append(f"read({off}, {max_bytes}, bound={bound}, min_one={min_one}) "
                                f"= {got}, expected {want}")
    return failures


def test_read_respects_max_bytes_at_batch_boundaries_sparse_index(tmp_path) -> None:
    # no index entries at all: every read walks from the segment start
    rng = random.Random(11)
    log = open_log(tmp_path, index_interval_bytes=10**9, segment_bytes=20_000)
    fill(log, rng, 150)
    assert len(log.segments) > 2
    assert probe_reads(log, rng, 600) == []
    log.close()


def test_read_without_min_one_batch_within_a_segment(tmp_path) -> None:
    log = open_log(tmp_path, index_interval_bytes=10**9)
    fill(log, random.Random(13), 60)
    assert len(log.segments) == 1
    assert probe_reads(log, random.Random(14), 400, min_ones=(False,)) == []
    log.close()


def test_read_without_min_one_batch_never_skips_to_the_next_segment(tmp_path) -> None:
    # Kafka LogSegment.read returns an empty FetchDataInfo (not null) when the first batch is too
    # big and minOneMessage is false, so LocalLog.read stops there
    log = open_log(tmp_path)
    log.append(kbatch([b"s"]))
    log.append(kbatch([b"B" * 600]))
    log.roll()
    log.append(kbatch([b"s"]))          # a new segment at offset 2
    log.update_high_watermark(3)
    assert [s.base_offset for s in log.segments] == [0, 2]
    res = log.read(1, 200, min_one_batch=False)
    got = [base_offset(b) for s in res.slices for _, b in split_batches(s.read())]
    log.close()
    assert got == []  # not [2]: offset 1 would be skipped


def test_read_respects_max_bytes_at_batch_boundaries_dense_index(tmp_path) -> None:
    rng = random.Random(12)
    log = open_log(tmp_path, index_interval_bytes=0, segment_bytes=20_000)
    fill(log, rng, 150)
    failures = probe_reads(log, rng, 600)
    log.close()
    assert failures == [], failures[:5]


def test_read_max_bytes_dense_index_minimal_case(tmp_path) -> None:
    # the same rule on a hand-sized example; the part that works today
    log = open_log(tmp_path, index_interval_bytes=0)
    sizes = []
    for v in [50, 50, 300, 50]:
        b = kbatch([b"x" * v], [T0])
        sizes.append(len(b))
        log.append(b)
    log.update_high_watermark(4)
    assert slice_of(log.read(0, sum(sizes))) == (0, sum(sizes))
    assert slice_of(log.read(0, sizes[0])) == (0, sizes[0])
    assert slice_of(log.read(0, sizes[0] + 1)) == (0, sizes[0])
    log.close()


def test_read_max_bytes_dense_index_two_batches_fit(tmp_path) -> None:
    log = open_log(tmp_path, index_interval_bytes=0)
    sizes = []
    for v in [50, 50, 300, 50]:
        b = kbatch([b"x" * v], [T0])
        sizes.append(len(b))
        log.append(b)
    log.update_high_watermark(4)
    try:
        # batches 0 and 1 fit, batch 2 (which has an index entry) crosses the limit
        assert slice_of(log.read(0, sizes[0] + sizes[1] + 10)) == (0, sizes[0] + sizes[1])
    finally:
        log.close()


def test_read_after_reopen_and_roll_spans_one_segment(tmp_path) -> None:
    rng = random.Random(5)
    log = open_log(tmp_path, segment_bytes=3000)
    fill(log, rng, 60)
    log.close()
    log = PartitionLog.open(tmp_path / "topic-0", LogConfig(segment_bytes=3000),
                            clean_shutdown=True)
    log.update_high_watermark(log.log_end_offset)
    for seg, nxt in zip(log.segments, log.segments[1:], strict=False):
        res = log.read(seg.base_offset, 10**7)
        assert slice_of(res) == (0, seg.size)  # reads stay inside one segment
        assert last_offset(split_batches(res.slices[0].read())[-1][1]) == nxt.base_offset - 1
    assert probe_reads(log, rng, 300) == []
    log.close()


# -- ListOffsets by timestamp -------------------------------------------------------------------


def oracle_offset_for_timestamp(log: PartitionLog, target: int,
                                retained=None) -> tuple[int, int] | None:
    if retained is None:
        retained = all_records(log.directory)
    recs = [r for r in retained if r[0] >= log.log_start_offset]
    if target == -1:
        return log.log_end_offset, -1
    if target == -2:
        return log.log_start_offset, -1
    if target == -3:
        # UnifiedLog.fetchOffsetByTimestamp(MAX_TIMESTAMP) looks at every retained segment
        # (maxBy maxTimestampSoFar) without filtering by the log start offset
        if not retained:
            return None
        top = max(r[1] for r in retained)
        first = next(r for r in retained if r[1] == top)
        return first[0], first[1]
    for off, ts, _, _ in recs:
        if ts >= target:
            return off, ts
    return None


@pytest.mark.parametrize("interval", [0, 500, 4096])
def test_offset_for_timestamp_matches_brute_force(tmp_path, interval: int) -> None:
    rng = random.Random(interval + 1)
    cfg = {"index_interval_bytes": interval, "segment_bytes": 6000}
    log = open_log(tmp_path, **cfg)
    fill(log, rng, 120, ts_spread=20_000)
    assert len(log.segments) > 3
    recs = all_records(log.directory)
    stamps = sorted({r[1] for r in recs})

    def check(lg: PartitionLog) -> None:
        probes = [-1, -2, -3, 0, stamps[0] - 1, stamps[-1], stamps[-1] + 1, 2**62]
        probes += rng.sample(stamps, 40)                          # exact timestamps
        probes += [rng.randrange(stamps[0], stamps[-1]) for _ in range(60)]  # in between
        retained = all_records(lg.directory)
        for t in probes:
            assert lg.offset_for_timestamp(t) == oracle_offset_for_timestamp(lg, t, retained), t

    check(log)
    assert log.offset_for_timestamp(stamps[-1] + 1) is None  # beyond the last: no offset
    assert log.offset_for_timestamp(-1) == (log.log_end_offset, -1)
    assert log.offset_for_timestamp(-2) == (0, -1)
    log.close()
    reopened = PartitionLog.open(tmp_path / "topic-0", LogConfig(**cfg), clean_shutdown=True)
    check(reopened)
    # after DeleteRecords the search starts at the new log start offset
    reopened.update_high_watermark(reopened.log_end_offset)
    reopened.delete_records_before(recs[len(recs) // 2][0] + 1)
    check(reopened)
    reopened.close()


def test_offset_for_timestamp_max_timestamp_ties(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(kbatch([b"a", b"b", b"c"], [T0, T0 + 9, T0 + 3]))
    log.append(kbatch([b"d", b"e"], [T0 + 9, T0 + 1]))
    # -3 (MAX_TIMESTAMP, KIP-734): the first record carrying the largest timestamp
    assert log.offset_for_timestamp(-3) == (1, T0 + 9)
    assert log.offset_for_timestamp(T0 + 4) == (1, T0 + 9)
    assert log.offset_for_timestamp(T0 + 2) == (1, T0 + 9)
    assert log.offset_for_timestamp(T0 + 1) == (1, T0 + 9)
    assert log.offset_for_timestamp(T0) == (0, T0)
    assert log.offset_for_timestamp(T0 + 10) is None
    log.close()


def test_fetch_offset_by_timestamp_answers_the_found_batch_epoch(tmp_path) -> None:
    """``UnifiedLog.fetchOffsetByTimestamp``: the epoch of the batch found, not the current
    one; "earliest" the epoch covering the log start; "latest" the latest epoch."""
    log = open_log(tmp_path)
    log.append(kbatch([b"a", b"b"], [T0, T0 + 9]), leader_epoch=0, now_ms=T0)
    log.append(kbatch([b"c"], [T0 + 5]), leader_epoch=3, now_ms=T0)
    log.append(kbatch([b"d"], [T0 + 20]), leader_epoch=4, now_ms=T0)
    log.update_high_watermark(log.log_end_offset)
    f = log.fetch_offset_by_timestamp
    assert f(T0) == (T0, 0, 0)
    assert f(T0 + 9) == (T0 + 9, 1, 0)
    assert f(T0 + 10) == (T0 + 20, 3, 4)
    assert f(T0 + 21) is None
    assert f(-3) == (T0 + 20, 3, 4)
    assert f(-1) == (-1, 4, 4)
    assert f(-2) == (-1, 0, 0)
    log.delete_records_before(2)
    assert f(-2) == (-1, 2, 3)            # the epoch whose range holds the new log start
    log.close()


def test_max_timestamp_when_no_record_has_one(tmp_path) -> None:
    """Every record carries -1: Kafka answers the first record (its segment's max timestamp is
    -1 at its base offset, and the first batch with max timestamp -1 holds it)."""
    log = open_log(tmp_path, segment_bytes=200)
    assert log.fetch_offset_by_timestamp(-3) is None
    for _ in range(4):
        log.append(kbatch([b"x" * 40, b"y"], [-1, -1]), leader_epoch=0, now_ms=T0)
    assert len(log.segments) > 1
    assert log.fetch_offset_by_timestamp(-3) == (-1, 0, 0)
    assert log.fetch_offset_by_timestamp(0) is None
    log.close()


def test_a_duplicate_answers_the_original_timestamp_as_append_time(tmp_path) -> None:
    for timestamp_type in ("CreateTime", "LogAppendTime"):
        log = PartitionLog.open(tmp_path / timestamp_type / "t-0",
                                LogConfig(message_timestamp_type=timestamp_type))
        b = kbatch([b"a", b"b"], [T0, T0 + 4], producer_id=9, producer_epoch=0,
                   base_sequence=0)
        first = log.append(b, now_ms=T0 + 100)
        stored_ts = T0 + 4 if timestamp_type == "CreateTime" else T0 + 100
        again = log.append(b, now_ms=T0 + 200)
        assert (again.first_offset, again.last_offset, again.batch_count) == (0, 1, 0)
        assert again.log_append_time == stored_ts == first.max_timestamp
        log.close()


def test_offset_for_timestamp_empty_log(tmp_path) -> None:
    log = open_log(tmp_path)
    assert log.offset_for_timestamp(-1) == (0, -1)
    assert log.offset_for_timestamp(-2) == (0, -1)
    assert log.offset_for_timestamp(-3) is None
    assert log.offset_for_timestamp(T0) is None
    log.close()


# -- retention ------------------------------------------------------------------------------------


def make_segments(tmp_path, n_segments: int = 5, per_segment: int = 3, **cfg) -> PartitionLog:
    """``n_segments`` segments of ``per_segment`` equal batches; segment i has timestamps T0+i*1000."""
    size = len(kbatch([b"z" * 100], [T0], key=b"k"))
    log = open_log(tmp_path, segment_bytes=per_segment * size, **cfg)
    for i in range(n_segments * per_segment):  # keyed: compacted topics need keys
        log.append(kbatch([b"z" * 100], [T0 + (i // per_segment) * 1000], key=b"k"))
    assert [s.base_offset for s in log.segments] == [i * per_segment for i in range(n_segments)]
    return log


def log_files(log: PartitionLog) -> list[str]:
    return sorted(p.name for p in log.directory.glob("*.log"))


def test_retention_by_bytes(tmp_path) -> None:
    log = make_segments(tmp_path, retention_bytes=-1)
    log.update_high_watermark(log.log_end_offset)
    seg_size = log.segments[0].size
    total = log.size_in_bytes
    assert log.delete_old_segments(now_ms=T0) == 0
    # UnifiedLog.deleteRetentionSizeBreachedSegments: delete the oldest while what remains is
    # still >= retention.bytes
    log.config = LogConfig(segment_bytes=log.config.segment_bytes,
                           retention_bytes=total - 2 * seg_size + 1)
    assert log.delete_old_segments(now_ms=T0) == 1
    assert [s.base_offset for s in log.segments] == [3, 6, 9, 12]
    assert log.log_start_offset == 3
    log.config = LogConfig(segment_bytes=log.config.segment_bytes,
                           retention_bytes=total - 2 * seg_size)
    assert log.delete_old_segments(now_ms=T0) == 1
    assert log.log_start_offset == 6
    assert log_files(log) == [f"{b:020d}.log" for b in (6, 9, 12)]
    assert not any(log.directory.glob("00000000000000000000.*"))
    assert not any(log.directory.glob("00000000000000000003.*"))
    with pytest.raises(OffsetOutOfRangeError):
        log.read(5, 1000)
    assert slice_of(log.read(6, 10**6))[0] == 0
    log.close()


def test_retention_never_deletes_at_or_above_the_high_watermark(tmp_path) -> None:
    log = make_segments(tmp_path, retention_bytes=0)
    log.update_high_watermark(7)  # inside the third segment [6, 9)
    assert log.delete_old_segments(now_ms=T0) == 2
    assert [s.base_offset for s in log.segments] == [6, 9, 12]
    assert log.log_start_offset == 6
    log.update_high_watermark(9)  # the third segment's upper bound is 9: now deletable
    assert log.delete_old_segments(now_ms=T0) == 1
    assert log.log_start_offset == 9
    log.close()


def test_retention_deleting_everything_rolls_the_active_segment(tmp_path) -> None:
    log = make_segments(tmp_path, n_segments=2, retention_bytes=0)
    log.update_high_watermark(log.log_end_offset)
    assert log.delete_old_segments(now_ms=T0) == 2
    assert [s.base_offset for s in log.segments] == [6]
    assert log.active_segment.size == 0
    assert log.log_start_offset == log.log_end_offset == 6
    assert log_files(log) == ["00000000000000000006.log"]
    assert log.read(6, 100).slices == []
    with pytest.raises(OffsetOutOfRangeError):
        log.read(5, 100)
    # an empty active segment is never deleted
    assert log.delete_old_segments(now_ms=T0) == 0
    info = log.append(kbatch([b"after"]))
    assert info.first_offset == 6
    log.close()
    reopened = PartitionLog.open(tmp_path / "topic-0", LogConfig(), clean_shutdown=True,
                                 log_start_offset=6)
    assert (reopened.log_start_offset, reopened.log_end_offset) == (6, 7)
    reopened.close()


def test_retention_by_time(tmp_path) -> None:
    log = make_segments(tmp_path, retention_ms=10_000)
    log.update_high_watermark(log.log_end_offset)
    # segment i's largest timestamp is T0 + i*1000; deletable when now - largest > retention.ms
    assert log.delete_old_segments(now_ms=T0 + 10_000) == 0
    assert log.delete_old_segments(now_ms=T0 + 11_001) == 2
    assert [s.base_offset for s in log.segments] == [6, 9, 12]
    assert log.log_start_offset == 6
    assert log.offset_for_timestamp(-2) == (6, -1)
    assert log.delete_old_segments(now_ms=T0 + 100_000) == 3
    assert log.log_start_offset == log.log_end_offset == 15
    assert len(log.segments) == 1 and log.active_segment.size == 0
    log.close()


def test_retention_disabled(tmp_path) -> None:
    log = make_segments(tmp_path, retention_ms=-1, retention_bytes=-1)
    log.update_high_watermark(log.log_end_offset)
    assert log.delete_old_segments(now_ms=T0 + 10**12) == 0
    log.close()
    log = make_segments(tmp_path / "c", retention_ms=1, retention_bytes=0, cleanup_policy="compact")
    log.update_high_watermark(log.log_end_offset)
    assert log.delete_old_segments(now_ms=T0 + 10**12) == 0
    assert len(log.segments) == 5
    log.close()


def test_delete_records_before(tmp_path) -> None:
    log = make_segments(tmp_path)
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records_before(1)  # above the HW (0)
    log.update_high_watermark(log.log_end_offset)
    assert log.delete_records_before(4) == 4
    assert log.log_start_offset == 4
    # the first segment ends at 3 < 4: deleted; the second one holds the log start
    assert [s.base_offset for s in log.segments] == [3, 6, 9, 12]
    assert not (log.directory / "00000000000000000000.log").exists()
    for off in (0, 3):
        with pytest.raises(OffsetOutOfRangeError):
            log.read(off, 1000)
    res = log.read(4, 10**6)
    assert res.log_start_offset == 4
    # reading at the log start returns the batch containing it
    assert base_offset(split_batches(res.slices[0].read())[0][1]) == 4
    assert log.offset_for_timestamp(-2) == (4, -1)
    assert log.delete_records_before(2) == 4  # never moves backwards
    with pytest.raises(OffsetOutOfRangeError):
        log.delete_records_before(16)
    assert log.delete_records_before(15) == 15
    assert log.log_start_offset == 15
    log.close()


def test_file_slice_survives_segment_deletion(tmp_path) -> None:
    log = make_segments(tmp_path, retention_bytes=0)
    log.update_high_watermark(log.log_end_offset)
    res = log.read(0, 10**6)
    sl = res.slices[0]
    expected = (log.directory / "00000000000000000000.log").read_bytes()
    assert sl.read() == expected
    assert log.delete_old_segments(now_ms=T0) == 5
    assert not (log.directory / "00000000000000000000.log").exists()
    # the slice's handle keeps the descriptor (and the unlinked inode) alive
    assert sl.fd >= 0
    assert os.fstat(sl.fd).st_nlink == 0
    assert sl.read() == expected
    assert os.pread(sl.fd, sl.length, sl.position) == expected
    log.close()
    assert sl.read() == expected


# -- truncation -----------------------------------------------------------------------------------


def test_truncate_to_batch_boundary_in_active_segment(tmp_path) -> None:
    log = open_log(tmp_path, index_interval_bytes=0)
    for n in [2, 3, 1, 4]:
        log.append(kbatch([b"t"] * n, [T0 + n] * n))
    log.update_high_watermark(10)
    log.flush()
    rows = batch_rows(log.active_segment.log_path)
    log.truncate_to(5)
    assert log.log_end_offset == 5
    assert log.high_watermark == 5 and log.recovery_point == 5
    assert os.path.getsize(log.active_segment.log_path) == rows[2][0]
    assert [r[0] for r in all_records(log.directory)] == list(range(5))
    info = log.append(kbatch([b"new"]))
    assert info.first_offset == 5
    log.close()
    _, index_path, _ = segment_paths(log.directory, 0)
    assert offset_index_entries(index_path, 0) == [(4, rows[1][0]), (5, rows[2][0])]
    assert [r[3] for r in all_records(log.directory)] == [b"t"] * 5 + [b"new"]


def test_truncate_to_across_segments(tmp_path) -> None:
    log = make_segments(tmp_path)
    log.update_high_watermark(log.log_end_offset)
    log.truncate_to(6)  # a segment base: it and everything after goes
    assert [s.base_offset for s in log.segments] == [0, 3]
    assert log.log_end_offset == 6
    assert log_files(log) == ["00000000000000000000.log", "00000000000000000003.log"]
    log.truncate_to(4)  # inside an old segment, at a batch boundary
    assert log.log_end_offset == 4
    assert log.active_segment.base_offset == 3
    info = log.append(kbatch([b"z" * 100], [T0]))
    assert info.first_offset == 4
    log.close()
    reopened = PartitionLog.open(tmp_path / "topic-0", LogConfig(), clean_shutdown=True)
    assert reopened.log_end_offset == 5
    assert [r[0] for r in all_records(reopened.directory)] == list(range(5))
    reopened.close()


def test_truncate_to_zero_and_beyond_leo(tmp_path) -> None:
    log = make_segments(tmp_path, n_segments=2)
    log.truncate_to(100)  # at or beyond the LEO: nothing happens
    assert log.log_end_offset == 6
    log.truncate_to(0)
    assert log.log_end_offset == 0
    assert [s.base_offset for s in log.segments] == [0]
    assert log.append(kbatch([b"again"])).first_offset == 0
    log.close()
    assert [r[3] for r in all_records(log.directory)] == [b"again"]


def test_truncate_to_mid_batch_drops_the_batch(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(kbatch([b"a", b"b", b"c"]))
    log.append(kbatch([b"d"]))
    log.truncate_to(1)
    leo = log.log_end_offset
    log.close()
    assert leo <= 1
    assert all(r[0] < 1 for r in all_records(log.directory))


def test_truncate_to_keeps_the_true_max_timestamp(tmp_path) -> None:
    log = open_log(tmp_path, index_interval_bytes=10**6)  # no index entries
    for ts in [100, 500, 200, 300]:
        log.append(kbatch([b"v"], [T0 + ts]))
    log.truncate_to(3)  # a batch boundary: timestamps 100, 500, 200 remain
    try:
        assert log.active_segment.max_timestamp_so_far == T0 + 500
        assert log.offset_for_timestamp(T0 + 400) == (1, T0 + 500)
        assert log.offset_for_timestamp(-3) == (1, T0 + 500)
    finally:
        log.close()


# -- validation -----------------------------------------------------------------------------------


def test_message_too_large(tmp_path) -> None:
    small = kbatch([b"ok"])
    big = kbatch([b"x" * 2000])
    log = open_log(tmp_path, max_message_bytes=len(big) - 1)
    log.append(small)
    size_before = os.path.getsize(log.active_segment.log_path)
    with pytest.raises(RecordTooLargeError) as exc:
        log.append(big)
    assert exc.value.code == 10  # MESSAGE_TOO_LARGE
    with pytest.raises(RecordTooLargeError):
        log.append(small + big + small)  # one oversized batch fails the whole append
    assert os.path.getsize(log.active_segment.log_path) == size_before
    assert log.log_end_offset == 1
    log.close()
    # exactly max.message.bytes is allowed (LogValidator: size > maxMessageSize fails)
    log = open_log(tmp_path / "b", max_message_bytes=len(big))
    assert log.append(big).last_offset == 0
    log.close()


def corrupt_crc(batch: bytes) -> bytes:
    b = bytearray(batch)
    b[-1] ^= 0x01
    return bytes(b)


@pytest.mark.parametrize(
    "bad",
    [
        lambda b: corrupt_crc(b),                                   # record byte flipped
        lambda b: b[:17] + bytes([b[17] ^ 0x80]) + b[18:],          # CRC byte flipped
        lambda b: b[:16] + b"\x01" + b[17:],                        # magic 1
        lambda b: b[:-1],                                           # truncated batch
        lambda b: b[:8] + struct.pack(">i", 40) + b[12:],           # length below the header
        lambda b: b[:30],                                           # half a header
    ],
)
def test_corrupt_batch_in_multi_batch_append_appends_nothing(tmp_path, bad) -> None:
    log = open_log(tmp_path)
    log.append(kbatch([b"before"]))
    path = log.active_segment.log_path
    size_before = os.path.getsize(path)
    good = kbatch([b"g1", b"g2"])
    payload = good + bad(kbatch([b"victim", b"v2"])) + good
    with pytest.raises(CorruptRecordError):
        log.append(payload)
    assert os.path.getsize(path) == size_before
    assert log.log_end_offset == 1
    assert log.append(good).first_offset == 1
    log.close()
    assert [r[3] for r in all_records(log.directory)] == [b"before", b"g1", b"g2"]


def test_record_count_mismatch_rejected_when_validating(tmp_path) -> None:
    # LogValidator.validateBatch: lastOffsetDelta + 1 must equal the record count
    b = bytearray(kbatch([b"a", b"b", b"c"]))
    struct.pack_into(">i", b, 23, 5)
    struct.pack_into(">I", b, 17, crc32c.crc32c(bytes(b[21:])))
    log = open_log(tmp_path)
    with pytest.raises(CorruptRecordError):
        log.append(bytes(b))
    with pytest.raises(CorruptRecordError):
        log.append(b"")
    assert log.log_end_offset == 0
    assert os.path.getsize(log.active_segment.log_path) == 0
    log.close()


# -- LogAppendTime ------------------------------------------------------------------------------


def test_log_append_time_rewrites_attributes_max_timestamp_and_crc(tmp_path) -> None:
    now = T0 + 123_456
    log = open_log(tmp_path, message_timestamp_type="LogAppendTime")
    sent = [kbatch([b"a", b"b"], [T0, T0 + 5]),
            kbatch([b"c"] * 3, [T0 - 7] * 3, compression=1),
            kbatch([b"d"], [T0 + 999_999])]
    info = log.append(b"".join(sent), now_ms=now)
    assert info.log_append_time == now
    assert info.max_timestamp == now
    log.close()
    stored = log_batches(log.active_segment.log_path)
    assert len(stored) == 3
    for (_, s), b in zip(stored, sent, strict=True):
        assert attributes(s) == attributes(b) | 0x08          # timestamp type bit 3
        assert max_timestamp(s) == now
        assert s[27:35] == b[27:35]                          # baseTimestamp untouched
        assert s[43:] == b[43:]                              # producer fields and records untouched
        assert crc_ok(s)                                     # CRC recomputed (crc32c package)
        recs = decode(s)                                     # kafka-python validates CRC too
        assert all(ts == now for _, ts, _, _ in recs)
    reopened = PartitionLog.open(tmp_path / "topic-0", log.config, clean_shutdown=True)
    assert reopened.offset_for_timestamp(T0) == (0, now)
    assert reopened.offset_for_timestamp(now) == (0, now)
    assert reopened.offset_for_timestamp(now + 1) is None
    assert reopened.offset_for_timestamp(-3) == (0, now)
    reopened.close()


def test_create_time_keeps_client_timestamps(tmp_path) -> None:
    log = open_log(tmp_path)
    b = kbatch([b"a", b"b"], [T0, T0 + 5])
    info = log.append(b, now_ms=T0 + 10**6)
    assert info.log_append_time == -1
    assert info.max_timestamp == T0 + 5
    log.close()
    (_, s), = log_batches(log.active_segment.log_path)
    assert s[16:] == b[16:]
    assert [r[1] for r in decode(s)] == [T0, T0 + 5]


# -- flush --------------------------------------------------------------------------------------


@pytest.fixture
def fsyncs(monkeypatch):
    """Count os.fdatasync calls (the real call still happens)."""
    calls = []
    real = os.fdatasync

    def counting(fd):
        calls.append(fd)
        return real(fd)

    monkeypatch.setattr(os, "fdatasync", counting)
    return calls


def test_flush_moves_recovery_point_to_leo(tmp_path, fsyncs) -> None:
    log = open_log(tmp_path)
    assert log.recovery_point == 0
    assert log.flush() is False  # nothing to flush
    for _ in range(3):
        log.append(kbatch([b"f", b"g"]))
    assert log.recovery_point == 0 and fsyncs == []
    assert log.flush() is True
    assert log.recovery_point == log.log_end_offset == 6
    assert len(fsyncs) == 1
    assert log.flush() is False  # nothing new
    assert log.flush(up_to=3) is False
    assert len(fsyncs) == 1
    log.append(kbatch([b"h"]))
    assert log.flush(up_to=100) is True  # clamped to the LEO
    assert log.recovery_point == 7
    log.close()


def test_flush_up_to_returns_once_covered(tmp_path, fsyncs) -> None:
    log = open_log(tmp_path)
    for _ in range(3):
        log.append(kbatch([b"f"]))
    assert log.flush(up_to=2) is True
    assert log.recovery_point >= 2
    assert log.flush(up_to=1) is False
    log.close()


def test_flush_covers_everything_written_before_it(tmp_path, fsyncs) -> None:
    log = open_log(tmp_path)
    for _ in range(3):
        log.append(kbatch([b"f"]))
    assert log.flush(up_to=1) is True  # the fsync made offsets 0..2 durable
    try:
        assert log.flush(up_to=3) is False
        assert len(fsyncs) == 1
    finally:
        log.close()


def test_concurrent_flushers_all_covered(tmp_path, fsyncs) -> None:
    n = 8
    log = open_log(tmp_path)
    writer = threading.Lock()      # one writer at a time, as in a partition worker
    barrier = threading.Barrier(n)
    results: list[tuple[int, int, bool]] = []
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            with writer:
                info = log.append(kbatch([b"w%d" % i]))
            barrier.wait(timeout=20)
            ran = log.flush(up_to=info.last_offset + 1)
            results.append((info.last_offset + 1, log.recovery_point, ran))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len(results) == n
    for needed, rp_at_return, _ in results:
        assert rp_at_return >= needed
    assert 1 <= len(fsyncs) <= n
    assert sum(ran for _, _, ran in results) == len(fsyncs)
    assert log.recovery_point == log.log_end_offset == n
    log.close()


def test_flush_messages_triggers_flush(tmp_path, fsyncs) -> None:
    log = open_log(tmp_path, flush_messages=3)
    log.append(kbatch([b"1"]))
    log.append(kbatch([b"2"]))
    assert log.recovery_point == 0 and fsyncs == []
    log.append(kbatch([b"3"]))
    assert log.recovery_point == 3 and len(fsyncs) == 1
    log.append(kbatch([b"4", b"5", b"6", b"7"]))  # 4 messages at once: due immediately
    assert log.recovery_point == 7 and len(fsyncs) == 2
    assert log.unflushed_messages == 0
    log.close()


def test_flush_ms_via_maybe_flush(tmp_path, fsyncs) -> None:
    log = open_log(tmp_path, flush_ms=60_000)
    now = int(time.time() * 1000)
    log.append(kbatch([b"1"]), now_ms=now)
    assert log.recovery_point == 0
    log.maybe_flush(now_ms=now + 30_000)
    assert log.recovery_point == 0 and fsyncs == []
    log.maybe_flush(now_ms=now + 61_000)
    assert log.recovery_point == 1 and len(fsyncs) == 1
    log.maybe_flush(now_ms=now + 200_000)  # nothing unflushed: no fsync
    assert len(fsyncs) == 1
    log.close()


def test_close_flushes(tmp_path, fsyncs) -> None:
    log = open_log(tmp_path)
    log.append(kbatch([b"1"]))
    log.close()
    assert log.recovery_point == 1 and len(fsyncs) == 1
    with pytest.raises(ValueError):
        log.append(kbatch([b"2"]))


# -- leader-epoch checkpoint: written when an epoch starts, durable at the next flush -------------


def _epoch_file(log: PartitionLog) -> list[tuple[int, int]]:
    """The leader-epoch-checkpoint on disk, parsed here (version, count, "epoch offset" lines)."""
    lines = (log.directory / "leader-epoch-checkpoint").read_text().splitlines()
    assert lines[0] == "0" and int(lines[1]) == len(lines) - 2, lines
    return [(int(e), int(o)) for e, o in (line.split() for line in lines[2:])]


def _append_epochs(log: PartitionLog, epochs: list[int]) -> None:
    for i, epoch in enumerate(epochs):
        log.append(kbatch([b"v%d" % i, b"w%d" % i], [T0 + i, T0 + i]), leader_epoch=epoch)


def test_a_new_epoch_is_written_by_flush_not_by_the_append(tmp_path, monkeypatch) -> None:
    # KAFKA-15046: no fsync on the append path; here no file write either (it was the first
    # append's largest cost): flush writes the entries and makes them durable before the
    # recovery point passes the batches that start them.
    from shmq.storage import checkpoint

    log = open_log(tmp_path)
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(checkpoint.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    path = log.directory / "leader-epoch-checkpoint"
    before = path.read_bytes() if path.exists() else None
    _append_epochs(log, [0, 0, 2, 5])
    assert synced == []
    assert log.epoch_entries == [(0, 0), (2, 4), (5, 6)]
    assert (path.read_bytes() if path.exists() else None) == before  # not touched
    assert not path.with_name(path.name + ".tmp").exists()
    assert log.flush()
    assert len(synced) >= 2  # the file and its directory
    assert _epoch_file(log) == [(0, 0), (2, 4), (5, 6)]
    assert log.recovery_point == 8
    synced.clear()
    _append_epochs(log, [5])  # no new epoch: nothing written
    assert log.flush() and synced == []
    log.close()


@pytest.mark.parametrize("stale", ["missing", "older", "intact"])
def test_recovery_rebuilds_epochs_the_checkpoint_lacks(tmp_path, stale: str) -> None:
    """A crash after appends that started epochs but before a flush: the checkpoint on disk may
    lack them (or be gone); recovery rebuilds them from the recovered batches' headers."""
    log = open_log(tmp_path)
    _append_epochs(log, [0, 1])
    assert log.flush()  # (0, 0), (1, 2) durable; recovery point 4
    _append_epochs(log, [1, 3, 3, 4])  # starts epochs 3 (offset 6) and 4 (offset 10): unflushed
    want = [(0, 0), (1, 2), (3, 6), (4, 10)]
    assert log.epoch_entries == want
    rp = log.recovery_point
    log.crash_close()
    path = tmp_path / "topic-0" / "leader-epoch-checkpoint"
    if stale == "missing":
        path.unlink()
        (tmp_path / "topic-0" / "shmq-recovery-point").unlink()  # never flushed: no record
    elif stale == "older":
        path.write_text("0\n2\n0 0\n1 2\n")
    # "missing": a new log never flushed (its first epoch's write lost): recovery point 0
    reopened = PartitionLog.open(tmp_path / "topic-0", LogConfig(),
                                 recovery_point=0 if stale == "missing" else rp,
                                 clean_shutdown=False)
    try:
        assert reopened.log_end_offset == 12
        assert reopened.epoch_entries == want
        assert _epoch_file(reopened) == want
        assert reopened.leader_epoch == 4
    finally:
        reopened.close()


def test_end_offset_for_epoch_follows_leader_epoch_file_cache(tmp_path) -> None:
    """LeaderEpochFileCache.endOffsetFor, which OffsetForLeaderEpoch answers and Fetch's
    diverging-epoch check (KIP-595) uses."""
    log = open_log(tmp_path)
    _append_epochs(log, [1] * 5 + [3] * 7 + [4] * 3)  # two records a batch
    assert log.epoch_entries == [(1, 0), (3, 10), (4, 24)] and log.log_end_offset == 30
    assert log.end_offset_for_epoch(-1) == (-1, -1)           # UNDEFINED_EPOCH
    assert log.end_offset_for_epoch(4) == (4, 30)             # the latest: the LEO
    assert log.end_offset_for_epoch(3) == (3, 24)             # where epoch 4 starts
    assert log.end_offset_for_epoch(2) == (1, 10)             # floor 1, ends where 3 starts
    assert log.end_offset_for_epoch(0) == (0, 0)              # older than all: first start
    assert log.end_offset_for_epoch(5) == (-1, -1)            # newer than any
    # the leader's current epoch starts at the LEO before any batch of it (makeLeader)
    assert log.end_offset_for_epoch(4, current_epoch=6) == (4, 30)
    assert log.end_offset_for_epoch(5, current_epoch=6) == (4, 30)
    assert log.end_offset_for_epoch(6, current_epoch=6) == (6, 30)
    assert log.end_offset_for_epoch(7, current_epoch=6) == (-1, -1)
    log.close()


def test_flush_starts_the_writeback_of_each_new_byte_once(tmp_path, monkeypatch) -> None:
    """Before it waits for the flush lock (held by an fsync of earlier appends: here by the
    test), a flush starts the disk writes of every byte appended since the previous start
    (``disk.start_writeback``), across rolls, each byte once; one that finds everything durable
    starts nothing, and so does one that finds the lock free (its fdatasync starts them at
    once: a start first would be a system call for nothing).  Checked against the files'
    sizes."""
    import threading

    from shmq.storage import disk

    started: list[tuple[str, int, int]] = []
    real = disk.start_writeback

    def recording(fd: int, offset: int, length: int) -> bool:
        started.append((os.readlink(f"/proc/self/fd/{fd}"), offset, length))
        return real(fd, offset, length)

    def flush_behind_the_lock() -> bool:
        results: list[bool] = []
        log._flush_lock.acquire()
        t = threading.Thread(target=lambda: results.append(log.flush()))
        t.start()
        deadline = time.monotonic() + 10
        while len(started) == before and time.monotonic() < deadline:
            time.sleep(0.001)  # the waiting flush started the writes first
        log._flush_lock.release()
        t.join(10)
        return results[0]

    monkeypatch.setattr(disk, "start_writeback", recording)
    log = open_log(tmp_path, segment_bytes=3000)
    for _ in range(40):
        log.append(kbatch([b"v" * 100]))
    assert len(log.segments) > 2  # rolled
    before = len(started)
    assert flush_behind_the_lock() is True
    assert log.flush() is False  # nothing new: nothing started
    for _ in range(3):
        log.append(kbatch([b"w" * 100]))
    before = len(started)
    assert flush_behind_the_lock() is True
    covered: dict[str, list[tuple[int, int]]] = {}
    for path, offset, length in started:
        covered.setdefault(path, []).append((offset, offset + length))
    for seg in log.segments:
        spans = sorted(covered.get(str(seg.log_path), []))
        assert spans and spans[0][0] == 0, seg
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False)), spans  # once
        assert spans[-1][1] == os.path.getsize(seg.log_path)
    n = len(started)
    log.append(kbatch([b"x" * 100]))
    assert log.flush() is True  # the lock free: fdatasync alone
    assert len(started) == n, started[n:]
    log.append(kbatch([b"y" * 100]))  # and a later start begins after the bytes it wrote
    log.start_writeback()
    last = log.segments[-1]
    assert started[n:] == [(str(last.log_path), os.path.getsize(last.log_path) - len(
        kbatch([b"y" * 100])), len(kbatch([b"y" * 100])))], started[n:]
    log.close()
