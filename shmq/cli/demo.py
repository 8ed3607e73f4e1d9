"""``shmq demo``: drive real traffic through the storage engine and show what it did.

Until the broker exists this is the README's main job: it writes a few hundred thousand records
into partition logs in Kafka's on-disk format (all five compression codecs), reads them back by
offset and by timestamp, kills a writer process with SIGKILL in the middle of appending, recovers
the log it left, and checks that every acknowledged record survived exactly once.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from shmq.cli import CommandError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "demo",
        help="write, read, crash and recover partition logs in Kafka's format",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--data-dir", help="where to put the logs (default: a temporary directory)")
    p.add_argument("--records", type=int, default=200_000, help="records per partition")
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--record-size", type=int, default=100, help="value bytes per record")
    p.add_argument("--batch-records", type=int, default=500, help="records per batch")
    p.add_argument("--keep", action="store_true", help="keep the data directory afterwards")
    p.add_argument("--_crash-writer", dest="crash_writer", help=argparse.SUPPRESS)
    return p


def _batches(partition: int, records: int, size: int, per_batch: int, first: int = 0):
    from shmq.protocol import compression
    from shmq.protocol.records import encode_batch

    codecs = list(compression.CODEC_NAMES)
    base_ts = 1_700_000_000_000
    value = (b"shmq" * (size // 4 + 1))[:size]
    for start in range(first, records, per_batch):
        rows = [(b"key-%d" % i, value, base_ts + i, [("p", b"%d" % partition)])
                for i in range(start, min(start + per_batch, records))]
        yield encode_batch(rows, compression_type=codecs[(start // per_batch) % len(codecs)])


def _crash_writer(directory: str) -> int:
    """Child process: append batches forever, printing each acknowledged last offset."""
    from shmq.storage import LogConfig, PartitionLog

    log = PartitionLog.open(Path(directory), LogConfig(segment_bytes=4 << 20))
    out = sys.stdout
    for batch in _batches(0, 10**9, 100, 100, first=log.log_end_offset):
        info = log.append(batch)
        out.write(f"{info.last_offset}\n")
        out.flush()
    return 0


def run(args: argparse.Namespace) -> int:
    if args.crash_writer:
        return _crash_writer(args.crash_writer)
    from shmq import _fast
    from shmq.protocol.records import decode_batches
    from shmq.storage import LogConfig, LogManager

    if args.records < 1 or args.partitions < 1 or args.batch_records < 1 or args.record_size < 0:
        raise CommandError("--records, --partitions and --batch-records must be positive")
    tmp = None
    if args.data_dir:
        data_dir = Path(args.data_dir)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="shmq-demo-")
        data_dir = Path(tmp.name)
    print(f"shmq demo: data in {data_dir} (compiled hot paths: {_fast.HAVE_FAST}, "
          f"SSE4.2 CRC: {_fast.have_hardware()})")
    config = LogConfig(segment_bytes=8 << 20)
    manager = LogManager(data_dir, config)
    manager.startup()
    try:
        # 1. produce
        t0 = time.perf_counter()
        total_bytes = 0
        for p in range(args.partitions):
            log = manager.get_or_create_log("demo-events", p)
            for batch in _batches(p, args.records, args.record_size, args.batch_records):
                total_bytes += log.append(batch).size
            log.update_high_watermark(log.log_end_offset)
            log.flush()
        dt = time.perf_counter() - t0
        n = args.records * args.partitions
        print(f"appended {n:,} records ({total_bytes / 1e6:.1f} MB, 5 codecs) in {dt:.2f} s: "
              f"{n / dt / 1e6:.2f} M records/s, fsynced")
        # 2. consume everything back by offset
        t0 = time.perf_counter()
        seen = 0
        for p in range(args.partitions):
            log = manager.get_or_create_log("demo-events", p)
            offset = log.log_start_offset
            while offset < log.high_watermark:
                result = log.read(offset, 1 << 20)
                records = decode_batches(result.slices[0].read())
                for rec in records:
                    if rec.offset >= offset:
                        if rec.offset != offset or rec.key != b"key-%d" % offset:
                            raise CommandError(f"partition {p}: offset {rec.offset} out of order")
                        offset += 1
                        seen += 1
        dt = time.perf_counter() - t0
        print(f"read back {seen:,} records in order in {dt:.2f} s: {seen / dt / 1e6:.2f} M records/s")
        log = manager.get_or_create_log("demo-events", 0)
        found = log.offset_for_timestamp(1_700_000_000_000 + args.records // 2)
        print(f"offset for timestamp {1_700_000_000_000 + args.records // 2}: {found}")
        segs = log.segments
        print(f"partition 0: {len(segs)} segments, log start {log.log_start_offset}, "
              f"LEO {log.log_end_offset}, first file {segs[0].log_path.name}")
    finally:
        manager.shutdown()
    print("clean shutdown: indexes trimmed, checkpoints and .kafka_cleanshutdown written")

    # 3. SIGKILL a writer mid-append, then recover what it left
    crash_dir = data_dir / "crash-test-0"
    child = subprocess.Popen(
        [sys.executable, "-m", "shmq", "demo", "--_crash-writer", str(crash_dir)],
        stdout=subprocess.PIPE, text=True)
    acked = -1
    assert child.stdout is not None
    deadline = time.monotonic() + 20
    while acked < 50_000 and time.monotonic() < deadline:
        line = child.stdout.readline()
        if not line:
            break
        acked = int(line)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close()
    if acked < 0:
        raise CommandError("the crash writer did not start")
    from shmq.storage import PartitionLog
    from shmq.storage.loader import load_log

    t0 = time.perf_counter()
    loaded = load_log(crash_dir, LogConfig(segment_bytes=4 << 20), clean_shutdown=False)
    dt = time.perf_counter() - t0
    leo = loaded.segments[-1].next_offset
    for seg in loaded.segments:
        seg.close()
    print(f"SIGKILLed a writer after {acked + 1:,} acknowledged records; recovery validated "
          f"{len(loaded.recovered_batches):,} batches in {dt * 1e3:.0f} ms, truncated "
          f"{loaded.truncated_bytes} bytes of a torn tail, LEO {leo:,}")
    log = PartitionLog.open(crash_dir, LogConfig(segment_bytes=4 << 20), clean_shutdown=True)
    log.update_high_watermark(log.log_end_offset)
    expected = 0
    offset = 0
    while offset < log.log_end_offset:
        for rec in decode_batches(log.read(offset, 1 << 20).slices[0].read()):
            if rec.offset != expected or rec.key != b"key-%d" % expected:
                raise CommandError(f"recovered log is not a prefix: offset {rec.offset}")
            expected += 1
        offset = expected
    log.close()
    if expected <= acked:
        raise CommandError(f"lost acknowledged records: have {expected}, acked {acked + 1}")
    print(f"every acknowledged record is there exactly once ({expected:,} contiguous offsets)")
    if args.keep or args.data_dir:
        print(f"data kept in {data_dir}; try: shmq dump-log --files "
              f"{data_dir}/demo-events-0/00000000000000000000.log | head")
    if tmp is not None and not args.keep:
        tmp.cleanup()
    return 0
