"""Crash recovery: full ``load_log`` of an uncleanly closed log vs CRC-32C over the same bytes.

A log of ``--log-bytes`` is built in a temp dir from one reused batch (``--batch-bytes``, ~100 B
records) with ``segment.bytes`` = ``--segment-bytes``, then dropped with ``crash_close()`` (no
flush, indexes left untrimmed, no clean-shutdown marker).  Each sample times

    load_log(dir, config, recovery_point=0, clean_shutdown=False)

i.e. open every segment, CRC-check every batch, check offsets and epochs, rebuild the offset and
time indexes, regrow the last segment's indexes.  After a sample the loaded segments are closed
(``LogSegment.close()``, which trims the indexes) and the last segment's two indexes are grown
back to ``segment.index.bytes``, which is what the crash left: every sample recovers the same
on-disk state.  The anchor is ``shmq._fast.crc32c`` over each segment file's bytes already in
memory: the floor of what a CRC-checking recovery can cost.  Before every sample of either kind
the ``.log`` files are read once, so both measure CPU with the data in the page cache (no disk
I/O).  Target: recovery MB/s >= 0.5x the CRC MB/s.

    python perf/bench_recovery.py [--repeat 7] [--log-bytes 256M] [--segment-bytes 64M]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

import _common as c

TARGET_RATIO = 0.5


def parser() -> argparse.ArgumentParser:
    p = c.base_parser(__doc__.splitlines()[0])
    p.set_defaults(repeat=7)
    c.add_dir_arg(p)
    p.add_argument("--log-bytes", type=c.size_arg, default=256 * c.MiB, help="size of the log")
    p.add_argument("--segment-bytes", type=c.size_arg, default=64 * c.MiB, help="segment.bytes")
    p.add_argument("--batch-sizes", default="1M,64K",
                   help="batch sizes, one log and one row each (the first is ~1 MiB)")
    p.add_argument("--value-bytes", type=int, default=84)
    return p


def build_log(directory: Path, config, log_bytes: int, batch: bytes) -> int:
    from shmq.storage.log import PartitionLog

    log = PartitionLog.open(directory, config)
    # several batches per append call when they are small: quicker to build, same bytes on disk
    per_call = max(1, (1 << 20) // len(batch))
    chunk = batch * per_call
    appended = 0
    while appended + len(chunk) <= log_bytes:
        log.append(chunk)
        appended += len(chunk)
    while appended + len(batch) <= log_bytes:
        log.append(batch)
        appended += len(batch)
    segments = len(log.segments)
    log.crash_close()
    return segments


def log_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix == ".log")


def warm_page_cache(paths: list[Path]) -> int:
    total = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            while chunk := f.read(8 * c.MiB):
                total += len(chunk)
    return total


def batch_of_size(batch_size: int, value_bytes: int) -> bytes:
    """The largest batch of ``value_bytes`` records that fits in ``batch_size`` bytes."""
    from bench_append import make_batch

    records = max(1, (batch_size - 61) // (8 + value_bytes + 8))
    batch = make_batch(records, value_bytes)
    while len(batch) > batch_size and records > 1:
        records -= max(1, (len(batch) - batch_size) // (8 + value_bytes + 12))
        batch = make_batch(max(1, records), value_bytes)
    return batch


def bench_one(args: argparse.Namespace, batch_size: int, root: Path) -> c.Row:
    from shmq import _fast
    from shmq.storage import layout
    from shmq.storage.loader import load_log
    from shmq.storage.log_config import LogConfig

    batch = batch_of_size(batch_size, args.value_bytes)
    config = LogConfig(segment_bytes=args.segment_bytes)
    directory = root / f"recover-{batch_size}-0"
    segments = build_log(directory, config, args.log_bytes, batch)
    paths = log_files(directory)
    total = sum(p.stat().st_size for p in paths)
    loaded: dict = {}
    results: list = []

    def before_load() -> None:
        warm_page_cache(paths)

    def load() -> None:
        loaded["log"] = load_log(directory, config, recovery_point=0, clean_shutdown=False)

    def after_load() -> None:
        result = loaded.pop("log")
        results.append(result)
        if result.truncated_bytes or len(result.segments) != len(paths):
            raise SystemExit(f"recovery lost data: {result.truncated_bytes} bytes truncated")
        for seg in result.segments:
            seg.close()
        # give the last segment back its untrimmed, preallocated indexes (the crash state)
        _, index_path, time_path = layout.segment_paths(directory, result.segments[-1].base_offset)
        os.truncate(index_path, (config.segment_index_bytes // 8) * 8)
        os.truncate(time_path, (config.segment_index_bytes // 12) * 12)

    blobs: list[bytes] = []

    def before_crc() -> None:
        warm_page_cache(paths)
        if not blobs:
            blobs.extend(p.read_bytes() for p in paths)

    def crc_all() -> None:
        crc = _fast.crc32c
        for blob in blobs:
            crc(blob)

    t = c.measure({"shmq": c.Case(load, before_load, after_load),
                   "anchor": c.Case(crc_all, before_crc)}, args.repeat, args.warmup)
    batches = len(results[-1].recovered_batches)
    mbs = total / t["shmq"].median / 1e6
    anchor = total / t["anchor"].median / 1e6
    return c.Row(
        f"recovery, {c.human_bytes(batch_size)} batches", mbs, "MB/s", anchor,
        "crc32c in memory", kind="ratio>=", goal=TARGET_RATIO,
        note=(f"{total / c.MiB:.0f} MiB in {segments} segments, {batches} batches of "
              f"{len(batch):,} B; page cache warm (files read before every sample, both sides); "
              + c.spread_note("shmq", t["shmq"]) + "; " + c.spread_note("anchor", t["anchor"])),
    )


def run(args: argparse.Namespace) -> list[c.Row]:
    root = Path(tempfile.mkdtemp(prefix="shmq-bench-recovery-", dir=args.dir))
    try:
        return [bench_one(args, c.size_arg(s), root) for s in args.batch_sizes.split(",")]
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    return c.main_for("Recovery: load_log after a crash vs CRC-32C over the same bytes", parser(),
                      run, argv)


if __name__ == "__main__":
    sys.exit(main())
