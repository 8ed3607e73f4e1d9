"""Worker restart and broker start against the size of the logs (issue 23).

    python perf/bench_restart_size.py [--sizes 10M,1G,10G] [--repeat 5] [--clean-bytes 50G]
        [--clean-partitions 50] [--clean-segment 256M] [--cache drop|fadvise] [--dir DIR]

Part 1, for each size S: a topic whose partitions on worker 1 hold S in their active segments
(1 GiB per partition at most, ``segment.bytes`` 2 GiB so each stays one segment; 256 KiB
batches of ~100 B records, written by the storage engine into the stopped broker's logs:
producing 10 GiB through the broker would only take longer).
Then the broker starts, a confluent-kafka producer (acks=all, idempotent, reconnect backoff
50-500 ms) acknowledges a message on worker 1, worker 1 is SIGKILLed, and the rows are

* ``kill -> answering``: to its listener answering ApiVersions (the controller keeps the socket:
  the connection waits in the backlog until the restarted worker serves),
* ``kill -> first ack``: to the first acknowledgement of a message produced after the kill,
  ``--repeat`` kills each, median and spread.  Target: under 0.5 s for every size.
* the anchor, ``recovery by Kafka's rule``: ``load_log`` of one of those partitions after a crash
  without its recovery record (the whole active segment validated, as Kafka and shmq before
  issue 23 did), in the bench process; for S above 1 GiB it is one partition of S / 1 GiB.

The worker's own line (``worker 1 ready: ... validated in ... s``) is printed for the last kill.

Part 2: ``--clean-bytes`` (50 GB) in ``--clean-partitions`` partitions of ``--clean-segment``
segments over two workers, written the same way, the broker stopped cleanly; then ``shmq broker``
from exec to its ready line with the page cache evicted (``--cache drop``: ``sync; echo 3 >
/proc/sys/vm/drop_caches``, needs root and evicts everyone's cache; ``fadvise``:
``posix_fadvise(DONTNEED)`` on every file of the data dir, ours only; ``both``: one start each),
and warm; the anchor is the start with an empty data dir.  Then, cold again: the first acks=all acknowledgement and the first
fetch of offset 0 of a partition (each loads and checks a lazily opened segment).  Target: ready
in under 2 s, cold cache included.

Only loopback; every wait is bounded; every process started here is stopped by PID; the data is
deleted at the end (``--keep`` keeps it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as c  # noqa: E402
from bench_append import make_batch  # noqa: E402
from bench_startup import Shmq, _api_versions, _wait  # noqa: E402

TIMEOUT = 120.0
TARGET_ACK_S = 0.5
TARGET_START_S = 2.0
PER_PARTITION = c.GiB  # in one active segment: the topic's segment.bytes is Kafka's maximum
MAX_SEGMENT = 2**31 - 1


def _admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic(bootstrap: str, topic: str, partitions: int, config: dict[str, str]) -> dict:
    """Create ``topic``; {partition: leader}."""
    from confluent_kafka.admin import NewTopic

    admin = _admin(bootstrap)
    admin.create_topics([NewTopic(topic, partitions, 1, config=config)])[topic].result(TIMEOUT)
    md = admin.list_topics(topic, timeout=30)
    return {p: part.leader for p, part in md.topics[topic].partitions.items()}


def fill(directory: Path, size: int, batch: bytes, segment_bytes: int) -> None:
    """Append ``size`` bytes of ``batch`` copies to the (cleanly stopped) log in ``directory``."""
    from shmq.storage.log import PartitionLog
    from shmq.storage.log_config import LogConfig

    log = PartitionLog.open(directory, LogConfig(segment_bytes=segment_bytes), clean_shutdown=True)
    chunk = batch * max(1, (4 * c.MiB) // len(batch))
    written = 0
    while written + len(chunk) <= size:
        log.append(chunk, leader_epoch=0)
        written += len(chunk)
    while written < size:
        log.append(batch, leader_epoch=0)
        written += len(batch)
    log.close()


def evict(data_dir: Path, how: str) -> None:
    if how == "drop":
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return
    for root, _, files in os.walk(data_dir):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fdatasync(fd)  # dirty pages are not evicted
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _partition_dir(data_dir: Path, node: int, topic: str, p: int) -> Path:
    return data_dir / f"worker-{node}" / f"{topic}-{p}"


def kill_to_first_ack(b: Shmq, topic: str, partition: int) -> tuple[float, float]:
    from confluent_kafka import Producer

    acks: list[float] = []
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 0,
                  "enable.idempotence": True, "reconnect.backoff.ms": 50,
                  "reconnect.backoff.max.ms": 500, "message.timeout.ms": int(TIMEOUT * 1000)})
    p.produce(topic, b"warm", partition=partition)
    if p.flush(TIMEOUT):
        raise RuntimeError("warm-up produce failed")
    w = b.workers()[1]
    t_kill = time.perf_counter()
    os.kill(w["pid"], signal.SIGKILL)
    p.produce(topic, b"after", partition=partition,
              on_delivery=lambda err, msg: acks.append(time.perf_counter()) if err is None
              else None)
    answering = 0.0
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and not (answering and acks):
        p.poll(0.001)
        if not answering and _api_versions(w["port"]):
            answering = time.perf_counter() - t_kill
    p.flush(TIMEOUT)
    if not acks:
        raise RuntimeError("no acknowledgement after the restart")
    _wait(lambda: b.workers()[1]["pid"] != w["pid"])
    return answering, acks[0] - t_kill


def kafka_rule_recovery(directory: Path) -> tuple[float, int]:
    """Seconds ``load_log`` takes after a crash with no recovery record: every byte of the
    active segment validated (the anchor); and the bytes it validated."""
    from shmq.storage import layout, recovery_point
    from shmq.storage.loader import load_log
    from shmq.storage.log_config import LogConfig

    (directory / layout.CLEAN_SHUTDOWN_FILE).unlink(missing_ok=True)
    recovery_point.remove(directory)
    t0 = time.perf_counter()
    loaded = load_log(directory, LogConfig(), recovery_point=0, clean_shutdown=False)
    seconds = time.perf_counter() - t0
    for seg in loaded.segments:
        seg.close()
    return seconds, loaded.validated_bytes


def ready_line(log: Path, node: int) -> str:
    lines = [ln for ln in log.read_text(errors="replace").splitlines()
             if f"worker {node} ready:" in ln]
    return lines[-1].split(" INFO ", 1)[-1] if lines else "(no line: SHMQ_LOG_LEVEL set?)"


def part1(args: argparse.Namespace, work: Path, batch: bytes, rows: list[list[str]]) -> None:
    for size in args.sizes:
        d = work / f"size-{size}"
        log = work / f"size-{size}.log"
        n1 = math.ceil(size / PER_PARTITION)
        per = size // n1
        b = Shmq(d, 2, True, log)
        try:
            b.ready()
            leaders = create_topic(b.bootstrap, "big", 2 * n1,
                                   {"segment.bytes": str(MAX_SEGMENT)})
        finally:
            b.stop()
        mine = sorted(p for p, leader in leaders.items() if leader == 1)[:n1]
        t0 = time.perf_counter()
        for p in mine:
            fill(_partition_dir(d, 1, "big", p), per, batch, MAX_SEGMENT)
        fill_s = time.perf_counter() - t0
        total = sum(f.stat().st_size for p in mine
                    for f in _partition_dir(d, 1, "big", p).glob("*.log"))
        print(f"  {c.human_bytes(total)} on worker 1 in {len(mine)} active segments "
              f"(written in {fill_s:.1f} s)", flush=True)
        answering, acked = [], []
        b = Shmq(d, 2, True, log)
        try:
            start = b.ready()
            for _ in range(args.repeat):
                a, k = kill_to_first_ack(b, "big", mine[0])
                answering.append(a)
                acked.append(k)
                time.sleep(11)  # past the controller's crash-loop window (10 s)
            line = ready_line(log, 1)
        finally:
            b.stop()
        anchor, validated = kafka_rule_recovery(_partition_dir(d, 1, "big", mine[0]))
        label = c.human_bytes(total)
        kafka_rule = anchor * len(mine)  # every active segment validated, one after the other
        rows.append([f"{label}: start (clean, warm)", f"{start:.3f}", "", ""])
        rows.append([f"{label}: kill -> answering", _cell(answering), "", ""])
        ok = statistics.median(acked) < TARGET_ACK_S
        rows.append([f"{label}: kill -> first acks=all ack", _cell(acked),
                     f"{statistics.median(acked) / kafka_rule:.3f}x",
                     f"< {TARGET_ACK_S} s {'PASS' if ok else 'FAIL'}"])
        rows.append([f"{label}: anchor, recovery by Kafka's rule: {len(mine)} x "
                     f"{anchor:.3f} s ({c.human_bytes(validated)} each)", f"{kafka_rule:.3f}",
                     "1.000x", ""])
        print(f"  worker 1, last restart: {line}", flush=True)
        if not args.keep:
            shutil.rmtree(d, ignore_errors=True)


def part2(args: argparse.Namespace, work: Path, batch: bytes, rows: list[list[str]]) -> None:
    d = work / "clean"
    log = work / "clean.log"
    b = Shmq(d, 2, True, log)
    try:
        b.ready()
        leaders = create_topic(b.bootstrap, "store", args.clean_partitions,
                               {"segment.bytes": str(args.clean_segment)})
    finally:
        b.stop()
    per = args.clean_bytes // args.clean_partitions
    t0 = time.perf_counter()
    for p, node in sorted(leaders.items()):
        fill(_partition_dir(d, node, "store", p), per, batch, args.clean_segment)
    total = sum(f.stat().st_size for f in d.glob("worker-*/store-*/*.log"))
    segments = len(list(d.glob("worker-*/store-*/*.log")))
    print(f"  {c.human_bytes(total)} in {args.clean_partitions} partitions, {segments} segments "
          f"(written in {time.perf_counter() - t0:.0f} s)", flush=True)
    modes = ["fadvise", "drop"] if args.cache == "both" else [args.cache]
    cold: dict[str, list[float]] = {m: [] for m in modes}
    empty, warm, first_ack, first_fetch = [], [], [], []
    for r in range(args.repeat):
        e = work / f"empty-{r}"
        b = Shmq(e, 2, True, work / "empty.log")
        try:
            empty.append(b.ready())
        finally:
            b.stop()
        shutil.rmtree(e, ignore_errors=True)
        for mode in modes:
            evict(d, mode)
            b = Shmq(d, 2, True, log)
            try:
                cold[mode].append(b.ready())
                ack, fetch = first_use(b, "store", args.clean_partitions)
                first_ack.append(ack)
                first_fetch.append(fetch)
            finally:
                b.stop()
        b = Shmq(d, 2, True, log)
        try:
            warm.append(b.ready())
        finally:
            b.stop()
    label = f"{c.human_bytes(total)}, {segments} segments"
    base = statistics.median(empty)
    rows.append(["start, empty data dir (anchor)", _cell(empty), "1.000x", ""])
    for mode, times in cold.items():
        ok = statistics.median(times) < TARGET_START_S
        rows.append([f"start, {label}, cold ({mode})", _cell(times),
                     f"{statistics.median(times) / base:.3f}x",
                     f"< {TARGET_START_S:.0f} s {'PASS' if ok else 'FAIL'}"])
    rows.append([f"start, {label}, warm", _cell(warm), f"{statistics.median(warm) / base:.3f}x", ""])
    rows.append(["  then cold: first acks=all ack (1 partition)", _cell(first_ack), "", ""])
    rows.append(["  then cold: first fetch of offset 0 (1 partition)", _cell(first_fetch), "", ""])
    print(f"  last start: {ready_line(log, 1)}", flush=True)
    if not args.keep:
        shutil.rmtree(d, ignore_errors=True)


def first_use(b: Shmq, topic: str, partitions: int) -> tuple[float, float]:
    """Seconds to the first acks=all ack on partition 0, and to the first record of a fetch
    from offset 0 of partition 1 (a cold, lazily opened first segment)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 0})
    p.list_topics(topic, timeout=30)
    acks: list[float] = []
    t0 = time.perf_counter()
    p.produce(topic, b"x", partition=0, on_delivery=lambda e, m: acks.append(time.perf_counter()))
    p.flush(TIMEOUT)
    consumer = Consumer({"bootstrap.servers": b.bootstrap, "group.id": "bench-first-fetch",
                         "enable.auto.commit": False})
    try:
        consumer.list_topics(topic, timeout=30)
        t1 = time.perf_counter()
        consumer.assign([TopicPartition(topic, 1 % partitions, 0)])
        msg = None
        while msg is None and time.perf_counter() - t1 < TIMEOUT:
            msg = consumer.poll(0.05)
        fetched = time.perf_counter() - t1
    finally:
        consumer.close()
    return acks[0] - t0, fetched


def _cell(v: list[float]) -> str:
    return f"{statistics.median(v):.3f} ({min(v):.3f}-{max(v):.3f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="10M,1G,10G",
                    help="bytes in worker 1's active segments, one case each")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--clean-bytes", type=c.size_arg, default=50 * 10**9)
    ap.add_argument("--clean-partitions", type=int, default=50)
    ap.add_argument("--clean-segment", type=c.size_arg, default=256 * c.MiB)
    ap.add_argument("--cache", choices=["drop", "fadvise", "both"], default="fadvise",
                    help="how the page cache is emptied before a cold start")
    ap.add_argument("--skip", choices=["kill", "clean"], action="append", default=[])
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--dir", default=None, help="parent of the data dirs (needs the space)")
    args = ap.parse_args(argv)
    args.sizes = [c.size_arg(s) for s in args.sizes.split(",")]
    c.byte_compile_shmq()
    env = dict(os.environ)
    env.pop("SHMQ_LOG_LEVEL", None)  # the workers' ready lines are logged at the default level
    os.environ.clear()
    os.environ.update(env)
    c.print_environment("worker restart and broker start vs log size")
    print(f"loadavg {os.getloadavg()[0]:.2f}; repeat {args.repeat}; cache eviction "
          f"{args.cache}", flush=True)
    batch = make_batch(2048, 100)  # ~256 KiB
    rows: list[list[str]] = []
    work = Path(tempfile.mkdtemp(prefix="shmq-restart-size-", dir=args.dir))
    try:
        if "kill" not in args.skip:
            part1(args, work, batch, rows)
        if "clean" not in args.skip:
            part2(args, work, batch, rows)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(f"{'seconds: median (min-max)':<66} | {'value':<24} | {'/ anchor':>9} | target")
    print("-" * 67 + "+" + "-" * 26 + "+" + "-" * 11 + "+---------")
    for row in rows:
        print(f"{row[0]:<66} | {row[1]:<24} | {row[2]:>9} | {row[3]}")
    print(json.dumps({"rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
