"""When a partition worker's ring session spins and when it sleeps (``shmq.worker.rings``:
``SPIN_GAP_S``, ``IDLE_SPIN_S``).

A session with nothing left to drain keeps looking (one ``sched_yield`` and one event-loop turn a
look) only while entries have been coming closer together than a wake-up costs; otherwise it
sets ``consumer_sleeping`` at once and the client's next entry wakes it through the eventfd.
These tests drive a real ``RingSession`` on a real ring region (no broker: the entries name an
unknown topic, so each is answered UNKNOWN_TOPIC_OR_PARTITION through ``produce_partition``)."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import types
from collections.abc import Iterator
from typing import Any

import pytest

from shmq import _fast
from shmq.ipc import ring as rings
from shmq.worker import rings as worker_rings

SUBMIT, COMPLETION = 1 << 16, 1 << 16
STATS = ("ring_sessions", "ring_sessions_open", "ring_entries", "ring_wakeups", "ring_kicks",
         "ring_spins", "ring_refused")


@pytest.fixture
def session() -> Iterator[Any]:
    loop = asyncio.new_event_loop()
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ctx = types.SimpleNamespace(metadata=types.SimpleNamespace(topics={}), logs=None, node_id=1,
                                metrics=None)
    server = types.SimpleNamespace(ctx=ctx, loop=loop, stats=dict.fromkeys(STATS, 0),
                                   sessions={})
    s = worker_rings.RingSession(server, a, os.getpid(), 1)  # type: ignore[arg-type]
    layout = rings.Layout(SUBMIT, COMPLETION)
    fd = rings.create_region(layout, 1)
    s.mapping = _fast.MappedFile(fd, layout.size, True)
    os.close(fd)
    s.view = memoryview(s.mapping)
    s.rings = _fast.WorkerRings(s.view, rings.SUBMIT_CONTROL, rings.DATA, SUBMIT,
                                rings.COMPLETION_CONTROL, rings.DATA + SUBMIT, COMPLETION,
                                rings.RingCorruptError)
    s.client = rings.session_rings(s.view, layout)
    try:
        yield s
    finally:
        s.closed = True
        s.rings.close()
        s.client = None
        s.view.release()
        s.mapping.close()
        a.close()
        b.close()
        loop.close()


def _send(s: Any, corr: int) -> None:
    """One PRODUCE entry (acks=1) as a client publishes it, and the answers read (``poll(0)``)."""
    submit, completion = s.client
    topic, body = b"no-such-topic", b"\0" * 80
    n = rings.PRODUCE_HEADER_SIZE + len(topic) + len(body)
    at = submit.reserve(n)
    assert at >= 0
    rings.PRODUCE_HEADER.pack_into(s.view, at, n, rings.PRODUCE, 0, corr, 0, len(topic), 1, 0, 0)
    s.view[at + 24 : at + 24 + len(topic)] = topic
    submit.commit(n, at)
    while (entry := completion.peek()) is not None:
        completion.advance(entry[1])
    completion.release()


def _sleeping(s: Any) -> bool:
    return bool(_fast.ring.load_u32(s.view, rings.SUBMIT_CONTROL + 128))  # consumer_sleeping


def _busy(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_entries_farther_apart_than_the_spin_gap_sleep_between_drains(session: Any) -> None:
    """Entries whose idle gap between drains is longer than ``SPIN_GAP_S``: the session sleeps
    at once after each drain instead of spinning through the gap."""
    s = session
    _send(s, 1)
    s._drain()
    for corr in range(2, 6):
        _busy(1.5 * worker_rings.SPIN_GAP_S)  # idle, then the next entry
        _send(s, corr)
        s._drain()
        assert s.stats["ring_entries"] == corr
        assert not s.scheduled and _sleeping(s), "spun through a long gap"
        assert s.stats["ring_spins"] == 0


def test_back_to_back_entries_spin_before_sleeping(session: Any) -> None:
    """Entries with no gap between drains (a client sending batches back to back): the session
    keeps looking for the next one (a loop turn after a sched_yield) instead of sleeping, and
    counts the turn in ``ring_spins``; a turn that finds the ring empty looks again."""
    s = session
    for attempt in range(20):  # a preemption between the two drains makes a gap: try again
        _send(s, 2 * attempt + 1)
        s._drain()
        _send(s, 2 * attempt + 2)
        s._drain()
        if s.scheduled:
            break
    assert s.scheduled and not _sleeping(s)
    spins = s.stats["ring_spins"]
    assert spins >= 1
    s._drain()  # the spin turn: nothing there, still within IDLE_SPIN_S (unless preempted)
    assert s.stats["ring_entries"] == 2 * attempt + 2
    assert s.scheduled or _sleeping(s)
    assert s.stats["ring_spins"] == spins + (1 if s.scheduled else 0)
