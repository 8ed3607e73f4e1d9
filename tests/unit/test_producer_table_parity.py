"""Parity: ``shmq._fast.producers.ProducerTable`` (C rows) against its pure-Python twin.

Random operation sequences (appends, checks, markers, snapshot-style puts, expirations, clears)
go to both tables; every answer and the full contents after each step must agree.  A few small
pids collide in the compiled table's index on purpose (many ids, few slots), and the arrays
grow and shrink on the way.  Skipped when the extensions are not loaded.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shmq._fast as fast
from shmq._fast import _producers_reference as ref

if not fast.HAVE_FAST:
    pytest.skip("compiled shmq._fast extensions are not loaded", allow_module_level=True)

from shmq._fast import producers  # noqa: E402

INT32_MAX = 2**31 - 1
T0 = 1_700_000_000_000

pids = st.one_of(st.integers(0, 40), st.integers(-(2**63), 2**63 - 1))
epochs = st.integers(-1, 3)
seqs = st.one_of(st.integers(-1, 12), st.sampled_from([INT32_MAX - 1, INT32_MAX]))
stamps = st.integers(T0 - 5000, T0 + 5000)

ops = st.one_of(
    st.tuples(st.just("append"), pids, epochs, seqs, st.integers(0, 3), st.integers(0, 10**6),
              st.integers(0, 4), stamps, st.booleans()),
    st.tuples(st.just("check"), pids, epochs, seqs, st.integers(0, 3), st.booleans(),
              st.booleans()),
    st.tuples(st.just("end_txn"), pids, epochs, stamps, st.integers(-1, 3), st.booleans(),
              st.booleans()),
    st.tuples(st.just("put"), pids, epochs, st.integers(-1, 3), stamps,
              st.one_of(st.just(-1), st.integers(0, 10**6)),
              st.lists(st.tuples(seqs, seqs, st.integers(0, 10**6), st.integers(0, 5), stamps),
                       max_size=7)),
    st.tuples(st.just("expire"), st.integers(T0 - 6000, T0 + 12000), st.integers(1, 8000)),
    st.tuples(st.just("get"), pids),
    st.tuples(st.just("clear")),
)


def apply(table: Any, op: tuple) -> Any:
    kind = op[0]
    if kind == "append":
        _, pid, epoch, seq, n, offset, span, ts, txn = op
        last = seq + n if seq >= 0 and seq + n <= INT32_MAX else seq
        return table.append_batch(pid, epoch, seq, last, offset, offset + span, ts, txn)
    if kind == "check":
        _, pid, epoch, seq, n, txn, client = op
        last = seq + n if seq >= 0 and seq + n <= INT32_MAX else seq
        return table.check(pid, epoch, seq, last, txn, client)
    if kind == "end_txn":
        _, pid, epoch, ts, coord, has_coord, check = op
        return table.end_txn(pid, epoch, ts, coord, has_coord, check)
    if kind == "put":
        _, pid, epoch, coord, ts, txn, batches = op
        return table.put(pid, epoch, coord, ts, txn, batches)
    if kind == "expire":
        _, now, expiration = op
        return sorted(table.remove_expired(now, expiration))
    if kind == "get":
        return table.get(op[1])
    return table.clear()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, max_size=80))
def test_random_operation_sequences_agree(sequence: list[tuple]) -> None:
    fast_table, twin = producers.ProducerTable(), ref.ProducerTable()
    for op in sequence:
        assert apply(fast_table, op) == apply(twin, op), op
        assert fast_table.items() == twin.items(), op
        assert len(fast_table) == len(twin)
        assert fast_table.first_unstable_offset() == twin.first_unstable_offset()


def test_many_producers_grow_shrink_and_free() -> None:
    table, twin = producers.ProducerTable(), ref.ProducerTable()
    assert table.memory() == 0  # an empty table holds no memory
    for t in (table, twin):
        for i in range(50_000):
            t.append_batch(i * 7919, 0, 0, 0, i, i, T0 + (i % 2) * 10_000, i % 1000 == 0)
    assert table.items() == twin.items() and len(table) == 50_000
    big = table.memory()
    assert 50_000 * 192 <= big <= 50_000 * 192 * 2 + 8 * 2**17
    assert sorted(table.remove_expired(T0 + 5000, 5000)) == sorted(twin.remove_expired(T0 + 5000,
                                                                                       5000))
    assert len(table) == 25_050 and table.items() == twin.items()  # + 50 open transactions
    assert table.check(7919, 0, 0, 0, False, True) == twin.check(7919, 0, 0, 0, False, True)
    assert table.first_unstable_offset() == twin.first_unstable_offset() == 0
    table.clear()
    assert table.memory() == 0 and len(table) == 0 and table.first_unstable_offset() == -1


def test_out_of_range_values_raise_and_change_nothing() -> None:
    for t in (producers.ProducerTable(), ref.ProducerTable()):
        t.append_batch(1, 0, 0, 0, 0, 0, T0, False)
        with pytest.raises(OverflowError):
            t.append_batch(2, 2**15, 0, 0, 0, 0, T0, False)
        with pytest.raises(OverflowError):
            t.append_batch(2, 0, 0, 0, 0, 2**31, T0, False)  # offset delta past int32
        with pytest.raises(OverflowError):
            t.put(3, 0, 0, T0, -1, [(0, 0, 0, 0, 2**63)])
        assert [r[0] for r in t.items()] == [1]
        assert 2 not in t and 1 in t and "x" not in t
