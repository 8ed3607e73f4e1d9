"""The broker's fixed CPU per client session: connect, ApiVersions, Metadata, one record, close.

    python perf/probe_session.py [--sessions 40] [--partitions 6 1000] [--kcat]

Starts a shmq broker (2 workers) of the tree whose Python runs it, creates a topic of each
partition count, warms it with 5 sessions, then runs ``--sessions`` sessions one after another
and prints the broker's CPU (``bench_broker.cpu_seconds``) per session in microseconds, net of
its idle CPU, split controller / workers.  Raw sessions against the controller first (a socket
that connects and closes; + ApiVersions v3; + Metadata v12 of the topic), then sessions of clients.  A
session is one confluent-kafka Producer (the suite's settings) that
produces one 100 B record, flushes and is dropped; with ``--kcat``, also one ``kcat -P`` run of
one record.  A/B: run it alternately from each tree (``cd <tree> && .venv/bin/python
/path/to/probe_session.py``: the broker is ``sys.executable -m shmq`` in the working directory).
"""

from __future__ import annotations

import argparse
import gc
import socket
import struct
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


def _frame(api_key: int, version: int, body: bytes) -> bytes:
    """A request with header v2 (client id "x", no tags)."""
    out = struct.pack(">hhih", api_key, version, 1, 1) + b"x\x00" + body
    return struct.pack(">i", len(out)) + out


API_VERSIONS_V3 = _frame(18, 3, b"\x02a\x02b\x00")  # client software "a" version "b"


def metadata_v12(topic: str) -> bytes:
    name = topic.encode()
    return _frame(3, 12, b"\x02" + bytes(16) + bytes([len(name) + 1]) + name
                  + b"\x00\x00\x00\x00")


def raw_session(addr: tuple[str, int], requests: list[bytes]) -> None:
    """One connection that sends each request, reads its answer and closes."""
    with socket.create_connection(addr) as s:
        for req in requests:
            s.sendall(req)
            head = b""
            while len(head) < 4:
                head += s.recv(4 - len(head))
            left = struct.unpack(">i", head)[0]
            while left:
                left -= len(s.recv(min(65536, left)))


def kcat_session(bootstrap: str, topic: str) -> None:
    subprocess.run(["kcat", "-P", "-b", bootstrap, "-t", topic, *bb.KCAT_PRODUCE_X],
                   input=b"x" * 100 + b"\n", check=True, timeout=30,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(broker: bb.Broker, run, sessions: int) -> tuple[float, float]:
    """(controller, workers) microseconds of CPU a session, net of the broker's idle CPU (its
    timers and samplers: 1.7 ms/s in a controller serving 6 partitions, 4 ms/s with 1,000),
    measured over one second before."""
    for _ in range(5):
        run()
    time.sleep(0.3)
    root = broker.proc.pid
    idle0, t0 = broker.cpu(), time.monotonic()
    time.sleep(1.0)
    before, t1 = broker.cpu(), time.monotonic()
    for _ in range(sessions):
        run()
    time.sleep(0.3)  # the closes' work
    after, t2 = broker.cpu(), time.monotonic()
    scale = (t2 - t1) / (t1 - t0)

    def net(pids: list[int]) -> float:
        return sum((after[p] - before.get(p, 0.0))
                   - (before.get(p, 0.0) - idle0.get(p, 0.0)) * scale for p in pids)

    ctl = net([root])
    workers = net([p for p in after if p != root])
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
            host, port = broker.bootstrap.split(",")[0].rsplit(":", 1)
            addr = (host, int(port))
            for parts in args.partitions:
                topic = f"session-{parts}"
                bb.create_topic(broker.bootstrap, topic, parts, 60)
                kinds = [
                    ("connect, close", lambda: raw_session(addr, [])),
                    ("+ ApiVersions", lambda: raw_session(addr, [API_VERSIONS_V3])),
                    ("+ Metadata", lambda t=topic: raw_session(
                        addr, [API_VERSIONS_V3, metadata_v12(t)])),
                    ("confluent-kafka", lambda t=topic: producer_session(broker.bootstrap, t))]
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
