"""Loading and recovering partition logs (Kafka ``LogLoader``, ``LogSegment.recover``)."""

from __future__ import annotations

import os
import random
import shutil
import struct

import crc32c
import pytest
from _storage_util import (
    all_records,
    base_offset,
    batch_rows,
    crc_ok,
    expected_indexes,
    kbatch,
    log_batches,
    offset_index_entries,
    time_index_entries,
)

from shmq.storage import LogConfig, PartitionLog, recovery_point
from shmq.storage.layout import segment_paths
from shmq.storage.loader import LoadedLog, load_log

T0 = 1_700_000_000_000
CFG = LogConfig(segment_index_bytes=4096, index_interval_bytes=0)


def build(directory, n_segments: int = 4, per_segment: int = 6, *, config: LogConfig = CFG,
          epochs=None) -> PartitionLog:
    """A log of ``n_segments`` segments of ``per_segment`` batches (2 records each), rolled by
    hand so every segment boundary is known: segment i starts at offset i * per_segment * 2."""
    log = PartitionLog.open(directory, config)
    n = 0
    for s in range(n_segments):
        if s:
            log.roll()
        for _ in range(per_segment):
            epoch = epochs[n] if epochs else 0
            log.append(kbatch([b"v%d" % n, b"w" * (n % 37)], [T0 + n * 10, T0 + n * 10 + 3]),
                       leader_epoch=epoch)
            n += 1
    log.update_high_watermark(log.log_end_offset)
    return log


def load(directory, config: LogConfig = CFG, **kw) -> LoadedLog:
    return load_log(directory, config, **kw)


def rebuilt_on_load(directory, config: LogConfig = CFG, **kw) -> list[int]:
    """Load and close ``directory``; the base offsets of the segments whose indexes were rebuilt
    (at load, or at the first use of a lazily opened segment, forced here)."""
    loaded = load(directory, config, **kw)
    try:
        return rebuilt(loaded)
    finally:
        close_loaded(loaded)


def rebuilt(loaded: LoadedLog) -> list[int]:
    """Segments rebuilt by the loader or when first used (every segment is used here)."""
    for seg in loaded.segments:
        seg.ensure_loaded()
    return sorted(set(loaded.rebuilt_segments) | {s.base_offset for s in loaded.segments
                                                   if s.rebuilt})


def forget_record(directory) -> None:
    """Remove the partition's recovery record: recovery then follows Kafka's rule (the whole
    segment holding the checkpointed recovery point and every later one), as for a directory
    written before shmq had records, or whose record was torn."""
    (directory / recovery_point.FILE_NAME).unlink(missing_ok=True)


def close_loaded(loaded: LoadedLog) -> None:
    for seg in loaded.segments:
        seg.close()


def snapshot(directory) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def assert_indexes_follow_the_rule(directory, config: LogConfig = CFG) -> None:
    """Every (trimmed) index equals Kafka's append-time rule run over its .log file."""
    for log_path in sorted(directory.glob("*.log")):
        base = int(log_path.name[:20])
        _, index_path, time_path = segment_paths(directory, base)
        rows = batch_rows(log_path)
        offsets, times = expected_indexes(rows, config.index_interval_bytes)
        if rows:
            max_ts = max(r[2] for r in rows)
            if not times or times[-1][0] < max_ts:
                times.append((max_ts, next(r[1] for r in rows if r[2] == max_ts)))
        assert offset_index_entries(index_path, base) == offsets, log_path.name
        assert time_index_entries(time_path, base) == times, log_path.name


# -- clean shutdown -------------------------------------------------------------------------------


def test_clean_close_and_reopen_keeps_everything_without_recovery(tmp_path) -> None:
    d = tmp_path / "t-0"
    log = build(d)
    records = all_records(d)
    leo = log.log_end_offset
    log.close()
    before = snapshot(d)
    loaded = load(d, clean_shutdown=True, recovery_point=0)
    try:
        assert loaded.rebuilt_segments == []
        assert loaded.truncated_bytes == 0
        assert len(loaded.recovered_batches) == 0
        assert [s.base_offset for s in loaded.segments] == [0, 12, 24, 36]
        assert loaded.segments[-1].next_offset == leo
        assert loaded.recovery_point == leo
        assert loaded.log_start_offset == 0
        assert loaded.segments[-1].active
        assert not any(s.active for s in loaded.segments[:-1])
    finally:
        close_loaded(loaded)
    assert snapshot(d) == before  # nothing rewritten
    assert all_records(d) == records
    assert_indexes_follow_the_rule(d)


def test_clean_reopen_continues_appending_with_the_same_index_rule(tmp_path) -> None:
    d = tmp_path / "t-0"
    build(d, n_segments=2).close()
    log = PartitionLog.open(d, CFG, clean_shutdown=True)
    assert log.log_end_offset == 24
    for i in range(5):
        log.append(kbatch([b"more%d" % i], [T0 + 10**6 + i]))
    log.close()
    assert [r[0] for r in all_records(d)] == list(range(29))
    assert_indexes_follow_the_rule(d)


# -- unclean shutdown -----------------------------------------------------------------------------


@pytest.mark.parametrize(("flush_to", "rebuilt"), [(0, [0, 12, 24, 36]), (13, [12, 24, 36]),
                                                    (24, [24, 36]), (None, [36])])
def test_crash_then_recover_from_the_recovery_point(tmp_path, flush_to, rebuilt) -> None:
    d = tmp_path / "t-0"
    log = build(d)
    records = all_records(d)
    # a flush covers everything appended before it (group commit), so a recovery point in the
    # middle of the log is what an older checkpoint records: pass it as the checkpoint would
    if flush_to is None:
        log.flush()
        rp = log.recovery_point
    else:
        rp = flush_to
    log.crash_close()
    # the crashed active segment's indexes are still preallocated (untrimmed)
    _, index_path, _ = segment_paths(d, 36)
    assert os.path.getsize(index_path) == 4096
    loaded = load(d, clean_shutdown=False, recovery_point=rp)
    try:
        assert loaded.truncated_bytes == 0
        assert loaded.segments[-1].next_offset == 48
        assert loaded.recovery_point == rp  # recovered bytes are valid but not known durable
        if flush_to is None:
            # the flush recorded its byte position: nothing after it to validate
            assert loaded.rebuilt_segments == []
            assert loaded.resumed_at == (36, os.path.getsize(segment_paths(d, 36)[0]))
            assert loaded.validated_bytes == 0 and len(loaded.recovered_batches) == 0
        else:
            assert loaded.rebuilt_segments == rebuilt
            assert loaded.resumed_at is None
            assert int(loaded.recovered_batches[:, 1].min()) == rebuilt[0]
    finally:
        close_loaded(loaded)
    assert all_records(d) == records
    assert_indexes_follow_the_rule(d)


def test_truncated_tail_at_every_byte_of_the_last_batch(tmp_path) -> None:
    pristine = tmp_path / "pristine" / "t-0"
    log = build(pristine, n_segments=2, per_segment=3)
    log.append(kbatch([b"L1", b"L2", b"L3"], [T0 + 5000] * 3), leader_epoch=0)  # ~80 bytes
    log.crash_close()
    log_path = segment_paths(pristine, 6)[0]
    rows = batch_rows(log_path)
    last_pos, end = rows[-1][0], rows[-1][0] + rows[-1][3]
    assert end == os.path.getsize(log_path)
    for cut in range(last_pos, end + 1):
        d = tmp_path / f"cut{cut}" / "t-0"
        shutil.copytree(pristine, d)
        os.truncate(segment_paths(d, 6)[0], cut)
        loaded = load(d, clean_shutdown=False, recovery_point=6)
        try:
            keep = end if cut == end else last_pos
            assert loaded.segments[-1].size == keep, cut
            assert loaded.truncated_bytes == cut - keep, cut
            assert loaded.segments[-1].next_offset == (15 if cut == end else 12), cut
        finally:
            close_loaded(loaded)
        assert os.path.getsize(segment_paths(d, 6)[0]) == keep
        assert [r[0] for r in all_records(d)] == list(range(15 if cut == end else 12))
        shutil.rmtree(d.parent)


def test_zero_filled_tail_is_truncated(tmp_path) -> None:
    # what a crash leaves with a preallocated (log.preallocate=true) or mmapped segment
    d = tmp_path / "t-0"
    log = build(d, n_segments=2)
    records = all_records(d)
    log.crash_close()
    log_path = segment_paths(d, 12)[0]
    size = os.path.getsize(log_path)
    with open(log_path, "ab") as f:
        f.write(bytes(8192))
    loaded = load(d, clean_shutdown=False, recovery_point=12)
    try:
        assert loaded.truncated_bytes == 8192
        assert loaded.segments[-1].next_offset == 24
    finally:
        close_loaded(loaded)
    assert os.path.getsize(log_path) == size
    assert all_records(d) == records


def test_garbage_tail_is_truncated(tmp_path) -> None:
    d = tmp_path / "t-0"
    log = build(d, n_segments=1)
    log.crash_close()
    log_path = segment_paths(d, 0)[0]
    size = os.path.getsize(log_path)
    with open(log_path, "ab") as f:
        f.write(random.Random(1).randbytes(300))
    loaded = load(d, clean_shutdown=False, recovery_point=0)
    close_loaded(loaded)
    assert os.path.getsize(log_path) == size
    assert loaded.truncated_bytes == 300


def flip(path, position: int, mask: int = 0x01) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        b = f.read(1)
        f.seek(position)
        f.write(bytes([b[0] ^ mask]))


def test_corrupt_batch_in_a_middle_segment_truncates_it_and_drops_later_segments(tmp_path) -> None:
    d = tmp_path / "t-0"
    log = build(d)
    log.close()
    forget_record(d)  # Kafka's rule: validate from the checkpoint (0)
    log_path = segment_paths(d, 12)[0]
    rows = batch_rows(log_path)
    flip(log_path, rows[2][0] + rows[2][3] - 1)  # last byte of the third batch: CRC mismatch
    loaded = load(d, clean_shutdown=False, recovery_point=0)
    try:
        assert [s.base_offset for s in loaded.segments] == [0, 12]
        assert loaded.segments[-1].next_offset == 16
        assert loaded.segments[-1].size == rows[2][0]
        assert loaded.truncated_bytes == rows[-1][0] + rows[-1][3] - rows[2][0]
        assert loaded.recovery_point == 0
    finally:
        close_loaded(loaded)
    assert sorted(p.name for p in d.glob("*.log")) == [f"{0:020d}.log", f"{12:020d}.log"]
    assert not any(d.glob(f"{24:020d}.*")) and not any(d.glob(f"{36:020d}.*"))
    assert [r[0] for r in all_records(d)] == list(range(16))
    # the log goes on from there
    log = PartitionLog.open(d, CFG, clean_shutdown=False)
    assert log.log_end_offset == 16
    assert log.append(kbatch([b"next"])).first_offset == 16
    log.close()
    assert_indexes_follow_the_rule(d)


def test_corrupt_first_batch_empties_the_log(tmp_path) -> None:
    d = tmp_path / "t-0"
    build(d, n_segments=2).close()
    forget_record(d)  # Kafka's rule: validate from the checkpoint (0)
    flip(segment_paths(d, 0)[0], 61)  # first record byte of the first batch
    loaded = load(d, clean_shutdown=False, recovery_point=0)
    try:
        assert [s.base_offset for s in loaded.segments] == [0]
        assert loaded.segments[0].size == 0 and loaded.segments[0].next_offset == 0
    finally:
        close_loaded(loaded)
    assert all_records(d) == []


@pytest.mark.parametrize("record", [True, False])
def test_corruption_below_the_recovery_point_is_not_scanned_after_a_crash(tmp_path,
                                                                          record: bool) -> None:
    # Kafka only recovers segments from the recovery point on; earlier ones are trusted.  With
    # the recovery record, only the bytes after the last flush's byte position are validated.
    d = tmp_path / "t-0"
    log = build(d)
    log.flush()
    log.crash_close()
    if not record:
        forget_record(d)
    rows = batch_rows(segment_paths(d, 0)[0])
    flip(segment_paths(d, 0)[0], rows[1][0] + rows[1][3] - 1)
    loaded = load(d, clean_shutdown=False, recovery_point=30)
    close_loaded(loaded)
    assert loaded.rebuilt_segments == ([] if record else [24, 36])
    assert loaded.segments[-1].next_offset == 48


def test_deleted_index_is_rebuilt_identically(tmp_path) -> None:
    d = tmp_path / "t-0"
    build(d).close()
    original = snapshot(d)
    for name in (f"{12:020d}.index", f"{24:020d}.timeindex", f"{36:020d}.index",
                 f"{36:020d}.timeindex"):
        (d / name).unlink()
    loaded = load(d, clean_shutdown=True)
    try:
        # the tail (36) is checked at load, its record naming a missing index; the others are
        # opened lazily and rebuilt at first use
        assert loaded.rebuilt_segments == [36]
        assert rebuilt(loaded) == [12, 24, 36]
        assert loaded.truncated_bytes == 0
        assert loaded.segments[-1].next_offset == 48
    finally:
        close_loaded(loaded)
    assert snapshot(d) == original


@pytest.mark.parametrize("suffix", [".index", ".timeindex"])
def test_garbled_index_after_clean_shutdown_is_rebuilt(tmp_path, suffix: str) -> None:
    d = tmp_path / "t-0"
    build(d, per_segment=12).close()
    original = snapshot(d)
    rng = random.Random(suffix)
    for base in (24, 72):
        path = d / f"{base:020d}{suffix}"
        path.write_bytes(rng.randbytes(len(original[path.name])))
    assert rebuilt_on_load(d, clean_shutdown=True) == [24, 72]  # caught by sanity_check
    assert snapshot(d) == original


def build_large(directory, config: LogConfig = CFG, *, batches: int = 17) -> None:
    """Segment 0 above ``LogSegment.sanity_check``'s full-verification limit (16 MiB): ~1 MiB
    batches of 2 records, one index entry each (interval 0), timestamps 10 ms apart; then a
    small active segment.  Closed cleanly."""
    log = PartitionLog.open(directory, config)
    for n in range(batches):
        log.append(kbatch([b"v%d" % n, b"x" * ((1 << 20) - 4096)], [T0 + n * 10, T0 + n * 10 + 3]),
                   now_ms=T0 + n * 10 + 5)
    log.roll()
    log.append(kbatch([b"tail"], [T0 + batches * 10]), now_ms=T0 + batches * 10 + 5)
    log.close()


def _patch_entry(path, slot: int, fmt: str, change) -> None:
    """Rewrite entry ``slot`` of an index file as ``change(entry)`` (same format)."""
    size = struct.calcsize(fmt)
    data = bytearray(path.read_bytes())
    entry = struct.unpack_from(fmt, data, slot * size)
    struct.pack_into(fmt, data, slot * size, *change(entry))
    path.write_bytes(bytes(data))


# each garble keeps the entries in order and leaves the last entry alone: only checking every
# entry against the batch it names can tell (the op fuzzer's seed 4000 found the first one)
LARGE_SEGMENT_GARBLES = {
    "time-first-timestamp-down": (".timeindex", ">qi", 0, lambda e: (e[0] - 5, e[1])),
    "time-middle-timestamp-up": (".timeindex", ">qi", 5, lambda e: (e[0] + 4, e[1])),
    "time-middle-offset-down": (".timeindex", ">qi", 5, lambda e: (e[0], e[1] - 1)),
    "offset-first-offset-down": (".index", ">ii", 0, lambda e: (e[0] - 1, e[1])),
    "offset-middle-position-up": (".index", ">ii", 5, lambda e: (e[0], e[1] + 1)),
}


@pytest.mark.parametrize("garble", sorted(LARGE_SEGMENT_GARBLES))
def test_garbled_index_entry_of_a_large_segment_is_rebuilt(tmp_path, garble: str) -> None:
    """Segments above the full-verification limit are not scanned at a clean start, yet every
    index entry is checked against the batch header it names: an in-order garbled entry that
    is not the last one is caught and the indexes are rebuilt (Kafka's sanityCheck looks at
    the last entry and the file length only)."""
    d = tmp_path / "t-0"
    build_large(d)
    original = snapshot(d)
    suffix, fmt, slot, change = LARGE_SEGMENT_GARBLES[garble]
    _patch_entry(d / f"{0:020d}{suffix}", slot, fmt, change)
    loaded = load(d, clean_shutdown=True)
    try:
        assert loaded.segments[0].size > 16 << 20  # the large-segment path
        assert rebuilt(loaded) == [0]
        assert loaded.truncated_bytes == 0
    finally:
        close_loaded(loaded)
    assert snapshot(d) == original


@pytest.mark.parametrize("garble", sorted(LARGE_SEGMENT_GARBLES))
def test_a_sample_of_the_entries_is_checked_beyond_the_limit(tmp_path, garble: str,
                                                              monkeypatch) -> None:
    """Beyond ``_CHECK_ENTRIES`` entries an evenly spaced sample is read (a 1 GiB segment has
    ~260,000): with the limit at 4, entries 0, 5, 10 and 16 of the 17 are checked, so the
    garbles above (slots 0 and 5) are still caught, and intact indexes are kept."""
    from shmq.storage import segment

    monkeypatch.setattr(segment, "_CHECK_ENTRIES", 4)
    assert segment._sample(17).tolist() == [0, 5, 10, 16]
    d = tmp_path / "t-0"
    build_large(d)
    original = snapshot(d)
    assert rebuilt_on_load(d, clean_shutdown=True) == []
    suffix, fmt, slot, change = LARGE_SEGMENT_GARBLES[garble]
    _patch_entry(d / f"{0:020d}{suffix}", slot, fmt, change)
    assert rebuilt_on_load(d, clean_shutdown=True) == [0]
    assert snapshot(d) == original


@pytest.mark.parametrize("timestamp_type", ["CreateTime", "LogAppendTime"])
def test_intact_indexes_of_a_large_segment_are_kept(tmp_path, timestamp_type: str) -> None:
    d = tmp_path / "t-0"
    config = LogConfig(segment_index_bytes=4096, index_interval_bytes=0,
                       message_timestamp_type=timestamp_type)
    build_large(d, config)
    original = snapshot(d)
    loaded = load(d, config, clean_shutdown=True)
    try:
        assert loaded.segments[0].size > 16 << 20
        assert rebuilt(loaded) == []
        assert loaded.segments[0].max_timestamp_so_far == T0 + 16 * 10 + (
            5 if timestamp_type == "LogAppendTime" else 3)
    finally:
        close_loaded(loaded)
    assert snapshot(d) == original


def test_stray_files_are_removed(tmp_path) -> None:
    d = tmp_path / "t-0"
    build(d, n_segments=2).close()
    original = snapshot(d)
    strays = [
        f"{0:020d}.log.deleted", f"{0:020d}.index.deleted", f"{12:020d}.log.cleaned",
        f"{12:020d}.index.swap", f"{24:020d}.log.swap", "leader-epoch-checkpoint.tmp",
        f"{99:020d}.index", f"{99:020d}.timeindex", f"{99:020d}.txnindex",  # no .log
    ]
    for name in strays:
        (d / name).write_bytes(b"\x00" * 24)
    assert rebuilt_on_load(d, clean_shutdown=True) == []
    assert snapshot(d) == original


def test_flipped_base_offset_bit_is_caught_by_the_contiguity_check(tmp_path) -> None:
    d = tmp_path / "t-0"
    log = build(d)
    log.crash_close()
    log_path = segment_paths(d, 12)[0]
    rows = batch_rows(log_path)
    flip(log_path, rows[3][0] + 2, 0x10)  # a high bit of baseOffset (bytes 0..8)
    stored = log_batches(log_path)[3][1]
    assert crc_ok(stored)                 # the CRC does not cover baseOffset
    assert base_offset(stored) != 18
    loaded = load(d, clean_shutdown=False, recovery_point=0)
    try:
        assert [s.base_offset for s in loaded.segments] == [0, 12]
        assert loaded.segments[-1].next_offset == 18
        assert loaded.segments[-1].size == rows[3][0]
    finally:
        close_loaded(loaded)
    assert [r[0] for r in all_records(d)] == list(range(18))


@pytest.mark.parametrize("where", ["first", "last"])
def test_flipped_base_offset_at_a_segment_edge(tmp_path, where: str) -> None:
    d = tmp_path / "t-0"
    log = build(d)
    log.crash_close()
    log_path = segment_paths(d, 24)[0]
    rows = batch_rows(log_path)
    row = rows[0] if where == "first" else rows[-1]
    flip(log_path, row[0] + 7)  # lowest bit: offset off by one
    loaded = load(d, clean_shutdown=False, recovery_point=0)
    close_loaded(loaded)
    expect = 24 if where == "first" else 34
    assert loaded.segments[-1].next_offset == expect
    assert [r[0] for r in all_records(d)] == list(range(expect))


def test_batch_that_does_not_fit_the_segment_base_is_caught(tmp_path) -> None:
    # a batch whose baseOffset (and CRC) is valid but belongs before the segment's base offset
    d = tmp_path / "t-0"
    log = build(d, n_segments=2)
    log.crash_close()
    log_path = segment_paths(d, 12)[0]
    first = bytearray(log_batches(log_path)[0][1])
    struct.pack_into(">q", first, 0, 3)
    with open(log_path, "r+b") as f:
        f.write(first)
    loaded = load(d, clean_shutdown=False, recovery_point=12)
    close_loaded(loaded)
    assert loaded.segments[-1].next_offset == 12


def test_leader_epoch_going_backwards_is_caught(tmp_path) -> None:
    d = tmp_path / "t-0"
    epochs = [1, 1, 3, 3, 2, 3]
    log = build(d, n_segments=1, epochs=epochs)
    log.crash_close()
    loaded = load(d, clean_shutdown=False, recovery_point=0)
    try:
        assert loaded.segments[-1].next_offset == 8  # 4 batches of 2 records
        assert loaded.leader_epoch == 3
        assert loaded.truncated_bytes > 0
    finally:
        close_loaded(loaded)
    assert [r[0] for r in all_records(d)] == list(range(8))


def test_epoch_newer_than_the_checkpoint_is_kept_by_recovery(tmp_path) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, CFG)
    log.write_leader_epoch_checkpoint([(0, 0)])
    log.append(kbatch([b"a"]), leader_epoch=0)
    log.append(kbatch([b"b"]), leader_epoch=1)  # became leader again; checkpoint not yet written
    log.flush()
    assert log.recovery_point == 2               # durable
    log.crash_close()
    loaded = load(d, clean_shutdown=False, recovery_point=2)
    close_loaded(loaded)
    assert loaded.segments[-1].next_offset == 2
    assert [r[3] for r in all_records(d)] == [b"a", b"b"]


def test_leader_epochs_across_segments(tmp_path) -> None:
    d = tmp_path / "t-0"
    epochs = [0] * 6 + [5] * 6 + [4] * 6   # segment 2 starts with an older epoch
    log = build(d, n_segments=3, epochs=epochs)
    log.crash_close()
    loaded = load(d, clean_shutdown=False, recovery_point=0)
    close_loaded(loaded)
    assert [s.base_offset for s in loaded.segments] == [0, 12, 24]
    assert loaded.segments[-1].next_offset == 24
    assert loaded.leader_epoch == 5


def test_rebuilt_indexes_after_crash_follow_the_rule(tmp_path) -> None:
    d = tmp_path / "t-0"
    cfg = LogConfig(segment_index_bytes=4096, index_interval_bytes=200)
    log = PartitionLog.open(d, cfg)
    rng = random.Random(8)
    for i in range(80):
        log.append(kbatch([rng.randbytes(rng.randrange(0, 150))], [T0 + rng.randrange(0, 10**5)]))
        if i % 30 == 29:
            log.roll()
    log.crash_close()
    loaded = load(d, cfg, clean_shutdown=False, recovery_point=0)
    close_loaded(loaded)
    assert loaded.rebuilt_segments == [0, 30, 60]
    assert_indexes_follow_the_rule(d, cfg)


def test_log_start_offset_is_clamped_into_the_log(tmp_path) -> None:
    d = tmp_path / "t-0"
    build(d, n_segments=2).close()
    loaded = load(d, clean_shutdown=True, log_start_offset=5)
    close_loaded(loaded)
    assert loaded.log_start_offset == 5
    loaded = load(d, clean_shutdown=True, log_start_offset=1000)
    close_loaded(loaded)
    assert loaded.log_start_offset == 24


def test_empty_directory_gets_one_empty_segment(tmp_path) -> None:
    d = tmp_path / "new" / "t-0"
    loaded = load(d, log_start_offset=7)
    close_loaded(loaded)
    assert [s.base_offset for s in loaded.segments] == [7]
    assert (d / f"{7:020d}.log").exists()
    assert os.stat(d).st_mode & 0o777 == 0o700


def test_crc32c_oracle_agrees_with_stored_batches_after_recovery(tmp_path) -> None:
    d = tmp_path / "t-0"
    log = build(d, n_segments=2)
    log.crash_close()
    loaded = load(d, clean_shutdown=False, recovery_point=0)
    close_loaded(loaded)
    for path in sorted(d.glob("*.log")):
        for _, b in log_batches(path):
            assert crc32c.crc32c(b[21:]) == struct.unpack_from(">I", b, 17)[0]
