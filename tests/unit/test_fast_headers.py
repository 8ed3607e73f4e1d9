"""``fill_headers``: record headers into Arrow list<struct<key, value>> buffers.

The compiled function against its twin and both against an independent expectation built from
``decode_records`` (which decodes headers to Python objects its own way).  Header keys that are
not UTF-8 are counted (the caller repairs them), never written as anything but their bytes.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shmq._fast as fast
from shmq._fast import _reference as ref
from shmq.errors import CorruptRecordError

IMPLS = [ref] + ([__import__("shmq._fast.batch", fromlist=["batch"])] if fast.HAVE_FAST else [])
NO_LAT = -(2**63)
FEW = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def run(impl: Any, sections: list[tuple[bytes, int, int]], lo: int = -(2**63) + 1,
        hi: int = 2**63 - 1, spare: int = 0) -> tuple[str, Any]:
    rows = sum(max(c, 0) for _, c, _ in sections) + spare
    data = sum(len(b) for b, _, _ in sections) + spare
    heads = data // 2 + 1
    bufs = {
        "list_offsets": np.full(rows + 1, -7, np.int32),
        "list_valid": np.full(rows // 8 + 1, 0xAA, np.uint8),
        "key_offsets": np.full(heads + 1, -7, np.int32),
        "key_data": np.full(max(data, 1), 0xEE, np.uint8),
        "value_offsets": np.full(heads + 1, -7, np.int32),
        "value_data": np.full(max(data, 1), 0xEE, np.uint8),
        "value_valid": np.full(heads // 8 + 1, 0x55, np.uint8),
    }
    meta = np.array([v for b, c, off in sections for v in (c, off, 0, NO_LAT)], np.int64)
    try:
        res = impl.fill_headers([s[0] for s in sections], meta, *bufs.values(), lo, hi)
    except CorruptRecordError:
        return "corrupt", None
    rows_n, n, klen, vlen = res[:4]

    def bits(buf: np.ndarray, count: int) -> list[int]:
        raw = bytes(buf)
        return [(raw[i >> 3] >> (i & 7)) & 1 for i in range(count)]

    return "ok", {
        "result": tuple(res),
        "list_offsets": bufs["list_offsets"][: rows_n + 1].tolist(),
        "list_valid": bits(bufs["list_valid"], rows_n),
        "key_offsets": bufs["key_offsets"][: n + 1].tolist(),
        "key_data": bytes(bufs["key_data"][:klen]),
        "value_offsets": bufs["value_offsets"][: n + 1].tolist(),
        "value_data": bytes(bufs["value_data"][:vlen]),
        "value_valid": bits(bufs["value_valid"], n),
    }


def expected(records: list[tuple]) -> dict[str, Any]:
    """What the buffers must hold, from decoded records (keys re-encoded: valid UTF-8 only)."""
    out: dict[str, Any] = {"list_offsets": [0], "list_valid": [], "key_offsets": [0],
                           "key_data": b"", "value_offsets": [0], "value_data": b"",
                           "value_valid": []}
    n = nulls = vnulls = 0
    for r in records:
        hs = r[4]
        out["list_valid"].append(int(bool(hs)))
        nulls += not hs
        for k, v in hs:
            out["key_data"] += k.encode()
            out["key_offsets"].append(len(out["key_data"]))
            out["value_data"] += v or b""
            out["value_offsets"].append(len(out["value_data"]))
            out["value_valid"].append(int(v is not None))
            vnulls += v is None
            n += 1
        out["list_offsets"].append(n)
    out["result"] = (len(records), n, len(out["key_data"]), len(out["value_data"]), nulls,
                     vnulls, 0)
    return out


keys = st.text(max_size=6)
header_lists = st.lists(st.tuples(keys, st.one_of(st.none(), st.binary(max_size=12))),
                        max_size=3)
record_tuples = st.tuples(st.one_of(st.none(), st.binary(max_size=5)),
                          st.one_of(st.none(), st.binary(max_size=5)), st.just(0), header_lists)


@FEW
@given(sections=st.lists(st.lists(record_tuples, max_size=6), max_size=4),
       window=st.one_of(st.just(None), st.tuples(st.integers(-1, 30), st.integers(-1, 30))),
       flip=st.one_of(st.none(), st.tuples(st.integers(0, 400), st.integers(0, 7))))
def test_fill_headers_parity(sections: list[list[tuple]], window: tuple[int, int] | None,
                             flip: tuple[int, int] | None) -> None:
    lo, hi = window if window else (-(2**63) + 1, 2**63 - 1)
    built, want, base = [], [], 0
    for recs in sections:
        body = bytearray(ref.encode_records(recs, 0))
        built.append([body, len(recs), base])
        base += len(recs)
    if flip is not None and built and built[0][0]:
        body = built[0][0]
        body[flip[0] % len(body)] ^= 1 << flip[1]  # often malformed, sometimes still valid
    for b in built:
        b[0] = bytes(b[0])
    outcomes = [run(impl, [tuple(b) for b in built], lo, hi) for impl in IMPLS]
    assert all(o[0] == outcomes[0][0] for o in outcomes)
    if outcomes[0][0] == "ok":
        assert all(o == outcomes[0] for o in outcomes)
    if flip is None:
        for body, count, off in built:
            want += [r for r in ref.decode_records(body, count, off, 0) if lo <= r[0] < hi]
        assert outcomes[0] == ("ok", expected(want))


@pytest.mark.parametrize("impl", IMPLS)
def test_fill_headers_invalid_utf8_keys_are_counted(impl: Any) -> None:
    recs = [(b"k", b"v", 0, [(b"\xff\xfe", b"x"), ("ok", None)]),
            (None, b"v", 0, []),
            (b"k", None, 0, [(b"\xed\xa0\x80", b"")])]  # a UTF-16 surrogate: not UTF-8
    body = ref.encode_records(recs, 0)
    kind, got = run(impl, [(body, 3, 10)])
    assert kind == "ok"
    assert got["result"] == (3, 3, 7, 1, 1, 1, 2)
    assert got["key_data"] == b"\xff\xfeok\xed\xa0\x80"
    assert got["list_offsets"] == [0, 2, 2, 3]
    assert got["list_valid"] == [1, 0, 1]
    assert got["value_valid"] == [1, 0, 1]


@pytest.mark.parametrize("impl", IMPLS)
def test_fill_headers_many_rows_across_bitmap_bytes(impl: Any) -> None:
    rng = random.Random(7)
    recs = [(None, b"v", 0, [(f"h{j}", None if rng.random() < .3 else rng.randbytes(3))
                             for j in range(rng.randint(0, 3))]) for _ in range(700)]
    body = ref.encode_records(recs, 0)
    kind, got = run(impl, [(body, len(recs), 0)], spare=5)
    assert kind == "ok"
    assert got == expected(ref.decode_records(body, len(recs), 0, 0))


@pytest.mark.parametrize("impl", IMPLS)
def test_fill_headers_buffers_too_small(impl: Any) -> None:
    body = ref.encode_records([(None, b"v", 0, [("key", b"value")])], 0)
    meta = np.array([1, 0, 0, NO_LAT], np.int64)

    def fill(rows: int, heads: int, kb: int, vb: int) -> Any:
        return impl.fill_headers(
            [body], meta, np.zeros(rows + 1, np.int32), np.zeros(1, np.uint8),
            np.zeros(heads + 1, np.int32), np.zeros(kb, np.uint8),
            np.zeros(heads + 1, np.int32), np.zeros(vb, np.uint8), np.zeros(1, np.uint8))

    assert fill(1, 1, 3, 5)[:4] == (1, 1, 3, 5)
    for args in [(0, 1, 3, 5), (1, 0, 3, 5), (1, 1, 2, 5), (1, 1, 3, 4)]:
        with pytest.raises(ValueError) as info:
            fill(*args)
        assert not isinstance(info.value, CorruptRecordError)
