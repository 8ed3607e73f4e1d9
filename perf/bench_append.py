"""Append throughput: PartitionLog.append of one reused batch vs plain os.write of the same bytes.

One batch is built once with ``encode_batch`` (``--batch-records`` records of ~100 B: 8-byte key,
``--value-bytes`` value, no headers, uncompressed) and appended again and again until ``--total``
bytes are in the log.  Each append validates the batch (size, magic, CRC, produce rules), stamps
offsets into a copy of the header and writes header + body with one pwritev; ``segment.bytes``
is ``--segment-bytes`` so the log rolls a few times.  The anchor writes the same bytes with
``os.write`` to one file in the same directory.  Page cache only: nothing is fsynced; files are
deleted between repeats.  Target (1 MiB batches): shmq >= 0.5x the anchor's MB/s.

    python perf/bench_append.py [--repeat 5] [--total 512M] [--segment-bytes 128M]
                                [--codecs lz4,zstd,snappy,gzip]

Informational rows per ``--codecs`` entry append a ~1 MiB (uncompressed) batch compressed with
that codec, whose values are random uppercase letters as Kafka's producer-perf-test sends (they
compress about 1.6x): since Kafka's LogValidator reads every record of a produced batch, the
append decompresses it (keys and values skipped) to check and derive its timestamps.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

import _common as c

TARGET_RATIO = 0.5


def parser() -> argparse.ArgumentParser:
    p = c.base_parser(__doc__.splitlines()[0])
    c.add_dir_arg(p)
    p.add_argument("--total", type=c.size_arg, default=512 * c.MiB, help="bytes appended per sample")
    p.add_argument("--segment-bytes", type=c.size_arg, default=128 * c.MiB,
                   help="segment.bytes of the log (rolls = total / this)")
    p.add_argument("--batch-records", type=int, default=10_000,
                   help="records in the big (~1 MiB) batch")
    p.add_argument("--small-batch-records", type=int, default=160,
                   help="records in the small (~16 KiB) batch of the informational row; 0 skips it")
    p.add_argument("--value-bytes", type=int, default=84, help="value size (key is 8 bytes)")
    p.add_argument("--codecs", default="lz4,zstd",
                   help="compressed rows, comma separated (none of gzip,snappy,lz4,zstd: '')")
    return p


def make_batch(records: int, value_bytes: int, seed: int = 1, codec: str = "none") -> bytes:
    from shmq.protocol import compression
    from shmq.protocol.records import encode_batch

    rng = random.Random(seed)
    if codec == "none":
        recs = [(b"k%07d" % i, rng.randbytes(value_bytes)) for i in range(records)]
    else:  # producer-perf-test payloads: random uppercase letters
        letters = bytes(range(65, 91))
        recs = [(b"k%07d" % i, bytes(rng.choices(letters, k=value_bytes)))
                for i in range(records)]
    return bytes(encode_batch(recs, compression_type=compression.CODEC_BY_NAME[codec]))


def bench_one(args: argparse.Namespace, batch: bytes, label: str, judged: bool) -> c.Row:
    from shmq.storage.log import PartitionLog
    from shmq.storage.log_config import LogConfig

    appends = max(1, args.total // len(batch))
    total = appends * len(batch)
    config = LogConfig(segment_bytes=args.segment_bytes)
    root = Path(tempfile.mkdtemp(prefix="shmq-bench-append-", dir=args.dir))
    state: dict = {}
    segments_seen: list[int] = []

    def setup_log() -> None:
        state["log"] = PartitionLog.open(root / "bench-0", config)

    def append_all() -> None:
        log = state["log"]
        append = log.append
        for _ in range(appends):
            append(batch)

    def teardown_log() -> None:
        log = state.pop("log")
        segments_seen.append(len(log.segments))
        assert log.log_end_offset == appends * (batch_records(batch)), "lost records"
        log.crash_close()  # no flush: page cache only
        shutil.rmtree(root / "bench-0")

    def setup_anchor() -> None:
        state["fd"] = os.open(root / "anchor.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)

    def write_all() -> None:
        fd, write = state["fd"], os.write
        for _ in range(appends):
            n = write(fd, batch)
            if n != len(batch):  # never happens on a regular file, but be honest about it
                view = memoryview(batch)[n:]
                while len(view):
                    view = view[write(fd, view):]

    def teardown_anchor() -> None:
        os.close(state.pop("fd"))
        os.unlink(root / "anchor.bin")

    try:
        t = c.measure({
            "anchor": c.Case(write_all, setup_anchor, teardown_anchor),
            "shmq": c.Case(append_all, setup_log, teardown_log),
        }, args.repeat, args.warmup)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    mbs = total / t["shmq"].median / 1e6
    anchor = total / t["anchor"].median / 1e6
    per_append_us = t["shmq"].median / appends * 1e6
    return c.Row(
        f"append {label} batches", mbs, "MB/s", anchor, "os.write",
        kind="ratio>=" if judged else "info", goal=TARGET_RATIO if judged else None,
        note=(f"{appends} appends of {len(batch):,} B = {total / c.MiB:.0f} MiB, "
              f"{segments_seen[-1]} segments of <= {c.human_bytes(args.segment_bytes)}; "
              f"{per_append_us:.1f} us/append; "
              + c.spread_note("shmq", t["shmq"]) + "; " + c.spread_note("anchor", t["anchor"])),
    )


def batch_records(batch: bytes) -> int:
    return int.from_bytes(batch[57:61], "big")


def run(args: argparse.Namespace) -> list[c.Row]:
    rows = [bench_one(args, make_batch(args.batch_records, args.value_bytes), "1 MiB", True)]
    if args.small_batch_records:
        rows.append(bench_one(args, make_batch(args.small_batch_records, args.value_bytes),
                              "16 KiB", False))
    for codec in filter(None, args.codecs.split(",")):
        batch = make_batch(args.batch_records, args.value_bytes, codec=codec)
        rows.append(bench_one(args, batch, f"{codec} (1 MiB of records)", False))
    return rows


def main(argv: list[str] | None = None) -> int:
    return c.main_for("Append: PartitionLog.append vs os.write (page cache only)", parser(), run, argv)


if __name__ == "__main__":
    sys.exit(main())
