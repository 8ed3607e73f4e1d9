"""A partition worker's CPU for one ring drain, in process: no event loop, no wake-ups.

    .venv/bin/python perf/probe_drain.py [--entries 20000] [--per-drain 1] [--kick] [--paced-us 100]

Builds what a worker holds for one partition (a ``PartitionLog`` in a temporary directory, a
state table and a metrics table in /dev/shm, a ``RingSession`` on a fresh ring region), then,
``--entries`` times: publishes one idempotent 100 B record as a client does, runs
``RingSession.drain`` and reads the answer.  Prints the CPU (``time.thread_time``) of the
drains alone, per entry: the warm cost of validation, idempotence, append (``pwritev`` into the
page cache), state-table publish and answer; the live worker's cost per wake-up (epoll, asyncio,
a cold interpreter) is not in it (``bench_shm.py --trace``, ``probe_wake.py``).

``--kick`` times the worker's whole callback instead of the drain alone: the client writes the
eventfd (the session sleeps after each drain, as at a paced rate: no idle spin) and
``RingSession._on_kick`` runs (the eventfd read, the drain, the clock reads and the decision to
sleep), still warm and without the event loop's own turn.

``--paced-us N`` measures the rest too: a forked client publishes one entry every N us
(absolute schedule, timer slack 1 ns), writing the worker's eventfd when its session sleeps and
reading its answers as ``poll(0)`` does, while this process runs the worker's event-loop path
(``add_reader`` on the eventfd -> ``RingSession._on_kick`` -> drain -> sleep or spin).  It
prints this process's CPU (``getrusage``) per entry and per wake-up, and the wake-ups and spin
turns per entry: a partition worker's CPU at a paced rate with no local reader to wake.
Everything it creates is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import resource
import shutil
import socket
import tempfile
import time
import types
from pathlib import Path
from typing import Any

from shmq import _fast
from shmq.broker.config import BrokerConfig
from shmq.broker.context import BrokerContext
from shmq.broker.metadata import ClusterMetadata, PartitionInfo, TopicInfo
from shmq.ipc import ring as rings
from shmq.ipc.metrics_table import MetricsTable
from shmq.ipc.state_table import StateTable
from shmq.storage.log import LogConfig, PartitionLog
from shmq.worker import rings as worker_rings

TOPIC = "t"
SUBMIT, COMPLETION = 1 << 20, 1 << 16


class _Logs:
    def __init__(self, logs: dict[tuple[str, int], PartitionLog]) -> None:
        self.logs = logs

    def get_log(self, topic: str, partition: int) -> PartitionLog | None:
        return self.logs.get((topic, partition))


def _client(view: Any, layout: Any, topic: bytes, values: list[bytes], now: int, size: int,
            n: int, entries: int, interval: float, worker_efd: int) -> None:
    """The forked client of ``--paced-us``: one entry every ``interval`` s, then exits."""
    import ctypes

    ctypes.CDLL(None).prctl(29, 1, 0, 0, 0)  # PR_SET_TIMERSLACK: sleeps end when asked
    submit, completion = rings.session_rings(view, layout)
    time.sleep(0.2)
    start = time.monotonic()
    for seq in range(entries):
        left = start + seq * interval - time.monotonic()
        if left > 0:
            time.sleep(left)
        while (at := submit.reserve(n)) < 0:
            time.sleep(0.0001)
        rings.PRODUCE_HEADER.pack_into(view, at, n, rings.PRODUCE, 0, seq, 0, len(topic), 1, 0, 0)
        view[at + 24 : at + 24 + len(topic)] = topic
        _fast.ring.encode_values_into(view, at + 24 + len(topic), size, values, now, 1000, 0,
                                      seq)
        if submit.commit(n, at):
            os.eventfd_write(worker_efd, 1)
        while (entry := completion.peek()) is not None:  # poll(0)
            completion.advance(entry[1])
            if completion.release():  # the worker waits for room to answer in
                os.eventfd_write(worker_efd, 1)


async def paced(session: Any, plog: PartitionLog, view: Any, layout: Any, topic: bytes,
                values: list[bytes], now: int, size: int, n: int, entries: int,
                interval: float) -> tuple[float, int, int]:
    """(CPU s of this process, wake-ups, spin turns) while a forked client sends ``entries``."""
    loop = asyncio.get_running_loop()
    session.worker_efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    session.client_efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    stats = session.stats
    pid = os.fork()
    if pid == 0:
        try:
            _client(view, layout, topic, values, now, size, n, entries, interval,
                    session.worker_efd)
        finally:
            os._exit(0)
    try:
        loop.add_reader(session.worker_efd, session._on_kick)
        session._schedule()
        done = loop.create_future()
        deadline = time.monotonic() + 10 + entries * interval * 3

        def check() -> None:
            if plog.log_end_offset >= entries or time.monotonic() > deadline:
                done.set_result(None)
            else:
                loop.call_later(0.05, check)

        def cpu() -> float:
            ru = resource.getrusage(resource.RUSAGE_SELF)
            return ru.ru_utime + ru.ru_stime

        w0, s0, c0 = stats["ring_wakeups"], stats.get("ring_spins", 0), cpu()
        check()
        await done
        used = cpu() - c0
        loop.remove_reader(session.worker_efd)
        assert plog.log_end_offset == entries, plog.log_end_offset
        return used, stats["ring_wakeups"] - w0, stats.get("ring_spins", 0) - s0
    finally:
        os.waitpid(pid, 0)
        os.close(session.worker_efd)
        os.close(session.client_efd)
        session.worker_efd = session.client_efd = -1


async def run(entries: int, per_drain: int, paced_us: float = 0.0, kick: bool = False) -> Any:
    tmp = Path(tempfile.mkdtemp(prefix="probe-drain-"))
    table, metrics = StateTable.create(4), MetricsTable.create(2, 4)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    session: Any = None
    plog = None
    try:
        info = TopicInfo(TOPIC, "00000000-0000-0000-0000-000000000001",
                         [PartitionInfo(0, 1, [1], [1], slot=0)])
        plog = PartitionLog.open(tmp / f"{TOPIC}-0", LogConfig())
        ctx = BrokerContext(node_id=1, config=BrokerConfig(data_dir=tmp),
                            metadata=ClusterMetadata(cluster_id="x", topics={TOPIC: info}),
                            controller=None, logs=_Logs({(TOPIC, 0): plog}))  # type: ignore[arg-type]
        ctx.state_table, ctx.metrics = table, metrics.writer(1)
        PartitionLog.defer_flushes = True  # as in a worker
        stats = dict.fromkeys(("ring_sessions", "ring_sessions_open", "ring_entries",
                               "ring_wakeups", "ring_kicks", "ring_spins", "ring_refused"), 0)
        server = types.SimpleNamespace(ctx=ctx, loop=asyncio.get_running_loop(), stats=stats,
                                       sessions={})
        session = worker_rings.RingSession(server, a, os.getpid(), 1)  # type: ignore[arg-type]
        layout = rings.Layout(SUBMIT, COMPLETION)
        fd = rings.create_region(layout, 1)
        session.mapping = _fast.MappedFile(fd, layout.size, True)
        os.close(fd)
        session.view = view = memoryview(session.mapping)
        session.rings = _fast.WorkerRings(view, rings.SUBMIT_CONTROL, rings.DATA, SUBMIT,
                                          rings.COMPLETION_CONTROL, rings.DATA + SUBMIT,
                                          COMPLETION, rings.RingCorruptError)
        client_submit, client_completion = rings.session_rings(view, layout)
        topic, values, now = TOPIC.encode(), [b"x" * 100], int(time.time() * 1000)
        size = -_fast.ring.encode_batch_into(bytearray(0), 0, 0, values, now, 1000, 0, 0)
        n = rings.PRODUCE_HEADER_SIZE + len(topic) + size
        gc.freeze()  # as a worker does
        if paced_us:
            return await paced(session, plog, view, layout, topic, values, now, size, n,
                               entries, paced_us / 1e6)
        cpu, seq = 0.0, 0
        step = session.drain
        if kick:
            worker_rings.SPIN_GAP_S = 0.0  # it sleeps after each drain, as at a paced rate
            session.worker_efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            session.client_efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            session._drain()  # asleep from here
            step = session._on_kick
        for _ in range(entries // per_drain):
            for _ in range(per_drain):
                at = client_submit.reserve(n)
                rings.PRODUCE_HEADER.pack_into(view, at, n, rings.PRODUCE, 0, seq, 0, len(topic),
                                               1, 0, 0)
                view[at + 24 : at + 24 + len(topic)] = topic
                _fast.ring.encode_values_into(view, at + 24 + len(topic), size, values, now, 1000,
                                              0, seq)
                if client_submit.commit(n, at) and kick:
                    os.eventfd_write(session.worker_efd, 1)
                seq += 1
            t0 = time.thread_time()
            step()
            cpu += time.thread_time() - t0
            while (entry := client_completion.peek()) is not None:
                assert rings.COMPLETION_HEADER.unpack_from(view, entry[0])[4] == 0
                client_completion.advance(entry[1])
            client_completion.release()
        assert plog.log_end_offset == seq
        return cpu / seq
    finally:
        if session is not None:
            for efd in (session.worker_efd, session.client_efd):
                if efd >= 0:
                    os.close(efd)
            session.closed = True
            if session.rings is not None:
                session.rings.close()
        a.close()
        b.close()
        if plog is not None:
            plog.close()
        table.close()
        table.unlink()
        metrics.close()
        metrics.unlink()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entries", type=int, default=20_000)
    p.add_argument("--per-drain", type=int, default=1)
    p.add_argument("--kick", action="store_true",
                   help="time RingSession._on_kick (eventfd read + drain + sleep) per entry")
    p.add_argument("--paced-us", type=float, default=0.0,
                   help="a forked client sends one entry every this many us (the event loop's "
                        "wake-up path measured too)")
    args = p.parse_args()
    if args.paced_us:
        used, wakes, spins = asyncio.run(run(args.entries, 1, args.paced_us))
        print(f"paced every {args.paced_us:g} us: worker CPU {used / args.entries * 1e6:.2f} us "
              f"an entry, {used / max(wakes, 1) * 1e6:.2f} a wake-up; "
              f"{wakes / args.entries:.2f} wake-ups and {spins / args.entries:.2f} spin turns "
              f"an entry (load {os.getloadavg()[0]:.1f})")
        return
    p_kick = args.kick
    per = asyncio.run(run(args.entries, args.per_drain, kick=p_kick))
    what = "_on_kick (eventfd read, drain, sleep)" if p_kick else "drain"
    print(f"{what} CPU per entry: {per * 1e6:.2f} us ({args.entries:,} entries of one 100 B "
          f"record, {args.per_drain} a drain)")


if __name__ == "__main__":
    main()
