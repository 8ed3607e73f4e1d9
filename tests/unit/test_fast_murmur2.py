"""``murmur2_partitions``: Kafka's partition for each key of an Arrow binary column, the compiled
function and its twin against kafka-python's port of Java's ``Utils.murmur2`` (the oracle)."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shmq._fast as fast
from shmq._fast import _reference as ref

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from kafka.partitioner.default import murmur2

IMPLS = [ref] + ([__import__("shmq._fast.batch", fromlist=["batch"])] if fast.HAVE_FAST else [])


def partitions_of(impl: Any, keys: list[bytes | None], n: int) -> list[int]:
    arr = pa.array(keys, pa.binary())
    valid, offsets, data = arr.buffers()
    out = np.full(len(keys), -7, np.int32)
    impl.murmur2_partitions(np.frombuffer(offsets, np.int32)[: len(keys) + 1],
                            np.frombuffer(data, np.uint8) if data is not None
                            else np.zeros(0, np.uint8), valid, n, out)
    return out.tolist()


@settings(max_examples=150, deadline=None)
@given(keys=st.lists(st.one_of(st.none(), st.binary(max_size=40)), max_size=50),
       n=st.integers(1, 1000))
def test_partitions_match_kafkas_murmur2(keys: list[bytes | None], n: int) -> None:
    want = [-1 if k is None else (murmur2(k) & 0x7FFFFFFF) % n for k in keys]
    for impl in IMPLS:
        assert partitions_of(impl, keys, n) == want


@pytest.mark.parametrize("impl", IMPLS)
def test_known_values_and_bad_arguments(impl: Any) -> None:
    # Kafka's own test vectors (UtilsTest.testMurmur2): "21" -> -973932308, "" -> 275646681
    assert partitions_of(impl, [b"21", b"", None], 2**31 - 1) == [
        -973932308 & 0x7FFFFFFF, 275646681 & 0x7FFFFFFF, -1]
    with pytest.raises(ValueError):
        partitions_of(impl, [b"a"], 0)
    with pytest.raises(ValueError):
        impl.murmur2_partitions(np.zeros(1, np.int32), np.zeros(0, np.uint8), None, 3,
                                np.zeros(1, np.int32))
    with pytest.raises(ValueError):
        impl.murmur2_partitions(np.array([0, 9], np.int32), np.zeros(3, np.uint8), None, 3,
                                np.zeros(1, np.int32))
