"""What one cross-process wake-up costs on this machine (the 10,000 records/s latency rows).

    .venv/bin/python perf/probe_wake.py [--wakes 5000] [--repeat 2]

At 10,000 records/s records come 100 us apart, longer than the spin rule's 50 us
(``SPIN_GAP_S``), so each stage sleeps between records and each record costs one wake-up a
stage: the producer's ``eventfd_write`` wakes the worker, the worker's publish wakes the reader
(a futex).  Two numbers, both CPU time (``getrusage`` / ``thread_time``), not wall:

* **waker**: the CPU of one ``eventfd_write`` that wakes a process asleep on the eventfd
  (``select``), one every 100 us; the sleeper in this process's session, then in a session
  of its own (as the broker runs: ``start_new_session``, another autogroup).
* **sleeper**: the CPU per wake-up of a process woken every 100 us: asleep in an asyncio event
  loop's ``add_reader`` callback (as the partition worker waits for its ring's eventfd) against
  a bare ``epoll.poll`` loop.  The difference is the event loop's own machinery per wake-up.

Each run forks one child for at most a few seconds and waits for it; nothing is left behind.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import select
import time


def _cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def waker(wakes: int, own_session: bool) -> tuple[float, float]:
    """(p50, p90) CPU us of an eventfd_write that wakes a sleeping process."""
    efd = os.eventfd(0, os.EFD_NONBLOCK)
    pid = os.fork()
    if pid == 0:  # the sleeper: until the parent closes its end (bounded by the deadline)
        if own_session:
            os.setsid()
        end = time.monotonic() + 30
        while time.monotonic() < end:
            select.select([efd], [], [], 0.05)
            try:
                if os.eventfd_read(efd) >= 1 << 40:
                    break
            except BlockingIOError:
                pass
        os._exit(0)
    try:
        time.sleep(0.2)
        cpu = []
        for _ in range(wakes):
            time.sleep(0.0001)
            before = time.thread_time_ns()
            os.eventfd_write(efd, 1)
            cpu.append(time.thread_time_ns() - before)
        os.eventfd_write(efd, 1 << 41)  # the sleeper's signal to end
    finally:
        os.waitpid(pid, 0)
        os.close(efd)
    cpu.sort()
    return cpu[len(cpu) // 2] / 1000, cpu[len(cpu) * 9 // 10] / 1000


def sleeper(wakes: int, how: str) -> float:
    """CPU us per wake-up of a process woken every 100 us (``how``: asyncio or epoll)."""
    efd = os.eventfd(0, os.EFD_NONBLOCK)
    pid = os.fork()
    if pid == 0:  # the waker: one eventfd_write every 100 us, on an absolute schedule
        time.sleep(0.3)
        start = time.monotonic()
        for i in range(wakes):
            left = start + i * 1e-4 - time.monotonic()
            if left > 0:
                time.sleep(left)
            os.eventfd_write(efd, 1)
        os._exit(0)
    try:
        if how == "asyncio":
            async def main() -> float:
                loop = asyncio.get_running_loop()
                done = loop.create_future()
                seen = [0]

                def on_kick() -> None:
                    try:
                        seen[0] += os.eventfd_read(efd)
                    except BlockingIOError:
                        return
                    if seen[0] >= wakes and not done.done():
                        done.set_result(None)

                loop.add_reader(efd, on_kick)
                loop.call_later(30, lambda: done.done() or done.set_result(None))
                began = _cpu()
                await done
                loop.remove_reader(efd)
                return _cpu() - began

            used = asyncio.run(main())
        else:
            ep = select.epoll()
            ep.register(efd, select.EPOLLIN)
            seen = 0
            began = _cpu()
            end = time.monotonic() + 30
            while seen < wakes and time.monotonic() < end:
                ep.poll(1.0)
                try:
                    seen += os.eventfd_read(efd)
                except BlockingIOError:
                    pass
            used = _cpu() - began
            ep.close()
    finally:
        os.waitpid(pid, 0)
        os.close(efd)
    return used / wakes * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wakes", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f} at the start; {args.wakes} wake-ups a row, "
          f"one every 100 us\n")
    print(f"{'row':<58} {'CPU us':>14}")
    for _ in range(args.repeat):
        for own in (False, True):
            p50, p90 = waker(args.wakes, own)
            where = "own session" if own else "same session"
            print(f"{'waker: eventfd_write to a sleeping process, ' + where:<58} "
                  f"p50 {p50:5.1f} p90 {p90:5.1f}")
        for how in ("asyncio", "epoll"):
            label = ("sleeper: asyncio add_reader callback" if how == "asyncio"
                     else "sleeper: bare epoll.poll loop")
            print(f"{label:<58} {sleeper(args.wakes, how):8.1f} a wake")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
