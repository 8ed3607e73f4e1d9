"""The worker's half of a session's rings (``shmq._fast.WorkerRings``, ``worker_ring.pyx``).

Oracles: the pure-Python twin ``_worker_ring_reference`` (same results, same bytes), and
``shmq.ipc.ring.Ring`` on the client's side (the entries the client published are the ones taken,
the answers written are the ones the client reads).  Garbage in the submit ring raises the
session's error class in both, with the same message, and never reads outside the buffer.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shmq._fast as fast
from shmq._fast import _worker_ring_reference
from shmq.ipc import ring as rings

IMPLS = [_worker_ring_reference.WorkerRings] + (
    [__import__("shmq._fast.worker_ring", fromlist=["x"]).WorkerRings] if fast.HAVE_FAST else [])
PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SUBMIT, COMPLETION = 4096, 4096
LAYOUT = rings.Layout(SUBMIT, COMPLETION)


class Corrupt(Exception):
    pass


def _region() -> bytearray:
    return bytearray(LAYOUT.size)


def _worker(impl: Any, buf: bytearray) -> Any:
    return impl(memoryview(buf), rings.SUBMIT_CONTROL, rings.DATA, SUBMIT,
                rings.COMPLETION_CONTROL, rings.DATA + SUBMIT, COMPLETION, Corrupt)


def _publish(client: rings.Ring, view: memoryview, corr: int, topic: bytes, body: bytes,
             acks: int) -> bool:
    n = rings.PRODUCE_HEADER_SIZE + len(topic) + len(body)
    at = client.reserve(n)
    if at < 0:
        return False
    rings.PRODUCE_HEADER.pack_into(view, at, n, rings.PRODUCE, 0, corr, corr % 7 - 1,
                                   len(topic), acks, 0, 0)
    view[at + 24 : at + 24 + len(topic)] = topic
    view[at + 24 + len(topic) : at + n] = body
    client.commit(n, at)
    return True


entry = st.tuples(st.binary(min_size=1, max_size=20), st.binary(max_size=900),
                  st.sampled_from([0, 1, -1]), st.binary(max_size=80))


@PROPS
@given(st.lists(entry, min_size=1, max_size=40), st.integers(1, 5))
def test_entries_taken_and_answered_as_the_client_sent_them(entries, per_drain) -> None:
    """A client publishes PRODUCE entries (wrapping the ring, PAD entries included); the worker
    takes them in drains, answers each and gives the space back; the client reads the answers.
    Both implementations see the same entries, return the same results and leave the same
    bytes; the taken entries are the sent ones and the answers are the written ones."""
    outcomes = []
    for impl in IMPLS:
        buf = _region()
        view = memoryview(buf)
        client_submit, client_completion = rings.session_rings(view, LAYOUT)
        worker = _worker(impl, buf)
        log: list[Any] = []
        todo = list(enumerate(entries))
        answers: list[tuple] = []
        while todo or answers:
            for _ in range(per_drain):  # the client publishes what fits
                if not todo:
                    break
                i, (topic, body, acks, message) = todo[0]
                if not _publish(client_submit, view, i, topic, body, acks):
                    break
                todo.pop(0)
            while (got := worker.next_produce()) is not None:
                at, length, corr, partition, tlen, acks = got
                topic, body, sent_acks, message = entries[corr]
                assert bytes(view[at + 24 : at + 24 + tlen]) == topic
                assert bytes(view[at + 24 + tlen : at + length]) == body
                assert (partition, acks) == (corr % 7 - 1, sent_acks)
                worker.advance(length)
                before = worker.completion_tail
                kick = worker.answer(corr, -corr, corr * 10, -1, 3, message)
                if kick < 0:  # no room: the client reads, the worker answers again
                    log.append(("full", corr))
                    while (c := client_completion.peek()) is not None:
                        answers.append(tuple(rings.COMPLETION_HEADER.unpack_from(view, c[0])))
                        client_completion.advance(c[1])
                    client_completion.release()
                    kick = worker.answer(corr, -corr, corr * 10, -1, 3, message)
                    assert kick >= 0
                log.append(("answer", corr, kick, worker.completion_tail - before))
                log.append(("release", worker.release(worker.head)))
            log.append(("sleep", worker.set_sleeping(), worker.free_space()))
            while (c := client_completion.peek()) is not None:
                at, length = c[0], c[1]
                fields = rings.COMPLETION_HEADER.unpack_from(view, at)
                assert bytes(view[at + 40 : at + length]) == entries[fields[3]][3]
                answers.append(tuple(fields))
                client_completion.advance(length)
            client_completion.release()
            if not todo:
                break
        got_corrs = [a[3] for a in answers]
        assert got_corrs == list(range(len(entries)))
        assert all(a[4] == -a[3] and a[6] == a[3] * 10 for a in answers)
        worker.close()
        outcomes.append((log, bytes(buf)))
    assert all(o == outcomes[0] for o in outcomes[1:])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.one_of(st.integers(0, LAYOUT.size - 8), st.integers(60, 400)),
                          st.binary(min_size=1, max_size=8)),
                min_size=1, max_size=12))
def test_garbage_in_the_submit_ring_raises_the_same_error_in_both(writes) -> None:
    """Random bytes over a region holding valid entries (counters, flags, entries, the
    completion ring's head): each implementation takes the same entries, writes the same
    answers (or finds no room) and leaves the same bytes, or raises the session's error class
    with the same message."""
    outcomes = []
    for impl in IMPLS:
        buf = _region()
        view = memoryview(buf)
        client_submit, _ = rings.session_rings(view, LAYOUT)
        for i in range(5):
            _publish(client_submit, view, i, b"topic", b"x" * (300 * i), 1)
        for at, data in writes:
            buf[at : at + len(data)] = data
        worker = _worker(impl, buf)
        log: list[Any] = []
        for _ in range(8):
            try:
                got = worker.next_produce()
            except Corrupt as exc:
                log.append(("corrupt", str(exc)))
                break
            log.append(got)
            if got is None:
                break
            worker.advance(got[1])
            log.append(("answer", worker.answer(got[2], 0, 1, -1, 0, b"m" * got[4]),
                        worker.completion_tail, worker.free_space()))
        try:
            log.append(("sleep", worker.set_sleeping()))
        except Corrupt as exc:
            log.append(("corrupt", str(exc)))
        worker.close()
        outcomes.append((log, bytes(buf)))
    assert all(o == outcomes[0] for o in outcomes[1:])


@pytest.mark.parametrize("impl", IMPLS)
def test_bounds_of_the_layout_are_checked_and_close_releases_the_view(impl) -> None:
    buf = _region()
    with pytest.raises(ValueError):
        impl(memoryview(buf), rings.SUBMIT_CONTROL, rings.DATA, SUBMIT * 4,
             rings.COMPLETION_CONTROL, rings.DATA + SUBMIT, COMPLETION, Corrupt)
    with pytest.raises(ValueError):
        impl(memoryview(buf), rings.SUBMIT_CONTROL, rings.DATA, 3000,
             rings.COMPLETION_CONTROL, rings.DATA + SUBMIT, COMPLETION, Corrupt)
    view = memoryview(buf)
    worker = impl(view, rings.SUBMIT_CONTROL, rings.DATA, SUBMIT, rings.COMPLETION_CONTROL,
                  rings.DATA + SUBMIT, COMPLETION, Corrupt)
    assert worker.next_produce() is None
    worker.close()
    view.release()  # no export left behind
    with pytest.raises(ValueError):
        worker.next_produce()
