"""Producer ids expire from a partition log (Kafka ``removeExpiredProducers``, issue 21 item 2).

Batches are built by kafka-python; snapshot files are parsed here with ``struct``
(ProducerSnapshot v1).
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import pytest
from _storage_util import kbatch

from shmq.broker.config import BrokerConfig
from shmq.errors import ConfigError, KafkaApiError
from shmq.storage import LogConfig, PartitionLog

HOUR = 3_600_000
DAY = 24 * HOUR


def now_ms() -> int:
    return int(time.time() * 1000)


def batch(pid: int, seq: int = 0, n: int = 1, ts: int | None = None) -> bytes:
    ts = now_ms() if ts is None else ts
    return kbatch([b"v%d" % i for i in range(n)], [ts] * n, producer_id=pid, producer_epoch=0,
                  base_sequence=seq)


def snapshot_pids(path: Path) -> list[int]:
    data = path.read_bytes()
    version, _crc, count = struct.unpack_from(">hIi", data)
    assert version == 1 and len(data) == 10 + 46 * count
    return [struct.unpack_from(">q", data, 10 + 46 * i)[0] for i in range(count)]


def test_idle_producers_go_and_the_next_snapshot_does_not_hold_them(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=4096))
    t = now_ms()
    for pid in range(1, 101):
        log.append(batch(pid, ts=t - 10_000))          # idle for 10 s
    log.append(batch(500, ts=t))                        # just wrote
    assert len(log.producer_state) == 101
    assert log.remove_expired_producers(t, 60_000) == 0
    assert log.remove_expired_producers(t, 10_000) == 100  # idle >= producer.id.expiration.ms
    assert sorted(log.producer_state.producers) == [500]
    log.roll()
    newest = sorted((tmp_path / "t-0").glob("*.snapshot"))[-1]
    assert snapshot_pids(newest) == [500]
    log.close()
    reopened = PartitionLog.open(tmp_path / "t-0", LogConfig(segment_bytes=4096))
    assert sorted(reopened.producer_state.producers) == [500]
    reopened.close()


def test_a_snapshot_loaded_at_start_drops_producers_idle_for_a_day(tmp_path: Path) -> None:
    """``loadFromSnapshot`` filters expired producers (the default producer.id.expiration.ms,
    a day, until the worker's first check applies its own setting)."""
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    t = now_ms()
    log.append(batch(1, ts=t - DAY - 1000))
    log.append(batch(2, ts=t - DAY + 60_000))
    log.close()  # clean shutdown: a snapshot at the LEO, nothing to replay after it
    assert snapshot_pids(sorted((tmp_path / "t-0").glob("*.snapshot"))[-1]) == [1, 2]
    reopened = PartitionLog.open(tmp_path / "t-0", LogConfig())
    assert sorted(reopened.producer_state.producers) == [2]
    reopened.close()


def test_a_retry_from_an_expired_producer_is_appended_again(tmp_path: Path) -> None:
    """Kafka >= 2.5 (KIP-360): a producer the partition no longer knows may write any sequence.
    A retry of a batch it wrote before expiring is therefore a new write, not a duplicate."""
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    t = now_ms()
    first = log.append(batch(7, seq=0, n=3, ts=t - 5000))
    assert (first.first_offset, first.last_offset) == (0, 2)
    retry = log.append(batch(7, seq=0, n=3, ts=t - 5000))
    assert (retry.first_offset, retry.batch_count) == (0, 0)   # a duplicate: nothing appended
    with pytest.raises(KafkaApiError) as gap:
        log.append(batch(7, seq=5))
    assert gap.value.code == 45  # known producer: OUT_OF_ORDER_SEQUENCE_NUMBER
    assert log.remove_expired_producers(t, 5000) == 1
    again = log.append(batch(7, seq=0, n=3, ts=t - 5000))
    assert (again.first_offset, again.last_offset) == (3, 5) and log.log_end_offset == 6
    assert log.append(batch(7, seq=3)).first_offset == 6       # and it continues from there
    assert log.remove_expired_producers(now_ms() + 10_000, 5000) == 1
    assert log.append(batch(7, seq=42)).first_offset == 7      # unknown: any sequence
    log.close()


def test_open_transactions_never_expire(tmp_path: Path) -> None:
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    b = bytearray(batch(9, ts=now_ms() - DAY * 2))
    b[22] |= 0x10  # transactional
    from shmq._fast import crc32c

    struct.pack_into(">I", b, 17, crc32c(bytes(b[21:])))
    log.append(bytes(b))
    assert log.remove_expired_producers(now_ms(), 1000) == 0
    assert log.producer_state.first_unstable_offset() == 0
    log.close()


def test_broker_configs() -> None:
    c = BrokerConfig().with_properties({"producer.id.expiration.ms": "60000",
                                        "producer.id.expiration.check.interval.ms": "1000"})
    assert (c.producer_id_expiration_ms, c.producer_id_expiration_check_interval_ms) == (60000,
                                                                                          1000)
    assert BrokerConfig().producer_id_expiration_ms == 86_400_000  # Kafka's defaults
    assert BrokerConfig().producer_id_expiration_check_interval_ms == 600_000
    for bad in ({"producer.id.expiration.ms": "0"}, {"producer.id.expiration.ms": "soon"},
                {"producer.id.expiration.check.interval.ms": "-1"}):
        with pytest.raises(ConfigError):
            BrokerConfig().with_properties(bad)
