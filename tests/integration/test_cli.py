"""``shmq topics``, ``shmq console-producer`` and ``shmq console-consumer`` as a user runs them:
real subprocesses against a real broker, checking the exact lines Kafka's tools would print."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _broker import RunningBroker, start_broker

TOPIC_ID = r"[A-Za-z0-9_-]{22}"  # Kafka's Uuid.toString(): URL-safe base64, no padding


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


def shmq(*args: str, stdin: str | None = None, env: dict[str, str] | None = None,
         timeout: float = 60) -> Result:
    proc = subprocess.run([sys.executable, "-m", "shmq", *args], input=stdin,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    b = start_broker(tmp_path_factory.mktemp("cli") / "data")
    try:
        yield b
    finally:
        code = b.stop()
        assert code == 0, b.log_path.read_text()


def topics(b: RunningBroker, *args: str) -> Result:
    return shmq("topics", "--bootstrap-server", b.bootstrap, *args)


def produce(b: RunningBroker, topic: str, lines: str, *args: str) -> Result:
    r = shmq("console-producer", "--bootstrap-server", b.bootstrap, "--topic", topic, *args,
             stdin=lines)
    assert (r.code, r.err) == (0, ""), r
    assert r.out == ""  # no ">" prompt: stdin is not a terminal
    return r


def consume(b: RunningBroker, topic: str, *args: str) -> Result:
    return shmq("console-consumer", "--bootstrap-server", b.bootstrap, "--topic", topic, *args)


# --- shmq topics -------------------------------------------------------------------------------


def test_topics_create_list_describe_delete(cluster: RunningBroker) -> None:
    r = topics(cluster, "--create", "--topic", "lc-events", "--partitions", "3",
               "--replication-factor", "1", "--config", "retention.ms=3600000")
    assert (r.code, r.out, r.err) == (0, "Created topic lc-events.\n", "")
    r = topics(cluster, "--create", "--topic", "lc-other")  # the broker's num.partitions (1)
    assert (r.code, r.out, r.err) == (0, "Created topic lc-other.\n", "")

    r = topics(cluster, "--list", "--topic", "lc-.*")
    assert (r.code, r.out, r.err) == (0, "lc-events\nlc-other\n", "")
    everything = topics(cluster, "--list").lines
    assert everything == sorted(everything) and {"lc-events", "lc-other"} <= set(everything)

    r = topics(cluster, "--describe", "--topic", "lc-events")
    assert r.code == 0 and r.err == "", r
    head, *parts = r.lines
    # Configs: the topic's overrides, from DescribeConfigs
    assert re.fullmatch(rf"Topic: lc-events\tTopicId: {TOPIC_ID}\tPartitionCount: 3\t"
                        r"ReplicationFactor: 1\tConfigs: retention.ms=3600000", head), head
    assert len(parts) == 3
    for p, line in enumerate(parts):
        m = re.fullmatch(rf"\tTopic: lc-events\tPartition: {p}\tLeader: (\d+)\tReplicas: (\d+)"
                         r"\tIsr: (\d+)\tElr: N/A\tLastKnownElr: N/A", line)
        assert m and m[1] == m[2] == m[3] and int(m[1]) in cluster.worker_pids(), line

    # --topic is a regular expression for --describe: both topics, sorted
    r = topics(cluster, "--describe", "--topic", "lc-.*")
    assert [line.split("\t")[0] for line in r.lines if not line.startswith("\t")] == [
        "Topic: lc-events", "Topic: lc-other"]
    assert len(r.lines) == 1 + 3 + 1 + 1

    r = topics(cluster, "--delete", "--topic", "lc-events")
    assert (r.code, r.out, r.err) == (0, "", "")
    assert topics(cluster, "--list", "--topic", "lc-.*").out == "lc-other\n"
    r = topics(cluster, "--delete", "--topic", "lc-other")
    assert (r.code, r.out, r.err) == (0, "", "")
    # Kafka prints the (empty) joined list with println: one empty line
    assert topics(cluster, "--list", "--topic", "lc-.*").out == "\n"


def test_topics_if_exists_and_if_not_exists(cluster: RunningBroker) -> None:
    assert topics(cluster, "--create", "--topic", "ie-a").code == 0
    r = topics(cluster, "--create", "--topic", "ie-a")
    assert (r.code, r.out) == (1, "")
    assert r.err == "Error while executing topic command : Topic 'ie-a' already exists.\n"
    r = topics(cluster, "--create", "--topic", "ie-a", "--if-not-exists")
    assert (r.code, r.out, r.err) == (0, "", "")

    for action in ("--delete", "--describe"):
        r = topics(cluster, action, "--topic", "ie-missing")
        assert (r.code, r.out) == (1, "")
        assert r.err == ("Error while executing topic command : Topic 'ie-missing' does not "
                         "exist as expected\n")
        r = topics(cluster, action, "--topic", "ie-missing", "--if-exists")
        assert (r.code, r.out, r.err) == (0, "", "")


@pytest.mark.parametrize("args, message", [
    (["--create", "--topic", "er-zero", "--partitions", "0"],
     "The partitions must be greater than 0"),
    (["--create", "--topic", "er-rf", "--replication-factor", "3"],
     "Unable to replicate the partition 3 time(s): shmq keeps one replica per partition for "
     "now."),
    (["--create", "--topic", "er/slash"],
     "Topic name is invalid: 'er/slash' contains one or more characters other than ASCII "
     "alphanumerics, '.', '_' and '-'"),
    (["--create", "--topic", "er-cfg", "--config", "retention.ms"],
     "requirement failed: Invalid topic config: all configs to be added must be in the format "
     "\"key=val\"."),
])
def test_topics_errors_are_one_line(cluster: RunningBroker, args: list[str],
                                    message: str) -> None:
    r = topics(cluster, *args)
    assert (r.code, r.out, r.err) == (1, "", f"Error while executing topic command : {message}\n")


def test_topics_usage_errors(cluster: RunningBroker) -> None:
    r = topics(cluster, "--list", "--create")
    assert (r.code, r.out) == (2, "")
    assert r.err == ("shmq topics: error: Command must include exactly one action: --list, "
                     "--describe, --create, --alter or --delete (see 'shmq topics --help')\n")
    r = topics(cluster, "--delete")
    assert r.code == 2 and len(r.err.splitlines()) == 1 and '"[topic]"' in r.err
    r = topics(cluster, "--list", "--partitions", "3")
    assert r.code == 2 and len(r.err.splitlines()) == 1


def test_topic_names_with_dots_warn_like_kafka(cluster: RunningBroker) -> None:
    r = topics(cluster, "--create", "--topic", "dot.ted")
    assert r.code == 0 and r.lines == [
        "WARNING: Due to limitations in metric names, topics with a period ('.') or underscore "
        "('_') could collide. To avoid issues it is best to use either, but not both.",
        "Created topic dot.ted."]


# --- console producer and consumer -------------------------------------------------------------


def test_produce_keys_and_headers_then_consume_every_field(cluster: RunningBroker) -> None:
    assert topics(cluster, "--create", "--topic", "pc-one", "--partitions", "1").code == 0
    before = int(time.time() * 1000)
    produce(cluster, "pc-one",
            "h1:v1,h2:v2\tk1\thello\n"
            "h3:\tk2\tworld\n"
            "NULL\tNULL\tno key, no headers\n"
            "hn:NULL\tk4\tNULL\n",
            "--reader-property", "parse.key=true", "--reader-property", "parse.headers=true",
            "--reader-property", "null.marker=NULL")
    after = int(time.time() * 1000)
    r = consume(cluster, "pc-one", "--from-beginning", "--max-messages", "4",
                "--formatter-property", "print.key=true", "--formatter-property", "print.timestamp=true",
                "--formatter-property", "print.partition=true",
                "--formatter-property", "print.offset=true", "--formatter-property", "print.headers=true")
    assert (r.code, r.err) == (0, "Processed a total of 4 messages\n"), r
    stamps = [int(s) for s in re.findall(r"^CreateTime:(\d+)\t", r.out, re.M)]
    assert len(stamps) == 4 and all(before <= s <= after for s in stamps), r.out
    assert r.lines == [
        f"CreateTime:{stamps[0]}\tPartition:0\tOffset:0\th1:v1,h2:v2\tk1\thello",
        f"CreateTime:{stamps[1]}\tPartition:0\tOffset:1\th3:\tk2\tworld",
        f"CreateTime:{stamps[2]}\tPartition:0\tOffset:2\tNO_HEADERS\tnull\tno key, no headers",
        f"CreateTime:{stamps[3]}\tPartition:0\tOffset:3\thn:null\tk4\tnull",
    ]
    # the defaults: the value only; and the separators / null literal can change
    r = consume(cluster, "pc-one", "--from-beginning", "--max-messages", "4")
    assert r.out == "hello\nworld\nno key, no headers\nnull\n"
    r = consume(cluster, "pc-one", "--from-beginning", "--max-messages", "4",
                "--formatter-property", "print.key=true", "--formatter-property", "key.separator= => ",
                "--formatter-property", "null.literal=<nil>", "--formatter-property", "line.separator=|")
    assert r.out == "k1 => hello|k2 => world|<nil> => no key, no headers|k4 => <nil>|"
    r = consume(cluster, "pc-one", "--from-beginning", "--max-messages", "2",
                "--formatter-property", "print.value=false", "--formatter-property", "print.key=true")
    assert r.out == "k1\nk2\n"


def test_keys_go_to_partitions_by_murmur2_like_kafka(cluster: RunningBroker) -> None:
    assert topics(cluster, "--create", "--topic", "pc-keys", "--partitions", "4").code == 0
    keys = [f"key-{i}" for i in range(12)]
    produce(cluster, "pc-keys", "".join(f"{k}:{k}\n" for k in keys),
            "--reader-property", "parse.key=true", "--reader-property", "key.separator=:")
    r = consume(cluster, "pc-keys", "--from-beginning", "--max-messages", "12",
                "--formatter-property", "print.partition=true", "--formatter-property", "print.value=false",
                "--formatter-property", "print.key=true")
    assert r.code == 0
    got = dict(reversed(line.split("\t")) for line in r.lines)
    assert got == {k: f"Partition:{_kafka_partition(k.encode(), 4)}" for k in keys}


def _kafka_partition(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner: toPositive(murmur2(key)) % partitions."""
    m, r = 0x5BD1E995, 24
    length = len(key)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(key[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    tail = key[length - length % 4:]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions


def test_consume_one_partition_from_an_offset(cluster: RunningBroker) -> None:
    assert topics(cluster, "--create", "--topic", "po", "--partitions", "2").code == 0
    produce(cluster, "po", "".join(f"v{i}\n" for i in range(5)), "--reader-property", "parse.key=true",
            "--reader-property", "key.separator=|", "--reader-property", "ignore.error=true")
    # no key separator and ignore.error: the whole line is the value, the key is null; null
    # keys are spread at random, so look at what landed where
    r = consume(cluster, "po", "--from-beginning", "--max-messages", "5",
                "--formatter-property", "print.partition=true", "--formatter-property", "print.offset=true")
    assert r.code == 0 and len(r.lines) == 5
    by_partition: dict[int, list[str]] = {0: [], 1: []}
    for line in r.lines:
        p, o, value = line.split("\t")
        assert o == f"Offset:{len(by_partition[int(p[10:])])}"
        by_partition[int(p[10:])].append(value)
    p, values = max(by_partition.items(), key=lambda kv: len(kv[1]))
    r = consume(cluster, "po", "--partition", str(p), "--offset", "1",
                "--max-messages", str(len(values) - 1), "--formatter-property", "print.offset=true")
    assert (r.code, r.lines) == (0, [f"Offset:{i}\t{v}" for i, v in enumerate(values)][1:])
    r = consume(cluster, "po", "--partition", str(p), "--offset", "earliest", "--max-messages",
                "1")
    assert (r.code, r.out) == (0, f"{values[0]}\n")
    r = consume(cluster, "po", "--partition", str(p), "--offset", "latest", "--timeout-ms", "1000")
    assert (r.code, r.out, r.err) == (0, "", "Processed a total of 0 messages\n")
    r = consume(cluster, "po", "--partition", "7", "--offset", "0", "--timeout-ms", "1000")
    assert r.code == 1 and r.err.splitlines() == [
        "Error: partition 7 of topic po does not exist (it has 2 partitions)"]


def test_consumer_usage_errors(cluster: RunningBroker) -> None:
    for args, message in [
        (["--topic", "x", "--offset", "3"], "The partition is required when offset is specified."),
        (["--topic", "x", "--partition", "0", "--offset", "-4"],
         "The provided offset value '-4' is incorrect. Valid values are 'earliest', 'latest', "
         "or a non-negative long."),
        (["--topic", "x", "--partition", "0", "--offset", "1", "--from-beginning"],
         "Options from-beginning and offset cannot be specified together."),
        (["--topic", "x", "--partition", "0", "--group", "g"],
         "Options group and partition cannot be specified together."),
    ]:
        r = shmq("console-consumer", "--bootstrap-server", cluster.bootstrap, *args)
        assert (r.code, r.out) == (2, "")
        assert r.err == (f"shmq console-consumer: error: {message} "
                         "(see 'shmq console-consumer --help')\n")


def test_consumer_starts_at_the_end_without_from_beginning(cluster: RunningBroker) -> None:
    assert topics(cluster, "--create", "--topic", "tail", "--partitions", "2").code == 0
    produce(cluster, "tail", "old\n")
    consumer = subprocess.Popen(
        [sys.executable, "-m", "shmq", "console-consumer", "--bootstrap-server",
         cluster.bootstrap, "--topic", "tail", "--max-messages", "1", "--timeout-ms", "30000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        i = 0
        while consumer.poll() is None and i < 60:  # until it is positioned and sees one
            produce(cluster, "tail", f"new-{i}\n", "--timeout", "0")
            i += 1
            time.sleep(0.2)
        out, err = consumer.communicate(timeout=30)
    finally:
        consumer.kill()
    assert consumer.returncode == 0
    assert re.fullmatch(r"new-\d+\n", out), out
    assert err == "Processed a total of 1 messages\n"


def test_ctrl_c_stops_the_consumer_cleanly(cluster: RunningBroker) -> None:
    produce(cluster, "sigint", "a\nb\n")
    consumer = subprocess.Popen(
        [sys.executable, "-m", "shmq", "console-consumer", "--bootstrap-server",
         cluster.bootstrap, "--topic", "sigint", "--from-beginning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, PYTHONFAULTHANDLER="1"),  # SIGABRT prints every thread's stack
        # as a terminal's Ctrl-C finds it: a suite started in the background by a
        # non-interactive shell (`cmd &`) inherits SIGINT ignored, and then so would the
        # consumer (Python installs no KeyboardInterrupt handler for an ignored SIGINT)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert consumer.stdout is not None
        assert consumer.stdout.readline() == "a\n"
        assert consumer.stdout.readline() == "b\n"
        consumer.send_signal(signal.SIGINT)
        try:
            out, err = consumer.communicate(timeout=30)
        except subprocess.TimeoutExpired:  # say where it hangs
            consumer.send_signal(signal.SIGABRT)
            out, err = consumer.communicate(timeout=30)
            pytest.fail(f"no exit within 30 s of SIGINT; its threads:\n{err}")
    finally:
        consumer.kill()
        consumer.wait()  # reaped and its pipes closed even when the test failed: a leaked
        for pipe in (consumer.stdout, consumer.stderr):  # Popen's ResourceWarnings fail
            if pipe is not None:                         # whichever test the GC runs in
                pipe.close()
    assert (consumer.returncode, out, err) == (130, "", "Processed a total of 2 messages\n")


def test_producer_stops_at_a_line_it_cannot_parse(cluster: RunningBroker) -> None:
    r = shmq("console-producer", "--bootstrap-server", cluster.bootstrap, "--topic", "bad-line",
             "--reader-property", "parse.key=true", stdin="k\tgood\nno separator\nk\tnever\n")
    assert (r.code, r.out) == (1, "")
    assert r.err == "Error: No key separator found on line number 2: 'no separator'\n"
    r = consume(cluster, "bad-line", "--from-beginning", "--timeout-ms", "1500")
    assert (r.out, r.err) == ("good\n", "Processed a total of 1 messages\n")


def test_producer_settings_old_and_new_spellings(cluster: RunningBroker, tmp_path: Path) -> None:
    config = tmp_path / "producer.properties"
    config.write_text("# Java client settings\nkey.serializer = org.apache.kafka.common."
                      "serialization.ByteArraySerializer\nlinger.ms: 5\nclient.id=cli-test\n")
    reader = tmp_path / "reader.properties"
    reader.write_text("parse.key=true\nkey.separator=\\u003d\n")  # "=" escaped
    soon = "is deprecated and will be removed in a future version."
    r = shmq("console-producer", "--bootstrap-server", cluster.bootstrap, "--topic", "spellings",
             "--reader-config", str(reader), "--producer.config", str(config),
             "--producer-property", "acks=1", "--compression-codec", "lz4", "--sync",
             stdin="k0=v0\n")
    # Kafka 4.3 names each old spelling on stdout, in this order
    assert (r.code, r.err, r.lines) == (0, "", [
        f"Warning: --producer-property {soon} Use --command-property instead.",
        f"Warning: --producer.config {soon} Use --command-config instead."])
    produce(cluster, "spellings", "k1=v1\n", "--reader-config", str(reader),
            "--command-config", str(config), "--command-property", "acks=all",
            "--compression-codec", "--batch-size", "100", "--timeout", "10",
            "--request-required-acks", "1")
    r = consume(cluster, "spellings", "--from-beginning", "--max-messages", "2",
                "--consumer-property", "client.id=cli-consumer", "--property", "print.key=true",
                "--isolation-level", "read_committed")
    assert r.lines[:2] == [
        f"Option --consumer-property {soon} Use --command-property instead.",
        f"Option --property {soon} Use --formatter-property instead."]
    assert sorted(r.lines[2:]) == ["k0\tv0", "k1\tv1"]
    r = shmq("console-producer", "--bootstrap-server", cluster.bootstrap, "--topic", "x",
             "--command-property", "no.such.setting=1", stdin="")
    assert (r.code, r.err) == (1, 'Error: No such configuration property: "no.such.setting"\n')


# --- finding the broker ------------------------------------------------------------------------


def test_commands_find_the_broker_through_its_data_dir(cluster: RunningBroker,
                                                       tmp_path: Path) -> None:
    data_dir = str(cluster.data_dir)
    r = shmq("topics", "--data-dir", data_dir, "--create", "--topic", "found")
    assert (r.code, r.out) == (0, "Created topic found.\n")
    r = shmq("console-producer", "--data-dir", data_dir, "--topic", "found", stdin="via dir\n")
    assert (r.code, r.err) == (0, "")
    # no flag at all: $SHMQ_DATA_DIR is the default data dir
    r = shmq("console-consumer", "--topic", "found", "--from-beginning", "--max-messages", "1",
             env={"SHMQ_DATA_DIR": data_dir})
    assert (r.code, r.out) == (0, "via dir\n")

    missing = tmp_path / "nowhere"
    for command in (["topics", "--list"], ["console-producer", "--topic", "t"],
                    ["console-consumer", "--topic", "t"]):
        r = shmq(*command, "--data-dir", str(missing), stdin="")
        assert (r.code, r.out) == (1, "")
        assert r.err == ("Error: no broker found: pass --bootstrap-server or start one with "
                         f"`shmq broker` (no {missing}/run/broker.json)\n")


def test_help_lists_the_commands() -> None:
    r = shmq("--help")
    assert r.code == 0
    for name in ("topics", "console-producer", "console-consumer"):
        assert name in r.out
        h = shmq(name, "--help")
        assert h.code == 0 and "--bootstrap-server" in h.out and "--data-dir" in h.out
