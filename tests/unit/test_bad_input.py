"""Hostile input: every ``_fast`` entry point (compiled and twin) and the record decoders.

The contract (``shmq/_fast/batch.pyx``): bad record data raises ``CorruptRecordError`` and
nothing else, never crashes, never reads outside the buffer.  The index searches raise
``ValueError`` for an entry count or layout that does not fit the buffer.  Anything that could
take the interpreter down runs in a child process.
"""

from __future__ import annotations

import importlib
import os
import struct
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import cramjam
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shmq._fast as fast
from shmq._fast import _reference
from shmq.errors import CorruptRecordError
from shmq.protocol import compression as codecs
from shmq.protocol.records import (
    RecordBatchView,
    batches_to_arrow,
    decode_batches,
    iter_batches,
)

ROOT = Path(__file__).resolve().parents[2]
SCAN_COLUMNS = fast.SCAN_COLUMNS
MiB = 1024 * 1024
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _impl(batch: Any, crc: Any, index: Any) -> SimpleNamespace:
    names = ("validate_batch", "batch_header", "stamp_batch", "scan_batches", "decode_records",
             "encode_records", "build_batch", "fill_columns")
    ns = SimpleNamespace(**{n: getattr(batch, n) for n in names})
    ns.crc32c = crc.crc32c
    ns.largest_lower_bound = index.largest_lower_bound
    ns.smallest_upper_bound = index.smallest_upper_bound
    return ns


TWIN = _impl(_reference, _reference, _reference)
if fast.HAVE_FAST:
    COMPILED = _impl(
        importlib.import_module("shmq._fast.batch"),
        importlib.import_module("shmq._fast.crc32c"),
        importlib.import_module("shmq._fast.index"),
    )
    IMPLS = [pytest.param(COMPILED, id="compiled"), pytest.param(TWIN, id="twin")]
else:
    IMPLS = [pytest.param(TWIN, id="twin")]

impls = pytest.mark.parametrize("impl", IMPLS)


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def _zz(v: int) -> bytes:
    """A zigzag varint."""
    z = ((v << 1) ^ (v >> 63)) & 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _record_body(key: bytes | None = b"k", value: bytes | None = b"v", ts_delta: int = 0,
                 offset_delta: int = 0, headers: list[tuple[bytes, bytes | None]] = ()) -> bytes:
    body = b"\x00" + _zz(ts_delta) + _zz(offset_delta)
    body += _zz(-1) if key is None else _zz(len(key)) + key
    body += _zz(-1) if value is None else _zz(len(value)) + value
    body += _zz(len(headers))
    for hk, hv in headers:
        body += _zz(len(hk)) + hk + (_zz(-1) if hv is None else _zz(len(hv)) + hv)
    return body


def _framed(body: bytes) -> bytes:
    return _zz(len(body)) + body


SMALL_RECORDS = [(b"key", b"value", 1000, [("h", b"x")]), (None, b"v2", 1001, []),
                 (b"k3", None, 1003, [("h2", None)])]
SMALL_SECTION = _reference.encode_records(SMALL_RECORDS, 1000)


def _batch(section: bytes = SMALL_SECTION, count: int = 3, delta: int | None = None,
           attributes: int = 0, producer_id: int = -1, base_sequence: int = -1,
           base_offset: int = 0) -> bytearray:
    """A batch with a valid CRC around ``section`` (which may be a lie)."""
    return _reference.build_batch(section, count, count - 1 if delta is None else delta,
                                  attributes, base_offset, 0, 1000, 1003, producer_id, 0,
                                  base_sequence)


SMALL_BATCH = bytes(_batch())


def _set(buf: bytes, fmt: str, pos: int, value: int) -> bytes:
    out = bytearray(buf)
    struct.pack_into(fmt, out, pos, value)
    return bytes(out)


def corrupt(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """``fn`` must raise CorruptRecordError (any other exception propagates and fails)."""
    with pytest.raises(CorruptRecordError):
        fn(*args, **kwargs)


def scan(impl: Any, buf: bytes, rows: int = 4, **kwargs: Any) -> tuple[int, int, int, Any]:
    out = np.zeros(SCAN_COLUMNS * rows, dtype=np.int64)
    return impl.scan_batches(buf, 0, -1, out, **kwargs)


def fill(impl: Any, sections: list[tuple[Any, int]], lat: int = -1) -> tuple[int, ...]:
    """``fill_columns`` over (body, count) sections, buffers sized like a careful caller: one
    row per claimed record but never more rows than bytes (a record takes at least 7)."""
    rows = sum(min(max(count, 0), len(body)) for body, count in sections)
    data = max(1, sum(len(body) for body, _ in sections))
    meta = np.array([v for i, (_, count) in enumerate(sections) for v in (count, 10 * i, 0, lat)],
                    dtype=np.int64)
    return impl.fill_columns(
        [body for body, _ in sections], meta, np.zeros(rows, np.int64), np.zeros(rows, np.int64),
        np.zeros(rows + 1, np.int32), np.zeros(data, np.uint8), np.zeros(rows // 8 + 1, np.uint8),
        np.zeros(rows + 1, np.int32), np.zeros(data, np.uint8), np.zeros(rows // 8 + 1, np.uint8))


def records_everywhere_corrupt(impl: Any, section: bytes, count: int) -> None:
    """A bad records section: every record decoder refuses it, alone or after a good one."""
    corrupt(impl.decode_records, section, count, 0, 0)
    corrupt(fill, impl, [(section, count)])
    corrupt(fill, impl, [(SMALL_SECTION, 3), (section, count)])


def batch_everywhere_corrupt(buf: bytes, **kwargs: Any) -> None:
    """Through the records API (whichever implementation ``shmq._fast`` exports)."""
    corrupt(lambda: RecordBatchView(buf).records(**kwargs))
    corrupt(decode_batches, buf, **kwargs)
    corrupt(batches_to_arrow, buf, **kwargs)


# --- the valid baseline ------------------------------------------------------------------------


@impls
def test_small_batch_is_valid(impl: Any) -> None:
    assert impl.validate_batch(SMALL_BATCH) == len(SMALL_BATCH)
    assert impl.decode_records(SMALL_SECTION, 3, 0, 1000) == [
        (0, 1000, b"key", b"value", (("h", b"x"),)),
        (1, 1001, None, b"v2", ()),
        (2, 1003, b"k3", None, (("h2", None),)),
    ]
    assert scan(impl, SMALL_BATCH)[:3] == (1, len(SMALL_BATCH), fast.SCAN_END)


# --- empty and truncated -----------------------------------------------------------------------


@impls
@pytest.mark.parametrize("empty", [b"", bytearray(), memoryview(b"")], ids=["bytes", "ba", "mv"])
def test_empty_buffer(impl: Any, empty: Any) -> None:
    corrupt(impl.validate_batch, empty)
    corrupt(impl.validate_batch, empty, 0, -1, False, False)
    corrupt(impl.batch_header, empty)
    corrupt(impl.stamp_batch, bytearray(), 0, 1, 1)
    assert impl.scan_batches(empty, 0, -1, np.zeros(SCAN_COLUMNS, np.int64)) == (
        0, 0, fast.SCAN_END, None)
    corrupt(impl.decode_records, empty, 1, 0, 0)
    assert impl.decode_records(empty, 0, 0, 0) == []
    corrupt(fill, impl, [(empty, 1)])
    assert tuple(fill(impl, [(empty, 0)])) == (0, 0, 0, 0, 0)
    assert tuple(fill(impl, [])) == (0, 0, 0, 0, 0)
    corrupt(impl.scan_batches, empty, 1, -1, np.zeros(SCAN_COLUMNS, np.int64))
    corrupt(impl.validate_batch, empty, 1)


def test_empty_buffer_records_api() -> None:
    corrupt(RecordBatchView, b"")
    assert decode_batches(b"") == []
    assert list(iter_batches(b"")) == []


@impls
def test_truncated_at_every_length(impl: Any) -> None:
    n = len(SMALL_BATCH)
    for cut in range(n):
        part = SMALL_BATCH[:cut]
        corrupt(impl.validate_batch, part)
        corrupt(impl.validate_batch, part, 0, -1, False, False)
        # the same cut expressed through `end` inside the whole buffer
        corrupt(impl.validate_batch, SMALL_BATCH, 0, cut)
        got = scan(impl, part)
        assert got[:3] == ((0, 0, fast.SCAN_END) if cut == 0 else (0, 0, fast.SCAN_PARTIAL)), cut
        assert scan(impl, SMALL_BATCH + part)[:3] == (
            1, n, fast.SCAN_END if cut == 0 else fast.SCAN_PARTIAL)
        if cut < 61:
            corrupt(impl.batch_header, part)
            corrupt(impl.stamp_batch, bytearray(part), 0, 1, 1)
        else:
            assert impl.batch_header(part) == impl.batch_header(SMALL_BATCH)
    for cut in range(len(SMALL_SECTION)):
        records_everywhere_corrupt(impl, SMALL_SECTION[:cut], 3)


def test_truncated_at_every_length_records_api() -> None:
    for cut in range(1, len(SMALL_BATCH)):  # (an empty buffer is an empty log)
        part = SMALL_BATCH[:cut]
        batch_everywhere_corrupt(part)
        with pytest.raises(CorruptRecordError):
            list(iter_batches(part))


# --- header fields -----------------------------------------------------------------------------


@impls
@pytest.mark.parametrize("magic", [0, 1, 3, 255])
def test_wrong_magic(impl: Any, magic: int) -> None:
    buf = bytearray(SMALL_BATCH)
    buf[16] = magic
    buf = bytes(buf)
    for verify in (True, False):
        for strict in (True, False):
            corrupt(impl.validate_batch, buf, 0, -1, verify, strict)
            assert scan(impl, buf, verify_crc=verify, strict=strict)[:3] == (
                0, 0, fast.SCAN_CORRUPT)


@pytest.mark.parametrize("magic", [0, 1, 3, 255])
def test_wrong_magic_records_api(magic: int) -> None:
    buf = bytearray(SMALL_BATCH)
    buf[16] = magic
    corrupt(lambda: list(iter_batches(buf, verify_crc=False)))
    corrupt(decode_batches, buf, verify_crc=False)


@impls
def test_bad_crc_every_byte(impl: Any) -> None:
    for i in range(17, len(SMALL_BATCH)):  # the CRC field itself, then everything it covers
        for flip in (0x01, 0x80):
            buf = bytearray(SMALL_BATCH)
            buf[i] ^= flip
            buf = bytes(buf)
            corrupt(impl.validate_batch, buf, 0, -1, True, False)
            n, pos, status, reason = scan(impl, buf)
            assert (n, pos, status) == (0, 0, fast.SCAN_CORRUPT), i
            assert "CRC" in reason
    # bytes outside the CRC (base offset, leader epoch) may change freely
    for i in list(range(0, 8)) + list(range(12, 16)):
        buf = bytearray(SMALL_BATCH)
        buf[i] ^= 0xFF
        assert impl.validate_batch(bytes(buf)) == len(SMALL_BATCH)


def test_bad_crc_records_api() -> None:
    for i in range(21, len(SMALL_BATCH), 5):
        buf = bytearray(SMALL_BATCH)
        buf[i] ^= 0x10
        corrupt(decode_batches, buf)
        corrupt(batches_to_arrow, buf)
        assert not RecordBatchView(buf).is_valid()


BAD_LENGTHS = {
    "negative": -1,
    "min_int": -(2**31),
    "zero": 0,
    "below_header": 48,
    "max_int": 0x7FFFFFFF,
    "one_past_end": len(SMALL_BATCH) - 12 + 1,
}


@impls
@pytest.mark.parametrize("name", BAD_LENGTHS)
def test_bad_batch_length(impl: Any, name: str) -> None:
    buf = _set(SMALL_BATCH, ">i", 8, BAD_LENGTHS[name])
    partial = name in ("max_int", "one_past_end")
    for verify in (True, False):
        for strict in (True, False):
            corrupt(impl.validate_batch, buf, 0, -1, verify, strict)
            if not partial:  # (with more bytes after it, a partial batch may fit)
                corrupt(impl.validate_batch, buf + b"\x00" * 64, 0, -1, verify, strict)
            assert scan(impl, buf, verify_crc=verify, strict=strict)[:3] == (
                0, 0, fast.SCAN_PARTIAL if partial else fast.SCAN_CORRUPT)


@pytest.mark.parametrize("name", BAD_LENGTHS)
def test_bad_batch_length_records_api(name: str) -> None:
    buf = _set(SMALL_BATCH, ">i", 8, BAD_LENGTHS[name])
    batch_everywhere_corrupt(buf)
    corrupt(lambda: RecordBatchView(buf).validate())


@pytest.mark.parametrize("trailing", [1, 88, 500])
def test_records_refuses_a_negative_batch_length(trailing: int) -> None:
    # RecordBatchView.records() decodes without validating first, so it must not trust
    # batchLength.  A negative batchLength makes the records slice buf[pos + 61 : pos + size]
    # end at a negative index, which Python counts from the END of the buffer: the view then
    # decodes bytes outside the batch.  Here those bytes are exactly the real records section.
    buf = bytearray(SMALL_BATCH) + b"\xa5" * trailing
    struct.pack_into(">i", buf, 8, -trailing - 12)  # size = -trailing
    view = RecordBatchView(buf)
    assert view.size == -trailing
    corrupt(view.records)
    corrupt(view.records_section)


@pytest.mark.parametrize("length", [0, 12, 48])
def test_records_refuses_a_batch_length_below_the_header(length: int) -> None:
    # batchLength + 12 smaller than the 61-byte header is no batch at all, even one claiming
    # zero records; records() and records_section() must not answer "empty".
    buf = bytearray(SMALL_BATCH) + bytes(200)
    struct.pack_into(">i", buf, 8, length)
    struct.pack_into(">i", buf, 57, 0)  # recordsCount 0
    view = RecordBatchView(buf)
    corrupt(view.records_section)
    corrupt(view.records)


# --- lying counts and produce rules ------------------------------------------------------------


@impls
@pytest.mark.parametrize("count", [4, 100, 2**31 - 1, 2, 1, 0, -1, -(2**31)])
def test_lying_records_count(impl: Any, count: int) -> None:
    # delta left at the true value 2: strict mode sees the mismatch, decoders see the lie
    buf = bytes(_batch(count=count, delta=2))
    corrupt(impl.validate_batch, buf, 0, -1, True, True)
    if count < 0:
        corrupt(impl.validate_batch, buf, 0, -1, True, False)
        assert scan(impl, buf)[2] == fast.SCAN_CORRUPT
    else:
        assert impl.validate_batch(buf, 0, -1, True, False) == len(buf)
        assert scan(impl, buf)[:3] == (1, len(buf), fast.SCAN_END)
    records_everywhere_corrupt(impl, SMALL_SECTION, count)
    # count and delta consistent but both lying: strict validation passes, decoding fails
    if count > 0:
        liar = bytes(_batch(count=count))
        assert impl.validate_batch(liar, 0, -1, True, True) == len(liar)


@pytest.mark.parametrize("count", [4, 100, 2**31 - 1, 2, 1, 0, -1, -(2**31)])
def test_lying_records_count_records_api(count: int) -> None:
    buf = bytes(_batch(count=count, delta=max(count - 1, -(2**31))))
    corrupt(lambda: RecordBatchView(buf).records())
    corrupt(batches_to_arrow, buf)


_HUGE_COUNT = """
import resource, sys
from shmq._fast import _reference as ref
from shmq.errors import CorruptRecordError
from shmq.protocol.records import batches_to_arrow, encode_batch
batches_to_arrow(encode_batch([(b"k", b"v", 1)]))  # warm up imports and memory pools
section = ref.encode_records([(b"k", b"v", 0, [])], 0)
liar = bytes(ref.build_batch(section, 2**31 - 1, 2**31 - 2, 0, 0, 0, 0, 0, -1, -1, -1))
with open("/proc/self/statm") as f:
    vm = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), resource.RLIM_INFINITY))
for n in (1, 4):
    try:
        batches_to_arrow(liar * n)
    except CorruptRecordError:
        pass
    else:
        sys.exit("a lying record count was accepted")
print("ok")
"""


def test_batches_to_arrow_lying_count_allocates_nothing_big() -> None:
    # A 70-byte CRC-valid batch claiming 2**31 - 1 records must be refused as corrupt before
    # any buffer is sized from the claim (a record takes at least 7 bytes).  The child process
    # has 1 GiB of address space to spare, so sizing Arrow buffers for the claimed rows (tens
    # of GiB) shows up as a MemoryError instead of CorruptRecordError.
    proc = subprocess.run([sys.executable, "-c", _HUGE_COUNT], capture_output=True, text=True,
                          timeout=60, env=_child_env())
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-1500:]


@impls
@pytest.mark.parametrize("delta", [-1, 0, 1, 3, 2**31 - 1, -(2**31)])
def test_last_offset_delta_mismatch(impl: Any, delta: int) -> None:
    buf = bytes(_batch(delta=delta))
    corrupt(impl.validate_batch, buf, 0, -1, True, True)
    assert scan(impl, buf, strict=True)[2] == fast.SCAN_CORRUPT
    if delta < 0:
        corrupt(impl.validate_batch, buf, 0, -1, True, False)
    else:
        assert impl.validate_batch(buf, 0, -1, True, False) == len(buf)


@impls
def test_control_batch_in_strict_mode(impl: Any) -> None:
    buf = bytes(_batch(attributes=0x30, producer_id=5, base_sequence=0))
    corrupt(impl.validate_batch, buf, 0, -1, True, True)
    n, _, status, reason = scan(impl, buf, strict=True)
    assert (n, status) == (0, fast.SCAN_CORRUPT) and "control" in reason
    assert impl.validate_batch(buf, 0, -1, True, False) == len(buf)


@impls
@pytest.mark.parametrize("seq", [-1, -2, -(2**31)])
def test_producer_id_with_negative_sequence_in_strict_mode(impl: Any, seq: int) -> None:
    buf = bytes(_batch(producer_id=0, base_sequence=seq))
    corrupt(impl.validate_batch, buf, 0, -1, True, True)
    assert "sequence" in scan(impl, buf, strict=True)[3]
    assert impl.validate_batch(buf, 0, -1, True, False) == len(buf)
    # no producer id: no sequence needed
    ok = bytes(_batch(producer_id=-1, base_sequence=seq))
    assert impl.validate_batch(ok, 0, -1, True, True) == len(ok)


@impls
@pytest.mark.parametrize("case", ["sequence", "delta", "count", "control", "magic0", "magic1",
                                  "partial", "tiny", "crc", "short", "magic3"])
def test_produce_rule_breaks_are_invalid_record_others_corrupt(impl: Any, case: str) -> None:
    """Kafka answers INVALID_RECORD (InvalidRecordException) for a batch that breaks a produce
    rule and CORRUPT_MESSAGE (CorruptRecordException) for damage: the two error classes."""
    from shmq.errors import InvalidRecordError

    good = SMALL_BATCH
    buf = {
        "sequence": bytes(_batch(producer_id=3, base_sequence=-1)),
        "delta": bytes(_batch(delta=1)),
        "count": bytes(_batch(delta=-1)),
        "control": bytes(_batch(attributes=0x20)),
        "magic0": _set(good, ">b", 16, 0),
        "magic1": _set(good, ">b", 16, 1),
        "partial": good[:-1],
        "tiny": good[:10],
        "crc": _set(good, ">q", 35, 7),
        "short": _set(good, ">i", 8, 40),
        "magic3": _set(good, ">b", 16, 3),
    }[case]
    with pytest.raises(CorruptRecordError) as exc:
        impl.validate_batch(buf, 0, -1, True, True)
    invalid = case not in ("crc", "short", "magic3")
    assert isinstance(exc.value, InvalidRecordError) == invalid, exc.value


@impls
def test_positions_outside_the_buffer(impl: Any) -> None:
    out = np.zeros(SCAN_COLUMNS, np.int64)
    for pos in (-1, -100, len(SMALL_BATCH) + 1, 2**40):
        corrupt(impl.validate_batch, SMALL_BATCH, pos)
        corrupt(impl.batch_header, SMALL_BATCH, pos)
        corrupt(impl.stamp_batch, bytearray(SMALL_BATCH), pos, 0, 0)
        corrupt(impl.scan_batches, SMALL_BATCH, pos, -1, out)
    corrupt(impl.validate_batch, SMALL_BATCH, len(SMALL_BATCH))  # nothing there
    corrupt(impl.batch_header, SMALL_BATCH, len(SMALL_BATCH) - 60)
    corrupt(impl.stamp_batch, bytearray(SMALL_BATCH), len(SMALL_BATCH) - 60, 0, 0)
    corrupt(impl.scan_batches, SMALL_BATCH, 10, 5, out)  # start past end


# --- hostile records sections ------------------------------------------------------------------

NEVER_ENDS = b"\xff" * 20
HOSTILE_SECTIONS = {
    "length_varint_never_ends": NEVER_ENDS,
    "length_varint_runs_off_the_end": b"\x80\x80",
    "length_varint_too_long": b"\x80" * 5 + b"\x01",
    "timestamp_varint_never_ends": _framed(b"\x00" + b"\xff" * 15),
    "offset_varint_never_ends": _framed(b"\x00\x00" + b"\xff" * 8),
    "key_length_past_end": _framed(b"\x00\x00\x00" + _zz(100) + b"abc" + _zz(-1) + _zz(0)),
    "key_length_huge": _framed(b"\x00\x00\x00" + _zz(2**31 - 1) + _zz(-1) + _zz(0)),
    "key_length_minus_two": _framed(b"\x00\x00\x00" + _zz(-2) + _zz(-1) + _zz(0)),
    "value_length_past_end": _framed(b"\x00\x00\x00" + _zz(-1) + _zz(50) + b"x" + _zz(0)),
    "value_length_minus_two": _framed(b"\x00\x00\x00" + _zz(-1) + _zz(-2) + _zz(0)),
    "negative_header_count": _framed(_record_body()[:-1] + _zz(-1)),
    "huge_header_count": _framed(_record_body()[:-1] + _zz(2**31 - 1)),
    "header_count_too_large": _framed(_record_body()[:-1] + _zz(2) + _zz(1) + b"h" + _zz(-1)),
    "header_key_length_minus_one": _framed(_record_body()[:-1] + _zz(1) + _zz(-1) + _zz(-1)),
    "header_key_length_past_end": _framed(_record_body()[:-1] + _zz(1) + _zz(90) + b"h"
                                          + _zz(-1)),
    "header_value_length_past_end": _framed(_record_body()[:-1] + _zz(1) + _zz(1) + b"h"
                                            + _zz(90)),
    "header_value_length_minus_two": _framed(_record_body()[:-1] + _zz(1) + _zz(1) + b"h"
                                             + _zz(-2)),
    "record_length_below_minimum": _zz(5) + b"\x00" * 5,
    "record_length_negative": _zz(-3) + b"\x00" * 8,
    "record_length_past_end": _zz(30) + _record_body(),
    "record_length_too_long_for_fields": _framed(_record_body() + b"\x00"),
    "record_length_too_short_for_fields": _zz(len(_record_body()) - 1) + _record_body(),
    "trailing_bytes_after_records": _framed(_record_body()) + b"\x00",
    "trailing_record_after_count": _framed(_record_body()) + _framed(_record_body()),
}


@impls
@pytest.mark.parametrize("name", HOSTILE_SECTIONS)
def test_hostile_records_section(impl: Any, name: str) -> None:
    section = HOSTILE_SECTIONS[name]
    records_everywhere_corrupt(impl, section, 1)
    # wrapped in a batch with a valid CRC: validation passes, decoding does not
    buf = bytes(_batch(section=section, count=1))
    assert impl.validate_batch(buf) == len(buf)


@pytest.mark.parametrize("name", HOSTILE_SECTIONS)
def test_hostile_records_section_records_api(name: str) -> None:
    buf = bytes(_batch(section=HOSTILE_SECTIONS[name], count=1))
    batch_everywhere_corrupt(buf)
    # compressed, the same section is just as bad
    for codec in (codecs.GZIP, codecs.ZSTD):
        packed = bytes(_batch(section=codecs.compress(codec, HOSTILE_SECTIONS[name]), count=1,
                              attributes=codec))
        batch_everywhere_corrupt(packed)


@impls
def test_records_section_sanity_of_the_hostile_builders(impl: Any) -> None:
    # the helpers above do build valid records when asked to
    good = _framed(_record_body(headers=[(b"h", b"x"), (b"g", None)]))
    assert impl.decode_records(good, 1, 5, 7) == [(5, 7, b"k", b"v", (("h", b"x"), ("g", None)))]


@pytest.mark.parametrize("codec", [5, 6, 7])
def test_unknown_codec(codec: int) -> None:
    buf = bytes(_batch(attributes=codec))
    assert RecordBatchView(buf).validate() == len(buf)
    batch_everywhere_corrupt(buf)


@pytest.mark.parametrize("codec", [codecs.GZIP, codecs.SNAPPY, codecs.LZ4, codecs.ZSTD],
                         ids=codecs.CODEC_NAMES.get)
def test_corrupt_compressed_stream(codec: int) -> None:
    packed = codecs.compress(codec, SMALL_SECTION * 50)
    for cut in (0, 1, len(packed) // 2, len(packed) - 1):
        batch_everywhere_corrupt(bytes(_batch(section=packed[:cut], attributes=codec)))
    # the uncompressed section where a compressed stream belongs
    batch_everywhere_corrupt(bytes(_batch(section=SMALL_SECTION, attributes=codec)))


# --- compression bombs -------------------------------------------------------------------------

BOMB = 64 * MiB


def _bomb_stream(codec: int) -> bytes:
    zeros = bytes(BOMB)
    if codec == codecs.GZIP:
        return bytes(cramjam.gzip.compress(zeros, level=1))
    return codecs.compress(codec, zeros)


def tracing_is_slow() -> bool:
    """The twin's CRC loop under tracemalloc crawls; the compiled CRC does not notice."""
    return not fast.HAVE_FAST


@pytest.mark.parametrize("codec", [codecs.GZIP, codecs.SNAPPY, codecs.LZ4, codecs.ZSTD],
                         ids=codecs.CODEC_NAMES.get)
def test_compression_bomb(codec: int) -> None:
    stream = _bomb_stream(codec)
    assert len(stream) < BOMB // 16  # (snappy tops out near 21:1)
    buf = bytes(_batch(section=stream, count=1, attributes=codec))
    view = RecordBatchView(buf)
    if fast.HAVE_FAST:  # (the twin's pure-Python CRC over megabytes is just slow)
        assert view.validate(strict=True) == len(buf)
    tracemalloc.start()
    try:
        with pytest.raises(CorruptRecordError, match="exceeds"):
            view.records(max_decompressed=1 << 20)
        with pytest.raises(CorruptRecordError, match="exceeds"):
            view.records_section(max_decompressed=1 << 20)
        with pytest.raises(CorruptRecordError, match="exceeds"):
            decode_batches(buf, max_decompressed=1 << 20, verify_crc=not tracing_is_slow())
        with pytest.raises(CorruptRecordError, match="exceeds"):
            batches_to_arrow(buf, max_decompressed=1 << 20, verify_crc=not tracing_is_slow())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # the cap bounds what Python allocates (the 64 MiB never materialise)
    assert peak < 16 * MiB, peak


# --- random garbage ----------------------------------------------------------------------------


@st.composite
def garbage(draw: st.DrawFn) -> bytes:
    """Random bytes, or a valid batch (log) with random damage: both are hostile."""
    kind = draw(st.sampled_from(["random", "damaged", "header"]))
    if kind == "random":
        return draw(st.binary(max_size=4096))
    if kind == "header":
        # a plausible header (magic 2, fitting length) over random bytes: reaches the deep checks
        body = draw(st.binary(min_size=61, max_size=600))
        out = bytearray(body)
        struct.pack_into(">i", out, 8, len(out) - 12)
        out[16] = 2
        if draw(st.booleans()):
            struct.pack_into(">I", out, 17, _reference.crc32c(out[21:]))
        return bytes(out)
    buf = bytearray(SMALL_BATCH * draw(st.integers(1, 3)))
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(buf) - 1))
        buf[i] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        struct.pack_into(">I", buf, 17, _reference.crc32c(buf[21 : len(SMALL_BATCH)]))
    return bytes(buf[: draw(st.integers(0, len(buf)))])


@impls
@PROPS
@given(buf=garbage(), verify=st.booleans(), strict=st.booleans(), pos=st.integers(0, 100))
def test_garbage_validate_and_scan(impl: Any, buf: bytes, verify: bool, strict: bool,
                                   pos: int) -> None:
    try:
        size = impl.validate_batch(buf, pos, -1, verify, strict)
    except CorruptRecordError:
        pass
    else:
        assert 61 <= size <= len(buf) - pos
    out = np.zeros(SCAN_COLUMNS * 3, np.int64)
    n, end, status, reason = impl.scan_batches(buf, 0, -1, out, verify, strict)
    assert 0 <= n <= 3 and 0 <= end <= len(buf)
    assert int(out[: n * SCAN_COLUMNS].reshape(n, SCAN_COLUMNS)[:, fast.COL_SIZE].sum()) == end
    if status == fast.SCAN_END:
        assert end == len(buf) and reason is None
    elif status == fast.SCAN_FULL:
        assert n == 3 and reason is None
    else:
        assert status in (fast.SCAN_PARTIAL, fast.SCAN_CORRUPT)
        assert end < len(buf) and isinstance(reason, str)
    try:
        header = impl.batch_header(buf, pos)
    except CorruptRecordError:
        assert len(buf) - pos < 61
    else:
        assert len(header) == 13


@impls
@PROPS
@given(body=st.one_of(st.binary(max_size=4096), garbage()), count=st.integers(-3, 40),
       lat=st.sampled_from([-1, 5]))
def test_garbage_decode_records_and_fill_columns(impl: Any, body: bytes, count: int,
                                                 lat: int) -> None:
    try:
        got = impl.decode_records(body, count, 0, 0, lat)
    except CorruptRecordError:
        got = None
    else:
        assert len(got) == count
    try:
        result = fill(impl, [(body, count)], lat)
    except CorruptRecordError:
        assert got is None
    else:
        assert got is not None and result[0] == count


@PROPS
@given(buf=garbage())
def test_garbage_record_batch_view(buf: bytes) -> None:
    try:
        view = RecordBatchView(buf)
    except CorruptRecordError:
        assert len(buf) < 61
        return
    for fn in (lambda: view.records(max_decompressed=1 << 20),
               lambda: decode_batches(buf, max_decompressed=1 << 20, verify_crc=False)):
        try:
            out = fn()
        except CorruptRecordError:
            continue
        assert isinstance(out, list)


@pytest.mark.parametrize("codec", [codecs.GZIP, codecs.SNAPPY, codecs.LZ4, codecs.ZSTD],
                         ids=codecs.CODEC_NAMES.get)
@settings(max_examples=60, deadline=None)
@given(stream=st.one_of(st.binary(max_size=600),
                        st.binary(max_size=200).map(lambda b: b"\x82SNAPPY\x00" + b),
                        st.binary(max_size=200).map(lambda b: b"\x04\x22\x4d\x18" + b),
                        st.binary(max_size=200).map(lambda b: b"\x28\xb5\x2f\xfd" + b),
                        st.binary(max_size=200).map(lambda b: b"\x1f\x8b\x08\x00" + b)))
def test_garbage_compressed_stream(codec: int, stream: bytes) -> None:
    buf = bytes(_batch(section=stream, count=1, attributes=codec))
    try:
        RecordBatchView(buf).records(max_decompressed=1 << 20)
    except CorruptRecordError:
        pass


# --- stamp_batch / build_batch / crc on odd buffers --------------------------------------------


@impls
def test_stamp_batch_needs_a_writable_buffer(impl: Any) -> None:
    with pytest.raises((TypeError, ValueError, BufferError)):
        impl.stamp_batch(SMALL_BATCH, 0, 1, 1)  # bytes are read-only
    buf = bytearray(SMALL_BATCH)
    impl.stamp_batch(memoryview(buf), 0, 9, 9)
    assert impl.batch_header(buf)[:3] == (9, len(SMALL_BATCH) - 12, 9)


# --- index searches ----------------------------------------------------------------------------


def _index_buf(n: int) -> bytes:
    return b"".join(struct.pack(">ii", i * 2, i * 100) for i in range(n))


@impls
@pytest.mark.parametrize("fn_name", ["largest_lower_bound", "smallest_upper_bound"])
def test_index_entries_larger_than_buffer(impl: Any, fn_name: str) -> None:
    fn = getattr(impl, fn_name)
    buf = _index_buf(10)
    for entries in (11, 12, 1000, 2**31):
        with pytest.raises(ValueError):
            fn(buf, entries, 8, 0, 4, 5)
    with pytest.raises(ValueError):
        fn(buf[:-1], 10, 8, 0, 4, 5)  # a torn last entry does not count
    with pytest.raises(ValueError):
        fn(b"", 1, 8, 0, 4, 5)
    with pytest.raises(ValueError):
        fn(buf, -1, 8, 0, 4, 5)
    for layout in [(0, 0, 4), (-8, 0, 4), (8, 0, 3), (8, 0, 16), (8, 5, 4), (8, -1, 4),
                   (12, 8, 8), (4, 0, 8)]:
        with pytest.raises(ValueError):
            fn(buf, 1, *layout, 5)
    # the contract holds: a fitting count works, 0 entries finds nothing
    assert fn(buf, 0, 8, 0, 4, 5) == -1
    assert fn(b"", 0, 8, 0, 4, 5) == -1
    assert fn(buf, 10, 8, 0, 4, 5) == (2 if fn_name == "largest_lower_bound" else 3)


_OVERFLOW = """
import sys
from shmq import _fast
buf = bytes(16)
for fn in (_fast.largest_lower_bound, _fast.smallest_upper_bound):
    for entries, entry_size in [(2**61, 8), (2**62, 4), (2**63 - 1, 8), (1537228672809129302, 12),
                                (768614336404564651, 12), (2**60 + 1, 16)]:
        try:
            fn(buf, entries, entry_size, 0, 4, 0)
        except (ValueError, OverflowError):
            pass
        else:
            sys.exit(f"{fn.__name__}({entries}, {entry_size}) did not raise")
print("ok")
"""


def test_index_entries_times_entry_size_overflow() -> None:
    # entries * entry_size must not wrap around: 2**61 entries of 8 bytes is 2**64 bytes, which
    # wraps to 0 in a 64-bit multiplication and would pass a "fits in the buffer" check, then
    # read far outside the buffer.  In a child process: the failure mode is a segfault.
    proc = subprocess.run([sys.executable, "-c", _OVERFLOW], capture_output=True, text=True,
                          timeout=60, env=_child_env())
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", (proc.returncode,
                                                                    proc.stderr[-2000:])


@impls
@PROPS
@given(buf=st.binary(max_size=400), layout=st.sampled_from([(8, 0, 4), (8, 4, 4), (12, 0, 8),
                                                             (12, 8, 4)]),
       data=st.data())
def test_index_search_on_garbage_stays_in_bounds(impl: Any, buf: bytes,
                                                  layout: tuple[int, int, int],
                                                  data: st.DataObject) -> None:
    # Unsorted garbage breaks the answer's meaning, not memory safety: the result is a slot
    # inside [0, entries) or -1.
    entry_size = layout[0]
    entries = data.draw(st.integers(0, len(buf) // entry_size))
    target = data.draw(st.integers(-(2**63), 2**63 - 1))
    for fn in (impl.largest_lower_bound, impl.smallest_upper_bound):
        slot = fn(buf, entries, *layout, target)
        assert -1 <= slot < entries
