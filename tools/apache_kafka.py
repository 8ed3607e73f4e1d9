#!/usr/bin/env python3
"""Apache Kafka on demand: shmq's reference broker, its tools and its Java client.

    python tools/apache_kafka.py fetch                      # resolve Kafka 4.3.1 from Maven Central
    python tools/apache_kafka.py broker [--dir D] [--port P] [--heap 512m]   # a KRaft broker, until Ctrl-C
    python tools/apache_kafka.py run dump-log --files 00000000000000000000.log --print-data-log
    python tools/apache_kafka.py run mirror-maker mm2.properties
    python tools/apache_kafka.py tools                      # the tool names and their main classes

Fetching.  ``tools/apache-kafka/pom.xml`` pins one Kafka version for every artifact (the broker,
kafka-tools, connect-mirror, connect-runtime, kafka-clients).  ``fetch`` asks Maven for their
runtime classpath; Maven downloads the jars into its own cache (``~/.m2``, shared by every checkout)
and this script keeps only the resolved classpath, in ``.cache/kafka/`` (ignored by git;
``SHMQ_KAFKA_CACHE`` moves it).  Later runs check that every jar is still there and call no Maven.

The broker.  A single-node KRaft broker (broker and controller in one JVM) on free loopback ports:
``kafka.tools.StorageTool format`` for the log dir, then ``kafka.Kafka server.properties``, with
Kafka's own GC flags (``kafka-run-class.sh``) and a small heap.  Ready means it answers a Metadata
request listing itself.  It is stopped by its pid (SIGTERM: a controlled shutdown, SIGKILL after
30 s) and dies with the process that started it (PR_SET_PDEATHSIG).

Tools run by main class, as ``bin/kafka-*.sh`` would run them, with the log4j2 setting of Kafka's
tool scripts (warnings to stderr).

Where Kafka is required.  ``required()`` is true when ``SHMQ_REQUIRE_KAFKA=1`` (``.ci/run`` sets it)
or ``CI`` is set: then a failed download or start is a failure.  Elsewhere the tests that need
Kafka skip with the same one line (``KafkaUnavailable``).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import ctypes
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

VERSION = "4.3.1"
ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "tools" / "apache-kafka"
POM = HERE / "pom.xml"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"

# Kafka's kafka-run-class.sh: KAFKA_JVM_PERFORMANCE_OPTS, the same for the broker and its tools.
KAFKA_GC_OPTS = ("-server", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                 "-XX:InitiatingHeapOccupancyPercent=35", "-XX:+ExplicitGCInvokesConcurrent",
                 "-XX:MaxInlineLevel=15", "-Djava.awt.headless=true")
# kafka-server-start.sh's heap is 1 GiB; the tests' broker gets less (the perf benches say which).
TEST_BROKER_HEAP = "512m"
# kafka-run-class.sh's tool heap.  Short-lived tools also stop at the C1 compiler: a JVM that
# exits after a second never profits from C2 and starts ~30 % faster without it.
TOOL_HEAP = "256m"
QUICK_TOOL_OPTS = ("-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC")

# bin/kafka-*.sh -> main class (Kafka 4.3).
TOOLS = {
    "storage": "kafka.tools.StorageTool",
    "server": "kafka.Kafka",
    "topics": "org.apache.kafka.tools.TopicCommand",
    "configs": "kafka.admin.ConfigCommand",
    "console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "delete-records": "org.apache.kafka.tools.DeleteRecordsCommand",
    "broker-api-versions": "org.apache.kafka.tools.BrokerApiVersionsCommand",
    "dump-log": "org.apache.kafka.tools.DumpLogSegments",
    "producer-perf-test": "org.apache.kafka.tools.ProducerPerformance",
    "consumer-perf-test": "org.apache.kafka.tools.ConsumerPerformance",
    "mirror-maker": "org.apache.kafka.connect.mirror.MirrorMaker",
}
# Tools that run long enough for the JIT to matter get Kafka's own JVM flags unchanged.
LONG_RUNNING = {"server", "producer-perf-test", "consumer-perf-test", "mirror-maker"}


class KafkaUnavailable(RuntimeError):
    """Kafka could not be fetched or started; ``str()`` is one line that says why."""


def required() -> bool:
    """True where a missing Kafka is a failure (CI), not a reason to skip."""
    flag = os.environ.get("SHMQ_REQUIRE_KAFKA", "").strip().lower()
    if flag:
        return flag not in ("0", "false", "no")
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def cache_dir() -> Path:
    return Path(os.environ.get("SHMQ_KAFKA_CACHE", ROOT / ".cache" / "kafka"))


# -- fetching ---------------------------------------------------------------------------------------


def _classpath_file() -> Path:
    pom_hash = hashlib.sha256(POM.read_bytes()).hexdigest()[:12]
    return cache_dir() / f"classpath-{VERSION}-{pom_hash}.txt"


def _cached_classpath() -> str | None:
    path = _classpath_file()
    try:
        cp = path.read_text().strip()
    except OSError:
        return None
    jars = cp.split(os.pathsep)
    return cp if jars and all(os.path.isfile(j) for j in jars) else None


@contextlib.contextmanager
def _lock(name: str) -> Iterator[None]:
    """One fetcher (or compiler) at a time per cache, across processes."""
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / f"{name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _which(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        raise KafkaUnavailable(f"Apache Kafka {VERSION} unavailable: `{program}` not found "
                               "(Java 17 and Maven 3.6+ are needed)")
    return path


def fetch(quiet: bool = True) -> str:
    """The classpath of Kafka's broker, tools, MirrorMaker 2 and client, downloading with Maven
    into ``~/.m2`` when a jar is missing."""
    cp = _cached_classpath()
    if cp is not None:
        return cp
    mvn = _which("mvn")
    with _lock("fetch"):
        cp = _cached_classpath()
        if cp is not None:
            return cp
        out = _classpath_file()
        tmp = out.with_suffix(".tmp")
        cmd = [mvn, "-B", "-Dstyle.color=never", "-f", str(POM),
               f"{DEPENDENCY_PLUGIN}:build-classpath",
               "-Dmdep.includeScope=runtime", f"-Dmdep.outputFile={tmp}"]
        if quiet:
            cmd.insert(2, "-q")
        try:
            proc = subprocess.run(cmd, capture_output=quiet, text=True, timeout=900)
        except subprocess.TimeoutExpired as e:
            raise KafkaUnavailable(f"Apache Kafka {VERSION} unavailable: Maven did not finish "
                                   "resolving it within 15 minutes") from e
        if proc.returncode != 0 or not tmp.exists():
            raise KafkaUnavailable(f"Apache Kafka {VERSION} unavailable: Maven failed "
                                   f"({_maven_error(proc.stdout or '')})")
        tmp.replace(out)
    cp = _cached_classpath()
    if cp is None:
        raise KafkaUnavailable(f"Apache Kafka {VERSION} unavailable: Maven's classpath names "
                               "jars that are not there")
    return cp


def _maven_error(output: str) -> str:
    errors = [line.removeprefix("[ERROR]").strip() for line in output.splitlines()
              if line.startswith("[ERROR]") and line.strip() != "[ERROR]"]
    return errors[0][:300] if errors else f"exit status without a message; run `mvn -f {POM} ...`"


# -- running Java ---------------------------------------------------------------------------------


def java_command(main: str, args: Sequence[str] = (), *, heap: str = TOOL_HEAP,
                 jvm_opts: Sequence[str] | None = None, extra_classpath: Sequence[str] = (),
                 log4j: Path | None = None) -> list[str]:
    """``java ... main args``: Kafka's classpath (fetched if needed) and JVM flags."""
    cp = os.pathsep.join([*map(str, extra_classpath), fetch()])
    opts = list(KAFKA_GC_OPTS) if jvm_opts is None else list(jvm_opts)
    return [_which("java"), f"-Xmx{heap}", *opts,
            f"-Dlog4j2.configurationFile={log4j or HERE / 'log4j2-tools.properties'}",
            "-cp", cp, main, *args]


def tool_command(tool: str, args: Sequence[str] = (), **kw: object) -> list[str]:
    """The command line of Kafka's ``bin/kafka-<tool>.sh args`` (``TOOLS`` names them)."""
    if tool not in TOOLS:
        raise ValueError(f"unknown Kafka tool {tool!r}; known: {', '.join(sorted(TOOLS))}")
    if tool not in LONG_RUNNING and "jvm_opts" not in kw:
        kw["jvm_opts"] = [*QUICK_TOOL_OPTS, "-Djava.awt.headless=true"]
    return java_command(TOOLS[tool], args, **kw)  # type: ignore[arg-type]


def run_tool(tool: str, *args: str, input: str | None = None, timeout: float = 120,
             **kw: object) -> subprocess.CompletedProcess[str]:
    """Run one of Kafka's tools to completion; stdout and stderr are captured as text."""
    return subprocess.run(tool_command(tool, args, **kw), input=input, capture_output=True,
                          text=True, timeout=timeout, preexec_fn=_die_with_parent)


def run_tools(calls: Sequence[tuple[str, Sequence[str]] | tuple[str, Sequence[str], str]],
              timeout: float = 300) -> list[subprocess.CompletedProcess[str]]:
    """Run several of Kafka's tools, in order, in one JVM (``ToolRunner.java``: each tool's
    main with its own stdin/stdout/stderr, Kafka's Exit turned into a return code).  A call is
    (tool, args) or (tool, args, stdin).  Saves a JVM start (1-3 s here) per call."""
    runner = compile_java(HERE / "ToolRunner.java")
    lines = []
    for call in calls:
        tool, args = call[0], call[1]
        stdin = call[2] if len(call) > 2 else ""  # type: ignore[misc]
        if tool not in TOOLS:
            raise ValueError(f"unknown Kafka tool {tool!r}")
        fields = [base64.b64encode(stdin.encode()).decode(), TOOLS[tool],
                  *(base64.b64encode(a.encode()).decode() for a in args)]
        lines.append("\t".join(fields))
    cmd = java_command("ToolRunner", extra_classpath=[runner],
                       jvm_opts=[*QUICK_TOOL_OPTS, "-Djava.awt.headless=true"])
    try:
        proc = subprocess.run(cmd, input="\n".join(lines) + "\n", capture_output=True,
                              text=True, timeout=timeout, preexec_fn=_die_with_parent)
    except subprocess.TimeoutExpired as e:
        done = (e.stdout or b"").count(b"\n")
        raise RuntimeError(f"ToolRunner: call {done + 1} of {len(calls)} ({calls[done][0]} "
                           f"{' '.join(calls[done][1])}) did not end within {timeout:.0f} s"
                           ) from None
    answers = proc.stdout.splitlines()
    if proc.returncode != 0 or len(answers) != len(calls):
        raise RuntimeError(f"ToolRunner failed ({proc.returncode}, {len(answers)} of "
                           f"{len(calls)} answers):\n{proc.stderr[-3000:]}")
    out = []
    for call, answer in zip(calls, answers, strict=True):
        code, stdout, stderr = answer.split("\t")
        out.append(subprocess.CompletedProcess(
            [call[0], *call[1]], int(code), base64.b64decode(stdout).decode(),
            base64.b64decode(stderr).decode()))
    return out


def compile_java(*sources: Path) -> Path:
    """javac the given sources against kafka-clients; the classes dir is cached by content."""
    digest = hashlib.sha256(VERSION.encode())
    for src in sources:
        digest.update(src.read_bytes())
    out = cache_dir() / "java" / digest.hexdigest()[:16]
    if (out / ".done").exists():
        return out
    javac = _which("javac")
    with _lock("javac"):
        if not (out / ".done").exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            proc = subprocess.run([javac, "-nowarn", "-d", str(out), "-cp", fetch(),
                                   *map(str, sources)], capture_output=True, text=True,
                                  timeout=300)
            if proc.returncode != 0:
                raise RuntimeError(f"javac failed:\n{proc.stderr}")
            (out / ".done").touch()
    return out


def _die_with_parent() -> None:
    """In the child: SIGTERM when the process that started it dies (a killed test run)."""
    ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


# -- the broker -------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _metadata_brokers(port: int, timeout: float = 2.0) -> int:
    """How many brokers a Metadata v1 request for no topics lists (0 while starting)."""
    client = b"shmq-ready"
    body = struct.pack(">hhih", 3, 1, 1, len(client)) + client + struct.pack(">i", 0)
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        head = b""
        while len(head) < 12:
            chunk = s.recv(12 - len(head))
            if not chunk:
                return 0
            head += chunk
    _size, _correlation, brokers = struct.unpack(">iii", head)
    return brokers


@dataclass
class KafkaBroker:
    """A running single-node KRaft broker (broker and controller in one JVM)."""

    proc: subprocess.Popen[bytes]
    workdir: Path
    port: int
    controller_port: int
    heap: str
    jvm_opts: tuple[str, ...]
    overrides: dict[str, str] = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def log_dir(self) -> Path:
        """Kafka's ``log.dirs``: the partitions' segment files."""
        return self.workdir / "data"

    @property
    def server_log(self) -> Path:
        return self.workdir / "server.log"

    def jvm_settings(self) -> str:
        return f"-Xmx{self.heap} -Xms{self.heap} " + " ".join(self.jvm_opts)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM (Kafka's controlled shutdown), then SIGKILL after ``timeout``."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode


def random_cluster_id() -> str:
    """A Kafka Uuid in its base64url text form, never starting with '-' (Kafka's
    Uuid.randomUuid redraws those too: the tools' argument parser reads them as an option)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def server_properties(workdir: Path, port: int, controller_port: int,
                      overrides: dict[str, str]) -> str:
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(workdir / "data"),
        # one node: every internal topic has one replica (Kafka's defaults expect three)
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        **overrides,
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


def start_broker(workdir: Path, *, port: int = 0, heap: str = TEST_BROKER_HEAP,
                 jvm_opts: Sequence[str] = KAFKA_GC_OPTS,
                 overrides: dict[str, str] | None = None, features: dict[str, int] | None = None,
                 timeout: float = 120) -> KafkaBroker:
    """Format a log dir in ``workdir`` and start a broker on it; raises ``KafkaUnavailable``.
    ``overrides`` go to server.properties, ``features`` to the storage format (``--feature``)."""
    overrides = dict(overrides or {})
    workdir.mkdir(parents=True, exist_ok=True)
    fetch()  # the classpath, fetched once before the attempts
    for attempt in range(3):  # a free port can be taken by someone else before the JVM binds it
        broker_port = port or free_port()
        controller_port = free_port()
        props = workdir / "server.properties"
        props.write_text(server_properties(workdir, broker_port, controller_port, overrides))
        if not (workdir / "data" / "meta.properties").exists():
            args = ["format", "-t", random_cluster_id(), "-c", str(props)]
            for name, level in (features or {}).items():
                args += ["--feature", f"{name}={level}"]
            fmt = subprocess.run(
                java_command(TOOLS["storage"], args, jvm_opts=[*QUICK_TOOL_OPTS]),
                capture_output=True, text=True, timeout=120)
            if fmt.returncode != 0:
                last = (fmt.stderr or fmt.stdout).strip().splitlines()[-1:] or ["no output"]
                raise KafkaUnavailable(f"Apache Kafka {VERSION} did not start: the storage "
                                       f"format failed ({last[0][:300]})")
        stdout = open(workdir / "stdout.log", "ab")
        cmd = java_command(TOOLS["server"], [str(props)], heap=heap, jvm_opts=[
            f"-Xms{heap}", *jvm_opts, f"-Dkafka.logs.dir={workdir}"],
            log4j=HERE / "log4j2-broker.properties")
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=stdout,
                                stderr=subprocess.STDOUT, preexec_fn=_die_with_parent)
        stdout.close()
        broker = KafkaBroker(proc, workdir, broker_port, controller_port, heap, tuple(jvm_opts),
                             overrides)
        try:
            _wait_ready(broker, timeout)
            return broker
        except KafkaUnavailable:
            broker.stop(timeout=10)
            if attempt < 2 and not port and "Address already in use" in _log_tail(broker):
                continue
            raise
    raise AssertionError("unreachable")


def _wait_ready(broker: KafkaBroker, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if broker.proc.poll() is not None:
            raise KafkaUnavailable(f"Apache Kafka {VERSION} did not start: the JVM exited with "
                                   f"{broker.proc.returncode} ({_log_tail(broker)})")
        with contextlib.suppress(OSError):
            if _metadata_brokers(broker.port) > 0:
                return
        time.sleep(0.25)
    raise KafkaUnavailable(f"Apache Kafka {VERSION} did not start within {timeout:.0f} s "
                           f"({_log_tail(broker)})")


def _log_tail(broker: KafkaBroker) -> str:
    """The first ERROR line of the broker's log, else the last line of its stdout."""
    for path in (broker.server_log, broker.workdir / "stdout.log"):
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        errors = [line for line in lines if " ERROR " in line or "Exception" in line]
        if errors:
            return errors[0][:300]
    try:
        lines = (broker.workdir / "stdout.log").read_text(errors="replace").splitlines()
    except OSError:
        lines = []
    return lines[-1][:300] if lines else f"see {broker.server_log}"


# -- command line -----------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="apache_kafka.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fetch", help="resolve Kafka's jars with Maven (into ~/.m2)")
    f.add_argument("--if-possible", action="store_true",
                   help="a failure prints its line and exits 0 unless Kafka is required "
                        "(SHMQ_REQUIRE_KAFKA=1 or CI set)")
    sub.add_parser("classpath", help="print the classpath (fetching first)")
    sub.add_parser("tools", help="list the tool names and main classes")
    b = sub.add_parser("broker", help="run a single-node KRaft broker until Ctrl-C")
    b.add_argument("--dir", help="work dir (log dir, server.properties, server.log); "
                                 "default: a temporary dir removed at exit")
    b.add_argument("--port", type=int, default=0, help="listener port (default: a free one)")
    b.add_argument("--heap", default="1g", help="-Xmx and -Xms (default 1g, as "
                                                "kafka-server-start.sh)")
    b.add_argument("--override", action="append", default=[], metavar="K=V",
                   help="a server.properties setting")
    b.add_argument("--feature", action="append", default=[], metavar="NAME=LEVEL",
                   help="a feature level for the storage format (kafka-storage.sh --feature)")
    r = sub.add_parser("run", help="run one of Kafka's tools: run TOOL [ARGS...]")
    r.add_argument("tool", choices=sorted(TOOLS))
    r.add_argument("args", nargs=argparse.REMAINDER)
    a = p.parse_args(argv)
    try:
        if a.command == "fetch":
            if a.if_possible:
                try:
                    fetch()
                except KafkaUnavailable as e:
                    print(e, file=sys.stderr)
                    return 1 if required() else 0
                return 0
            fetch(quiet=False)
            print(f"Apache Kafka {VERSION}: {len(fetch().split(os.pathsep))} jars "
                  f"(classpath in {_classpath_file()})")
        elif a.command == "classpath":
            print(fetch())
        elif a.command == "tools":
            for name, main_class in TOOLS.items():
                print(f"{name:20} {main_class}")
        elif a.command == "run":
            cmd = tool_command(a.tool, a.args)
            os.execv(cmd[0], cmd)
        else:
            return _serve(a)
    except KafkaUnavailable as e:
        print(e, file=sys.stderr)
        return 1
    return 0


def _serve(a: argparse.Namespace) -> int:
    overrides = dict(kv.split("=", 1) for kv in a.override)
    temp = None if a.dir else tempfile.mkdtemp(prefix="apache-kafka-")
    workdir = Path(a.dir or temp)  # type: ignore[arg-type]
    features = {k: int(v) for k, v in (kv.split("=", 1) for kv in a.feature)}
    broker = start_broker(workdir, port=a.port, heap=a.heap, overrides=overrides,
                          features=features)
    print(f"Apache Kafka {VERSION} ready: bootstrap {broker.bootstrap} (pid {broker.pid}, "
          f"log {broker.server_log})", flush=True)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    try:
        while not stop and broker.proc.poll() is None:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    code = broker.stop()
    if temp:
        shutil.rmtree(temp, ignore_errors=True)
    return 0 if code in (0, -signal.SIGTERM, 143) else code


if __name__ == "__main__":
    sys.exit(main())
