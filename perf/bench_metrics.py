"""What monitoring costs: produce and consume throughput with collection on and off.

Two brokers configurations, run alternately in the same process so they share the machine's
state: **on** (the default: every process counts into the shared metrics table, the controller
serves /metrics and samples once a second) and **off** (``--no-metrics --http-listener none``).
Each round produces ``--messages`` records of ``--size`` bytes into a ``--partitions`` topic with
confluent-kafka (default client settings) and consumes them back; a row reports the median over
the rounds of records/s and of the broker's CPU per record (every process of the broker), with
the spread, and the ratio on/off.  The issue's target: on costs at most 2 % of either.

    python perf/bench_metrics.py                       # 3 rounds x 300,000 records
    python perf/bench_metrics.py --rounds 5 --messages 1000000

A scrape (/metrics) is taken at the end of each "on" run to check the counts are the records
sent; the clients are bound by their own CPU at these rates (see perf/README.md, "Broker"), so the
broker CPU per record is the more sensitive number.
"""

from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import print_environment  # noqa: E402
from bench_broker import (  # noqa: E402
    Broker,
    Phase,
    consume_py,
    create_topic,
    produce_py,
)


def start(data_dir: Path, logdir: Path, workers: int, metrics: bool, tag: str) -> Broker:
    shutil.rmtree(data_dir, ignore_errors=True)
    extra = ["--http-listener", "127.0.0.1:0"] if metrics else ["--no-metrics",
                                                                 "--http-listener", "none"]
    b = Broker(f"shmq-{tag}", [sys.executable, "-m", "shmq", "broker", "--listeners",
                               "127.0.0.1:0", "--workers", str(workers), "--data-dir",
                               str(data_dir), *extra], logdir / f"shmq-{tag}.log")
    try:
        rest = b.wait_ready("shmq broker ready: bootstrap ", timeout=60)
    except BaseException:
        b.stop()
        raise
    b.bootstrap = rest.split()[0]
    found = re.search(r"dashboard http://([^/\s,)]+)", rest)  # the ready line's address
    b.http = found.group(1) if found else ""
    return b


def scraped_messages_in(address: str, topic: str) -> float:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f'kafka_server_brokertopicmetrics_messagesin_total{{topic="{topic}"}}'):
                return float(line.split()[-1])
    return -1.0


def one_round(workdir: Path, args: argparse.Namespace, metrics: bool, n: int
              ) -> tuple[Phase, Phase]:
    tag = f"{'on' if metrics else 'off'}-{n}"
    b = start(workdir / f"data-{tag}", workdir, args.workers, metrics, tag)
    try:
        topic = "bench-metrics"
        create_topic(b.bootstrap, topic, args.partitions, 30)
        time.sleep(0.5)
        prod = produce_py(b, topic, args.messages, args.size, 300)
        cons = consume_py(b, topic, args.partitions, args.messages, 300)
        if metrics:
            time.sleep(1.2)
            seen = scraped_messages_in(b.http, topic)
            if seen != args.messages:
                raise RuntimeError(f"/metrics counted {seen} records, {args.messages} were sent")
        return prod, cons
    finally:
        b.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--messages", type=int, default=300_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--workers", type=int, default=2)
    args = p.parse_args()
    print_environment("bench_metrics: monitoring on vs off")
    print(f"{args.rounds} rounds x {args.messages:,} records of {args.size} B, "
          f"{args.partitions} partitions, {args.workers} workers, confluent-kafka defaults\n")
    results: dict[tuple[bool, str], list[Phase]] = {}
    with tempfile.TemporaryDirectory(prefix="shmq-bench-metrics-") as tmp:
        workdir = Path(tmp)
        for r in range(args.rounds):
            for metrics in ((True, False) if r % 2 == 0 else (False, True)):
                prod, cons = one_round(workdir, args, metrics, r)
                results.setdefault((metrics, "produce"), []).append(prod)
                results.setdefault((metrics, "consume"), []).append(cons)
                print(f"  round {r + 1} {'on ' if metrics else 'off'}: produce "
                      f"{prod.messages / prod.seconds:10,.0f} rec/s "
                      f"{prod.broker_cpu / prod.messages * 1e6:6.2f} us/rec broker CPU; consume "
                      f"{cons.messages / cons.seconds:10,.0f} rec/s "
                      f"{cons.broker_cpu / cons.messages * 1e6:6.2f} us/rec", flush=True)
    print()
    print(f"{'phase':<9}{'metric':<22}{'off: median (min-max)':>34}{'on: median (min-max)':>34}"
          f"{'on/off':>8}")
    for phase in ("produce", "consume"):
        for label, fn in (("records/s", lambda ph: ph.messages / ph.seconds),
                          ("broker CPU us/record", lambda ph: ph.broker_cpu / ph.messages * 1e6)):
            cells = []
            for metrics in (False, True):
                values = [fn(ph) for ph in results[(metrics, phase)]]
                med = statistics.median(values)
                cells.append((med, f"{med:,.2f} ({min(values):,.2f}-{max(values):,.2f})"))
            ratio = f"{cells[1][0] / cells[0][0]:.3f}" if cells[0][0] else "-"
            print(f"{phase:<9}{label:<22}{cells[0][1]:>34}{cells[1][1]:>34}{ratio:>8}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
