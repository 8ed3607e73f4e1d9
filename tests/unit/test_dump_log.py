"""``shmq dump-log`` against Kafka's DumpLogSegments text, on segment files built from real bytes.

Segments are concatenations of batches from two independent producers: shmq's ``encode_batch``
and kafka-python 3.0.12's ``DefaultRecordBatchBuilder``.  Index files are packed by hand with
``struct``; expected CRCs come from the ``crc32c`` package, not from shmq.  Expected lines are
written out in full, in the format of Kafka's DumpLogSegments.scala (core/src/main/scala/kafka/
tools/DumpLogSegments.scala: printBatchLevel, dumpLog, dumpIndex, dumpTimeIndex, dumpTxnIndex).
"""

from __future__ import annotations

import random
import struct
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import crc32c
import pytest

from shmq.cli import main
from shmq.protocol.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD
from shmq.protocol.records import LOG_APPEND_TIME, RecordBatchView, encode_batch

with warnings.catch_warnings():
    # kafka-python 3.0.12 calls the deprecated importlib.resources.read_text on import.
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.record.default_records import DefaultRecordBatchBuilder

ROOT = Path(__file__).resolve().parents[2]
SEG = "00000000000000000000"
T0 = 1_700_000_000_000
# a value that compresses well, so kafka-python never falls back to an uncompressed batch
BIG = b"abcdefgh" * 32


# --- helpers -----------------------------------------------------------------------------------


def shmq_batch(base_offset: int, records: list[tuple], *, leader_epoch: int = 0,
               **kwargs: Any) -> bytes:
    """A batch from shmq's encoder, its base offset and leader epoch stamped like a broker does."""
    buf = encode_batch(records, **kwargs)
    RecordBatchView(buf).stamp(base_offset, leader_epoch)
    return bytes(buf)


def kp_batch(base_offset: int, records: list[tuple], codec: int = NONE, *,
             producer_id: int = -1, producer_epoch: int = -1, base_sequence: int = -1) -> bytes:
    """A batch from kafka-python; base offset and leader epoch are outside the CRC."""
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=codec, is_transactional=False, producer_id=producer_id,
        producer_epoch=producer_epoch, base_sequence=base_sequence, batch_size=1 << 24,
    )
    for i, (key, value, ts, headers) in enumerate(records):
        assert builder.append(i, timestamp=ts, key=key, value=value, headers=headers) is not None
    buf = builder.build()
    struct.pack_into(">qi", buf, 0, base_offset, len(buf) - 12)
    struct.pack_into(">i", buf, 12, 0)  # partitionLeaderEpoch
    return bytes(buf)


def crc_of(batch: bytes) -> int:
    return crc32c.crc32c(batch[21:])


def reseal(batch: bytearray) -> bytes:
    """Recompute the CRC after editing a batch (with the independent crc32c package)."""
    struct.pack_into(">I", batch, 17, crc32c.crc32c(bytes(batch[21:])))
    return bytes(batch)


def write(tmp_path: Path, name: str, data: bytes) -> str:
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def dump(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], list[str]]:
    """Run ``shmq dump-log`` in-process: (exit code, stdout lines, stderr lines)."""
    capsys.readouterr()
    rc = main(["dump-log", *argv])
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err.splitlines()


def fields(line: str) -> dict[str, str]:
    """``key: value`` pairs of a batch line (its values hold no spaces)."""
    words = line.split(" ")
    return {k[:-1]: v for k, v in zip(words[::2], words[1::2], strict=True)}


def batch_line(pos: int, size: int, batch: bytes, *, base: int, last: int, count: int,
               max_ts: int, codec: str = "none", producer: str = "-1 producerEpoch: -1",
               sequences: str = "-1 lastSequence: -1", epoch: int = 0,
               transactional: str = "false", control: str = "false",
               ts_type: str = "CreateTime", valid: str = "true") -> str:
    return (
        f"baseOffset: {base} lastOffset: {last} count: {count} baseSequence: {sequences} "
        f"producerId: {producer} partitionLeaderEpoch: {epoch} isTransactional: {transactional} "
        f"isControl: {control} deleteHorizonMs: OptionalLong.empty position: {pos} "
        f"{ts_type}: {max_ts} size: {size} magic: 2 compresscodec: {codec} "
        f"crc: {crc_of(batch)} isvalid: {valid}"
    )


# --- one known batch, line for line ------------------------------------------------------------

KNOWN = [
    (None, b"hello", T0),
    (b"key", b"world", T0 + 9, [("h1", b"x"), ("h2", None)]),
]


def known_batch() -> bytes:
    return shmq_batch(0, KNOWN)


def test_known_batch_prints_exactly_kafkas_lines(tmp_path: Path, capsys: Any) -> None:
    batch = known_batch()
    # 61-byte header + a 12-byte and a 24-byte record, worked out by hand
    assert len(batch) == 97
    log = write(tmp_path, f"{SEG}.log", batch)
    rc, out, err = dump(capsys, "--files", log, "--print-data-log")
    assert rc == 0 and err == []
    assert out == [
        f"Dumping {log}",
        "Log starting offset: 0",
        "baseOffset: 0 lastOffset: 1 count: 2 baseSequence: -1 lastSequence: -1 producerId: -1 "
        "producerEpoch: -1 partitionLeaderEpoch: 0 isTransactional: false isControl: false "
        "deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 1700000000009 size: 97 "
        f"magic: 2 compresscodec: none crc: {crc_of(batch)} isvalid: true",
        "| offset: 0 CreateTime: 1700000000000 keySize: -1 valueSize: 5 sequence: -1 "
        "headerKeys: [] payload: hello",
        "| offset: 1 CreateTime: 1700000000009 keySize: 3 valueSize: 5 sequence: -1 "
        "headerKeys: [h1,h2] key: key payload: world",
    ]


def test_shallow_iteration_prints_batches_only(tmp_path: Path, capsys: Any) -> None:
    batch = known_batch()
    log = write(tmp_path, f"{SEG}.log", batch)
    rc, out, _ = dump(capsys, "--files", log)
    assert rc == 0
    assert out == [f"Dumping {log}", "Log starting offset: 0",
                   batch_line(0, 97, batch, base=0, last=1, count=2, max_ts=T0 + 9)]


def test_record_options_follow_kafkas_prefix_rules(tmp_path: Path, capsys: Any) -> None:
    log = write(tmp_path, f"{SEG}.log", known_batch())
    # --deep-iteration: metadata without key and payload
    _, out, _ = dump(capsys, "--files", log, "--deep-iteration")
    assert out[3:] == [
        "| offset: 0 CreateTime: 1700000000000 keySize: -1 valueSize: 5 sequence: -1 headerKeys: []",
        "| offset: 1 CreateTime: 1700000000009 keySize: 3 valueSize: 5 sequence: -1 "
        "headerKeys: [h1,h2]",
    ]
    # --skip-record-metadata: the "| " prefix goes to the key; with no key Kafka prints
    # " payload: ..." without it
    _, out, _ = dump(capsys, "--files", log, "--print-data-log", "--skip-record-metadata")
    assert out[3:] == [" payload: hello", "| key: key payload: world"]
    # --skip-record-metadata alone leaves one empty line per record
    _, out, _ = dump(capsys, "--files", log, "--deep-iteration", "--skip-record-metadata")
    assert out[3:] == ["", ""]


def test_python_dash_m_shmq_prints_the_same(tmp_path: Path, capsys: Any) -> None:
    log = write(tmp_path, f"{SEG}.log", known_batch() + shmq_batch(2, [(b"k", b"v", T0)]))
    _, out, _ = dump(capsys, "--files", log, "--print-data-log")
    proc = subprocess.run(
        [sys.executable, "-m", "shmq", "dump-log", "--files", log, "--print-data-log"],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.splitlines() == out


# --- segments from two producers ---------------------------------------------------------------


def test_mixed_segment_of_shmq_and_kafka_python_batches(tmp_path: Path, capsys: Any) -> None:
    headers = [("trace", b"1"), ("span", b"2")]
    b0 = shmq_batch(100, [(b"a", b"one", T0), (b"b", b"two", T0 + 1)])
    b1 = kp_batch(102, [(b"c", BIG, T0 + 5, headers), (None, BIG, T0 + 3, [])], GZIP,
                  producer_id=42, producer_epoch=3, base_sequence=10)
    b2 = shmq_batch(104, [(b"d", BIG, T0 + 7), (b"e", None, T0 + 8)], compression_type=ZSTD,
                    producer_id=42, producer_epoch=3, base_sequence=12)
    b3 = kp_batch(106, [(b"f", b"\xff\xfeok", T0 + 9, [])])
    assert b1[22] & 7 == GZIP and b2[22] & 7 == ZSTD  # both did compress
    log = write(tmp_path, "00000000000000000100.log", b0 + b1 + b2 + b3)
    rc, out, err = dump(capsys, "--files", log, "--print-data-log")
    assert rc == 0 and err == []
    p1, p2, p3 = len(b0), len(b0) + len(b1), len(b0) + len(b1) + len(b2)
    big = BIG.decode()
    assert out == [
        f"Dumping {log}",
        "Log starting offset: 100",
        batch_line(0, len(b0), b0, base=100, last=101, count=2, max_ts=T0 + 1),
        f"| offset: 100 CreateTime: {T0} keySize: 1 valueSize: 3 sequence: -1 headerKeys: [] "
        "key: a payload: one",
        f"| offset: 101 CreateTime: {T0 + 1} keySize: 1 valueSize: 3 sequence: -1 headerKeys: [] "
        "key: b payload: two",
        batch_line(p1, len(b1), b1, base=102, last=103, count=2, max_ts=T0 + 5, codec="gzip",
                   producer="42 producerEpoch: 3", sequences="10 lastSequence: 11"),
        f"| offset: 102 CreateTime: {T0 + 5} keySize: 1 valueSize: 256 sequence: 10 "
        f"headerKeys: [trace,span] key: c payload: {big}",
        f"| offset: 103 CreateTime: {T0 + 3} keySize: -1 valueSize: 256 sequence: 11 "
        f"headerKeys: [] payload: {big}",
        batch_line(p2, len(b2), b2, base=104, last=105, count=2, max_ts=T0 + 8, codec="zstd",
                   producer="42 producerEpoch: 3", sequences="12 lastSequence: 13"),
        f"| offset: 104 CreateTime: {T0 + 7} keySize: 1 valueSize: 256 sequence: 12 "
        f"headerKeys: [] key: d payload: {big}",
        f"| offset: 105 CreateTime: {T0 + 8} keySize: 1 valueSize: -1 sequence: 13 "
        "headerKeys: [] key: e",
        batch_line(p3, len(b3), b3, base=106, last=106, count=1, max_ts=T0 + 9),
        f"| offset: 106 CreateTime: {T0 + 9} keySize: 1 valueSize: 4 sequence: -1 headerKeys: [] "
        "key: f payload: \ufffd\ufffdok",
    ]


@pytest.mark.parametrize("codec,name", [(GZIP, "gzip"), (SNAPPY, "snappy"), (LZ4, "lz4"),
                                        (ZSTD, "zstd")])
def test_every_codec_is_named_and_decoded(tmp_path: Path, capsys: Any, codec: int,
                                          name: str) -> None:
    batch = kp_batch(0, [(b"k", BIG, T0, [])] * 3, codec)
    assert batch[22] & 7 == codec
    log = write(tmp_path, f"{SEG}.log", batch)
    rc, out, _ = dump(capsys, "--files", log, "--print-data-log")
    assert rc == 0
    assert fields(out[2])["compresscodec"] == name
    assert out[3:] == [
        f"| offset: {i} CreateTime: {T0} keySize: 1 valueSize: 256 sequence: -1 headerKeys: [] "
        f"key: k payload: {BIG.decode()}" for i in range(3)
    ]


def test_log_append_time_labels_batch_and_records(tmp_path: Path, capsys: Any) -> None:
    batch = shmq_batch(0, [(None, b"x", T0), (None, b"y", T0 + 1)],
                       timestamp_type=LOG_APPEND_TIME, log_append_time=T0 + 500)
    log = write(tmp_path, f"{SEG}.log", batch)
    _, out, _ = dump(capsys, "--files", log, "--deep-iteration")
    assert fields(out[2])["LogAppendTime"] == str(T0 + 500)
    assert "CreateTime" not in out[2]
    assert out[3:] == [
        f"| offset: {i} LogAppendTime: {T0 + 500} keySize: -1 valueSize: 1 sequence: -1 "
        "headerKeys: []" for i in range(2)
    ]


def test_sequences_wrap_at_int_max(tmp_path: Path, capsys: Any) -> None:
    batch = shmq_batch(0, [(None, b"v", T0)] * 3, producer_id=9, producer_epoch=0,
                       base_sequence=2**31 - 2)
    log = write(tmp_path, f"{SEG}.log", batch)
    _, out, _ = dump(capsys, "--files", log, "--deep-iteration")
    f = fields(out[2])
    assert (f["baseSequence"], f["lastSequence"]) == (str(2**31 - 2), "0")
    assert [fields(line.removesuffix(" headerKeys: []")[2:])["sequence"] for line in out[3:]] \
        == [str(2**31 - 2), str(2**31 - 1), "0"]


def test_delete_horizon_shows_the_base_timestamp(tmp_path: Path, capsys: Any) -> None:
    batch = bytearray(shmq_batch(0, [(b"k", None, T0 + 3)]))
    batch[22] |= 0x40  # attributes bit 6: the batch carries a delete horizon
    log = write(tmp_path, f"{SEG}.log", reseal(batch))
    _, out, _ = dump(capsys, "--files", log)
    f = fields(out[2])
    assert f["deleteHorizonMs"] == f"OptionalLong[{T0 + 3}]" and f["isvalid"] == "true"


# --- control batches ---------------------------------------------------------------------------


@pytest.mark.parametrize("type_id,name", [(1, "COMMIT"), (0, "ABORT")])
def test_control_batch_prints_the_end_txn_marker(tmp_path: Path, capsys: Any, type_id: int,
                                                 name: str) -> None:
    data = shmq_batch(0, [(b"k", b"v", T0)], producer_id=5, producer_epoch=2, base_sequence=0,
                      transactional=True)
    key = struct.pack(">hh", 0, type_id)
    marker = shmq_batch(1, [(key, b"\x00\x00\x00\x00\x00\x05", T0 + 1)], transactional=True,
                        control=True, producer_id=5, producer_epoch=2)
    assert marker[22] == 0x30
    log = write(tmp_path, f"{SEG}.log", data + marker)
    rc, out, err = dump(capsys, "--files", log, "--print-data-log")
    assert rc == 0 and err == []
    assert out[4] == batch_line(len(data), len(marker), marker, base=1, last=1, count=1,
                                max_ts=T0 + 1, producer="5 producerEpoch: 2",
                                transactional="true", control="true")
    # key and payload are never printed for control records
    assert out[5] == (f"| offset: 1 CreateTime: {T0 + 1} keySize: 4 valueSize: 6 sequence: -1 "
                      f"headerKeys: [] endTxnMarker: {name} coordinatorEpoch: 5")


def test_other_control_types_print_their_name_and_id(tmp_path: Path, capsys: Any) -> None:
    marker = shmq_batch(0, [(struct.pack(">hh", 0, 2), b"", T0), (struct.pack(">hh", 0, 77),
                        b"", T0)], control=True)
    log = write(tmp_path, f"{SEG}.log", marker)
    rc, out, _ = dump(capsys, "--files", log, "--deep-iteration")
    assert rc == 0
    assert out[3].endswith("headerKeys: [] controlType: LEADER_CHANGE(2)")
    assert out[4].endswith("headerKeys: [] controlType: UNKNOWN(77)")


def test_invalid_control_key_is_an_error_line(tmp_path: Path, capsys: Any) -> None:
    marker = shmq_batch(0, [(b"\x00", b"", T0)], control=True)
    log = write(tmp_path, f"{SEG}.log", marker)
    rc, out, err = dump(capsys, "--files", log, "--deep-iteration")
    assert rc == 1
    assert out[3] == f"| offset: 0 CreateTime: {T0} keySize: 1 valueSize: 0 sequence: -1 headerKeys: []"
    assert err == [f"Error: invalid control record at offset 0 of {log}: the control record key "
                   "must have at least 4 bytes, found 1"]


# --- damaged logs ------------------------------------------------------------------------------


@pytest.mark.parametrize("cut", [1, 17, 60, 61, 80])
def test_truncated_tail_reports_invalid_bytes(tmp_path: Path, capsys: Any, cut: int) -> None:
    b0, b1 = known_batch(), shmq_batch(2, [(b"k", b"v" * 40, T0)])
    log = write(tmp_path, f"{SEG}.log", b0 + b1[: len(b1) - cut])
    rc, out, err = dump(capsys, "--files", log, "--print-data-log")
    assert rc == 0 and err == []
    assert out[2] == batch_line(0, 97, b0, base=0, last=1, count=2, max_ts=T0 + 9)
    assert out[5:] == [f"Found {len(b1) - cut} invalid bytes at the end of {SEG}.log"]


def test_zero_filled_tail_is_invalid_bytes_and_an_error(tmp_path: Path, capsys: Any) -> None:
    b0 = known_batch()
    log = write(tmp_path, f"{SEG}.log", b0 + bytes(100))
    rc, out, err = dump(capsys, "--files", log)
    # Kafka's FileLogInputStream throws on a batch length below 14; we stop and say so
    assert rc == 1
    assert out[3:] == [f"Found 100 invalid bytes at the end of {SEG}.log"]
    assert err == [f"Error: corrupt record batch at position 97 of {log}: batch length 0 is "
                   "smaller than the minimum record overhead (14)"]


def test_max_bytes_reads_a_prefix_without_the_invalid_bytes_line(tmp_path: Path,
                                                                 capsys: Any) -> None:
    b0, b1 = known_batch(), shmq_batch(2, [(b"k", b"v", T0)])
    log = write(tmp_path, f"{SEG}.log", b0 + b1 + b"junk")
    _, out, _ = dump(capsys, "--files", log, "--max-bytes", str(len(b0) + 10))
    assert out == [f"Dumping {log}", "Log starting offset: 0",
                   batch_line(0, 97, b0, base=0, last=1, count=2, max_ts=T0 + 9)]
    _, out, _ = dump(capsys, "--files", log, "--max-bytes", str(len(b0) + len(b1)))
    assert len(out) == 4 and fields(out[3])["baseOffset"] == "2"
    _, out, _ = dump(capsys, "--files", log)
    assert out[-1] == f"Found 4 invalid bytes at the end of {SEG}.log"


@pytest.mark.parametrize("at", [30, 43, 45, 53])  # lastOffsetDelta, producerId, ..., baseSequence
def test_flipped_header_byte_is_reported_not_valid(tmp_path: Path, capsys: Any, at: int) -> None:
    good = known_batch()
    bad = bytearray(good)
    bad[at] ^= 0x01
    log = write(tmp_path, f"{SEG}.log", bytes(bad) + shmq_batch(2, [(None, b"z", T0)]))
    rc, out, _ = dump(capsys, "--files", log)
    assert rc == 0
    f = fields(out[2])
    assert f["isvalid"] == "false" and f["crc"] == str(crc_of(good))  # the stored CRC
    assert fields(out[3])["isvalid"] == "true"  # the next batch is still framed and read


def test_flipped_record_byte_still_dumps_the_batch(tmp_path: Path, capsys: Any) -> None:
    bad = bytearray(known_batch())
    bad[bad.index(b"world") + 4] ^= 0x20  # 'd' -> 'D'
    log = write(tmp_path, f"{SEG}.log", bytes(bad))
    rc, out, _ = dump(capsys, "--files", log, "--print-data-log")
    assert rc == 0
    assert fields(out[2])["isvalid"] == "false"
    assert out[4].endswith("key: key payload: worlD")


def test_undecodable_records_are_an_error_and_the_dump_goes_on(tmp_path: Path,
                                                               capsys: Any) -> None:
    bad = bytearray(known_batch())
    struct.pack_into(">i", bad, 57, 3)  # recordsCount 3, but only 2 records follow
    b1 = shmq_batch(2, [(None, b"z", T0)])
    log = write(tmp_path, f"{SEG}.log", reseal(bad) + b1)
    rc, out, err = dump(capsys, "--files", log, "--print-data-log")
    assert rc == 1
    assert fields(out[2])["isvalid"] == "true" and fields(out[2])["count"] == "3"
    assert fields(out[3])["baseOffset"] == "2"
    assert out[4] == f"| offset: 2 CreateTime: {T0} keySize: -1 valueSize: 1 sequence: -1 " \
        "headerKeys: [] payload: z"
    assert len(err) == 1 and err[0].startswith(
        f"Error: cannot read the records of the batch at position 0 of {log}: ")


def test_non_consecutive_offsets_are_reported(tmp_path: Path, capsys: Any) -> None:
    log = write(tmp_path, f"{SEG}.log", shmq_batch(0, [(None, b"a", T0)])
                + shmq_batch(5, [(None, b"b", T0)]) + shmq_batch(9, [(None, b"c", T0)]))
    rc, _, err = dump(capsys, "--files", log, "--deep-iteration")
    assert rc == 0
    # Kafka prepends each pair to its list, so the last gap comes first
    assert err == [f"Non-consecutive offsets in {log}", "  5 is followed by 9",
                   "  0 is followed by 5"]


def test_empty_log_prints_only_the_header(tmp_path: Path, capsys: Any) -> None:
    log = write(tmp_path, "00000000000000000042.log", b"")
    assert dump(capsys, "--files", log) == (0, [f"Dumping {log}", "Log starting offset: 42"], [])


# --- index files -------------------------------------------------------------------------------


def indexed_segment(tmp_path: Path) -> tuple[list[bytes], str]:
    batches = [shmq_batch(0, [(None, b"a", T0), (None, b"b", T0 + 2)]),
               kp_batch(2, [(b"k", b"c", T0 + 5, [])]),
               shmq_batch(3, [(None, b"d", T0 + 4), (None, b"e", T0 + 9)])]
    return batches, write(tmp_path, f"{SEG}.log", b"".join(batches))


def test_offset_index_entries_stop_at_the_zero_tail(tmp_path: Path, capsys: Any) -> None:
    batches, _ = indexed_segment(tmp_path)
    p1, p2 = len(batches[0]), len(batches[0]) + len(batches[1])
    # entries hold each batch's last offset, then a preallocated zero-filled tail
    index = write(tmp_path, f"{SEG}.index",
                  struct.pack(">iiiiii", 1, 0, 2, p1, 4, p2) + bytes(8 * 5))
    rc, out, err = dump(capsys, "--files", index)
    assert (rc, err) == (0, [])
    assert out == [f"Dumping {index}", "offset: 1 position: 0", f"offset: 2 position: {p1}",
                   f"offset: 4 position: {p2}"]


def test_offset_index_mismatches_are_reported_on_stderr(tmp_path: Path, capsys: Any) -> None:
    batches, _ = indexed_segment(tmp_path)
    p1 = len(batches[0])
    index = write(tmp_path, f"{SEG}.index", struct.pack(">iiiiii", 0, 0, 2, p1, 9, 5000))
    rc, out, err = dump(capsys, "--files", index)
    assert rc == 0
    assert out[1:] == ["offset: 0 position: 0", f"offset: 2 position: {p1}",
                       "offset: 9 position: 5000"]
    assert err == [f"Mismatches in :{index}", "  Index offset: 9, log offset: -1",
                   "  Index offset: 0, log offset: 1"]
    # --verify-index-only: the same report, no entries
    rc, out, err2 = dump(capsys, "--files", index, "--verify-index-only")
    assert (rc, out, err2) == (0, [f"Dumping {index}"], err)


def test_offset_index_sanity_check(tmp_path: Path, capsys: Any) -> None:
    indexed_segment(tmp_path)
    good = write(tmp_path, f"{SEG}.index", struct.pack(">ii", 1, 0) + bytes(8))
    assert dump(capsys, "--files", good, "--index-sanity-check") == (
        0, [f"Dumping {good}", f"{good} passed sanity check."], [])
    odd = write(tmp_path, f"{SEG}.index", struct.pack(">ii", 1, 0) + bytes(3))
    rc, out, err = dump(capsys, "--files", odd, "--index-sanity-check")
    assert (rc, out) == (1, [f"Dumping {odd}"])
    assert err == [f"Error: Index file {odd} is corrupt, found 11 bytes which is neither "
                   "positive nor a multiple of 8"]
    backwards = write(tmp_path, f"{SEG}.index", struct.pack(">iiii", 1, 0, -4, 0))
    rc, _, err = dump(capsys, "--files", backwards, "--index-sanity-check")
    assert rc == 1 and err == [
        f"Error: Corrupt index found, index file {backwards} has non-zero size but the last "
        "offset is -4 which is less than the base offset 0"]


def test_empty_index(tmp_path: Path, capsys: Any) -> None:
    index = write(tmp_path, "00000000000000000007.index", b"")
    assert dump(capsys, "--files", index) == (0, [f"Dumping {index}", f"{index} is empty."], [])


def test_index_without_its_log_is_dumped_with_a_warning(tmp_path: Path, capsys: Any) -> None:
    index = write(tmp_path, f"{SEG}.index", struct.pack(">ii", 3, 120))
    rc, out, err = dump(capsys, "--files", index)
    assert (rc, out) == (0, [f"Dumping {index}", "offset: 3 position: 120"])
    assert err == [f"Warning: {tmp_path / SEG}.log does not exist; the entries of {index} are "
                   "not checked against it"]
    rc, _, err = dump(capsys, "--files", index, "--verify-index-only")
    assert rc == 1 and err == [f"Error: cannot verify {index}: {tmp_path / SEG}.log does not exist"]


def test_time_index_entries_stop_at_the_zero_tail(tmp_path: Path, capsys: Any) -> None:
    indexed_segment(tmp_path)
    tindex = write(tmp_path, f"{SEG}.timeindex",
                   struct.pack(">qiqiqi", T0 + 2, 1, T0 + 5, 2, T0 + 9, 4) + bytes(12 * 3))
    rc, out, err = dump(capsys, "--files", tindex)
    assert (rc, err) == (0, [])
    assert out == [f"Dumping {tindex}", f"timestamp: {T0 + 2} offset: 1",
                   f"timestamp: {T0 + 5} offset: 2", f"timestamp: {T0 + 9} offset: 4"]


def test_time_index_checks_are_reported_on_stderr(tmp_path: Path, capsys: Any) -> None:
    indexed_segment(tmp_path)
    tindex = write(tmp_path, f"{SEG}.timeindex",
                   struct.pack(">qiqiqiqi", T0 + 2, 1, T0 + 1, 2, T0 + 9, 3, T0 + 9, 8))
    rc, out, err = dump(capsys, "--files", tindex)
    assert rc == 0 and len(out) == 5
    assert err == [
        f"Found timestamp mismatch in :{tindex}", f"  Index timestamp: {T0 + 1}, log timestamp: "
        f"{T0 + 5}",
        f"Found out of order timestamp in :{tindex}", f"  Index timestamp: {T0 + 1}, "
        f"Previously indexed timestamp: {T0 + 2}",
        f"The following indexed offsets are not found in :{tindex}",
        "Indexed offset: 3, found log offset: 4", "Indexed offset: 8, found log offset: -1",
    ]


def test_time_index_sanity_check(tmp_path: Path, capsys: Any) -> None:
    good = write(tmp_path, f"{SEG}.timeindex", struct.pack(">qiqi", T0, 1, T0 + 1, 3))
    assert dump(capsys, "--files", good, "--index-sanity-check") == (
        0, [f"Dumping {good}", f"{good} passed sanity check."], [])
    # a preallocated tail makes the last entry (0, base): Kafka's check fails on it
    tail = write(tmp_path, f"{SEG}.timeindex", struct.pack(">qi", T0, 1) + bytes(12))
    rc, _, err = dump(capsys, "--files", tail, "--index-sanity-check")
    assert rc == 1 and err == [
        f"Error: Corrupt time index found, time index file ({tail}) has non-zero size but the "
        f"last timestamp is 0 which is less than the first timestamp {T0}"]
    odd = write(tmp_path, f"{SEG}.timeindex", struct.pack(">qi", T0, 1) + bytes(5))
    rc, _, err = dump(capsys, "--files", odd, "--index-sanity-check")
    assert rc == 1 and err == [f"Error: Time index file {odd} is corrupt, found 17 bytes which "
                               "is neither positive nor a multiple of 12"]


def test_txn_index(tmp_path: Path, capsys: Any) -> None:
    entries = struct.pack(">hqqqq", 0, 7, 10, 20, 15) + struct.pack(">hqqqq", 0, 8, 30, 31, 31)
    txn = write(tmp_path, f"{SEG}.txnindex", entries + b"\x00" * 5)  # partial tail is ignored
    assert dump(capsys, "--files", txn) == (0, [
        f"Dumping {txn}",
        "version: 0 producerId: 7 firstOffset: 10 lastOffset: 20 lastStableOffset: 15",
        "version: 0 producerId: 8 firstOffset: 30 lastOffset: 31 lastStableOffset: 31",
    ], [])


def test_several_files_in_one_run(tmp_path: Path, capsys: Any) -> None:
    batches, log = indexed_segment(tmp_path)
    index = write(tmp_path, f"{SEG}.index", struct.pack(">ii", 1, 0))
    other = write(tmp_path, f"{SEG}.deleted", b"\x00\x01")
    rc, out, err = dump(capsys, "--files", ",".join([log, index, other]))
    assert rc == 0
    assert [line for line in out if line.startswith("Dumping")] == [
        f"Dumping {log}", f"Dumping {index}", f"Dumping {other}"]
    assert out[-2:] == ["offset: 1 position: 0", f"Dumping {other}"]
    assert err == [f"Ignoring unknown file {other}"]


def test_producer_snapshot(tmp_path: Path, capsys: Any) -> None:
    """Kafka's dumpProducerIdSnapshot lines; the oracle for the layout is Kafka's own tool
    (tests/integration/test_kafka_dump_log.py), here the lines themselves."""
    from shmq.storage.producer_state import BatchMetadata, ProducerStateEntry, encode_snapshot

    entries = [ProducerStateEntry(7, 2, [BatchMetadata(10, 14, 104, 4, T0 + 9)],
                                  last_timestamp=T0 + 9),
               ProducerStateEntry(9, 0, [BatchMetadata(2**31 - 2, 1, 50, 3, T0)],
                                  coordinator_epoch=3, last_timestamp=T0,
                                  current_txn_first_offset=48),
               ProducerStateEntry(11, 1, last_timestamp=T0 + 1)]
    data = encode_snapshot(entries)
    path = write(tmp_path, "00000000000000000105.snapshot", data)
    assert dump(capsys, "--files", path) == (0, [
        f"Dumping {path}",
        "producerId: 7 producerEpoch: 2 coordinatorEpoch: -1 currentTxnFirstOffset: "
        f"OptionalLong.empty lastTimestamp: {T0 + 9} firstSequence: 10 lastSequence: 14 "
        f"lastOffset: 104 offsetDelta: 4 timestamp: {T0 + 9}",
        "producerId: 9 producerEpoch: 0 coordinatorEpoch: 3 currentTxnFirstOffset: "
        f"OptionalLong[48] lastTimestamp: {T0} firstSequence: 2147483646 lastSequence: 1 "
        f"lastOffset: 50 offsetDelta: 3 timestamp: {T0}",
        "producerId: 11 producerEpoch: 1 coordinatorEpoch: -1 currentTxnFirstOffset: "
        f"OptionalLong.empty lastTimestamp: {T0 + 1}"], [])
    bad = write(tmp_path, "00000000000000000106.snapshot", data[:-1] + bytes([data[-1] ^ 1]))
    rc, out, err = dump(capsys, "--files", bad)
    assert (rc, out) == (0, [f"Dumping {bad}"])
    assert len(err) == 1 and err[0].startswith(
        "Snapshot is corrupt (CRC is no longer valid). Stored crc: ")
    invalid = "Snapshot failed schema validation: "
    for broken, why in ((b"\x00", invalid + "null"), (data[:20], invalid + "null"),
                        (b"\x00\x02" + data[2:],
                         invalid + "Snapshot contained an unknown file version 2")):
        f = write(tmp_path, "00000000000000000107.snapshot", broken)
        assert dump(capsys, "--files", f) == (0, [f"Dumping {f}"], [why])


# --- command-line errors -----------------------------------------------------------------------


def test_missing_file_is_one_error_line(tmp_path: Path, capsys: Any) -> None:
    log = write(tmp_path, f"{SEG}.log", known_batch())
    missing = str(tmp_path / "00000000000000000099.log")
    assert dump(capsys, "--files", f"{log},{missing}") == (
        1, [], [f"Error: file {missing} does not exist"])


def test_usage_errors_are_one_line(capsys: Any) -> None:
    for argv, needle in [
        (["dump-log"], "the following arguments are required: --files"),
        (["dump-log", "--files", "x.log", "--max-bytes", "lots"], "'lots' is not a whole number"),
        (["dump-log", "--files", "x.log", "--max-bytes", "-1"], "-1 is not between 0 and"),
        (["dump-log", "--files", "x.log", "--no-such-flag"], "unrecognized arguments"),
        (["no-such-command"], "invalid choice"),
        ([], "the following arguments are required"),
    ]:
        capsys.readouterr()
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1 and needle in err, (argv, err)


def test_help_and_version(capsys: Any) -> None:
    assert main(["--help"]) == 0
    assert "dump-log" in capsys.readouterr().out
    assert main(["dump-log", "--help"]) == 0
    assert "--print-data-log" in capsys.readouterr().out
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("shmq ")


def test_unparsable_segment_name_is_an_error(tmp_path: Path, capsys: Any) -> None:
    log = write(tmp_path, "segment.log", known_batch())
    rc, out, err = dump(capsys, "--files", log)
    assert (rc, out) == (1, [f"Dumping {log}"])
    assert err == [f"Error: cannot read a base offset from the name of {log} (segment files are "
                   "named like 00000000000000000000.log)"]


# --- garbage never raises ----------------------------------------------------------------------


def _mutations(rng: random.Random, good: bytes) -> bytes:
    data = bytearray(good)
    for _ in range(rng.randint(1, 6)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    if rng.random() < 0.5:  # keep the CRC right, so the damage reaches the record decoder
        pos = 0
        while pos + 61 <= len(data):
            size = struct.unpack_from(">i", data, pos + 8)[0] + 12
            if size < 61 or pos + size > len(data):
                break
            data[pos: pos + size] = reseal(bytearray(data[pos: pos + size]))
            pos += size
    return bytes(data)


def test_garbage_never_raises(tmp_path: Path, capsys: Any) -> None:
    rng = random.Random(20240601)
    good = (known_batch() + kp_batch(2, [(b"k", BIG, T0, [("h", b"v")])] * 2, GZIP)
            + shmq_batch(4, [(b"k", BIG, T0)] * 2, compression_type=ZSTD)
            + shmq_batch(6, [(b"\x00\x00\x00\x01", b"\x00\x00\x00\x00\x00\x05", T0)],
                         transactional=True, control=True))
    seen = set()
    for case in range(200):
        if case % 3 == 0:
            data = rng.randbytes(rng.choice([0, 1, 16, 17, 18, 61, 62, 500, 5000]))
        else:
            data = _mutations(rng, good)
        for suffix in (".log", ".index", ".timeindex", ".txnindex"):
            write(tmp_path, SEG + suffix, data)
        files = ",".join(str(tmp_path / (SEG + s)) for s in (".log", ".index", ".timeindex",
                                                           ".txnindex"))
        for extra in (["--print-data-log"], ["--index-sanity-check"]):
            rc, out, err = dump(capsys, "--files", files, *extra)
            assert rc in (0, 1), (case, err)
            assert out[0].startswith("Dumping ")
            assert all(not line.startswith("Traceback") for line in err)
            seen.add(rc)
    assert seen == {0, 1}


def test_garbage_file_via_subprocess_has_no_traceback(tmp_path: Path) -> None:
    log = write(tmp_path, f"{SEG}.log", random.Random(7).randbytes(4096))
    proc = subprocess.run(
        [sys.executable, "-m", "shmq", "dump-log", "--files", log, "--print-data-log"],
        capture_output=True, text=True, cwd=ROOT, timeout=60, check=False,
    )
    assert proc.returncode in (0, 1)
    assert "Traceback" not in proc.stderr
    assert proc.stdout.startswith(f"Dumping {log}\nLog starting offset: 0\n")
