"""Monitoring tools that read ``__consumer_offsets``: Debian's Burrow (LinkedIn's consumer-lag
monitor, sarama 1.22) against a live broker (issue 20).

Burrow needs a ZooKeeper for its own locks: the test starts Debian's ``zookeeper`` standalone on
a free loopback port (its admin server off), then Burrow with a cluster module (it lists topic
offsets with ListOffsets v0, whatever its ``kafka-version``), a consumer module (it consumes all
50 partitions of ``__consumer_offsets`` and decodes the records itself) and its HTTP server on
loopback.  A group's consumer commits its positions every second, at lag 0 on three partitions,
then records are produced behind it: Burrow must report lags 0, 600 and 1,000 exactly and status
OK (Burrow's rules: the commits go on, so the partitions are not stopped, and the lag was zero
within the window of stored commits).
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _broker import RunningBroker, start_broker
from _monitoring import require_binary
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
ZOOKEEPER_SERVER = "/usr/share/zookeeper/bin/zkServer.sh"
COMMITTED = {0: 2000, 1: 1400, 2: 1000}
PRODUCED_LATER = {0: 0, 1: 600, 2: 1000}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop(proc: subprocess.Popen, timeout: float = 15) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def zookeeper(tmp_path: Path) -> Iterator[str]:
    """A standalone ZooKeeper on 127.0.0.1 (Debian's package), as ``host:port``."""
    java = require_binary("java")
    require_binary(ZOOKEEPER_SERVER)  # Debian's zookeeper package: its jar and scripts
    home = tmp_path / "zookeeper"
    home.mkdir()
    port = free_port()
    config = home / "zoo.cfg"
    config.write_text(f"tickTime=500\ndataDir={home / 'data'}\nclientPort={port}\n"
                      "clientPortAddress=127.0.0.1\nadmin.enableServer=false\n"
                      "maxClientCnxns=20\n4lw.commands.whitelist=ruok\n")
    log = open(home / "zookeeper.log", "wb")
    proc = subprocess.Popen(
        [java, "-Xmx96m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC",
         "-Dzookeeper.admin.enableServer=false", "-cp", ZOOKEEPER_JAR,
         "org.apache.zookeeper.server.ZooKeeperServerMain", str(config)],
        stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (home / "zookeeper.log").read_text()[-3000:]
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                    s.sendall(b"ruok")
                    if s.recv(4) == b"imok":
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, (home / "zookeeper.log").read_text()[-3000:]
            time.sleep(0.2)
        yield f"127.0.0.1:{port}"
    finally:
        stop(proc)


def start_burrow(directory: Path, zookeeper: str, bootstrap: str,
                 attempts: int = 3) -> tuple[subprocess.Popen, str]:
    """Burrow, answering HTTP.  Burrow exits when its first ZooKeeper session fails ("cannot
    create root path": seen once on a box at load 11, ZooKeeper answering ``ruok`` but closing
    the session handshake); that is about the test's ZooKeeper, not shmq, so it is started again
    (at most ``attempts`` times) and a Burrow that dies later still fails the test."""
    for attempt in range(1, attempts + 1):
        proc, http = _start_burrow_once(directory, zookeeper, bootstrap)
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://{http}/burrow/admin", timeout=2):
                    return proc, http
            except OSError:
                time.sleep(0.25)
        stop(proc)
        if attempt == attempts:
            raise AssertionError(f"Burrow did not start ({attempts} attempts):\n"
                                 + (directory / "burrow.log").read_text(errors="replace")[-4000:])
        shutil.move(directory, directory.with_name(f"{directory.name}-failed-{attempt}"))
    raise AssertionError("unreachable")


def _start_burrow_once(directory: Path, zookeeper: str,
                       bootstrap: str) -> tuple[subprocess.Popen, str]:
    burrow = require_binary("Burrow")
    directory.mkdir()
    http = f"127.0.0.1:{free_port()}"
    (directory / "burrow.toml").write_text(f"""
[general]
pidfile="{directory / 'burrow.pid'}"

[logging]
level="info"

[zookeeper]
servers=["{zookeeper}"]
timeout=6
root-path="/burrow-{uuid.uuid4().hex[:6]}"

[client-profile.shmq]
client-id="burrow-test"
kafka-version="2.0.0"

[cluster.shmq]
class-name="kafka"
servers=["{bootstrap}"]
client-profile="shmq"
topic-refresh=2
offset-refresh=1

[consumer.shmq]
class-name="kafka"
cluster="shmq"
servers=["{bootstrap}"]
client-profile="shmq"
start-latest=false

[httpserver.default]
address="{http}"

[storage.default]
class-name="inmemory"
workers=2
intervals=30
expire-group=604800
min-distance=1

[evaluator.default]
class-name="caching"
expire-cache=1
""")
    log = open(directory / "burrow.log", "wb")
    proc = subprocess.Popen([burrow, "-config-dir", str(directory)], cwd=directory,
                            stdout=log, stderr=subprocess.STDOUT)
    log.close()
    return proc, http


def get(http: str, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{http}/v3/kafka/shmq{path}", timeout=5) as r:
        return json.loads(r.read())  # type: ignore[no-any-return]


def wait_for(what: str, probe: Any, timeout: float, log: Path) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = probe()
        except OSError as exc:  # the HTTP server is not up yet
            last = exc
        else:
            if last:
                return last
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}: {last}\n"
                         f"{log.read_text(errors='replace')[-4000:] if log.exists() else ''}")


def produce(bootstrap: str, topic: str, counts: dict[int, int]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for partition, count in counts.items():
        for i in range(count):
            p.produce(topic, b"m%d" % i, partition=partition)
            if i % 1000 == 0:
                p.poll(0)
    assert p.flush(30) == 0


class Committer(threading.Thread):
    """A consumer that commits the same positions every second (as auto-commit does while the
    application makes no progress), from a thread, until stopped."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
        self.offsets = [TopicPartition(topic, p, o) for p, o in COMMITTED.items()]
        self.done = threading.Event()
        self.commits = 0
        self.consumer.commit(offsets=self.offsets, asynchronous=False)

    def run(self) -> None:
        try:
            while not self.done.wait(1.0):
                self.consumer.commit(offsets=self.offsets, asynchronous=False)
                self.commits += 1
        finally:
            self.consumer.close()

    def stop(self) -> None:
        self.done.set()
        self.join(30)


@pytest.fixture
def mbroker(tmp_path: Path) -> Iterator[RunningBroker]:
    b = start_broker(tmp_path / "data")
    try:
        yield b
    finally:
        assert b.stop() == 0, b.log_path.read_text()


def test_burrow_reports_the_lag_of_a_committed_group(mbroker: RunningBroker, zookeeper: str,
                                                     tmp_path: Path) -> None:
    topic, group = "lagged", "lagging-group"
    admin = AdminClient({"bootstrap.servers": mbroker.bootstrap})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(30)
    produce(mbroker.bootstrap, topic, COMMITTED)
    committer = Committer(mbroker.bootstrap, group, topic)  # lag 0 on every partition
    committer.start()
    proc, http = start_burrow(tmp_path / "burrow", zookeeper, mbroker.bootstrap)
    log = tmp_path / "burrow" / "burrow.log"
    try:
        # the cluster module: topic offsets from ListOffsets v0
        offsets = wait_for("the topic's offsets", lambda: get(http, f"/topic/{topic}").get(
            "offsets"), 60, log)
        assert offsets == [COMMITTED[p] for p in range(3)]

        def partitions() -> list[dict[str, Any]] | None:
            status = get(http, f"/consumer/{group}/lag")["status"]
            parts = status["partitions"] or []
            return parts if len(parts) == 3 else None

        # the consumer module: the group's commit read from __consumer_offsets (all 50
        # partitions: sarama adds one per 250 ms fetch wait, so this takes ~15 s)
        first = wait_for("the group's commit", partitions, 90, log)
        assert [(p["partition"], p["end"]["offset"], p["current_lag"]) for p in first] == [
            (p, o, 0) for p, o in COMMITTED.items()]
        produce(mbroker.bootstrap, topic, PRODUCED_LATER)  # the consumer falls behind

        def lagging() -> dict[str, Any] | None:
            status = get(http, f"/consumer/{group}/lag")["status"]
            lags = [p["current_lag"] for p in status["partitions"] or []]
            return status if lags == [PRODUCED_LATER[p] for p in range(3)] else None

        status = wait_for("lags 0, 600 and 1000", lagging, 60, log)
        assert status["status"] == "OK", json.dumps(status, indent=1)
        assert [(p["topic"], p["partition"], p["end"]["offset"], p["current_lag"], p["status"])
                for p in status["partitions"]] == [
            (topic, 0, 2000, 0, "OK"), (topic, 1, 1400, 600, "OK"), (topic, 2, 1000, 1000, "OK")]
        assert status["totallag"] == 1600 and status["maxlag"]["partition"] == 2
        assert get(http, f"/topic/{topic}")["offsets"] == [2000, 2000, 2000]
    finally:
        committer.stop()
        stop(proc)
        shutil.rmtree(tmp_path / "burrow", ignore_errors=True)
