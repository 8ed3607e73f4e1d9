"""Record timestamps on append, Kafka's ``LogValidator`` rules (issue 21 item 3).

* CreateTime: every record timestamp other than -1 within [now - message.timestamp.before.max.ms,
  now + message.timestamp.after.max.ms] (Kafka 4: 1 h after, no limit before), else
  INVALID_TIMESTAMP with one error per record;
* the batch's maxTimestamp is derived from its records (compressed ones decompressed), and the
  header rewritten (CRC included) when the client's says otherwise;
* a producer-set LogAppendTime attribute: refused on LogAppendTime topics, rewritten to
  CreateTime on CreateTime topics.

Batches are built by kafka-python and patched with ``struct``; CRCs are checked with the
``crc32c`` package and records decoded with kafka-python.
"""

from __future__ import annotations

import struct
import time

import crc32c
import pytest
from _storage_util import attributes, crc_ok, decode, kbatch, log_batches, max_timestamp

from shmq.storage import LogConfig, PartitionLog
from shmq.storage.log import InvalidTimestampError

HOUR = 3_600_000
NOW = 1_800_000_000_000  # the broker's clock in these tests (now_ms=NOW)


def open_log(tmp_path, **cfg) -> PartitionLog:  # type: ignore[no-untyped-def]
    return PartitionLog.open(tmp_path / "t-0", LogConfig(**cfg))


def patch(batch: bytes, **fields: int) -> bytes:
    at = {"attributes": (21, ">h"), "max_timestamp": (35, ">q"), "base_timestamp": (27, ">q")}
    out = bytearray(batch)
    for name, value in fields.items():
        struct.pack_into(at[name][1], out, at[name][0], value)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


@pytest.mark.parametrize("compression", [0, 1, 2, 3, 4])
def test_a_record_too_far_in_the_future_is_refused(tmp_path, compression: int) -> None:
    log = open_log(tmp_path)
    ok = [NOW - 5 * 365 * 24 * HOUR, NOW, NOW + HOUR]  # no limit before, 1 h after (inclusive)
    sent = kbatch([b"a" * 200, b"b" * 200, b"c" * 200], ok, compression=compression)
    assert attributes(sent) & 7 == compression
    assert log.append(sent, now_ms=NOW).last_offset == 2
    bad = [NOW, NOW + HOUR + 1, -1, NOW + 2 * HOUR]
    with pytest.raises(InvalidTimestampError) as exc:
        log.append(kbatch([b"w" * 200, b"x" * 200, b"y" * 200, b"z" * 200], bad,
                          compression=compression), now_ms=NOW)
    assert exc.value.code == 32
    assert str(exc.value) == "One or more records have been rejected due to invalid timestamp"
    assert exc.value.record_errors == [
        (1, f"Timestamp {NOW + HOUR + 1} of message with offset 1 is out of range. The "
            f"timestamp should be within [{NOW - (2**63 - 1)}, {NOW + HOUR}]"),
        (3, f"Timestamp {NOW + 2 * HOUR} of message with offset 3 is out of range. The "
            f"timestamp should be within [{NOW - (2**63 - 1)}, {NOW + HOUR}]")]
    assert log.log_end_offset == 3  # nothing of the refused batch
    log.close()


def test_the_limits_are_the_topic_configs(tmp_path) -> None:
    log = open_log(tmp_path, message_timestamp_before_max_ms=HOUR,
                   message_timestamp_after_max_ms=10)
    with pytest.raises(InvalidTimestampError) as exc:
        log.append(kbatch([b"old"], [NOW - HOUR - 1]), now_ms=NOW)
    assert exc.value.record_errors[0][0] == 0
    log.append(kbatch([b"edge", b"none"], [NOW - HOUR, -1]), now_ms=NOW)  # -1 is never checked
    with pytest.raises(InvalidTimestampError):
        log.append(kbatch([b"soon"], [NOW + 11]), now_ms=NOW)
    log.update_config(LogConfig(message_timestamp_after_max_ms=2**63 - 1))
    log.append(kbatch([b"soon"], [NOW + 11]), now_ms=NOW)
    log.close()


def test_log_append_time_topics_take_any_timestamp(tmp_path) -> None:
    log = open_log(tmp_path, message_timestamp_type="LogAppendTime")
    info = log.append(kbatch([b"a"], [NOW + 100 * HOUR]), now_ms=NOW)
    assert info.max_timestamp == NOW
    log.close()


@pytest.mark.parametrize("compression", [0, 1, 2, 3, 4])
def test_max_timestamp_comes_from_the_records(tmp_path, compression: int) -> None:
    """A client whose header claims a maxTimestamp its records do not have: Kafka stores the
    records' (setMaxTimestamp rewrites header and CRC); the time index, the retention clock and
    MAX_TIMESTAMP lookups follow the records."""
    log = open_log(tmp_path)
    honest = kbatch([b"a" * 300, b"b" * 300], [NOW - 10, NOW - 20], compression=compression)
    assert max_timestamp(honest) == NOW - 10
    lying = patch(honest, max_timestamp=NOW + 50 * 365 * 24 * HOUR)
    info = log.append(lying, now_ms=NOW)
    assert info.max_timestamp == NOW - 10
    log.append(honest, now_ms=NOW)  # a header that tells the truth is stored as sent
    assert log.offset_for_timestamp(-3) == (0, NOW - 10)
    assert log.active_segment.largest_timestamp == NOW - 10
    log.close()
    (_, a), (_, b) = log_batches(log.active_segment.log_path)
    assert max_timestamp(a) == NOW - 10 and crc_ok(a) and attributes(a) == compression
    assert a[16:17] + a[21:35] + a[43:] == lying[16:17] + lying[21:35] + lying[43:]
    assert b[16:] == honest[16:]
    assert [r[1] for r in decode(a)] == [NOW - 10, NOW - 20]


def test_a_producer_set_log_append_time_is_rewritten_on_create_time_topics(tmp_path) -> None:
    """Kafka reads every record of a LogAppendTime batch as carrying the batch's maxTimestamp;
    on a CreateTime topic it validates that and stores the batch as CreateTime."""
    log = open_log(tmp_path)
    sent = patch(kbatch([b"a", b"b"], [NOW - 10, NOW - 5]), attributes=0x08,
                 max_timestamp=NOW - 1)
    assert log.append(sent, now_ms=NOW).max_timestamp == NOW - 1
    with pytest.raises(InvalidTimestampError):  # that maxTimestamp is what gets validated
        log.append(patch(sent, max_timestamp=NOW + 2 * HOUR), now_ms=NOW)
    with pytest.raises(InvalidTimestampError) as exc:  # -1: a LogAppendTime batch after all
        log.append(patch(sent, max_timestamp=-1), now_ms=NOW)
    assert exc.value.record_errors[0][1] == (
        "Invalid timestamp type in message DefaultRecord(offset=0, timestamp=-1, key=0 bytes, "
        "value=1 bytes). Producer should not set timestamp type to LogAppendTime.")
    log.close()
    ((_, stored),) = log_batches(log.active_segment.log_path)
    assert attributes(stored) == 0 and max_timestamp(stored) == NOW - 1 and crc_ok(stored)


def test_a_producer_set_log_append_time_is_refused_on_log_append_time_topics(tmp_path) -> None:
    log = open_log(tmp_path, message_timestamp_type="LogAppendTime")
    sent = patch(kbatch([b"a", b"b"], [NOW, NOW]), attributes=0x08)
    with pytest.raises(InvalidTimestampError) as exc:
        log.append(sent, now_ms=NOW)
    assert [i for i, _ in exc.value.record_errors] == [0, 1]
    assert log.log_end_offset == 0
    log.close()


def test_a_far_future_record_no_longer_blocks_retention(tmp_path) -> None:
    """Before: one record from 2100 made its segment's largest timestamp 2100, so time
    retention kept it and every later segment forever."""
    log = open_log(tmp_path, segment_bytes=300, retention_ms=HOUR)
    old = NOW - 10 * HOUR
    for i in range(6):
        log.append(kbatch([b"x" * 60], [old + i]), now_ms=NOW)
    with pytest.raises(InvalidTimestampError):
        log.append(kbatch([b"from 2100"], [4_102_444_800_000]), now_ms=NOW)
    log.append(kbatch([b"x" * 60], [NOW]), now_ms=NOW)
    log.update_high_watermark(log.log_end_offset)
    assert log.delete_old_segments(now_ms=NOW) == 3  # two batches a segment
    assert log.log_start_offset == 6
    log.close()


def test_a_wall_clock_append_accepts_a_client_clock(tmp_path) -> None:
    log = open_log(tmp_path)
    log.append(kbatch([b"now"], [int(time.time() * 1000)]))
    log.close()
