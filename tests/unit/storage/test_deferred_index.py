"""A new log's first index files are created when they are needed on disk, not at the first
append (``index_file.py``, "A new log's first index"), and a deleted log is released without a
flush (``PartitionLog.discard``).  Real files in a temp dir; the expected index entries come from
Kafka's rule run over the ``.log`` bytes (``_storage_util.expected_indexes``)."""

from __future__ import annotations

import os

from _storage_util import (
    all_records,
    batch_rows,
    expected_indexes,
    kbatch,
    offset_index_entries,
    time_index_entries,
)

from shmq.storage import LogConfig, LogManager, PartitionLog
from shmq.storage.index_file import DEFERRED_ENTRIES

TOPIC_ID = "6f1c2e9a-3b7d-4c5e-8f90-123456789abc"
T0 = 1_700_000_000_000
INDEX, TIMEINDEX = "00000000000000000000.index", "00000000000000000000.timeindex"


def fill(plog: PartitionLog, batches: int, value_size: int = 3000, start: int = 0) -> None:
    for i in range(start, start + batches):
        plog.append(kbatch([b"%06d" % i + b"v" * value_size], [T0 + i]), leader_epoch=0)
    plog.update_high_watermark(plog.log_end_offset)


def expected(directory, interval: int = 4096, closed: bool = False):
    """Kafka's entries for the log's batches; ``closed``: with the time entry a segment gets
    when it stops being active (``onBecomeInactiveSegment``: the max timestamp so far)."""
    rows = batch_rows(directory / "00000000000000000000.log")
    offsets, times = expected_indexes(rows, interval)
    last = max(rows, key=lambda r: (r[2], -r[1]))
    if closed and (not times or last[2] > times[-1][0]):
        times.append((last[2], last[1]))
    return offsets, times


def test_appends_to_a_new_log_create_no_index_file_until_a_flush(tmp_path) -> None:
    directory = tmp_path / "t-0"
    plog = PartitionLog.create(directory, LogConfig(), topic_id=TOPIC_ID)
    fill(plog, 40)  # ~120 KiB: an index entry every other batch
    assert INDEX not in os.listdir(directory) and TIMEINDEX not in os.listdir(directory)
    offsets, times = expected(directory)
    assert len(offsets) > 15
    # lookups are served from the entries in memory
    seg = plog.active_segment
    for offset, position in offsets:
        assert seg.offset_index.lookup(offset) == (offset, position)
    ts, off = times[len(times) // 2]
    assert plog.fetch_offset_by_timestamp(ts).offset == off
    plog.flush()  # the files now, with every entry (preallocated: zeros after them)
    assert offset_index_entries(directory / INDEX, 0)[:len(offsets)] == offsets
    assert time_index_entries(directory / TIMEINDEX, 0)[:len(times)] == times
    fill(plog, 5, start=40)  # appends after the flush go to the files' mappings
    plog.close()  # trimmed to exactly Kafka's entries
    offsets, times = expected(directory, closed=True)
    assert offset_index_entries(directory / INDEX, 0) == offsets
    assert time_index_entries(directory / TIMEINDEX, 0) == times
    again = PartitionLog.open(directory, LogConfig(), clean_shutdown=True)
    assert [r[3][:6] for r in all_records(directory)] == [b"%06d" % i for i in range(45)]
    assert again.fetch_offset_by_timestamp(T0 + 44).offset == 44
    again.close()


def test_a_new_log_closed_before_any_flush_leaves_kafkas_index_files(tmp_path) -> None:
    directory = tmp_path / "t-0"
    plog = PartitionLog.create(directory, LogConfig(), topic_id=TOPIC_ID)
    fill(plog, 12)
    plog.close()
    offsets, times = expected(directory, closed=True)
    assert offset_index_entries(directory / INDEX, 0) == offsets and offsets
    assert time_index_entries(directory / TIMEINDEX, 0) == times


def test_the_files_are_created_past_the_bound_before_the_batch_is_written(tmp_path) -> None:
    """Past ``DEFERRED_ENTRIES`` entries the files exist (a local reader reads ``.index``)."""
    directory = tmp_path / "t-0"
    config = LogConfig(index_interval_bytes=0)  # an entry for every batch after the first
    plog = PartitionLog.create(directory, config, topic_id=TOPIC_ID)
    fill(plog, DEFERRED_ENTRIES, value_size=10)
    assert INDEX not in os.listdir(directory)
    fill(plog, 3, value_size=10)
    assert {INDEX, TIMEINDEX} <= set(os.listdir(directory))
    offsets, _ = expected(directory, interval=0)
    assert offset_index_entries(directory / INDEX, 0)[:len(offsets)] == offsets
    plog.close()


def test_a_crash_before_any_flush_leaves_no_index_and_recovery_rebuilds_it(tmp_path) -> None:
    directory = tmp_path / "t-0"
    plog = PartitionLog.create(directory, LogConfig(), topic_id=TOPIC_ID)
    fill(plog, 30)
    plog.crash_close()
    assert INDEX not in os.listdir(directory)
    again = PartitionLog.open(directory, LogConfig(), clean_shutdown=False)
    assert again.log_end_offset == 30
    assert again.fetch_offset_by_timestamp(T0 + 17).offset == 17
    again.close()
    offsets, times = expected(directory, closed=True)
    assert offset_index_entries(directory / INDEX, 0) == offsets
    assert time_index_entries(directory / TIMEINDEX, 0) == times


def test_deleting_a_log_flushes_nothing_and_creates_no_file(tmp_path, monkeypatch) -> None:
    """Kafka's delete closes the handlers only: no fsync, no checkpoint, snapshot or index file
    created just before the directory goes."""
    mgr = LogManager(tmp_path / "logs")
    mgr.startup(hosted={})
    for p in range(2):
        fill(mgr.get_or_create_log("t", p, topic_id=TOPIC_ID), 10)
    mgr.get_log("t", 1).flush()  # one flushed before (its index files exist), one not
    calls: list[str] = []
    real_open, real_fsync, real_fdatasync = os.open, os.fsync, os.fdatasync

    def spy_open(path, flags, *args, **kwargs):
        if flags & os.O_CREAT:
            calls.append(f"create {path}")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync") or real_fsync(fd))
    monkeypatch.setattr(os, "fdatasync", lambda fd: calls.append("fdatasync")
                        or real_fdatasync(fd))
    for p in range(2):
        mgr.delete_log("t", p)
    monkeypatch.undo()
    assert [c for c in calls if c != "fsync"] == []  # the log dir's own fsync (the rename) stays
    assert calls.count("fsync") <= 2
    assert not any(n.startswith("t-") for n in os.listdir(tmp_path / "logs"))
    mgr.shutdown()
