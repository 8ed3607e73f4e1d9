"""Recovery that starts at the last flush's byte position (``recovery_point.py``), so that a
restart after a crash costs what was written since the last fsync, not the size of the log.

The oracles are the files themselves (kafka-python decodes every batch, ``crc32c`` checks it,
the indexes are compared with Kafka's append-time rule run over the ``.log``) and the byte
counts recovery reports.
"""

from __future__ import annotations

import os
import shutil
import struct

import crc32c
import pytest
from _storage_util import all_records, batch_rows, kbatch, log_batches
from test_loader import assert_indexes_follow_the_rule

from shmq.storage import LogConfig, PartitionLog, recovery_point
from shmq.storage.layout import segment_paths
from shmq.storage.loader import load_log
from shmq.storage.log import PRODUCER_SNAPSHOT_BYTES

T0 = 1_700_000_000_000
CFG = LogConfig(segment_index_bytes=1 << 20, index_interval_bytes=4096)


def fill(log: PartitionLog, n: int, size: int, start: int = 0, **kw) -> None:
    for i in range(start, start + n):
        log.append(kbatch([b"%06d" % i + b"x" * size], [T0 + i]), **kw)


def reopen(d, config: LogConfig = CFG, **kw) -> PartitionLog:
    return PartitionLog.open(d, config, clean_shutdown=False, **kw)


# -- the file ----------------------------------------------------------------------------------


def test_two_slots_a_torn_write_leaves_the_older_record(tmp_path) -> None:
    f = recovery_point.RecoveryPointFile(tmp_path)
    first = recovery_point.RecoveryRecord(10, 0, 700, 1, 1, 20, 0, T0, 9)
    second = first._replace(offset=20, position=1400, bytes_since_index_entry=720)
    f.write(first)
    f.write(second)
    f.close()
    assert recovery_point.read(tmp_path) == second
    raw = bytearray((tmp_path / recovery_point.FILE_NAME).read_bytes())
    assert len(raw) == 2 * recovery_point.SLOT_SIZE
    second = recovery_point.SLOT_SIZE + 8
    newer = 0 if struct.unpack_from(">Q", raw, 8)[0] > struct.unpack_from(">Q", raw, second)[0] \
        else 1
    torn = bytearray(raw)
    torn[newer * recovery_point.SLOT_SIZE + 20] ^= 0xFF  # half-written: its CRC fails
    (tmp_path / recovery_point.FILE_NAME).write_bytes(bytes(torn))
    assert recovery_point.read(tmp_path) == first
    torn[(1 - newer) * recovery_point.SLOT_SIZE + 30] ^= 0xFF
    (tmp_path / recovery_point.FILE_NAME).write_bytes(bytes(torn))
    assert recovery_point.read(tmp_path) is None
    # CRC-32C of bytes 8..80 of a slot (the crc32c package as the oracle)
    slot = raw[: recovery_point.SLOT_SIZE]
    assert struct.unpack_from(">I", slot, 4)[0] == crc32c.crc32c(bytes(slot[8:]))
    assert slot[:4] == b"SRP2" and recovery_point.SLOT_SIZE == 80


def test_a_flush_records_its_byte_position_and_appends_do_not(tmp_path) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, CFG)
    fill(log, 50, 300)
    assert recovery_point.read(d) is None  # nothing fsynced yet
    log.flush()
    size = os.path.getsize(segment_paths(d, 0)[0])
    rec = recovery_point.read(d)
    assert (rec.offset, rec.segment_base, rec.position) == (50, 0, size)
    assert rec.offset_index_entries == log.active_segment.offset_index.entries
    fill(log, 5, 300, start=50)
    assert recovery_point.read(d) == rec  # only a flush moves it
    log.close()


# -- recovery from it --------------------------------------------------------------------------


def test_recovery_validates_only_what_follows_the_last_flush(tmp_path) -> None:
    """A 24 MiB active segment, flushed, then 10 batches more and a crash: recovery validates
    those 10 batches, nothing before them, and the result equals a full recovery."""
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, CFG)
    fill(log, 3000, 8192)
    log.flush()
    flushed_size = log.active_segment.size
    fill(log, 10, 100, start=3000)
    tail = log.active_segment.size - flushed_size
    records = all_records(d)
    log.crash_close()
    full = tmp_path / "full" / "t-0"
    shutil.copytree(d, full)
    (full / recovery_point.FILE_NAME).unlink()

    loaded = load_log(d, CFG, recovery_point=0, clean_shutdown=False)
    for seg in loaded.segments:
        seg.close()
    assert loaded.resumed_at == (0, flushed_size)
    assert loaded.validated_bytes == tail
    assert [int(r) for r in loaded.recovered_batches[:, 1]] == list(range(3000, 3010))
    assert loaded.recovery_point == 3000  # the record's offset: the rest is not known durable
    assert all_records(d) == records
    assert_indexes_follow_the_rule(d, CFG)

    loaded = load_log(full, CFG, recovery_point=0, clean_shutdown=False)  # Kafka's rule
    for seg in loaded.segments:
        seg.close()
    assert loaded.resumed_at is None and loaded.validated_bytes == os.path.getsize(
        segment_paths(full, 0)[0])
    for name in (f"{0:020d}.index", f"{0:020d}.timeindex", f"{0:020d}.log"):
        assert (d / name).read_bytes() == (full / name).read_bytes(), name


@pytest.mark.parametrize("damage", ["torn", "zeros", "flip", "bad-offset"])
def test_damage_after_the_recorded_position_is_caught(tmp_path, damage: str) -> None:
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, CFG)
    fill(log, 40, 500)
    log.flush()
    fill(log, 5, 500, start=40)
    log.crash_close()
    path = segment_paths(d, 0)[0]
    rows = batch_rows(path)
    pos, size = rows[42][0], rows[42][3]  # batch of offset 42, after the record (offset 40)
    with open(path, "r+b") as f:
        if damage == "torn":
            f.truncate(pos + size // 2)
        elif damage == "zeros":
            f.truncate(pos)
            f.seek(pos)
            f.write(bytes(4096))
        elif damage == "flip":
            f.seek(pos + 100)
            b = f.read(1)
            f.seek(pos + 100)
            f.write(bytes([b[0] ^ 0x08]))
        else:  # a base offset (not covered by the CRC) off by one
            f.seek(pos + 7)
            b = f.read(1)
            f.seek(pos + 7)
            f.write(bytes([b[0] ^ 0x01]))
    reopened = reopen(d)
    try:
        assert reopened.load_summary.resumed_at == (0, rows[40][0])
        assert reopened.log_end_offset == 42
        assert reopened.active_segment.size == pos
    finally:
        reopened.close()
    assert [r[0] for r in all_records(d)] == list(range(42))
    for _, batch in log_batches(path):
        assert crc32c.crc32c(batch[21:]) == struct.unpack_from(">I", batch, 17)[0]
    assert_indexes_follow_the_rule(d, CFG)


def test_a_record_the_files_contradict_is_not_used(tmp_path) -> None:
    """A log cut below the recorded position (it lost fsynced bytes): recovery falls back to
    the checkpointed offset, and the record, which now names bytes the log no longer has, is
    removed before new appends could land there."""
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, CFG)
    fill(log, 40, 500)
    log.flush()
    log.crash_close()
    path = segment_paths(d, 0)[0]
    rows = batch_rows(path)
    os.truncate(path, rows[30][0] + 10)
    reopened = reopen(d, recovery_point=0)
    try:
        assert reopened.load_summary.resumed_at is None
        assert reopened.log_end_offset == 30
        assert recovery_point.read(d) is None
        fill(reopened, 10, 500, start=30)  # the same offsets again, not flushed
    finally:
        reopened.crash_close()
    again = reopen(d, recovery_point=0)
    try:
        assert again.load_summary.resumed_at is None
        assert again.load_summary.validated_bytes == os.path.getsize(path)
    finally:
        again.close()


def test_truncation_lowers_the_record_at_once(tmp_path) -> None:
    """A follower's truncation below the recovery point: the record follows it down before new
    appends reuse the offsets, so a crash then validates them."""
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, CFG)
    fill(log, 40, 500)
    log.flush()
    log.truncate_to(25)
    rec = recovery_point.read(d)
    assert (rec.offset, rec.position) == (25, log.active_segment.size)
    fill(log, 10, 700, start=100)  # other batches at offsets 25.. (not flushed)
    log.crash_close()
    reopened = reopen(d)
    try:
        assert reopened.load_summary.resumed_at == (0, rec.position)
        assert reopened.load_summary.validated_bytes == os.path.getsize(
            segment_paths(d, 0)[0]) - rec.position
        assert reopened.log_end_offset == 35
    finally:
        reopened.close()


def test_recovery_resumes_in_an_older_segment_and_recovers_later_ones(tmp_path) -> None:
    d = tmp_path / "t-0"
    config = LogConfig(segment_bytes=64 << 10, segment_index_bytes=4096, index_interval_bytes=1000)
    log = PartitionLog.open(d, config)
    fill(log, 50, 1000)
    log.flush()
    rec = recovery_point.read(d)
    fill(log, 100, 1000, start=50)  # rolls twice more, nothing flushed
    records = all_records(d)
    bases = [s.base_offset for s in log.segments]
    log.crash_close()
    loaded = load_log(d, config, clean_shutdown=False)
    for seg in loaded.segments:
        seg.close()
    assert loaded.resumed_at == (rec.segment_base, rec.position)
    assert loaded.rebuilt_segments == [b for b in bases if b > rec.segment_base]
    assert all_records(d) == records
    assert_indexes_follow_the_rule(d, config)


def test_producer_state_replays_at_most_the_snapshot_interval(tmp_path, monkeypatch) -> None:
    """Producer state is snapshotted every PRODUCER_SNAPSHOT_BYTES of appends: after a crash the
    replay starts at most that far back, and duplicates are still detected."""
    from shmq.storage import log as log_mod

    monkeypatch.setattr(log_mod, "PRODUCER_SNAPSHOT_BYTES", 64 << 10)
    d = tmp_path / "t-0"
    log = PartitionLog.open(d, CFG)
    for i in range(200):
        log.append(kbatch([b"%04d" % i + b"y" * 1000], [T0 + i], producer_id=7,
                          producer_epoch=0, base_sequence=i))
    log.flush()
    snapshots = sorted(int(p.name[:20]) for p in d.glob("*.snapshot"))
    assert len(snapshots) == 1  # older periodic ones in the segment are dropped
    assert 0 < log.log_end_offset - snapshots[-1] <= (64 << 10) // 1000
    assert PRODUCER_SNAPSHOT_BYTES == 16 << 20
    last = log.producer_state.last_entry(7)
    log.crash_close()
    reopened = reopen(d)
    try:
        assert reopened.producer_state.last_entry(7).last_seq == last.last_seq
        dup = reopened.append(kbatch([b"%04d" % 199 + b"y" * 1000], [T0 + 199], producer_id=7,
                                     producer_epoch=0, base_sequence=199))
        assert (dup.first_offset, dup.batch_count) == (199, 0)  # the original offset, not again
    finally:
        reopened.close()


# -- lazy segments -----------------------------------------------------------------------------


def test_a_clean_start_opens_no_index_until_a_segment_is_used(tmp_path) -> None:
    d = tmp_path / "t-0"
    config = LogConfig(segment_bytes=32 << 10, segment_index_bytes=4096, index_interval_bytes=500)
    log = PartitionLog.open(d, config)
    fill(log, 120, 1000)
    records = all_records(d)
    log.close()
    reopened = PartitionLog.open(d, config, clean_shutdown=True)
    try:
        assert len(reopened.segments) > 3
        assert not any(s.loaded for s in reopened.segments)  # the tail's LEO is on record
        assert reopened.log_end_offset == 120
        first = reopened.read(5, 1 << 20)  # a read loads (and checks) the segment it touches
        assert first.slices and reopened.segments[0].loaded
        assert not any(s.loaded for s in reopened.segments[1:])
        reopened.append(kbatch([b"more"], [T0 + 500]))  # so does an append, for the tail
        assert reopened.active_segment.loaded
    finally:
        reopened.close()
    assert all_records(d)[:120] == records
    assert_indexes_follow_the_rule(d, config)


def test_kept_index_entries_are_checked_at_the_first_read(tmp_path) -> None:
    """Recovery keeps the index entries below the recovery point; they get the check a clean
    start makes, at the first read rather than during the restart.  A garbled one is caught
    there, the indexes rebuilt, and the read is right; appends before it do not wait for it."""
    d = tmp_path / "t-0"
    config = LogConfig(segment_index_bytes=1 << 20, index_interval_bytes=0)
    log = PartitionLog.open(d, config)
    fill(log, 60, 200)
    log.flush()
    fill(log, 3, 200, start=60)
    records = all_records(d)
    log.crash_close()
    index = segment_paths(d, 0)[1]
    raw = bytearray(index.read_bytes())
    rel, pos = struct.unpack_from(">ii", raw, 20 * 8)
    struct.pack_into(">ii", raw, 20 * 8, rel, pos + 1)  # in order, but names no batch
    index.write_bytes(bytes(raw))
    reopened = reopen(d, config)
    try:
        seg = reopened.active_segment
        assert reopened.load_summary.resumed_at is not None and not seg.rebuilt
        reopened.append(kbatch([b"appended"], [T0 + 99]))  # does not check
        assert not seg.rebuilt
        got = reopened.read(21, 1 << 20, upper_bound=reopened.log_end_offset)  # checks
        assert seg.rebuilt
        data = got.slices[0].read()
        first = struct.unpack_from(">q", data, 0)[0]
        assert first == 21
    finally:
        reopened.close()
    assert all_records(d)[:63] == records
    assert_indexes_follow_the_rule(d, config)
