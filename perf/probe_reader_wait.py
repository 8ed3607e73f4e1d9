"""What a local reader's wait costs its thread, woken once per publish (the 10,000 records/s row).

    .venv/bin/python perf/probe_reader_wait.py [--publishes 20000] [--gap-us 100] [--repeat 1]

A forked writer publishes a state-table slot every ``--gap-us`` (its high watermark + 1); this
process waits for each next offset with ``PartitionReader.wait``, as a waiting reader does, and
prints its thread's CPU a wait (``thread_time``), user and system, and its voluntary and
involuntary context switches (``RUSAGE_THREAD``).  No segment files: only the wait.
``SHMQ_READER_SLICE_US=0`` turns the short slice off (A/B of its cost: the switch to the short
slice right before the futex sleep preempts a thread that is not eligible, about once a wait
on Linux 6.18).  One child for a few seconds at most; the state table is unlinked at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import time
from typing import Any

from shmq.ipc.reader import PartitionReader
from shmq.ipc.state_table import StateTable


def _writer(name: str, n: int, gap: float, go: Any) -> None:
    table = StateTable.attach(name, readonly=False)
    go.wait()
    start = time.monotonic()
    for i in range(n):
        left = start + i * gap - time.monotonic()
        if left > 0:
            time.sleep(left)
        table.write(1, 1, 0, 0, 8 + i, 8 + i, 8 + i, 3, 0)
    table.close()


def run(n: int, gap: float) -> str:
    ctx = mp.get_context("fork")
    with StateTable.create(2) as table:
        table.write(1, 1, 0, 0, 7, 7, 7, 3, 0)
        reader = PartitionReader(table, 1, lambda node: "/nonexistent")
        go = ctx.Event()
        child = ctx.Process(target=_writer, args=(table.name, n, gap, go))
        child.start()
        try:
            time.sleep(0.2)
            offset, waits = 7, 0
            c0, r0 = time.thread_time(), resource.getrusage(resource.RUSAGE_THREAD)
            go.set()
            deadline = time.monotonic() + 10 + n * gap * 2
            while offset < 6 + n and time.monotonic() < deadline:
                offset = reader.wait(offset, 1.0).high_watermark
                waits += 1
            cpu, r1 = time.thread_time() - c0, resource.getrusage(resource.RUSAGE_THREAD)
        finally:
            child.join(30)
            if child.is_alive():
                child.kill()
                child.join()
        table.clear(1)
    per = 1e6 / max(waits, 1)
    return (f"{waits:,} waits: CPU {cpu * per:.2f} us a wait (user "
            f"{(r1.ru_utime - r0.ru_utime) * per:.2f}, system {(r1.ru_stime - r0.ru_stime) * per:.2f}),"
            f" context switches a wait: voluntary {(r1.ru_nvcsw - r0.ru_nvcsw) / max(waits, 1):.2f},"
            f" involuntary {(r1.ru_nivcsw - r0.ru_nivcsw) / max(waits, 1):.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--publishes", type=int, default=20_000)
    p.add_argument("--gap-us", type=float, default=100.0)
    p.add_argument("--repeat", type=int, default=1)
    args = p.parse_args(argv)
    for _ in range(args.repeat):
        print(run(args.publishes, args.gap_us * 1e-6))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
