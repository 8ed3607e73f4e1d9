"""Segments on disk: appended bytes, offset assignment, index entries, rolling, trimming.

Oracles: kafka-python builds the batches, the ``crc32c`` package checks CRCs, kafka-python decodes
the stored records, and the index files are parsed with ``struct`` (``_storage_util``).
"""

from __future__ import annotations

import os
import random
import time

import pytest
from _storage_util import (
    all_records,
    attributes,
    base_offset,
    batch_rows,
    crc_ok,
    decode,
    expected_indexes,
    kbatch,
    last_offset,
    leader_epoch,
    log_batches,
    offset_index_entries,
    time_index_entries,
)

from shmq.errors import CorruptIndexError
from shmq.storage import LogConfig, PartitionLog
from shmq.storage.layout import segment_paths

T0 = 1_700_000_000_000


def open_log(tmp_path, **cfg) -> PartitionLog:
    return PartitionLog.open(tmp_path / "topic-0", LogConfig(**cfg))


def seg_files(log: PartitionLog, i: int = -1):
    return segment_paths(log.directory, log.segments[i].base_offset)


def same_except_offset_and_epoch(stored: bytes, sent: bytes) -> bool:
    """Byte-identical except baseOffset (0..8) and partitionLeaderEpoch (12..16)."""
    return len(stored) == len(sent) and stored[8:12] == sent[8:12] and stored[16:] == sent[16:]


# -- appending ------------------------------------------------------------------------------------


def test_append_assigns_contiguous_offsets_from_zero(tmp_path) -> None:
    log = open_log(tmp_path)
    counts = [1, 3, 5, 1, 2]
    sent = [kbatch([b"v%d" % j for j in range(n)]) for n in counts]
    expected_first = 0
    for n, batch in zip(counts, sent, strict=True):
        info = log.append(batch, leader_epoch=4)
        assert (info.first_offset, info.last_offset) == (expected_first, expected_first + n - 1)
        assert info.batch_count == 1 and info.size == len(batch)
        expected_first += n
    assert log.log_end_offset == sum(counts)
    log.close()
    stored = log_batches(seg_files(log)[0])
    assert [base_offset(b) for _, b in stored] == [0, 1, 4, 9, 10]
    assert [last_offset(b) for _, b in stored] == [0, 3, 8, 9, 11]
    for (_, s), b in zip(stored, sent, strict=True):
        assert same_except_offset_and_epoch(s, b)
        assert leader_epoch(s) == 4
        assert crc_ok(s)  # the CRC does not cover baseOffset and epoch: still valid
    assert [r[0] for r in all_records(log.directory)] == list(range(12))


def test_multi_batch_append_in_one_call(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(kbatch([b"first"]), leader_epoch=2)
    sent = [
        kbatch([b"a", b"b"], [T0, T0 + 1]),
        kbatch([b"x" * 300] * 4, [T0 + 5] * 4, compression=1),  # gzip, stored as sent
        kbatch([None], [T0 - 100], key=b"k"),
        kbatch([b"c%d" % i for i in range(10)], [T0 + 50 - i for i in range(10)]),
    ]
    assert attributes(sent[1]) & 0x07 == 1
    info = log.append(b"".join(sent), leader_epoch=3)
    assert (info.first_offset, info.last_offset, info.batch_count) == (1, 17, 4)
    assert info.size == sum(len(b) for b in sent)
    assert info.max_timestamp == T0 + 50
    assert info.offset_of_max_timestamp == 17
    assert log.log_end_offset == 18
    log.close()
    stored = log_batches(seg_files(log)[0])
    assert len(stored) == 5
    assert [base_offset(b) for _, b in stored] == [0, 1, 3, 7, 8]
    assert [leader_epoch(b) for _, b in stored] == [2, 3, 3, 3, 3]
    for (_, s), b in zip(stored[1:], sent, strict=True):
        assert same_except_offset_and_epoch(s, b)
        assert crc_ok(s)
    recs = all_records(log.directory)
    assert [r[0] for r in recs] == list(range(18))
    assert [r[3] for r in recs[1:3]] == [b"a", b"b"]
    assert [r[3] for r in recs[3:7]] == [b"x" * 300] * 4
    assert recs[7][2:] == (b"k", None)
    assert [r[1] for r in recs[8:]] == [T0 + 50 - i for i in range(10)]


def test_stored_file_is_exactly_the_concatenated_batches(tmp_path) -> None:
    log = open_log(tmp_path)
    rng = random.Random(3)
    sent = [kbatch([rng.randbytes(rng.randrange(0, 400)) for _ in range(rng.randrange(1, 6))])
            for _ in range(40)]
    for b in sent:
        log.append(b, leader_epoch=0)
    log.close()
    data = seg_files(log)[0].read_bytes()
    assert len(data) == sum(len(b) for b in sent)
    stored = log_batches(seg_files(log)[0])
    pos = 0
    for (p, s), b in zip(stored, sent, strict=True):
        assert p == pos
        assert same_except_offset_and_epoch(s, b)
        assert crc_ok(s)
        pos += len(b)


# -- the index rule -------------------------------------------------------------------------------


def test_index_entry_rule_by_hand(tmp_path) -> None:
    # LogSegment.append: an entry for a batch when bytesSinceLastIndexEntry (before the batch)
    # > indexIntervalBytes; entry = (batch lastOffset, batch position); then the counter resets
    size = len(kbatch([b"y" * 100], [T0]))
    log = open_log(tmp_path, index_interval_bytes=size)  # "exceeds", not "reaches"
    for i in range(7):
        log.append(kbatch([b"y" * 100], [T0 + i]))
    log.close()
    log_path, index_path, time_path = seg_files(log, 0)
    assert [p for p, _ in log_batches(log_path)] == [i * size for i in range(7)]
    # counter before batch i: 0, S, 2S -> entry, S, 2S -> entry, S, 2S -> entry
    assert offset_index_entries(index_path, 0) == [(2, 2 * size), (4, 4 * size), (6, 6 * size)]
    assert time_index_entries(time_path, 0) == [(T0 + 2, 2), (T0 + 4, 4), (T0 + 6, 6)]


def test_index_entry_rule_interval_one_below_batch_size(tmp_path) -> None:
    size = len(kbatch([b"y" * 10], [T0]))
    log = open_log(tmp_path, index_interval_bytes=size - 1)
    for _ in range(5):
        log.append(kbatch([b"y" * 10], [T0]))  # equal timestamps: one time index entry
    log.close()
    _, index_path, time_path = seg_files(log, 0)
    assert offset_index_entries(index_path, 0) == [(i, i * size) for i in range(1, 5)]
    assert time_index_entries(time_path, 0) == [(T0, 0)]


@pytest.mark.parametrize("interval", [0, 150, 1000, 4096])
def test_index_entries_match_kafka_oracle(tmp_path, interval: int) -> None:
    rng = random.Random(interval)
    log = open_log(tmp_path, index_interval_bytes=interval, segment_index_bytes=1 << 16)
    for _ in range(120):
        n = rng.randrange(1, 5)
        stamps = [T0 + rng.randrange(-5000, 5000) for _ in range(n)]
        batch = kbatch([rng.randbytes(rng.randrange(0, 300)) for _ in range(n)], stamps)
        if rng.random() < 0.2:
            batch += kbatch([b"m"], [T0 + rng.randrange(-5000, 5000)])  # two batches, one call
        log.append(batch)
    # while active, the preallocated files hold the entries followed by zeros (a new log's
    # first index files from its first flush on: index_file.py)
    log.flush()
    log_path, index_path, time_path = seg_files(log, 0)
    offsets, times = expected_indexes(batch_rows(log_path), interval)
    seg = log.active_segment
    assert seg.offset_index.entries == len(offsets)
    assert offset_index_entries(index_path, 0)[: len(offsets)] == offsets
    assert time_index_entries(time_path, 0)[: len(times)] == times
    log.close()
    # on close the final (max timestamp, offset of max) entry goes into the time index
    rows = batch_rows(log_path)
    max_ts = max(r[2] for r in rows)
    off_of_max = next(r[1] for r in rows if r[2] == max_ts)
    if not times or times[-1][0] < max_ts:
        times.append((max_ts, off_of_max))
    assert offset_index_entries(index_path, 0) == offsets
    assert time_index_entries(time_path, 0) == times
    assert os.path.getsize(index_path) == 8 * len(offsets)
    assert os.path.getsize(time_path) == 12 * len(times)


def test_translate_offset_finds_the_containing_batch(tmp_path) -> None:
    for interval in (0, 10**6):
        log = open_log(tmp_path / str(interval), index_interval_bytes=interval)
        for n in [3, 1, 4, 1, 5, 9, 2, 6]:
            log.append(kbatch([b"v"] * n))
        seg = log.active_segment
        rows = batch_rows(seg_files(log)[0])
        first = 0
        for pos, last, _, size in rows:
            for off in range(first, last + 1):
                h = seg.translate_offset(off)
                assert (h.position, h.base_offset, h.last_offset, h.size) == (pos, first, last, size)
            first = last + 1
        assert seg.translate_offset(first) is None  # past the end
        log.close()


def test_translate_offset_at_indexed_batches_and_cut_ends(tmp_path) -> None:
    """The batch at the index entry is read from its header alone when it holds the offset;
    whatever the index density and wherever ``end_position`` cuts, the answer is the containing
    batch when it ends at or before the end, else None, and a garbled header at an indexed
    position is not trusted (the walk's answer, None)."""
    for interval in (0, 100, 10**6):
        log = open_log(tmp_path / str(interval), index_interval_bytes=interval)
        for n in [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]:
            log.append(kbatch([b"value-%d" % n] * n))
        seg = log.active_segment
        rows = batch_rows(seg_files(log)[0])
        first = 0
        for pos, last, _, size in rows:
            for off in range(first, last + 1):
                for end in (pos + size, pos + size - 1, pos + 61, pos + 60, seg.size):
                    h = seg.translate_offset(off, end_position=end)
                    if pos + size <= end:
                        assert (h.position, h.base_offset, h.last_offset, h.size) == (
                            pos, first, last, size), (interval, off, end)
                    else:
                        assert h is None, (interval, off, end, h)
            first = last + 1
        log.close()
    log = open_log(tmp_path / "garbled", index_interval_bytes=0)  # every batch indexed
    for n in (2, 3):
        log.append(kbatch([b"v"] * n))
    log.flush()
    seg = log.active_segment
    (pos, _, _, _), _ = batch_rows(seg_files(log)[0])
    assert seg.translate_offset(0).position == pos
    with open(seg.log_path, "r+b") as f:  # magic 2 -> 7
        f.seek(pos + 16)
        f.write(b"\x07")
    assert seg.translate_offset(0) is None
    log.close()


def test_header_walk_handles_big_batches_and_many_small_ones(tmp_path) -> None:
    # batches larger than the 64 KiB read window, and more small batches per window than the
    # scanner's row buffer holds
    rng = random.Random(21)
    log = open_log(tmp_path, index_interval_bytes=10**9)
    for _ in range(1500):
        big = rng.random() < 0.01
        log.append(kbatch([rng.randbytes(rng.randrange(65_000, 150_000)) if big else b"t"]))
    seg = log.active_segment
    rows = batch_rows(seg.log_path)
    assert max(r[3] for r in rows) > 64 * 1024
    # single-record batches: batch i holds offset i
    probes = {i for i, r in enumerate(rows) if r[3] > 64 * 1024}
    probes |= {i + 1 for i in probes if i + 1 < len(rows)} | set(range(0, len(rows), 37))
    probes |= set(range(len(rows) - 3, len(rows)))
    for i in sorted(probes):
        pos, last, _, size = rows[i]
        h = seg.translate_offset(i)
        assert (h.position, h.base_offset, h.last_offset, h.size) == (pos, i, last, size)
    log.update_high_watermark(log.log_end_offset)
    res = log.read(rows[-1][1], 10**9)
    assert (res.slices[0].position, res.slices[0].length) == (rows[-1][0], rows[-1][3])
    log.close()


# -- rolling --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("slack", "per_segment"), [(0, 3), (-1, 2), (5, 3)])
def test_roll_by_segment_bytes(tmp_path, slack: int, per_segment: int) -> None:
    # LogSegment.shouldRoll: size > segment.bytes - incoming
    size = len(kbatch([b"q" * 200], [T0]))
    log = open_log(tmp_path, segment_bytes=3 * size + slack)
    for _ in range(10):
        log.append(kbatch([b"q" * 200], [T0]))
    bases = [s.base_offset for s in log.segments]
    assert bases == list(range(0, 10, per_segment))
    log.close()
    names = sorted(p.name for p in log.directory.glob("*.log"))
    assert names == [f"{b:020d}.log" for b in bases]
    for b in bases:
        assert os.path.getsize(log.directory / f"{b:020d}.log") <= 3 * size + slack
    assert [r[0] for r in all_records(log.directory)] == list(range(10))


def test_batch_larger_than_segment_bytes_gets_its_own_segment(tmp_path) -> None:
    log = open_log(tmp_path, segment_bytes=1024)
    log.append(kbatch([b"s"]))
    log.append(kbatch([b"L" * 4000]))  # never split; an empty segment is never rolled
    log.append(kbatch([b"s"]))
    assert [s.base_offset for s in log.segments] == [0, 1, 2]
    log.close()


def test_roll_by_segment_ms_wall_clock(tmp_path) -> None:
    log = open_log(tmp_path, segment_ms=1000)
    now = int(time.time() * 1000)
    log.append(kbatch([b"a"], [now]), now_ms=now)
    log.append(kbatch([b"b"], [now + 500]), now_ms=now + 500)
    assert len(log.segments) == 1
    log.append(kbatch([b"c"], [now + 5000]), now_ms=now + 5000)
    assert [s.base_offset for s in log.segments] == [0, 2]
    log.close()


def test_roll_by_segment_ms_follows_record_timestamps(tmp_path) -> None:
    # Kafka: timeWaitedForRoll = incoming maxTimestamp - first batch's maxTimestamp (when set)
    log = open_log(tmp_path, segment_ms=1000)
    t = 1_000_000_000_000  # a clock that is not the wall clock (2001)
    log.append(kbatch([b"a"], [t]), now_ms=t)
    log.append(kbatch([b"b"], [t + 5000]), now_ms=t + 5000)
    try:
        assert [s.base_offset for s in log.segments] == [0, 1]
    finally:
        log.close()


def test_roll_when_time_index_is_full(tmp_path) -> None:
    # 48 bytes: offset index 6 entries, time index 4 entries.  interval 0: an entry from the
    # second batch on; growing timestamps fill the time index after 5 batches
    log = open_log(tmp_path, segment_index_bytes=48, index_interval_bytes=0)
    for i in range(12):
        log.append(kbatch([b"t"], [T0 + i]))
    assert [s.base_offset for s in log.segments] == [0, 5, 10]
    seg0 = log.segments[0]
    assert seg0.offset_index.entries == 4 and seg0.time_index.entries == 4
    log.close()
    log_path, index_path, time_path = segment_paths(log.directory, 0)
    positions = [row[0] for row in batch_rows(log_path)]
    assert offset_index_entries(index_path, 0) == [(i, positions[i]) for i in range(1, 5)]
    assert time_index_entries(time_path, 0) == [(T0 + i, i) for i in range(1, 5)]


def test_roll_when_offset_index_is_full(tmp_path) -> None:
    # equal timestamps keep the time index at one entry: the offset index (6 entries) fills first
    log = open_log(tmp_path, segment_index_bytes=48, index_interval_bytes=0)
    for _ in range(16):
        log.append(kbatch([b"t"], [T0]))
    assert [s.base_offset for s in log.segments] == [0, 7, 14]
    assert log.segments[0].offset_index.entries == 6
    assert log.segments[0].time_index.entries == 1
    log.close()
    assert [r[0] for r in all_records(log.directory)] == list(range(16))


def test_multi_batch_append_overflowing_the_index_is_all_or_nothing(tmp_path) -> None:
    log = open_log(tmp_path, segment_index_bytes=24, index_interval_bytes=0)
    data = b"".join(kbatch([b"a"], [T0 + i]) for i in range(10))
    try:
        log.append(data)
    except CorruptIndexError:
        pass
    seg = log.active_segment
    on_disk = os.path.getsize(seg.log_path)
    leo = log.log_end_offset
    log.close()
    # either everything was appended, or nothing: the file must match what the log believes
    assert leo in (0, 10)
    assert on_disk == seg.size
    assert [r[0] for r in all_records(log.directory)] == list(range(leo))


def test_roll_trims_indexes_and_close_trims_the_active_ones(tmp_path) -> None:
    # Kafka pitfall 10: preallocated index files are trimmed to entries * entrySize on roll and
    # on close, because Kafka derives the entry count from the file length
    log = open_log(tmp_path, segment_index_bytes=1000, index_interval_bytes=0, segment_bytes=4096)
    for i in range(60):
        log.append(kbatch([b"r" * 100], [T0 + i]))
    assert len(log.segments) > 2
    for i, seg in enumerate(log.segments):
        _, index_path, time_path = seg_files(log, i)
        if seg is log.active_segment:
            assert os.path.getsize(index_path) == 1000 // 8 * 8
            assert os.path.getsize(time_path) == 1000 // 12 * 12
        else:
            assert os.path.getsize(index_path) == seg.offset_index.entries * 8
            assert os.path.getsize(time_path) == seg.time_index.entries * 12
    active = log.active_segment
    _, index_path, time_path = seg_files(log)
    log.close()
    assert os.path.getsize(index_path) == active.offset_index.entries * 8
    assert os.path.getsize(time_path) == active.time_index.entries * 12
    assert active.offset_index.entries > 0 and active.time_index.entries > 0
    for seg_path in log.directory.glob("*.index"):
        assert os.path.getsize(seg_path) % 8 == 0
        entries = offset_index_entries(seg_path, int(seg_path.name[:20]))
        assert entries == sorted(set(entries))


def test_segment_files_are_0600(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(kbatch([b"p"]))
    log.close()
    for path in log.directory.iterdir():
        assert os.stat(path).st_mode & 0o777 == 0o600, path


def test_decoded_records_round_trip(tmp_path) -> None:
    log = open_log(tmp_path)
    values = [b"", b"one", b"x" * 1000, None]
    b = kbatch(values, [T0, T0 + 1, T0 - 1, T0 + 3], key=b"key")
    log.append(kbatch([b"pad"]))
    log.append(b)
    log.close()
    stored = log_batches(seg_files(log)[0])[1][1]
    assert decode(stored) == [(1 + i, t, b"key", v) for i, (t, v) in
                              enumerate(zip([T0, T0 + 1, T0 - 1, T0 + 3], values, strict=True))]
