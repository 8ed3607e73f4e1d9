"""A real ``shmq broker`` on an ephemeral loopback port, and Apache Kafka beside it, for tests that
use real clients.  Test modules import these from here (``from _broker import ...``), not from
``conftest``: a module named ``conftest`` is ambiguous once pytest has imported the conftest of
another test directory (``pytest tests/integration/x.py tests/unit/ipc/y.py``)."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import apache_kafka  # noqa: E402  (tools/apache_kafka.py: Kafka from Maven Central, on demand)


@dataclass
class RunningBroker:
    proc: subprocess.Popen
    data_dir: Path
    bootstrap: str
    log_path: Path
    ready_line: str = ""

    @property
    def run_info(self) -> dict:
        return json.loads((self.data_dir / "run" / "broker.json").read_text())

    def worker_pids(self) -> dict[int, int]:
        return {w["node_id"]: w["pid"] for w in self.run_info["workers"]}

    def worker_stats(self, after: float, timeout: float = 10) -> list[dict]:
        """The workers' counters (``run/worker-<id>.stats.json``, rewritten every second) as
        written after the wall-clock time ``after``."""
        deadline = time.monotonic() + timeout
        while True:
            files = [self.data_dir / "run" / f"worker-{n}.stats.json" for n in self.worker_pids()]
            if all(f.exists() and f.stat().st_mtime > after for f in files):
                try:
                    return [json.loads(f.read_text()) for f in files]
                except json.JSONDecodeError:
                    pass  # written atomically, but be lenient with a racing rename
            assert time.monotonic() < deadline, f"stats files not rewritten after {after}: {files}"
            time.sleep(0.1)

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None and not self.proc.stdout.closed:
            self.proc.stdout.close()
        _remove_stale_shm(self.data_dir)
        return self.proc.returncode


def _remove_stale_shm(data_dir: Path) -> None:
    """Unlink the shared memory a killed broker left behind (its broker.json lists it; only
    objects whose creator is dead are removed).  A clean stop has already unlinked them."""
    from shmq.ipc.state_table import remove_stale, stale_names

    try:
        records = json.loads((data_dir / "run" / "broker.json").read_text()).get("shm", [])
    except (OSError, ValueError):
        return
    remove_stale(stale_names(records))


def start_broker(
    data_dir: Path,
    *args: str,
    workers: int = 2,
    timeout: float = 60,
    env: dict[str, str] | None = None,
    prefix: tuple[str, ...] = (),
    log_path: Path | None = None,
) -> RunningBroker:
    """``prefix``: a command the broker runs under (``prlimit --nofile=...``, say); ``log_path``:
    its stderr (default: beside the data dir, which a test of a full disk must not share)."""
    log_path = log_path or data_dir.parent / f"{data_dir.name}-broker.log"
    log = open(log_path, "ab")
    proc = subprocess.Popen(
        [
            *prefix,
            sys.executable,
            "-m",
            "shmq",
            "broker",
            "--listeners",
            "127.0.0.1:0",
            "--workers",
            str(workers),
            "--data-dir",
            str(data_dir),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
    )
    log.close()
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    line = ""
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("shmq broker ready") or not line:
            break
    if not line.startswith("shmq broker ready"):
        proc.kill()
        proc.wait()
        _remove_stale_shm(data_dir)
        raise RuntimeError(f"broker did not start: {line!r}\n{log_path.read_text()}")
    bootstrap = line.split("bootstrap ", 1)[1].split(" ", 1)[0]
    return RunningBroker(proc, data_dir, bootstrap, log_path, line.strip())


# The reference Kafka broker is configured like shmq's defaults where a default only sets a pace
# the tests would otherwise wait for: the first rebalance of an empty group (Kafka: 3000 ms,
# shmq: 100 ms).  Every other setting is Kafka's default.
KAFKA_TEST_OVERRIDES = {
    "group.initial.rebalance.delay.ms": "100",
}


# Eligible leader replicas (KIP-966, on by default in 4.3) off: shmq has one replica per partition
# (tests/integration/kafka_differences.py, row 3).
KAFKA_FEATURES = {"eligible.leader.replicas.version": 0}


@contextlib.contextmanager
def reference_kafka(
    workdir: Path, overrides: dict[str, str] | None = None, groups: bool = True
) -> Iterator[apache_kafka.KafkaBroker]:
    """An Apache Kafka broker (KRaft, single node) configured as ``KAFKA_TEST_OVERRIDES`` plus
    ``overrides``, stopped at exit.  Where Kafka is required (CI) a failed fetch or start fails
    the tests that need it, with one line; elsewhere they skip with that line.  ``groups``: wait
    until its group coordinator answers (tests without groups need not)."""
    try:
        k = apache_kafka.start_broker(
            workdir,
            overrides={**KAFKA_TEST_OVERRIDES, **(overrides or {})},
            features=KAFKA_FEATURES,
        )
        try:
            if groups:
                _wait_for_group_coordinator(k.bootstrap)
        except BaseException:
            k.stop()
            raise
    except apache_kafka.KafkaUnavailable as e:
        why = str(e)  # failed or skipped outside the except: one line, no chained traceback
    else:
        why = ""
    if why:
        if apache_kafka.required():
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    try:
        yield k
    finally:
        k.stop()


def _wait_for_group_coordinator(bootstrap: str, timeout: float = 60) -> None:
    """Kafka creates ``__consumer_offsets`` at the first FindCoordinator and answers
    NOT_COORDINATOR until its partitions have leaders; a client's synchronous commit does not
    retry that.  One commit that succeeds means every test finds the coordinator ready."""
    import time

    from confluent_kafka import Consumer, KafkaException, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "reference-warm-up",
            "log_level": 0,
            "enable.auto.commit": False,
        }
    )
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                c.commit(offsets=[TopicPartition("__consumer_offsets", 0, 0)], asynchronous=False)
                return
            except KafkaException as e:
                if time.monotonic() > deadline:
                    raise apache_kafka.KafkaUnavailable(
                        f"Apache Kafka's group coordinator not ready in {timeout:.0f} s: {e}"
                    ) from None
                time.sleep(0.2)
    finally:
        c.close()
