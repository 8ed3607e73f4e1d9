"""What fresh and reused pages cost on this machine, and whether pre-faulting ahead pays.

    python perf/probe_pages.py [--dir /tmp] [--mib 128]

Appends ``--mib`` MiB in 100 KB ``pwrite``s (a 1,000-record batch of 100 B records) to files
under a fresh directory in ``--dir``, and prints MiB/s for: anonymous memory populated fresh,
again right after unmapping it and 4 s later (a VM guest that reports freed pages to its host
gets them back cold); appending to a new file, overwriting its pages, appending to a new file
right after unlinking one and 4 s later; writing into pages populated ahead with ``fallocate`` +
``MADV_POPULATE_WRITE``; appending after ``fallocate(FALLOC_FL_KEEP_SIZE)``; appending while a
pool of populated anonymous memory is unmapped just ahead of the writer; appending while a thread
keeps 16 / 64 MiB populated ahead of the writer (0.3 s idle first).  Every loop is bounded by
``--mib``; the directory is removed at the end.
"""

from __future__ import annotations

import argparse
import ctypes
import mmap
import os
import shutil
import tempfile
import threading
import time

MB = 1 << 20
CHUNK = 100_000
POPULATE_WRITE = 23
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                       ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]


def row(what: str, mib: float, seconds: float) -> None:
    print(f"  {what:<62} {mib / seconds:>8,.0f} MiB/s", flush=True)


def fill(fd: int, total: int, on_write: object = None) -> float:
    buf = b"x" * CHUNK
    pos = 0
    t = time.perf_counter()
    while pos < total:
        pos += os.pwrite(fd, buf, pos)
        if on_write is not None:
            on_write(pos)  # type: ignore[operator]
    return time.perf_counter() - t


def anon(mib: int) -> float:
    m = mmap.mmap(-1, mib * MB)
    t = time.perf_counter()
    m.madvise(POPULATE_WRITE)
    dt = time.perf_counter() - t
    m.close()
    return dt


def new_file(path: str) -> int:
    return os.open(path, os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default=tempfile.gettempdir())
    p.add_argument("--mib", type=int, default=128)
    args = p.parse_args()
    n, total = args.mib, args.mib * MB
    work = tempfile.mkdtemp(prefix="probe-pages-", dir=args.dir)
    try:
        row("anonymous memory, fresh (MADV_POPULATE_WRITE)", n, anon(n))
        row("anonymous memory, right after unmapping as much", n, anon(n))
        time.sleep(4)
        row("anonymous memory, 4 s after unmapping", n, anon(n))

        fd = new_file(f"{work}/a")
        row("append to a new file", n, fill(fd, total))
        row("overwrite the same file's pages", n, fill(fd, total))
        os.close(fd)
        os.unlink(f"{work}/a")
        fd = new_file(f"{work}/b")
        row("append to a new file right after unlinking one", n, fill(fd, total))
        os.close(fd)
        os.unlink(f"{work}/b")
        time.sleep(4)
        fd = new_file(f"{work}/c")
        row("append to a new file 4 s after unlinking one", n, fill(fd, total))
        os.close(fd)
        os.unlink(f"{work}/c")
        time.sleep(4)

        fd = new_file(f"{work}/d")
        t = time.perf_counter()
        os.posix_fallocate(fd, 0, total)
        m = mmap.mmap(fd, total)
        m.madvise(POPULATE_WRITE)
        row("fallocate + MADV_POPULATE_WRITE (the pre-faulting itself)", n,
            time.perf_counter() - t)
        row("write into those populated pages", n, fill(fd, total))
        m.close()
        os.close(fd)
        os.unlink(f"{work}/d")
        time.sleep(4)

        fd = new_file(f"{work}/e")
        _libc.fallocate(fd, 1, 0, total)  # FALLOC_FL_KEEP_SIZE: blocks, no page cache
        row("append after fallocate(FALLOC_FL_KEEP_SIZE)", n, fill(fd, total))
        os.close(fd)
        os.unlink(f"{work}/e")
        time.sleep(4)

        pool = [mmap.mmap(-1, 4 * MB) for _ in range(max(1, n // 4))]
        for chunk in pool:
            chunk.madvise(POPULATE_WRITE)
        freed = [0]

        def free_ahead(pos: int) -> None:
            while pool and freed[0] * 4 * MB < pos + 4 * MB:
                pool.pop().close()
                freed[0] += 1

        fd = new_file(f"{work}/f")
        row("append, a warm anonymous pool unmapped just ahead", n, fill(fd, total, free_ahead))
        os.close(fd)
        os.unlink(f"{work}/f")

        for ahead in (16, 64):
            time.sleep(4)
            fd = new_file(f"{work}/g")
            state = {"pos": 0, "done": False}

            def prefault(fd: int = fd, ahead: int = ahead, state: dict = state) -> None:
                end = 0
                while not state["done"] and end < total:
                    if end - state["pos"] >= ahead * MB:
                        time.sleep(0.0002)
                        continue
                    _libc.fallocate(fd, 0, end, MB)
                    addr = _libc.mmap(None, MB, 3, 1, fd, end)  # PROT_RW, MAP_SHARED
                    _libc.madvise(addr, MB, POPULATE_WRITE)
                    _libc.munmap(addr, MB)
                    end += MB

            th = threading.Thread(target=prefault)
            th.start()
            time.sleep(0.3)
            dt = fill(fd, total, lambda pos, state=state: state.__setitem__("pos", pos))
            state["done"] = True
            th.join()
            row(f"append, a thread keeping {ahead} MiB populated ahead", n, dt)
            os.close(fd)
            os.unlink(f"{work}/g")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
