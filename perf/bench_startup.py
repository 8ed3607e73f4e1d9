"""Broker start and worker restart times: shmq with and without its fork server, and Tansu.

    python perf/bench_startup.py [--repeat 7] [--workers 2] [--partitions 64] [--tansu PATH]

Rows (median, min and max over ``--repeat`` runs; each mode measured back to back per repeat):

* ``start, empty data dir``: from ``exec`` of ``python -m shmq broker --listeners 127.0.0.1:0
  --workers N`` to its ``shmq broker ready`` line (every worker listening and holding the
  metadata); Tansu: from ``exec`` to a TCP connect on its port succeeding.  Target (issue 3):
  ``shmq broker`` starts in a second.
* ``start, N partitions with data``: the same on a data dir left by a clean stop after
  ``--partitions`` partitions got 1,000 messages each (every log is opened and its indexes are
  mapped: the clean-shutdown path).
* ``first acks=all produce``: from ``exec`` to the first acknowledgement of an acks=all produce
  to a topic created right after start (bootstrap, metadata, CreateTopics, Produce).
* ``worker restart``: SIGKILL of worker 1 to its listener answering ApiVersions again, its logs
  recovered (uncleanly: no clean-shutdown marker).
* ``kill to first ack``: SIGKILL of worker 1 to the first acks=all acknowledgement of a message
  produced after the kill, to a partition it leads, by a confluent-kafka producer that was
  connected before (reconnect backoff 50-500 ms).

Modes: ``fork server`` is the default (workers are forks of a process that imported shmq,
``shmq/supervisor/forkserver.py``); ``exec`` sets ``SHMQ_FORK_SERVER=0`` (each worker is a
``python -m shmq.worker``).  Only loopback; every wait is bounded; every process started here is
stopped by PID.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import byte_compile_shmq  # noqa: E402
from bench_broker import find_tansu, free_port, process_tree  # noqa: E402

TIMEOUT = 60.0
TARGET_START_S = 1.0


def _wait(pred, timeout: float = TIMEOUT, interval: float = 0.002):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(interval)
    raise TimeoutError("timed out")


class Shmq:
    def __init__(self, data_dir: Path, workers: int, fork_server: bool, log: Path) -> None:
        env = dict(os.environ)
        if not fork_server:
            env["SHMQ_FORK_SERVER"] = "0"
        self.data_dir = data_dir
        self.log = open(log, "ab")
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "shmq", "broker", "--listeners", "127.0.0.1:0",
             "--workers", str(workers), "--data-dir", str(data_dir)],
            stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        self.bootstrap = ""

    def ready(self) -> float:
        """Seconds from exec to the ready line."""
        assert self.proc.stdout is not None
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"shmq exited with {self.proc.wait()}")
            if line.startswith("shmq broker ready"):
                self.bootstrap = line.split("bootstrap ", 1)[1].split(" ", 1)[0]
                return time.perf_counter() - self.t0
        raise TimeoutError("shmq not ready")

    def workers(self) -> dict[int, dict]:
        info = json.loads((self.data_dir / "run" / "broker.json").read_text())
        return {w["node_id"]: w for w in info["workers"]}

    def stop(self) -> None:
        tree = process_tree(self.proc.pid)[1:]  # the fork server and the workers
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid in tree:  # anything of ours still there (never happens after a clean stop)
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc.stdout:
            self.proc.stdout.close()
        self.log.close()


def _api_versions(port: int) -> bool:
    req = struct.pack(">hhih", 18, 0, 1, 5) + b"bench"
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(struct.pack(">i", len(req)) + req)
            head = s.recv(4, socket.MSG_WAITALL)
            return len(head) == 4
    except OSError:
        return False


def _produce_once(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(TIMEOUT)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    done: list = []
    p.produce(topic, b"x", partition=0, on_delivery=lambda err, msg: done.append(err))
    p.flush(TIMEOUT)
    if done != [None]:
        raise RuntimeError(f"produce failed: {done}")


def _fill(bootstrap: str, topic: str, partitions: int, per_partition: int) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the result is in
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(TIMEOUT)
    p = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5})
    for i in range(partitions * per_partition):
        while True:
            try:
                p.produce(topic, b"v" * 100, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.01)
    if p.flush(TIMEOUT):
        raise RuntimeError("fill did not finish")


def _kill_to_first_ack(b: Shmq, node: int, topic: str, partitions: int) -> tuple[float, float]:
    """(kill -> worker answering, kill -> first ack of a message sent after the kill)."""
    from confluent_kafka import Producer

    acks: list[float] = []
    p = Producer({"bootstrap.servers": b.bootstrap, "acks": "all", "linger.ms": 0,
                  "enable.idempotence": True, "reconnect.backoff.ms": 50,
                  "reconnect.backoff.max.ms": 500, "message.timeout.ms": int(TIMEOUT * 1000)})
    md = p.list_topics(topic, timeout=10)
    mine = [pid for pid, part in md.topics[topic].partitions.items() if part.leader == node]
    if not mine:
        raise RuntimeError(f"worker {node} leads no partition of {topic}")
    p.produce(topic, b"warm", partition=mine[0])
    p.flush(TIMEOUT)
    w = b.workers()[node]
    t_kill = time.perf_counter()
    os.kill(w["pid"], signal.SIGKILL)
    p.produce(topic, b"after", partition=mine[0],
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
    _wait(lambda: b.workers()[node]["pid"] != w["pid"])
    return answering, acks[0] - t_kill


def _tansu_start(binary: Path, log: Path) -> float:
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    with open(log, "ab") as f:
        t0 = time.perf_counter()
        proc = subprocess.Popen([str(binary), "broker", "--listener-url", url,
                                 "--advertised-listener-url", url,
                                 "--storage-engine", "memory://tansu/"],
                                stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def up() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return True
            except OSError:
                return False

        _wait(up, interval=0.001)
        return time.perf_counter() - t0
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=64)
    ap.add_argument("--tansu", default=None)
    ap.add_argument("--dir", default=None, help="parent of the temporary data dirs")
    args = ap.parse_args(argv)
    byte_compile_shmq()
    try:
        tansu = find_tansu(args.tansu)
    except SystemExit:
        tansu = None
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    print(f"commit {commit}; {os.cpu_count()} CPUs; loadavg {os.getloadavg()[0]:.2f}; "
          f"workers {args.workers}; repeat {args.repeat}", flush=True)
    modes = {"fork server": True, "exec": False}
    rows: dict[str, dict[str, list[float]]] = {}

    def add(row: str, mode: str, v: float) -> None:
        rows.setdefault(row, {}).setdefault(mode, []).append(v)

    work = Path(tempfile.mkdtemp(prefix="shmq-startup-", dir=args.dir))
    try:
        filled = {}
        for mode, fork in modes.items():  # a data dir with --partitions logs, cleanly stopped
            d = work / f"filled-{'fork' if fork else 'exec'}"
            b = Shmq(d, args.workers, fork, work / "shmq.log")
            try:
                b.ready()
                _fill(b.bootstrap, "filled", args.partitions, 1000)
            finally:
                b.stop()
            filled[mode] = d
        for r in range(args.repeat):
            order = list(modes) if r % 2 == 0 else list(modes)[::-1]
            for mode in order:
                fork = modes[mode]
                d = work / f"empty-{r}-{mode.replace(' ', '-')}"
                b = Shmq(d, args.workers, fork, work / "shmq.log")
                try:
                    add("start, empty data dir", mode, b.ready())
                    _produce_once(b.bootstrap, "first", 2)
                    add("first acks=all produce", mode, time.perf_counter() - b.t0)
                    answering, first_ack = _kill_to_first_ack(b, 1, "first", 2)
                    add("worker restart (kill -> answering)", mode, answering)
                    add("kill -> first acks=all ack", mode, first_ack)
                finally:
                    b.stop()
                shutil.rmtree(d, ignore_errors=True)
                b = Shmq(filled[mode], args.workers, fork, work / "shmq.log")
                try:
                    add(f"start, {args.partitions} partitions with data", mode, b.ready())
                finally:
                    b.stop()
            if tansu is not None:
                add("start, empty data dir", "tansu", _tansu_start(tansu, work / "tansu.log"))
            print(f"  repeat {r + 1}/{args.repeat} done", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    cols = ["fork server", "exec", "tansu"]
    print()
    print(f"{'seconds (median, min-max)':<40} | " + " | ".join(f"{c:<20}" for c in cols)
          + " | fork/exec | target")
    print("-" * 41 + "+" + "+".join(["-" * 22] * len(cols)) + "+-----------+---------")
    for row, by_mode in rows.items():
        cells = []
        for c in cols:
            v = by_mode.get(c)
            cells.append(f"{statistics.median(v):.3f} ({min(v):.2f}-{max(v):.2f})" if v else "-")
        ratio = (statistics.median(by_mode["fork server"]) / statistics.median(by_mode["exec"])
                 if "exec" in by_mode else float("nan"))
        target = ""
        if row.startswith("start, empty"):
            ok = statistics.median(by_mode["fork server"]) <= TARGET_START_S
            target = f"<= {TARGET_START_S:.0f} s {'PASS' if ok else 'FAIL'}"
        print(f"{row:<40} | " + " | ".join(f"{c:<20}" for c in cells)
              + f" | {ratio:8.2f}x | {target}")
    print("\n  tansu: exec to its port accepting a connection (Rust binary, memory storage).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
