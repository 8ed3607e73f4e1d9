"""The broker's fixed CPU per client session: connect, ApiVersions, Metadata, one record, close.

    python perf/probe_session.py [--sessions 40] [--partitions 6 1000] [--kcat]

Starts a shmq broker (2 workers) of the tree whose Python runs it, creates a topic of each
partition count, warms it with 5 sessions, then runs ``--sessions`` sessions one after another
and prints the broker's CPU (``bench_broker.cpu_seconds``) per session in microseconds, split
controller / workers.  A session is one confluent-kafka Producer (the suite's settings) that
produces one 100 B record, flushes and is dropped; with ``--kcat``, also one ``kcat -P`` run of
one record.  A/B: run it alternately from each tree (``cd <tree> && .venv/bin/python
/path/to/probe_session.py``: the broker is ``sys.executable -m shmq`` in the working directory).
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import tempfile
import time
from pathlib import Path

import bench_broker as bb


def producer_session(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, **bb.CLIENT_CONF})
    p.produce(topic, b"x" * 100)
    if p.flush(10):
        raise RuntimeError("record not delivered")
    del p
    gc.collect()


def kcat_session(bootstrap: str, topic: str) -> None:
    subprocess.run(["kcat", "-P", "-b", bootstrap, "-t", topic, *bb.KCAT_PRODUCE_X],
                   input=b"x" * 100 + b"\n", check=True, timeout=30,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(broker: bb.Broker, run, sessions: int) -> tuple[float, float]:
    """(controller, workers) microseconds of CPU a session."""
    for _ in range(5):
        run()
    time.sleep(0.3)
    root = broker.proc.pid
    before = broker.cpu()
    for _ in range(sessions):
        run()
    time.sleep(0.3)  # the closes' work
    after = broker.cpu()
    ctl = after.get(root, 0.0) - before.get(root, 0.0)
    workers = sum(after[p] - before.get(p, 0.0) for p in after if p != root)
    return ctl / sessions * 1e6, workers / sessions * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sessions", type=int, default=40)
    ap.add_argument("--partitions", type=int, nargs="+", default=[6, 1000])
    ap.add_argument("--kcat", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="probe-session-") as tmp:
        broker = bb.start_shmq(2, Path(tmp) / "data", Path(tmp))
        try:
            for parts in args.partitions:
                topic = f"session-{parts}"
                bb.create_topic(broker.bootstrap, topic, parts, 60)
                kinds = [("confluent-kafka", lambda t=topic: producer_session(broker.bootstrap, t))]
                if args.kcat:
                    kinds.append(("kcat -P", lambda t=topic: kcat_session(broker.bootstrap, t)))
                for name, run in kinds:
                    ctl, wrk = measure(broker, run, args.sessions)
                    print(f"{name:16s} {parts:5d} partitions: {ctl + wrk:8.0f} us a session "
                          f"(controller {ctl:6.0f}, workers {wrk:6.0f})", flush=True)
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
