"""Broker CPU per small Produce request over TCP (issue 17).

Starts a real broker (``--workers 1``), creates a topic of ``--partitions`` partitions, then sends
``--requests`` prebuilt Produce v9 frames (acks=1, one partition each, ``--records`` keyed records
of ``--size`` bytes, partitions in turn) on ``--connections`` raw sockets, each keeping
``--window`` requests in flight, and reads the answers.  Prints the broker tree's CPU
(``bench_broker.cpu_seconds``) per request in µs; the client is a raw socket that does nothing but
send bytes and count answers, so the broker's share is what is measured.

    .venv/bin/python perf/probe_produce_requests.py --requests 20000 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

# the checkout the broker runs from: the current directory (an A/B runs this file from another)
sys.path.insert(0, str(Path.cwd() / "perf"))
sys.path.insert(0, str(Path.cwd() / "tests" / "integration"))

from bench_broker import cpu_delta, create_topic, start_shmq  # noqa: E402
from kafka_wire import Wire, produce_body, record_batch  # noqa: E402


def leaders(bootstrap: str, topic: str, partitions: int) -> dict[tuple[str, int], list[int]]:
    """The partitions of ``topic`` by their leader's address (each worker has its own)."""
    out: dict[tuple[str, int], list[int]] = {}
    with Wire(bootstrap) as w:
        for p in range(partitions):
            out.setdefault(w.leader(topic, p), []).append(p)
    return out


def build_frames(topic: str, parts: list[int], n: int, records: int, size: int) -> list[bytes]:
    w = Wire("127.0.0.1:1")
    value = b"v" * size
    frames = []
    for i in range(n):
        batch = record_batch([(b"k%d" % (i * records + j), value, 1_700_000_000_000 + i)
                              for j in range(records)])
        payload = w.frame(0, 9, produce_body(topic, parts[i % len(parts)], batch, acks=1))
        frames.append(struct.pack(">i", len(payload)) + payload)
    return frames


def user_sys(pids: list[int]) -> tuple[float, float]:
    """User and system CPU seconds of ``pids`` (/proc/<pid>/stat utime, stime)."""
    tick = os.sysconf("SC_CLK_TCK")
    u = k = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        u += int(fields[11])
        k += int(fields[12])
    return u / tick, k / tick


def drive(addr: tuple[str, int], frames: list[bytes], window: int, errors: list) -> None:
    try:
        s = socket.create_connection(addr, timeout=60)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sent = answered = 0
        buf = b""
        n = len(frames)
        while answered < n:
            while sent < n and sent - answered < window:
                s.sendall(frames[sent])
                sent += 1
            data = s.recv(1 << 16)
            if not data:
                raise ConnectionError("broker closed the connection")
            buf += data
            while len(buf) >= 4:
                size = struct.unpack_from(">i", buf)[0]
                if len(buf) < 4 + size:
                    break
                # the one partition's error code: after the correlation id, the header's tags,
                # the topic count, name "t" (2 bytes), the partition count and index
                if buf[4 + 4 + 1 + 1 + 2 + 1 + 4:4 + 4 + 1 + 1 + 2 + 1 + 4 + 2] != b"\0\0":
                    raise RuntimeError(f"error answer {buf[4:4 + size].hex()}")
                buf = buf[4 + size:]
                answered += 1
        s.close()
    except BaseException as exc:  # noqa: BLE001 - reported by the caller
        errors.append(exc)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--partitions", type=int, default=1000)
    p.add_argument("--records", type=int, default=10)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--connections", type=int, default=4)
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--hold", type=float, default=0.0,
                   help="seconds to wait before the measured runs (attach a profiler)")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="probe-preq-") as tmp:
        broker = start_shmq(1, Path(tmp) / "data", Path(tmp))
        try:
            create_topic(broker.bootstrap, "t", args.partitions, 60)
            by_leader = leaders(broker.bootstrap, "t", args.partitions)
            addrs = sorted(by_leader)
            per = args.requests // args.connections
            conns = [addrs[c % len(addrs)] for c in range(args.connections)]
            frames = [build_frames("t", by_leader[a], per, args.records, args.size)
                      for a in conns]
            errs: list = []
            for a in addrs:  # warm-up: every partition once
                drive(a, build_frames("t", by_leader[a], len(by_leader[a]), 1, 10), 4, errs)
            if errs:
                raise errs[0]
            print(f"broker pids {broker.pids()}", flush=True)
            if args.hold:
                time.sleep(args.hold)
            results = []
            for _ in range(args.repeat):
                before = broker.cpu()
                us0 = user_sys(list(before))
                t0 = time.perf_counter()
                threads = [threading.Thread(target=drive, args=(a, f, args.window, errs))
                           for a, f in zip(conns, frames, strict=True)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                wall = time.perf_counter() - t0
                cpu = cpu_delta(before, broker.cpu())
                us1 = user_sys(list(before))
                if errs:
                    raise errs[0]
                n = per * args.connections
                results.append(cpu / n * 1e6)
                print(f"{n} requests: broker {cpu:.3f} s CPU, {cpu / n * 1e6:.1f} µs/request, "
                      f"(user {(us1[0] - us0[0]) / n * 1e6:.1f}, sys {(us1[1] - us0[1]) / n * 1e6:.1f}), "
                      f"{n / wall:,.0f} req/s wall", flush=True)
            results.sort()
            print(f"median {results[len(results) // 2]:.1f} µs/request "
                  f"(min {results[0]:.1f}, max {results[-1]:.1f}) pid {os.getpid()}")
        finally:
            broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
