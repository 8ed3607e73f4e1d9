"""Kafka's own command-line tools against shmq, and shmq's CLI beside them.

The same state is built on a shmq broker and on the reference Kafka broker (topics, records with
fixed timestamps, keys and headers, a group with committed offsets, a group with a live member).
Then every command runs four ways, Kafka's tool and ``shmq <command>`` against each broker, and
the four outputs (exit code, stdout, stderr) must be the same once ``normalise_cli`` has replaced
what belongs to a broker (topic ids, node ids, member ids, addresses).  Kafka's tools run by main
class, many in one JVM (tools/apache_kafka.py ``run_tools``).

Commands that change state run twice on each broker, on two identical objects (a group or a topic
named ``...-k`` and ``...-s``): once with Kafka's tool, once with shmq's; the outputs are compared
with the names replaced.  The perf tools are compared by their output format (their
numbers are measurements).
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import apache_kafka
import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka_differences import assert_same, normalise_cli

NOW_MS = (int(time.time()) - 600) * 1000  # ten minutes ago: inside every retention
BROKERS = ("kafka", "shmq")
# the objects the state-changing commands work on: "-k" for Kafka's tool, "-s" for shmq's
TAGS = ("k", "s")


@dataclass
class Out:
    code: int
    out: str
    err: str


@pytest.fixture(scope="module")
def shmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    b = start_broker(tmp_path_factory.mktemp("tools") / "data")
    try:
        yield b
    finally:
        assert b.stop() == 0, b.log_path.read_text()[-3000:]


def build_state(bootstrap: str) -> None:
    """Topics, records and groups, the same on every broker."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    topics = [NewTopic("tl-a", 3, 1, config={"retention.ms": "86400000"}),
              NewTopic("tl-b", 1, 1), NewTopic("tl-live", 2, 1)]
    topics += [NewTopic(f"tl-m-{who}", 2, 1) for who in TAGS]
    for f in admin.create_topics(topics, operation_timeout=30).values():
        f.result(60)
    time.sleep(0.5)
    p = Producer({"bootstrap.servers": bootstrap, "log_level": 0, "linger.ms": 5})
    for i in range(30):
        headers = [("h", b"x%d" % i)] if i % 2 else None
        p.produce("tl-a", key=b"k%d" % i, value=b"v%d" % i, partition=i % 3,
                  timestamp=NOW_MS + i, headers=headers)
        for who in TAGS:
            p.produce(f"tl-m-{who}", key=b"k%d" % i, value=b"v%d" % i, partition=i % 2,
                      timestamp=NOW_MS + i)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "tl-g", "log_level": 0,
                  "enable.auto.commit": False})
    c.commit(offsets=[TopicPartition("tl-a", 0, 4), TopicPartition("tl-a", 1, 10)],
             asynchronous=False)
    for who in TAGS:
        c2 = Consumer({"bootstrap.servers": bootstrap, "group.id": f"tl-r-{who}",
                       "log_level": 0, "enable.auto.commit": False})
        c2.commit(offsets=[TopicPartition(f"tl-m-{who}", 0, 5),
                           TopicPartition(f"tl-m-{who}", 1, 7)], asynchronous=False)
        c2.close()
    c.close()


class LiveMember(threading.Thread):
    """A consumer in group tl-live (client.id tl-member) that holds its partitions."""

    def __init__(self, bootstrap: str) -> None:
        super().__init__(daemon=True)
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": "tl-live",
                           "client.id": "tl-member", "log_level": 0,
                           "session.timeout.ms": 10000, "partition.assignment.strategy": "range"})
        self.stop = threading.Event()
        self.assigned = threading.Event()

    def run(self) -> None:
        self.c.subscribe(["tl-live"], on_assign=lambda c, ps: self.assigned.set())
        while not self.stop.is_set():
            self.c.poll(0.1)
        self.c.close()


@pytest.fixture(scope="module")
def brokers(kafka: apache_kafka.KafkaBroker, shmq: RunningBroker) -> Iterator[dict[str, str]]:
    bootstraps = {"kafka": kafka.bootstrap, "shmq": shmq.bootstrap}
    members = []
    for bootstrap in bootstraps.values():
        build_state(bootstrap)
        m = LiveMember(bootstrap)
        m.start()
        members.append(m)
    for m in members:
        assert m.assigned.wait(30), "the live member got no partitions"
    time.sleep(1)  # its first commit-free poll loop is running
    yield bootstraps
    for m in members:
        m.stop.set()
        m.join(30)


def shmq_cli(args: list[str], stdin: str = "") -> Out:
    p = subprocess.run([sys.executable, "-m", "shmq", *args], input=stdin, capture_output=True,
                       text=True, timeout=120)
    return Out(p.returncode, p.stdout, p.stderr)


def run_four(brokers: dict[str, str], commands: list[list[str]]) -> list[dict[tuple, Out]]:
    """Each command with Kafka's tool and with shmq's CLI against each broker."""
    calls = [(c[0], [*c[1:], "--bootstrap-server", bs]) for c in commands
             for bs in brokers.values()]
    kafka_runs = iter(apache_kafka.run_tools(calls))
    results = []
    for c in commands:
        one = {}
        for name, bs in brokers.items():
            k = next(kafka_runs)
            one[("kafka tool", name)] = Out(k.returncode, k.stdout, k.stderr)
            one[("shmq cli", name)] = shmq_cli([*c, "--bootstrap-server", bs])
        results.append(one)
    return results


def own(run: Out, command: list[str]) -> Out:
    """Group lists without the groups of other test modules (the reference broker serves the
    whole session): this module's names start with tl-.  The GROUP column is as wide as the
    longest name of all groups, other modules' too, so its blanks are not compared."""
    if command[:2] != ["consumer-groups", "--list"]:
        return run
    keep = [re.sub(r"  +", "  ", line) for line in run.out.splitlines()
            if line.startswith(("tl-", "GROUP ")) or not line.strip()]
    return Out(run.code, "".join(line + "\n" for line in keep), run.err)


def agree(got: Out, reference: Out, command: list[str], what: str,
          error_text: bool = True) -> None:
    g = normalise_cli(own(got, command), command)
    r = normalise_cli(own(reference, command), command)
    if not error_text and r["failed"]:  # shmq's CLI on Kafka: that it fails, not the words
        g["error"] = r["error"] = ["<an error>"] if r["error"] else []
    if g != r:
        assert_same({"compared": what, **g}, {"compared": what, **r})


def assert_four_agree(runs: dict[tuple, Out], command: list[str]) -> None:
    """Kafka's tool prints the same on both brokers (the broker is Kafka's); shmq's CLI prints
    what Kafka's tool prints on the same broker (on Kafka, an error's words may differ:
    librdkafka's message is not Kafka's Java exception)."""
    agree(runs[("kafka tool", "shmq")], runs[("kafka tool", "kafka")], command,
          "Kafka's tool: on shmq vs on Kafka")
    agree(runs[("shmq cli", "shmq")], runs[("kafka tool", "shmq")], command,
          "on shmq: shmq's CLI vs Kafka's tool")
    agree(runs[("shmq cli", "kafka")], runs[("kafka tool", "kafka")], command,
          "on Kafka: shmq's CLI vs Kafka's tool", error_text=False)


# Read-only commands: the state above must print the same everywhere.
# The reference broker serves the whole test session: lists are of this module's objects (tl-).
READ_ONLY = [
    ["topics", "--list", "--topic", "tl-.*"],
    ["topics", "--list", "--exclude-internal", "--topic", "tl-.*"],
    ["topics", "--describe", "--topic", "tl-a"],
    ["topics", "--describe", "--topic", "tl-.*"],
    ["topics", "--describe", "--topics-with-overrides", "--topic", "tl-.*"],
    ["topics", "--describe", "--topic", "nope"],
    ["topics", "--describe", "--topic", "nope", "--if-exists"],
    ["configs", "--describe", "--topic", "tl-a"],
    ["configs", "--describe", "--all", "--topic", "tl-a"],
    ["configs", "--describe", "--entity-type", "topics", "--entity-name", "tl-b"],
    ["configs", "--describe", "--entity-type", "brokers", "--entity-default"],
    ["configs", "--describe", "--topic", "nope"],
    ["get-offsets", "--topic", "tl-a"],
    ["get-offsets", "--topic", "tl-a", "--time", "-2"],
    ["get-offsets", "--topic", "tl-a", "--time", "-3"],
    ["get-offsets", "--topic", "tl-a", "--time", str(NOW_MS + 10)],
    ["get-offsets", "--topic", "tl-a", "--time", str(NOW_MS + 1000)],
    ["get-offsets", "--topic-partitions", "tl-a:1-2,tl-b:0"],
    ["consumer-groups", "--list"],
    ["consumer-groups", "--list", "--state"],
    ["consumer-groups", "--list", "--state", "stable"],
    ["consumer-groups", "--describe", "--group", "tl-g"],
    ["consumer-groups", "--describe", "--group", "tl-g", "--state"],
    ["consumer-groups", "--describe", "--group", "tl-g", "--members"],
    ["consumer-groups", "--describe", "--group", "tl-live"],
    ["consumer-groups", "--describe", "--group", "tl-live", "--members"],
    ["consumer-groups", "--describe", "--group", "tl-live", "--state"],
    ["consumer-groups", "--describe", "--group", "nope"],
    ["consumer-groups", "--reset-offsets", "--group", "tl-g", "--topic", "tl-a",
     "--to-earliest"],
    ["consumer-groups", "--reset-offsets", "--group", "tl-g", "--all-topics", "--shift-by",
     "-3", "--dry-run"],
    ["consumer-groups", "--reset-offsets", "--group", "tl-live", "--topic", "tl-live",
     "--to-earliest", "--execute"],
    ["console-consumer", "--topic", "tl-a", "--partition", "1", "--offset", "earliest",
     "--max-messages", "10", "--timeout-ms", "10000", "--formatter-property",
     "print.key=true", "--formatter-property", "print.timestamp=true",
     "--formatter-property", "print.partition=true", "--formatter-property",
     "print.offset=true", "--formatter-property", "print.headers=true"],
    ["console-consumer", "--topic", "tl-a", "--partition", "2", "--offset", "3",
     "--max-messages", "2", "--timeout-ms", "10000"],
]


@pytest.fixture(scope="module")
def read_only_runs(brokers: dict[str, str]) -> list[dict[tuple, Out]]:
    return run_four(brokers, READ_ONLY)


def _test_id(command: list[str]) -> str:
    """The command, its timestamps relative to NOW_MS: the same id in every process that
    collects it (the workers of ``make test``), whenever it collects."""
    return " ".join(f"NOW_MS+{int(a) - NOW_MS}" if a.isdigit() and int(a) >= NOW_MS else a
                    for a in command)


@pytest.mark.parametrize("index", range(len(READ_ONLY)), ids=[_test_id(c) for c in READ_ONLY])
def test_shmq_cli_prints_what_kafkas_tool_prints(read_only_runs: list[dict[tuple, Out]],
                                                 index: int) -> None:
    assert_four_agree(read_only_runs[index], READ_ONLY[index])


# Commands that change state: Kafka's tool on the "-kafka" object, shmq's on the "-shmq" one.
CHANGES = [
    ["topics", "--create", "--topic", "tl-c-{who}", "--partitions", "3", "--config",
     "retention.ms=7200000"],
    ["topics", "--create", "--topic", "tl-c-{who}"],
    ["topics", "--create", "--topic", "tl-c-{who}", "--if-not-exists"],
    ["topics", "--describe", "--topic", "tl-c-{who}"],
    ["topics", "--delete", "--topic", "tl-c-{who}"],
    ["configs", "--alter", "--topic", "tl-m-{who}", "--add-config",
     "retention.ms=7200000,cleanup.policy=[delete,compact]"],
    ["configs", "--describe", "--topic", "tl-m-{who}"],
    ["configs", "--alter", "--topic", "tl-m-{who}", "--delete-config", "cleanup.policy"],
    ["configs", "--alter", "--topic", "tl-m-{who}", "--add-config", "retention.ms=soon"],
    ["topics", "--alter", "--topic", "tl-m-{who}", "--partitions", "3"],
    ["topics", "--alter", "--topic", "tl-m-{who}", "--partitions", "2"],
    ["consumer-groups", "--reset-offsets", "--group", "tl-r-{who}", "--topic", "tl-m-{who}",
     "--to-offset", "2", "--execute"],
    ["consumer-groups", "--describe", "--group", "tl-r-{who}"],
    ["consumer-groups", "--delete-offsets", "--group", "tl-r-{who}", "--topic",
     "tl-m-{who}:1"],
    ["consumer-groups", "--describe", "--group", "tl-r-{who}", "--offsets"],
    ["consumer-groups", "--delete", "--group", "tl-r-{who}"],
    ["consumer-groups", "--delete", "--group", "tl-r-{who}"],
    ["topics", "--delete", "--topic", "tl-m-{who}"],
    ["topics", "--describe", "--topic", "tl-m-{who}"],
]


def test_commands_that_change_state(brokers: dict[str, str]) -> None:
    """Kafka's tool changes the "-k" objects, shmq's CLI the "-s" ones, command after command
    on each broker; every output the same once the names are the same."""
    kafka_calls = [(c[0], [*(a.format(who="k") for a in c[1:]), "--bootstrap-server", bs])
                   for bs in brokers.values() for c in CHANGES]
    kafka_runs = iter(apache_kafka.run_tools(kafka_calls))
    kafka_outs = {name: [next(kafka_runs) for _ in CHANGES] for name in brokers}
    for name, bs in brokers.items():
        for c, k in zip(CHANGES, kafka_outs[name], strict=True):
            s = shmq_cli([a.format(who="s") for a in c] + ["--bootstrap-server", bs])
            runs = {("kafka tool", name): Out(k.returncode, *(re.sub(r"(tl-[cmr])-k\b", r"\1-X",
                                                                     t)
                                                              for t in (k.stdout, k.stderr))),
                    ("shmq cli", name): Out(s.code, *(re.sub(r"(tl-[cmr])-s\b", r"\1-X", t)
                                                      for t in (s.out, s.err)))}
            agree(runs[("shmq cli", name)], runs[("kafka tool", name)], c,
                  f"on {name}: shmq's CLI vs Kafka's tool, {' '.join(c)}",
                  error_text=name == "shmq")


def test_kafka_console_producer_into_shmq(brokers: dict[str, str]) -> None:
    """Kafka's console producer writes keys and headers into each broker; both console
    consumers read the same lines back."""
    lines = "h1:a,h2:b\tk1\tv1\nh0:\tk2\tv2\nh3:x\tk3\t\n"
    reader = ["--reader-property", "parse.key=true", "--reader-property", "parse.headers=true"]
    calls = [("console-producer", ["--topic", "tl-b", "--bootstrap-server", bs, *reader], lines)
             for bs in brokers.values()]
    for r in apache_kafka.run_tools(calls):
        assert (r.returncode, r.stdout, r.stderr) == (0, "", ""), r.stderr
    read = ["console-consumer", "--topic", "tl-b", "--from-beginning", "--max-messages", "3",
            "--timeout-ms", "10000", "--formatter-property", "print.key=true",
            "--formatter-property", "print.headers=true"]
    (runs,) = run_four(brokers, [read])
    assert_four_agree(runs, read)
    assert runs[("kafka tool", "shmq")].out == "h1:a,h2:b\tk1\tv1\nh0:\tk2\tv2\nh3:x\tk3\t\n"


PRODUCER_LINE = re.compile(r"^\d+ records sent, [\d.]+ records/sec \([\d.]+ MB/sec\), "
                           r"[\d.]+ ms avg latency, [\d.]+ ms max latency, \d+ ms 50th, "
                           r"\d+ ms 95th, \d+ ms 99th, \d+ ms 99.9th\.$")
CONSUMER_HEADER = ("start.time, end.time, data.consumed.in.MB, MB.sec, data.consumed.in.nMsg, "
                   "nMsg.sec, rebalance.time.ms, fetch.time.ms, fetch.MB.sec, fetch.nMsg.sec")
CONSUMER_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d:\d{3}, \d{4}-\d\d-\d\d "
                           r"\d\d:\d\d:\d\d:\d{3}, [\d.]+, [\d.]+, (\d+), [\d.]+, -?\d+, \d+, "
                           r"[\d.]+, [\d.]+$")


def test_perf_tools(brokers: dict[str, str]) -> None:
    """Kafka's producer-perf-test and consumer-perf-test against shmq, and shmq's against
    Kafka: every record sent and read, and the same output lines (Kafka's printf formats)."""
    n = "20000"
    for name, bs in brokers.items():
        produce = ["--topic", f"tl-perf-{name}", "--num-records", n, "--record-size", "100",
                   "--throughput", "-1", "--bootstrap-server", bs]
        consume = ["--topic", f"tl-perf-{name}", "--num-records", n, "--timeout", "20000",
                   "--bootstrap-server", bs]
        admin = AdminClient({"bootstrap.servers": bs, "log_level": 0})
        admin.create_topics([NewTopic(f"tl-perf-{name}", 2, 1)])[f"tl-perf-{name}"].result(30)
        time.sleep(0.5)
        k_produce, k_consume = apache_kafka.run_tools(
            [("producer-perf-test", produce), ("consumer-perf-test", consume)])
        s_produce = shmq_cli(["producer-perf-test", *produce])
        s_consume = shmq_cli(["consumer-perf-test", *consume])
        for r in (k_produce, s_produce):
            out = r.stdout if isinstance(r, subprocess.CompletedProcess) else r.out
            code = r.returncode if isinstance(r, subprocess.CompletedProcess) else r.code
            assert code == 0, (name, out)
            last = out.strip().splitlines()[-1]
            assert PRODUCER_LINE.match(last) and last.startswith(f"{n} records sent"), last
        for r in (k_consume, s_consume):
            out = r.stdout if isinstance(r, subprocess.CompletedProcess) else r.out
            lines = out.strip().splitlines()
            assert lines[0] == CONSUMER_HEADER, lines
            m = CONSUMER_LINE.match(lines[1])
            # both runs read the topic: 2 x 20000 records were sent to it
            assert m and int(m[1]) == int(n), (name, lines)


OFFSETS_FORMATTER = "org.apache.kafka.tools.consumer.OffsetsMessageFormatter"  # kafka-tools 4.3


def offset_commit_lines(stdout: str, groups: set[str]) -> list[dict]:
    """The formatter's JSON objects for ``groups`` (it prints them one after another, with no
    separator), commit times replaced (the broker's clock), Kafka 4.3's v4 values as the v3
    values shmq writes (the topic id left out: table row 11), sorted (the console consumer
    interleaves __consumer_offsets partitions as they arrive)."""
    import json

    decoder = json.JSONDecoder()
    out, pos, text = [], 0, stdout.strip()
    while pos < len(text):
        record, pos = decoder.raw_decode(text, pos)
        if record["key"]["data"]["group"] not in groups:
            continue  # other modules' groups: the reference broker serves the whole session
        value = record["value"]
        if value is not None and value["data"].get("commitTimestamp", -1) > 0:
            value["data"]["commitTimestamp"] = "<now>"
        if value is not None and value["version"] == 4:  # kafka_differences.py, row 11
            value["version"] = 3
            del value["data"]["topicId"]
        out.append(record)
    return sorted(out, key=json.dumps)


def test_kafka_offsets_formatter_reads_consumer_offsets(brokers: dict[str, str]) -> None:
    """Issue 20: Kafka's console consumer reads ``__consumer_offsets`` from shmq and Kafka's own
    OffsetsMessageFormatter decodes every commit record as it decodes Kafka's: the same JSON
    lines (key type, group, topic, partition; value version, offset, leader epoch, metadata)
    for the groups this module committed, and the offsets are the ones committed."""
    read = ["--topic", "__consumer_offsets", "--from-beginning", "--timeout-ms", "8000",
            "--formatter", OFFSETS_FORMATTER,
            "--command-property", "exclude.internal.topics=false"]
    runs = apache_kafka.run_tools([("console-consumer", [*read, "--bootstrap-server", bs])
                                   for bs in brokers.values()])
    groups = {"tl-g", *(f"tl-r-{who}" for who in TAGS)}
    lines = {}
    for name, r in zip(brokers, runs, strict=True):
        assert "Processed a total of" in r.stderr, (name, r.stderr[-2000:])
        lines[name] = offset_commit_lines(r.stdout, groups)
    assert_same(lines["shmq"], lines["kafka"])
    # tl-g is only read by the other tests (the tl-r groups' offsets are reset and deleted)
    committed = {(rec["key"]["data"]["topic"], rec["key"]["data"]["partition"]):
                 rec["value"]["data"]["offset"] for rec in lines["shmq"]
                 if rec["key"]["data"]["group"] == "tl-g"}
    assert committed == {("tl-a", 0): 4, ("tl-a", 1): 10}, committed
