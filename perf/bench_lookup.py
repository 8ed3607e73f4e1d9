"""Offset lookup cost with 10,000 segments vs 10 segments.

Two logs are built with the same segments (``--segment-bytes``, ~10 batches of ~1.6 KiB each):
one with ``--segments`` (10,000) of them, one with ``--few-segments`` (10).  Appending 10,000
segments through ``PartitionLog.append`` takes minutes (every roll preallocates two 10 MiB
indexes and msyncs them on seal), so the logs are written directly: two segments are appended
for real, then segment 0's three files are copied N times with the batches' base offsets
re-stamped (every segment holds the same batches, so relative index entries are identical), and
the directory is opened with ``PartitionLog.open(clean_shutdown=True)`` (index sanity checks,
tail state).  Each run checks that the copied 10-segment log is byte-identical to one built by
appending.  Then
``--lookups`` random offsets (same seed for both logs, uniform over each log's offsets) are
looked up two ways:

  * ``log.read(offset, 1 MiB)``: the fetch path (bounds, segment choice, index lookup, header
    walk, FileSlice);
  * bare: ``log._segment_for(offset)`` then ``segment.translate_offset(offset)``.

Reported: us per lookup (lower is better); ratio = 10,000-segment cost / 10-segment cost.
Target: ratio <= 2 (a lookup must not grow with the segment count beyond O(log n)).
An informational row holds the same data as the big log in just 10 segments (big segments, so
bigger index searches and header windows).  The storage holds one descriptor per segment:
``ulimit -n`` must exceed ``--segments`` (20,000 here).

    python perf/bench_lookup.py [--repeat 5] [--segments 10000] [--lookups 20000]
"""

from __future__ import annotations

import argparse
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import _common as c

TARGET_RATIO = 2.0
BATCHES_PER_SEGMENT = 10


def parser() -> argparse.ArgumentParser:
    p = c.base_parser(__doc__.splitlines()[0])
    p.set_defaults(repeat=5)  # each sample is 20,000 lookups per case
    c.add_dir_arg(p)
    p.add_argument("--segments", type=int, default=10_000, help="segments in the big log")
    p.add_argument("--few-segments", type=int, default=10, help="segments in the small log")
    p.add_argument("--segment-bytes", type=c.size_arg, default=16 * c.KiB, help="segment.bytes")
    p.add_argument("--lookups", type=int, default=20_000, help="random offsets per sample")
    p.add_argument("--max-bytes", type=c.size_arg, default=c.MiB, help="max_bytes of each read")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--value-bytes", type=int, default=84)
    p.add_argument("--same-data-row", action=argparse.BooleanOptionalAction, default=True,
                   help="also time the big log's data held in --few-segments big segments")
    return p


def segment_chunk(segment_bytes: int, value_bytes: int) -> bytes:
    """BATCHES_PER_SEGMENT batches that together fill (but do not overflow) one segment."""
    from bench_append import make_batch

    per_batch = segment_bytes // BATCHES_PER_SEGMENT
    records = max(1, (per_batch - 61) // (8 + value_bytes + 8))
    batch = make_batch(records, value_bytes)
    while len(batch) * BATCHES_PER_SEGMENT > segment_bytes and records > 1:
        records -= 1
        batch = make_batch(records, value_bytes)
    return batch * BATCHES_PER_SEGMENT


def build_by_append(directory: Path, segment_bytes: int, chunk: bytes, calls: int):
    """The honest way: one append call per segment (each call fills one segment)."""
    from shmq.storage.log import PartitionLog
    from shmq.storage.log_config import LogConfig

    log = PartitionLog.open(directory, LogConfig(segment_bytes=segment_bytes))
    for _ in range(calls):
        log.append(chunk)
    log.update_high_watermark(log.log_end_offset)
    return log


def build(directory: Path, segment_bytes: int, chunk: bytes, calls: int, *,
          now_ms: int = 1_700_000_000_000):
    """The quick way: template segment files copied with re-stamped base offsets, then opened
    by the loader as after a clean shutdown.  Same files as ``build_by_append`` (checked)."""
    from shmq import _fast
    from shmq.protocol.records import iter_batches
    from shmq.storage import layout
    from shmq.storage.log import PartitionLog
    from shmq.storage.log_config import LogConfig

    config = LogConfig(segment_bytes=segment_bytes)
    template_dir = directory.with_name(directory.name + ".template")
    log = PartitionLog.open(template_dir, config)
    log.append(chunk, now_ms=now_ms)
    log.append(chunk, now_ms=now_ms)  # rolls: segment 0 is sealed like every inactive one
    log.close()
    files = [p.read_bytes() for p in layout.segment_paths(template_dir, 0)]
    seg_log = bytearray(files[0])
    positions, counts = [], []
    for view in iter_batches(seg_log):
        positions.append(view._pos)
        counts.append(view.last_offset_delta + 1)
        view.buffer.release()
    per_segment = sum(counts)
    # every roll writes a producer snapshot named after the new segment (UnifiedLog.roll); with
    # no idempotent producer its bytes are the same at every roll
    snapshot = (template_dir / f"{per_segment:020d}.snapshot").read_bytes()
    shutil.rmtree(template_dir)
    directory.mkdir(mode=0o700, parents=True)
    for i in range(calls):
        base = i * per_segment
        offset = base
        for pos, n in zip(positions, counts, strict=True):
            _fast.stamp_batch(seg_log, pos, offset, -1)
            offset += n
        log_path, index_path, time_path = layout.segment_paths(directory, base)
        log_path.write_bytes(seg_log)
        index_path.write_bytes(files[1])
        time_path.write_bytes(files[2])
        if i:
            (directory / f"{base:020d}.snapshot").write_bytes(snapshot)
    leo = calls * per_segment
    log = PartitionLog.open(directory, config, recovery_point=leo, clean_shutdown=True)
    assert log.log_end_offset == leo and len(log.segments) == calls, log
    log.update_high_watermark(leo)
    return log


def check_builder(root: Path, segment_bytes: int, chunk: bytes, calls: int) -> None:
    """The quick builder must write exactly what appending writes (logs and indexes)."""
    now = 1_700_000_000_000
    a = build(root / "check-a-0", segment_bytes, chunk, calls, now_ms=now)
    from shmq.storage.log import PartitionLog
    from shmq.storage.log_config import LogConfig

    b = PartitionLog.open(root / "check-b-0", LogConfig(segment_bytes=segment_bytes))
    for _ in range(calls):
        b.append(chunk, now_ms=now)
    for log in (a, b):
        log.close()  # trims every index
    names_a = sorted(p.name for p in (root / "check-a-0").iterdir())
    names_b = sorted(p.name for p in (root / "check-b-0").iterdir())
    assert names_a == names_b, (names_a, names_b)
    for name in names_a:
        if (root / "check-a-0" / name).read_bytes() != (root / "check-b-0" / name).read_bytes():
            raise SystemExit(f"quick builder differs from appending in {name}")
    shutil.rmtree(root / "check-a-0")
    shutil.rmtree(root / "check-b-0")


def bench_pair(args: argparse.Namespace, big, small, offsets_big: list[int],
               offsets_small: list[int]) -> dict[str, c.Timing]:
    max_bytes = args.max_bytes

    def reads(log, offsets: list[int]):
        def fn() -> None:
            read = log.read
            for off in offsets:
                if not read(off, max_bytes).slices:
                    raise AssertionError(f"no data at offset {off}")
        return fn

    def bare(log, offsets: list[int]):
        def fn() -> None:
            segs, seg_for = log.segments, log._segment_for
            for off in offsets:
                if segs[seg_for(off)].translate_offset(off) is None:
                    raise AssertionError(f"offset {off} not found")
        return fn

    return c.measure({
        "read_big": c.Case(reads(big, offsets_big)),
        "read_small": c.Case(reads(small, offsets_small)),
        "bare_big": c.Case(bare(big, offsets_big)),
        "bare_small": c.Case(bare(small, offsets_small)),
    }, args.repeat, args.warmup)


def run(args: argparse.Namespace) -> list[c.Row]:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = args.segments + 3 * args.few_segments + 100
    if soft < need:
        raise SystemExit(f"ulimit -n is {soft}; {need} descriptors are needed (one per segment)")
    chunk = segment_chunk(args.segment_bytes, args.value_bytes)
    per_chunk = BATCHES_PER_SEGMENT * int.from_bytes(chunk[57:61], "big")
    root = Path(tempfile.mkdtemp(prefix="shmq-bench-lookup-", dir=args.dir))
    logs = []
    try:
        check_builder(root, args.segment_bytes, chunk, min(args.few_segments, 20) or 2)
        t0 = time.perf_counter()
        big = build(root / "big-0", args.segment_bytes, chunk, args.segments)
        build_s = time.perf_counter() - t0
        logs.append(big)
        small = build(root / "small-0", args.segment_bytes, chunk, args.few_segments)
        logs.append(small)
        assert len(big.segments) == args.segments, len(big.segments)
        assert len(small.segments) == args.few_segments, len(small.segments)
        rng = random.Random(args.seed)
        offsets_big = [rng.randrange(big.log_end_offset) for _ in range(args.lookups)]
        rng = random.Random(args.seed)
        offsets_small = [rng.randrange(small.log_end_offset) for _ in range(args.lookups)]
        t = bench_pair(args, big, small, offsets_big, offsets_small)
        us = {k: v.median / args.lookups * 1e6 for k, v in t.items()}
        common = (f"{args.lookups:,} random offsets/sample (seed {args.seed}); segments of "
                  f"{len(chunk):,} B = {BATCHES_PER_SEGMENT} batches x {per_chunk // BATCHES_PER_SEGMENT}"
                  f" records; big log built in {build_s:.1f} s; ")
        rows = [
            c.Row(f"log.read, {args.segments:,} vs {args.few_segments} segs", us["read_big"],
                  "us/lookup", us["read_small"], f"{args.few_segments} segs", kind="ratio<=",
                  goal=TARGET_RATIO, target_text=f"<= {TARGET_RATIO:g}x {args.few_segments}-seg cost",
                  note=common + c.spread_note(f"{args.segments} segs", t["read_big"]) + "; "
                  + c.spread_note(f"{args.few_segments} segs", t["read_small"])),
            c.Row(f"_segment_for+translate_offset, {args.segments:,} vs {args.few_segments}",
                  us["bare_big"], "us/lookup", us["bare_small"], f"{args.few_segments} segs",
                  kind="ratio<=", goal=TARGET_RATIO,
                  target_text=f"<= {TARGET_RATIO:g}x {args.few_segments}-seg cost",
                  note=c.spread_note(f"{args.segments} segs", t["bare_big"]) + "; "
                  + c.spread_note(f"{args.few_segments} segs", t["bare_small"])),
        ]
        small.crash_close()
        logs.remove(small)
        shutil.rmtree(root / "small-0")
        if args.same_data_row and args.few_segments > 0:
            per = -(-args.segments // args.few_segments)
            seg_bytes = per * len(chunk)
            same = build(root / "same-0", seg_bytes, chunk * per, args.few_segments)
            logs.append(same)
            ts = c.measure({"read": c.Case(bench_pair_reader(same, offsets_big, args.max_bytes))},
                           args.repeat, args.warmup)
            v = ts["read"].median / args.lookups * 1e6
            rows.append(c.Row(
                f"log.read, same data in {len(same.segments)} segs", v, "us/lookup",
                note=(f"segments of {c.human_bytes(seg_bytes)}"
                      f" (informational: compare with the {args.segments:,}-segment row); "
                      + c.spread_note("read", ts["read"])),
            ))
        return rows
    finally:
        for log in logs:
            log.crash_close()
        shutil.rmtree(root, ignore_errors=True)


def bench_pair_reader(log, offsets: list[int], max_bytes: int):
    def fn() -> None:
        read = log.read
        for off in offsets:
            if not read(off, max_bytes).slices:
                raise AssertionError(f"no data at offset {off}")
    return fn


def main(argv: list[str] | None = None) -> int:
    return c.main_for("Offset lookup: 10,000 segments vs 10", parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
