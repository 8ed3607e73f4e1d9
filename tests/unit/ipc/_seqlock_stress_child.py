"""One side of the seqlock stress test, run as its own process.

    python _seqlock_stress_child.py writer|reader|naive|seq compiled|reference <shm name> <seconds>

It maps the state table itself (posix_ipc + mmap, not StateTable) and prints "ready"; after a
line on stdin it runs and prints a JSON summary.  The writer publishes values in slot 1 that are
all derived from one counter n (``values(n)``) until the parent sets ``flags`` of slot 0 to 1.
A reader checks every snapshot against ``values(n)`` of its own ``log_start`` and that n never
goes backwards; it runs for <seconds> *and* until it has seen enough of the writer's progress
(a loaded host may not run both processes at once for a while), within a hard cap.  ``naive``
reads the same bytes without the seqlock until it sees a torn read: the control that shows the
check can see one.  ``seq`` loads only the slot's seq word (``slot_seq``), which must never go
backwards: a seq word written piecemeal shows values that were never published.
"""

from __future__ import annotations

import importlib
import json
import mmap
import struct
import sys
import time

import posix_ipc

M31, M32 = 2**31 - 1, 2**32 - 1
CONTROL, HAMMERED = 64, 128  # offsets of slots 0 and 1
MIN_OK, MIN_DISTINCT = 10_000, 1_000
HARD_CAP = 30.0  # seconds


def values(n: int) -> tuple[int, int, int, int, int, int, int, int]:
    """Every field from one counter, each in a different way (a torn read mixes two n's)."""
    return (n & M31, (n * 3) & M31, n, n + 1, -n, 2 * n, n & M32, ~n & M32)


def main() -> None:
    role, impl_name, name, seconds = sys.argv[1:5]
    offset = HAMMERED
    impl = importlib.import_module(
        "shmq._fast.seqlock" if impl_name == "compiled" else "shmq._fast._seqlock_reference"
    )
    shm = posix_ipc.SharedMemory(name, read_only=role != "writer")
    try:
        access = mmap.ACCESS_WRITE if role == "writer" else mmap.ACCESS_READ
        m = mmap.mmap(shm.fd, shm.size, access=access)
    finally:
        shm.close_fd()
    buf = memoryview(m)
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.monotonic()
    deadline, hard_deadline = start + float(seconds), start + HARD_CAP
    result: dict[str, object] = {}

    if role == "writer":
        write, n = impl.write_slot, 0
        while True:
            for _ in range(256):
                n += 1
                write(buf, offset, *values(n))
            control = impl.read_slot(buf, CONTROL)
            if (control is not None and control[7] == 1) or time.monotonic() >= hard_deadline:
                break
        result = {"writes": n}
    elif role == "seq":
        slot_seq = impl.slot_seq
        seen = backwards = distinct = 0
        last, first_backwards = -1, None
        while True:
            for _ in range(256):
                seq = slot_seq(buf, offset)
                seen += 1
                if seq < last:
                    backwards += 1
                    first_backwards = first_backwards or [last, seq]
                elif seq > last:
                    distinct += 1
                last = seq
            now = time.monotonic()
            if (
                now >= deadline and seen >= MIN_OK and distinct >= MIN_DISTINCT
            ) or now >= hard_deadline:
                break
        result = {
            "seen": seen,
            "backwards": backwards,
            "distinct": distinct,
            "first_backwards": first_backwards,
        }
    else:
        if role == "naive":
            fields = struct.Struct("=iiqqqqII")

            def read(buf: memoryview, offset: int) -> tuple[int, ...]:
                return fields.unpack_from(buf, offset + 8)
        else:
            read = impl.read_slot
        ok = gave_up = torn = backwards = 0
        last, distinct, first_torn = -1, 0, None
        while True:
            for _ in range(256):
                got = read(buf, offset)
                if got is None:
                    gave_up += 1
                    continue
                n = got[2]
                if n < 0 or got != values(n):  # n < 0: the "unknown" state before the first write
                    if n >= 0 or got[0] != -1:
                        torn += 1
                        first_torn = first_torn or list(got)
                    continue
                ok += 1
                if n < last:
                    backwards += 1
                elif n > last:
                    distinct += 1
                    last = n
            now = time.monotonic()
            if role == "naive":
                enough = torn > 0
            else:
                enough = ok >= MIN_OK and distinct >= MIN_DISTINCT
            if (now >= deadline and enough) or now >= hard_deadline:
                break
        result = {
            "ok": ok,
            "gave_up": gave_up,
            "torn": torn,
            "backwards": backwards,
            "distinct": distinct,
            "last": last,
            "first_torn": first_torn,
        }
    buf.release()
    m.close()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
