"""A partition worker's CPU for one ring drain, in process: no event loop, no wake-ups.

    .venv/bin/python perf/probe_drain.py [--entries 20000] [--per-drain 1]

Builds what a worker holds for one partition (a ``PartitionLog`` in a temporary directory, a
state table and a metrics table in /dev/shm, a ``RingSession`` on a fresh ring region), then,
``--entries`` times: publishes one idempotent 100 B record as a client does, runs
``RingSession.drain`` and reads the answer.  Prints the CPU (``time.thread_time``) of the
drains alone, per entry: the warm cost of validation, idempotence, append (``pwritev`` into the
page cache), state-table publish and answer; the live worker's cost per wake-up (epoll, asyncio,
a cold interpreter) is not in it (``bench_shm.py --trace``, ``probe_wake.py``).  Everything it
creates is removed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
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


async def run(entries: int, per_drain: int) -> float:
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
                               "ring_wakeups", "ring_kicks", "ring_refused"), 0)
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
        cpu, seq = 0.0, 0
        for _ in range(entries // per_drain):
            for _ in range(per_drain):
                at = client_submit.reserve(n)
                rings.PRODUCE_HEADER.pack_into(view, at, n, rings.PRODUCE, 0, seq, 0, len(topic),
                                               1, 0, 0)
                view[at + 24 : at + 24 + len(topic)] = topic
                _fast.ring.encode_values_into(view, at + 24 + len(topic), size, values, now, 1000,
                                              0, seq)
                client_submit.commit(n, at)
                seq += 1
            t0 = time.thread_time()
            session.drain()
            cpu += time.thread_time() - t0
            while (entry := client_completion.peek()) is not None:
                assert rings.COMPLETION_HEADER.unpack_from(view, entry[0])[4] == 0
                client_completion.advance(entry[1])
            client_completion.release()
        assert plog.log_end_offset == seq
        return cpu / seq
    finally:
        if session is not None:
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
    args = p.parse_args()
    per = asyncio.run(run(args.entries, args.per_drain))
    print(f"drain CPU per entry: {per * 1e6:.2f} us ({args.entries:,} entries of one 100 B "
          f"record, {args.per_drain} a drain)")


if __name__ == "__main__":
    main()
