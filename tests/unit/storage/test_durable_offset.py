"""The durable offset and the recovery point (``PartitionLog.flush``, "Durability"): real files.

An acknowledgement's flush (``checkpoint=False``) fdatasyncs the ``.log`` files and moves the
durable offset; the indexes' msyncs and the recovery record wait for a checkpoint (roll,
``CHECKPOINT_BYTES``, ``CHECKPOINT_INTERVAL_MS``, flush.messages / flush.ms, close).  The
oracles: the system calls themselves (``os.fdatasync`` and ``IndexFile.flush``, the msync, are
wrapped to record what each made durable) and the recovery record read back from its file.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest
from _storage_util import all_records, kbatch

from shmq.storage import LogConfig, PartitionLog, recovery_point
from shmq.storage import log as log_module
from shmq.storage.index_file import IndexFile
from shmq.storage.layout import segment_paths
from shmq.storage.loader import load_log

T0 = 1_700_000_000_000


@pytest.fixture(autouse=True)
def _no_interval_on_a_slow_box(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interval is passed by moving ``last_flush_ms`` or ``now``, never by a slow run."""
    monkeypatch.setattr(log_module, "CHECKPOINT_INTERVAL_MS", 1 << 40)


class Syncs:
    """What reached the disk: ``data[path]`` the size of each file at its last fdatasync,
    ``entries[path]`` the entries of each index at its last msync, and the calls in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.data: dict[str, int] = {}
        self.entries: dict[str, int] = {}
        self.calls: list[tuple[str, str]] = []
        real_fdatasync, real_flush = os.fdatasync, IndexFile.flush

        def fdatasync(fd: int) -> None:
            real_fdatasync(fd)
            path = os.readlink(f"/proc/self/fd/{fd}")
            self.data[path] = os.fstat(fd).st_size
            self.calls.append(("fdatasync", os.path.basename(path)))

        def flush(index: IndexFile) -> None:
            entries = index.entries
            real_flush(index)
            self.entries[str(index.path)] = entries
            self.calls.append(("msync", index.path.name))

        monkeypatch.setattr(os, "fdatasync", fdatasync)
        monkeypatch.setattr(IndexFile, "flush", flush)

    def msyncs(self) -> int:
        return sum(1 for kind, _ in self.calls if kind == "msync")


def batch(i: int, size: int = 200) -> bytes:
    return kbatch([bytes([i % 251]) * size], [T0 + i])


def new_log(path: Path, **cfg: int) -> PartitionLog:
    return PartitionLog.open(path / "t-0", LogConfig(index_interval_bytes=256, **cfg))


def test_an_acknowledgement_flush_syncs_the_log_and_leaves_the_rest_to_a_checkpoint(
        tmp_path, monkeypatch) -> None:
    """fdatasync of the ``.log`` only: no msync, the recovery point and its record stay; the
    next checkpoint msyncs both indexes and then moves both.  (Before the split every acks=all
    flush msynced both indexes: 343 msyncs beside 157 fdatasyncs in bench_client's batch rows.)"""
    log = new_log(tmp_path)
    log.append(batch(0))
    assert log.flush() is True  # a checkpoint: the record exists from here on
    syncs = Syncs(monkeypatch)
    before = recovery_point.read(log.directory)
    rp = log.recovery_point
    for i in range(1, 30):
        log.append(batch(i))
        assert log.flush(log.log_end_offset, checkpoint=False) is True
        assert log.durable_offset == log.log_end_offset
    assert log.flush(log.log_end_offset, checkpoint=False) is False  # covered already
    assert syncs.msyncs() == 0
    assert {kind for kind, _ in syncs.calls} == {"fdatasync"}
    assert log.recovery_point == rp
    assert recovery_point.read(log.directory) == before
    assert log.active_segment.offset_index.entries > before.offset_index_entries
    assert log.flush_due(log.last_flush_ms) is False
    assert log.flush_due(log.last_flush_ms + log_module.CHECKPOINT_INTERVAL_MS) is True
    assert log.flush() is True  # the checkpoint
    assert syncs.msyncs() == 2
    assert log.recovery_point == log.durable_offset == log.log_end_offset
    record = recovery_point.read(log.directory)
    assert (record.offset, record.position) == (log.log_end_offset, log.active_segment.size)
    assert record.offset_index_entries == log.active_segment.offset_index.entries
    assert log.flush() is False
    log.close()


@pytest.mark.parametrize("trigger", ["roll", "bytes", "interval", "flush.messages", "close"])
def test_each_trigger_takes_the_checkpoint(tmp_path, monkeypatch, trigger) -> None:
    """Checkpoints come at a roll (in the next acknowledgement's flush), after
    ``CHECKPOINT_BYTES`` or ``CHECKPOINT_INTERVAL_MS``, at flush.messages, and at close: each
    msyncs the indexes before the record moves.  Without any, the record stays behind."""
    cfg = {"flush_messages": 11} if trigger == "flush.messages" else {}
    log = new_log(tmp_path, **cfg)
    log.append(batch(0))
    log.flush()
    if trigger == "bytes":
        monkeypatch.setattr(log_module, "CHECKPOINT_BYTES", 2000)
    syncs = Syncs(monkeypatch)
    for i in range(1, 6):  # 5 batches, ~1.3 KB: below every bound
        log.append(batch(i))
        log.flush(log.log_end_offset, checkpoint=False)
    assert syncs.msyncs() == 0
    assert log.recovery_point < log.durable_offset == log.log_end_offset
    if trigger == "roll":
        log.roll()
    elif trigger == "interval":
        log.last_flush_ms -= log_module.CHECKPOINT_INTERVAL_MS
    for i in range(6, 12):  # crosses 2,000 bytes and, at the 11th since 0, flush.messages
        log.append(batch(i))
    if trigger == "close":
        log.close()
        record = recovery_point.read(log.directory)
        assert syncs.msyncs() >= 2 and record.offset == 12
        return
    log.flush(log.log_end_offset, checkpoint=False)
    msync_at = [i for i, (kind, _) in enumerate(syncs.calls) if kind == "msync"]
    assert msync_at, syncs.calls
    assert all(kind == "fdatasync" for kind, _ in syncs.calls[: msync_at[0]])
    assert log.recovery_point == log.log_end_offset == 12
    assert recovery_point.read(log.directory).offset == 12
    log.close()


def test_an_idle_log_is_checkpointed_by_the_owners_timer(tmp_path, monkeypatch) -> None:
    """``flush_due`` / ``maybe_flush``: a log whose recovery point trails its durable offset for
    ``CHECKPOINT_INTERVAL_MS`` gets its checkpoint without another append, so an unclean start
    can leave it unopened (``unclean_deferral``); an acks=1 log (nothing durable past the
    recovery point) is not fsynced by it (flush.ms stays Kafka's rule)."""
    log = new_log(tmp_path)
    log.append(batch(0))
    log.flush()
    log.append(batch(1))
    log.flush(checkpoint=False)
    log.append(batch(2))  # an acks=1 append after it
    now = log.last_flush_ms
    assert not log.flush_due(now + log_module.CHECKPOINT_INTERVAL_MS - 1)
    log.maybe_flush(now + log_module.CHECKPOINT_INTERVAL_MS - 1)
    assert log.recovery_point == 1
    log.maybe_flush(now + log_module.CHECKPOINT_INTERVAL_MS)
    assert log.recovery_point == log.log_end_offset == 3
    assert recovery_point.read(log.directory).offset == 3
    log.append(batch(3))  # acks=1 only: no timer flush
    assert not log.flush_due(log.last_flush_ms + 10 * log_module.CHECKPOINT_INTERVAL_MS)
    log.close()


def test_the_recovery_record_never_vouches_for_more_than_is_durable(tmp_path, monkeypatch) -> None:
    """After every operation, the record on disk names no byte of its ``.log`` past the last
    fdatasync and no index entry past the last msync of that index, and the durable offset
    names no byte past the last fdatasync either.  Random appends, acknowledgement flushes,
    checkpoints, rolls and due timers.  Guards the ordering in ``flush``: the record is taken
    under the lock and written only after the checkpoint's fdatasync and msyncs (writing it
    from an acknowledgement's flush vouches for index entries no msync covered)."""
    monkeypatch.setattr(log_module, "CHECKPOINT_BYTES", 6000)
    syncs = Syncs(monkeypatch)
    rng = random.Random(15)
    log = new_log(tmp_path, segment_bytes=9000)
    checkpoints = 0
    for i in range(400):
        log.append(batch(i, rng.randrange(20, 400)))
        r = rng.random()
        if r < 0.5:
            log.flush(log.log_end_offset, checkpoint=False)
        elif r < 0.55:
            log.flush()
        elif r < 0.6:
            log.last_flush_ms -= log_module.CHECKPOINT_INTERVAL_MS
            log.maybe_flush()
        record = recovery_point.read(log.directory)
        if record is not None:
            checkpoints += 1
            log_path, index_path, time_path = (str(p) for p in
                                               segment_paths(log.directory, record.segment_base))
            assert syncs.data.get(log_path, 0) >= record.position, (i, record)
            assert syncs.entries.get(index_path, 0) >= record.offset_index_entries, (i, record)
            assert syncs.entries.get(time_path, 0) >= record.time_index_entries, (i, record)
        seg = log.segments[log._segment_for(log.durable_offset - 1)] if log.durable_offset else None
        if seg is not None and log.durable_offset > seg.base_offset:
            header = seg.translate_offset(log.durable_offset - 1)
            assert syncs.data.get(str(seg.log_path), 0) >= header.position + header.size
    assert checkpoints and len(log.segments) > 3
    log.close()


def test_recovery_after_a_crash_rebuilds_the_index_range_no_checkpoint_covered(
        tmp_path, monkeypatch) -> None:
    """A crash (what SIGKILL leaves: the page cache, untrimmed preallocated indexes) with the
    durable offset past the recovery record: the reopen resumes at the record, validates
    the acknowledged bytes after it, and its indexes equal a rebuild from scratch (each
    ``.log`` copied alone into a fresh directory and recovered from offset 0)."""
    log = new_log(tmp_path, segment_bytes=20_000)
    for i in range(20):
        log.append(batch(i))
    log.flush()
    record = recovery_point.read(log.directory)
    for i in range(20, 160):
        log.append(batch(i))
        log._checkpoint_wanted = False  # no checkpoint at the rolls: the range spans segments
        log.flush(log.log_end_offset, checkpoint=False)
    assert len(log.segments) > 2 and recovery_point.read(log.directory) == record
    durable, want = log.durable_offset, all_records(log.directory)
    log.crash_close()
    reopened = PartitionLog.open(tmp_path / "t-0", LogConfig(index_interval_bytes=256,
                                                             segment_bytes=20_000))
    assert reopened.load_summary.resumed_at == (record.segment_base, record.position)
    assert reopened.load_summary.validated_bytes > 0
    assert reopened.log_end_offset == durable == 160
    assert reopened.recovery_point == reopened.durable_offset == record.offset
    assert all_records(reopened.directory) == want
    for seg in reopened.segments:
        seg.ensure_loaded()
    reopened.close()
    for seg_base in sorted(int(p.name.split(".")[0]) for p in (tmp_path / "t-0").glob("*.log")):
        fresh = tmp_path / f"fresh-{seg_base}" / "t-0"
        fresh.mkdir(parents=True)
        log_path, index_path, time_path = segment_paths(tmp_path / "t-0", seg_base)
        shutil.copy(log_path, fresh / log_path.name)
        load_log(fresh, LogConfig(index_interval_bytes=256, segment_bytes=20_000),
                 clean_shutdown=False)[0][-1].close()
        for path in (index_path, time_path):
            assert path.read_bytes() == (fresh / path.name).read_bytes(), path.name
