"""Logs of workers that no longer exist move to their partitions' new leaders (``--workers``
shrank): with their checkpoint entries, recovered when the old directory did not stop cleanly,
repeatable after a crash part-way, never over another non-empty log."""

from __future__ import annotations

import os

from _storage_util import all_records, kbatch

from shmq.storage import LogManager
from shmq.storage.relocate import relocate_orphan_logs

RP = "recovery-point-offset-checkpoint"
LSO = "log-start-offset-checkpoint"
MARKER = ".kafka_cleanshutdown"
T0 = 1_700_000_000_000


def _worker(data, node: int, logs: dict[tuple[str, int], int], *, clean: bool = True,
            start: dict[tuple[str, int], int] | None = None) -> None:
    mgr = LogManager(data / f"worker-{node}")
    mgr.startup()
    for (topic, p), n in logs.items():
        log = mgr.get_or_create_log(topic, p)
        for i in range(n):
            log.append(kbatch([b"%s-%d-%d" % (topic.encode(), p, i)], [T0 + i]))
        log.update_high_watermark(log.log_end_offset)
        if start and (topic, p) in start:
            log.delete_records_before(start[(topic, p)])
    if clean:
        mgr.shutdown()
    else:
        for log in mgr.logs.values():
            log.flush()
        mgr.checkpoint()


def test_logs_follow_their_new_leaders_with_their_checkpoints(tmp_path) -> None:
    _worker(tmp_path, 1, {("t", 0): 2})
    _worker(tmp_path, 2, {("t", 1): 3})
    _worker(tmp_path, 3, {("t", 2): 5, ("t", 5): 1}, start={("t", 2): 3})
    before = all_records(tmp_path / "worker-3" / "t-2")
    moved = relocate_orphan_logs(tmp_path, {("t", 0): 1, ("t", 1): 2, ("t", 2): 1, ("t", 5): 2},
                                 {1, 2})
    assert sorted(moved) == [("t", 2, 3, 1), ("t", 5, 3, 2)]
    assert not (tmp_path / "worker-3").exists()
    assert all_records(tmp_path / "worker-1" / "t-2") == before
    assert "t 2 3" in (tmp_path / "worker-1" / LSO).read_text()
    assert "t 0 0" in (tmp_path / "worker-1" / LSO).read_text()  # its own entries kept
    assert (tmp_path / "worker-1" / MARKER).exists()              # both stopped cleanly
    mgr = LogManager(tmp_path / "worker-1")
    mgr.startup()
    assert mgr.logs[("t", 2)].log_start_offset == 3
    assert mgr.logs[("t", 2)].log_end_offset == 5
    mgr.shutdown()


def test_an_unclean_old_directory_makes_the_new_one_recover(tmp_path) -> None:
    _worker(tmp_path, 1, {("t", 0): 1})
    _worker(tmp_path, 2, {("t", 1): 4}, clean=False)
    relocate_orphan_logs(tmp_path, {("t", 0): 1, ("t", 1): 1}, {1})
    assert not (tmp_path / "worker-1" / MARKER).exists()
    mgr = LogManager(tmp_path / "worker-1")
    mgr.startup()
    assert not mgr.had_clean_shutdown
    assert mgr.logs[("t", 1)].log_end_offset == 4
    mgr.shutdown()


def test_a_move_interrupted_part_way_is_finished_by_the_next_start(tmp_path) -> None:
    _worker(tmp_path, 1, {})
    _worker(tmp_path, 2, {("t", 0): 2, ("t", 1): 3})
    leaders = {("t", 0): 1, ("t", 1): 1}
    # the first start moved t-0 and its checkpoint entries, then died before t-1
    os.rename(tmp_path / "worker-2" / "t-0", tmp_path / "worker-1" / "t-0")
    relocate_orphan_logs(tmp_path, leaders, {1})
    assert sorted(p.name for p in (tmp_path / "worker-1").glob("t-*")) == ["t-0", "t-1"]
    assert not (tmp_path / "worker-2").exists()
    assert relocate_orphan_logs(tmp_path, leaders, {1}) == []


def test_a_non_empty_log_at_the_new_home_is_never_overwritten(tmp_path) -> None:
    _worker(tmp_path, 1, {("t", 0): 1, ("u", 0): 0})
    _worker(tmp_path, 2, {("t", 0): 2, ("u", 0): 2, ("gone", 0): 1})
    moved = relocate_orphan_logs(tmp_path, {("t", 0): 1, ("u", 0): 1}, {1})
    assert moved == [("u", 0, 2, 1)]                         # u-0 was empty at worker 1
    assert len(all_records(tmp_path / "worker-1" / "u-0")) == 2
    assert len(all_records(tmp_path / "worker-1" / "t-0")) == 1
    assert sorted(p.name for p in (tmp_path / "worker-2").glob("*-0")) == ["gone-0", "t-0"]
