"""What reading every produced record costs the broker: this tree against a baseline checkout.

Kafka's LogValidator reads every record of a produced batch (decompressing compressed ones,
keys and values skipped) to validate its timestamps and derive its max timestamp; shmq does the
same since issue 21 (``PartitionLog._validate_timestamps``, the per-record loop in
``_fast.check_timestamps``).  This measures the produce path with and without it, A/B
interleaved on one box: a shmq broker from this tree and one from ``--baseline`` (a checkout of
the commit before, with its extensions built) take turns, the order alternating per repeat.

    git worktree add /tmp/shmq-before <commit> && (cd /tmp/shmq-before && \\
        /path/to/.venv/bin/python setup.py -q build_ext --inplace)
    python perf/bench_produce_validation.py --baseline /tmp/shmq-before \\
        [--codecs none,lz4,zstd] [--messages 500000] [--size 100] [--repeat 3]

Per codec and broker: a confluent-kafka Producer in this process (linger.ms=5,
batch.size=1 MiB, acks=1, the codec, one partition, values drawn from a pool of random
uppercase letters as Kafka's producer-perf-test sends) produces ``--messages`` messages; the
table shows msg/s (client and broker share the 2 cores: client-bound) and the broker's CPU
seconds per million messages (utime+stime of the controller and its workers), the number that
says what the validation costs.  Medians over ``--repeat``; each broker runs one worker.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import _common as c
import bench_broker as bb


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, help="a shmq checkout with built extensions")
    p.add_argument("--codecs", default="none,lz4,zstd")
    p.add_argument("--messages", type=int, default=500_000)
    p.add_argument("--size", type=int, default=100, help="value bytes")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--dir", default=tempfile.gettempdir())
    return p


def start(tree: Path, root: Path, name: str) -> bb.Broker:
    data = root / f"{name}-data"
    shutil.rmtree(data, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(tree))
    b = bb.Broker(name, [sys.executable, "-m", "shmq", "broker", "--listeners", "127.0.0.1:0",
                         "--workers", "1", "--data-dir", str(data)], root / f"{name}.log", env)
    b.bootstrap = b.wait_ready("shmq broker ready: bootstrap ", timeout=60).split()[0]
    return b


def produce(b: bb.Broker, codec: str, n: int, size: int) -> tuple[float, float]:
    """(seconds, broker CPU seconds) to produce ``n`` messages with ``codec``."""
    from confluent_kafka import Producer

    topic = f"v-{codec}-{time.monotonic_ns()}"
    bb.create_topic(b.bootstrap, topic, 1, 30)
    rng = random.Random(7)
    pool = [bytes(rng.choices(range(65, 91), k=size)) for _ in range(1000)]
    prod = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5, "batch.size": 1 << 20,
                     "acks": 1, "compression.type": codec})
    prod.list_topics(topic, timeout=10)
    cpu0 = b.cpu()
    t0 = time.perf_counter()
    for i in range(n):
        while True:
            try:
                prod.produce(topic, pool[i % 1000], partition=0)
                break
            except BufferError:
                prod.poll(0.001)
        if not i & 4095:
            prod.poll(0)
    if prod.flush(120):
        raise RuntimeError("messages not delivered")
    seconds = time.perf_counter() - t0
    return seconds, bb.cpu_delta(cpu0, b.cpu())


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    c.print_environment("Produce path: reading every record (this tree) vs not (baseline)")
    trees = {"this tree": c.REPO, "baseline": Path(args.baseline).resolve()}
    root = Path(tempfile.mkdtemp(prefix="shmq-bench-validation-", dir=args.dir))
    results: dict[tuple[str, str], list[tuple[float, float]]] = {}
    codecs = [x for x in args.codecs.split(",") if x]
    try:
        for r in range(args.repeat):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for codec in codecs:
                for name in order:
                    b = start(trees[name], root, name.replace(" ", "-"))
                    try:
                        produce(b, codec, min(20_000, args.messages), args.size)  # warm up
                        results.setdefault((name, codec), []).append(
                            produce(b, codec, args.messages, args.size))
                    finally:
                        b.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{args.messages:,} x {args.size} B messages, 1 partition, median of {args.repeat}")
    print(f"{'codec':8} | {'msg/s this':>11} | {'msg/s base':>11} | {'ratio':>5} | "
          f"{'broker CPU s/M this':>19} | {'base':>6} | {'ratio':>5} | runs (s/M this ; base)")
    for codec in codecs:
        a, b = results[("this tree", codec)], results[("baseline", codec)]
        rate_a = statistics.median(args.messages / s for s, _ in a)
        rate_b = statistics.median(args.messages / s for s, _ in b)
        cpu_a = statistics.median(cpu / args.messages * 1e6 for _, cpu in a)
        cpu_b = statistics.median(cpu / args.messages * 1e6 for _, cpu in b)
        runs = (" ".join(f"{cpu / args.messages * 1e6:.2f}" for _, cpu in a) + " ; "
                + " ".join(f"{cpu / args.messages * 1e6:.2f}" for _, cpu in b))
        print(f"{codec:8} | {rate_a:11,.0f} | {rate_b:11,.0f} | {rate_a / rate_b:5.2f} | "
              f"{cpu_a:19.2f} | {cpu_b:6.2f} | {cpu_a / cpu_b:5.2f} | {runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
