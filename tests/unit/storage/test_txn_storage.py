"""Transactions in the partition log: markers (Kafka's control batch layout), the ``.txnindex``,
the last stable offset and their recovery.

Oracles: the marker and index bytes are checked against layouts written out here with
``struct`` from Kafka's ``EndTransactionMarker`` / ``ControlRecordType`` / ``AbortedTxn``, and
kafka-python's record decoder reads the marker batch.
"""

from __future__ import annotations

import struct

import pytest
from kafka.record.default_records import DefaultRecordBatch

from shmq.errors import KafkaApiError
from shmq.protocol.records import encode_batch
from shmq.storage import txn_index
from shmq.storage.log import PartitionLog, control_batch, parse_marker
from shmq.storage.log_config import LogConfig

PID, OTHER = 4000, 4001


def txn_batch(pid: int, epoch: int, seq: int, n: int = 2, transactional: bool = True) -> bytes:
    return bytes(encode_batch([(b"k", b"v%d" % i) for i in range(n)], producer_id=pid,
                              producer_epoch=epoch, base_sequence=seq,
                              transactional=transactional))


def open_log(tmp_path, **kw) -> PartitionLog:
    return PartitionLog.open(tmp_path / "t-0", LogConfig(**kw))


def test_marker_is_kafkas_control_batch() -> None:
    raw = bytes(control_batch(PID, 3, 7, commit=False, leader_epoch=2, now_ms=1234))
    batch = DefaultRecordBatch(bytearray(raw))
    assert batch.is_control_batch and batch.is_transactional
    assert batch.producer_id == PID and batch.producer_epoch == 3
    assert batch.base_sequence == -1 and batch.compression_type == 0
    assert struct.unpack_from(">i", raw, 12)[0] == 2  # partitionLeaderEpoch
    records = list(batch)
    assert len(records) == 1
    assert records[0].key == struct.pack(">hh", 0, 0)     # version 0, ABORT
    assert records[0].value == struct.pack(">hi", 0, 7)   # version 0, coordinator epoch
    assert parse_marker(raw) == (False, 7)
    commit = bytes(control_batch(PID, 3, 7, commit=True))
    assert list(DefaultRecordBatch(bytearray(commit)))[0].key == struct.pack(">hh", 0, 1)
    assert parse_marker(commit) == (True, 7)


def test_lso_abort_index_and_aborted_list(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(txn_batch(0 + 9, 0, 0, transactional=False))         # 0-1 plain idempotent
    log.append(txn_batch(PID, 0, 0))                                  # 2-3 txn A
    log.append(txn_batch(OTHER, 0, 0))                               # 4-5 txn B
    log.update_high_watermark(log.log_end_offset)
    assert log.last_stable_offset == 2
    info = log.append_control(PID, 0, 0, commit=False)               # 6 abort A
    log.update_high_watermark(log.log_end_offset)
    assert info.first_offset == 6
    assert log.last_stable_offset == 4                               # B still open
    log.append_control(OTHER, 0, 0, commit=True)                     # 7 commit B
    log.update_high_watermark(log.log_end_offset)
    assert log.last_stable_offset == log.high_watermark == 8
    path = txn_index.path_for(log.directory, 0)
    raw = path.read_bytes()
    assert raw == struct.pack(">hqqqq", 0, PID, 2, 6, 4)             # AbortedTxn, 34 bytes
    assert log.aborted_transactions(0, 8) == [(PID, 2)]
    assert log.aborted_transactions(7, 8) == []                      # marker before the read
    assert log.aborted_transactions(0, 2) == []                      # read ends before it
    # a non-transactional write while a transaction is open: INVALID_TXN_STATE
    log.append(txn_batch(PID, 0, 2))
    with pytest.raises(KafkaApiError) as exc:
        log.append(txn_batch(PID, 0, 4, transactional=False))
    assert exc.value.code == 48
    log.close()


def test_old_epoch_marker_refused_and_fenced_producer(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(txn_batch(PID, 1, 0))
    with pytest.raises(KafkaApiError) as exc:
        log.append_control(PID, 0, 0, commit=True)
    assert exc.value.code == 47
    log.append_control(PID, 2, 1, commit=False)   # the coordinator fenced epoch 1
    with pytest.raises(KafkaApiError) as exc:
        log.append(txn_batch(PID, 1, 2))          # the zombie
    assert exc.value.code == 47
    with pytest.raises(KafkaApiError) as exc:
        log.append_control(PID, 2, 0, commit=True)  # an older coordinator epoch
    assert exc.value.code == 52
    log.close()


@pytest.mark.parametrize("how", ["clean", "crash", "index_lost"])
def test_txn_state_survives_restart(tmp_path, how: str) -> None:
    log = open_log(tmp_path, segment_bytes=600)
    for i in range(6):
        pid = PID + i
        log.append(txn_batch(pid, 0, 0, n=3))
        log.append_control(pid, 0, 5, commit=i % 2 == 1)
    log.append(txn_batch(PID + 10, 0, 0))                # left open
    log.update_high_watermark(log.log_end_offset)
    before = list(log.aborted)
    lso = log.last_stable_offset
    assert len(before) == 3 and len(log.segments) > 1
    if how == "clean":
        log.close()
    else:
        log.crash_close()
    if how == "index_lost":
        for p in log.directory.glob("*.txnindex"):
            p.unlink()
        for p in log.directory.glob("*.snapshot"):
            p.unlink()
    again = open_log(tmp_path, segment_bytes=600)
    again.update_high_watermark(again.log_end_offset)
    assert [e[:3] for e in again.aborted] == [e[:3] for e in before]
    assert again.last_stable_offset == lso
    entry = again.producer_state.last_entry(PID + 1)
    assert entry is not None and entry.coordinator_epoch == 5
    again.close()


def test_replay_from_an_old_snapshot_indexes_each_abort_once(tmp_path) -> None:
    """Crashes that replay more than 64 aborted transactions after the last snapshot (one
    producer, as a consume-transform-produce copier): each restart indexed the older ones again
    (the duplicate check looked at the last 64 entries), Fetch listed them several times, and
    read_committed consumers dropped the producer's committed batches after them (the kill
    soak read 9,800 of 100,000).  A file holding duplicates from before is cleaned at load."""
    log = open_log(tmp_path)
    for i in range(100):
        log.append(txn_batch(PID, 0, 3 * i, n=3))
        log.append_control(PID, 0, 0, commit=i % 2 == 0)
    log.update_high_watermark(log.log_end_offset)
    before = list(log.aborted)
    assert len(before) == 50
    path = txn_index.path_for(log.directory, 0)
    for _ in range(3):
        log.crash_close()
        for p in log.directory.glob("*.snapshot"):
            p.unlink()
        log = open_log(tmp_path)
        assert log.aborted == before
        assert txn_index.read(path) == before
    log.crash_close()
    txn_index.rewrite(path, before + before[10:20])  # as the bug left them
    log = open_log(tmp_path)
    assert log.aborted == before and txn_index.read(path) == before
    assert len(log.aborted_transactions(0, log.log_end_offset)) == 50
    log.close()


def test_truncation_drops_index_entries(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(txn_batch(PID, 0, 0))
    log.append_control(PID, 0, 0, commit=False)     # marker at 2
    log.append(txn_batch(OTHER, 0, 0))
    log.append_control(OTHER, 0, 0, commit=False)   # marker at 5
    assert len(log.aborted) == 2
    log.truncate_to(5)
    assert [e.producer_id for e in log.aborted] == [PID]
    assert txn_index.read(txn_index.path_for(log.directory, 0)) == log.aborted
    log.close()


def test_corrupt_index_version_is_rebuilt(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(txn_batch(PID, 0, 0))
    log.append_control(PID, 0, 0, commit=False)
    log.close()
    path = txn_index.path_for(log.directory, 0)
    path.write_bytes(struct.pack(">hqqqq", 9, 1, 2, 3, 4) + b"\x00" * 5)
    (log.directory / ".kafka_cleanshutdown").unlink(missing_ok=True)
    for p in log.directory.glob("*.snapshot"):
        p.unlink()
    again = open_log(tmp_path)
    assert [e[:3] for e in again.aborted] == [(PID, 0, 2)]
    again.close()


def test_dump_log_shows_markers_and_txn_index(tmp_path) -> None:
    import subprocess
    import sys

    log = open_log(tmp_path)
    log.append(txn_batch(PID, 0, 0))
    log.append_control(PID, 0, 3, commit=False)
    log.append(txn_batch(OTHER, 0, 0))
    log.append_control(OTHER, 0, 3, commit=True)
    log.close()
    seg = log.directory / "00000000000000000000.log"
    out = subprocess.run([sys.executable, "-m", "shmq", "dump-log", "--deep-iteration",
                          "--print-data-log", "--files",
                          f"{seg},{txn_index.path_for(log.directory, 0)}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "endTxnMarker: ABORT coordinatorEpoch: 3" in out.stdout
    assert "endTxnMarker: COMMIT coordinatorEpoch: 3" in out.stdout
    assert f"producerId: {PID} firstOffset: 0 lastOffset: 2 lastStableOffset: 3" in out.stdout
