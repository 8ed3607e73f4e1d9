"""Per-append cost of PartitionLog.append in one process: microseconds per batch, optional cProfile.

Pre-built batches (``encode_batch``: 8-byte key, value of ``--value-bytes``) are appended again and
again to a log in a temp dir (page cache only, nothing fsynced; ``flush.messages`` and
``flush.ms`` left at their defaults, i.e. never).  Reports the best and median of ``--repeat``
runs of ``--appends`` appends for the small batch (100 records x 100 B) and for ~1 MiB batches.
The 1 MiB time is dominated by the CRC and the write; the small one shows the Python overhead.

    python perf/profile_append.py [--appends 20000] [--repeat 5] [--profile small|big] [--clock wall|cpu]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from shmq.protocol.records import encode_batch  # noqa: E402
from shmq.storage.log import PartitionLog  # noqa: E402
from shmq.storage.log_config import LogConfig  # noqa: E402


def make_batch(records: int, value_bytes: int) -> bytes:
    return bytes(encode_batch([(b"k%07d" % i, bytes([i % 251]) * value_bytes)
                               for i in range(records)]))


CLOCK = time.perf_counter


def run(batch: bytes, appends: int, root: Path) -> float:
    directory = root / "p-0"
    log = PartitionLog.open(directory, LogConfig(segment_bytes=1 << 30))
    append = log.append
    try:
        t0 = CLOCK()
        for _ in range(appends):
            append(batch)
        return (CLOCK() - t0) / appends * 1e6
    finally:
        log.crash_close()
        shutil.rmtree(directory)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--appends", type=int, default=20_000, help="appends of the small batch per run")
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--value-bytes", type=int, default=100)
    p.add_argument("--profile", choices=["small", "big"], default=None,
                   help="run one case under cProfile instead and print the top functions")
    p.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                   help="cpu: process time (user + system), steadier on a shared box")
    args = p.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    cases = {"small": (make_batch(100, args.value_bytes), args.appends),
             "big": (make_batch(8800, args.value_bytes), max(1, args.appends // 40))}
    root = Path(tempfile.mkdtemp(prefix="shmq-profile-append-"))
    try:
        if args.profile:
            batch, n = cases[args.profile]
            prof = cProfile.Profile()
            prof.enable()
            run(batch, n, root)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(18)
            return 0
        for name, (batch, n) in cases.items():
            run(batch, min(n, 200), root)  # warm up
            times = [run(batch, n, root) for _ in range(args.repeat)]
            print(f"{name:5s} batch {len(batch):>9,} B x {n:>6}: best {min(times):8.2f} us/append,"
                  f" median {statistics.median(times):8.2f}, max {max(times):8.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
