"""``shmq topics --alter``, ``shmq configs``, ``shmq get-offsets`` and the console tools' complete
flag set, run as a user runs them against a real broker; the output is compared with the
formats of Kafka's tools (reference/ecosystem.md §4, ConfigCommand, GetOffsetShell)."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _broker import RunningBroker, start_broker
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
from test_cli import TOPIC_ID, Result, shmq

HOUR_MS = 3600 * 1000
WEEK_MS = 7 * 24 * HOUR_MS
# ConfigCommand: "  name=value sensitive=false synonyms={SOURCE:name=value, ...}"
CONFIG_LINE = re.compile(r"  ([a-z0-9.]+)=(\S*) sensitive=(true|false) "
                         r"synonyms=\{((?:[A-Z_]+:[a-z0-9.]+=\S*)(?:, [A-Z_]+:[a-z0-9.]+=\S*)*)?\}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    home = tmp_path_factory.mktemp("cli-admin")
    b = start_broker(home / "data")
    try:
        yield b
    finally:
        code = b.stop()
        log = b.log_path.read_text()
        shutil.rmtree(home)
        assert code == 0, log


def run(b: RunningBroker, command: str, *args: str, stdin: str | None = None) -> Result:
    return shmq(command, "--bootstrap-server", b.bootstrap, *args, stdin=stdin)


def ok(r: Result) -> Result:
    assert r.code == 0 and r.err == "", r
    return r


def one_line_error(r: Result, code: int = 1) -> str:
    assert r.code == code and r.out == "", r
    assert len(r.err.splitlines()) == 1, r
    return r.err.rstrip("\n")


def produce_lines(b: RunningBroker, topic: str, count: int, *args: str) -> None:
    lines = "".join(f"line-{i}\n" for i in range(count))
    ok(run(b, "console-producer", "--topic", topic, *args, stdin=lines))


# --- shmq topics: --alter, --config, describe with configs --------------------------------------


def test_topics_alter_partitions_and_configs(cluster: RunningBroker) -> None:
    r = ok(run(cluster, "topics", "--create", "--topic", "ta-events", "--partitions", "2",
               "--replication-factor", "1", "--config", "retention.ms=3600000",
               "--config", "segment.bytes=1048576"))
    assert r.out == "Created topic ta-events.\n"
    head, *parts = ok(run(cluster, "topics", "--describe", "--topic", "ta-events")).lines
    assert re.fullmatch(rf"Topic: ta-events\tTopicId: {TOPIC_ID}\tPartitionCount: 2\t"
                        r"ReplicationFactor: 1\tConfigs: retention.ms=3600000,"
                        r"segment.bytes=1048576", head), head
    assert len(parts) == 2
    # grow: prints nothing, like Kafka
    assert ok(run(cluster, "topics", "--alter", "--topic", "ta-events", "--partitions", "4")
              ).out == ""
    head, *parts = ok(run(cluster, "topics", "--describe", "--topic", "ta-events")).lines
    assert "\tPartitionCount: 4\t" in head and len(parts) == 4
    for p, line in enumerate(parts):
        assert re.fullmatch(rf"\tTopic: ta-events\tPartition: {p}\tLeader: (\d+)\tReplicas: \1"
                            r"\tIsr: \1\tElr: N/A\tLastKnownElr: N/A", line), line
    # shrink and same count: the broker's INVALID_PARTITIONS message, one line, exit 1
    err = one_line_error(run(cluster, "topics", "--alter", "--topic", "ta-events",
                             "--partitions", "2"))
    assert err == ("Error while executing topic command : The topic ta-events currently has 4 "
                   "partition(s); 2 would not be an increase.")
    err = one_line_error(run(cluster, "topics", "--alter", "--topic", "ta-events",
                             "--partitions", "4"))
    assert err == "Error while executing topic command : Topic already has 4 partition(s)."
    err = one_line_error(run(cluster, "topics", "--alter", "--topic", "ta-events",
                             "--partitions", "-3"))
    assert err == "Error while executing topic command : The partitions must be greater than 0"
    # Kafka 2's --alter --config
    ok(run(cluster, "topics", "--alter", "--topic", "ta-events", "--config", "retention.ms=5000"))
    head = ok(run(cluster, "topics", "--describe", "--topic", "ta-events")).lines[0]
    assert head.endswith("\tConfigs: retention.ms=5000,segment.bytes=1048576")
    # unknown topics
    err = one_line_error(run(cluster, "topics", "--alter", "--topic", "ta-missing",
                             "--partitions", "3"))
    assert err == ("Error while executing topic command : Topic 'ta-missing' does not exist as "
                   "expected")
    assert ok(run(cluster, "topics", "--alter", "--topic", "ta-missing", "--partitions", "3",
                  "--if-exists")).out == ""


def test_topics_replica_assignment(cluster: RunningBroker) -> None:
    """kafka-topics.sh --replica-assignment: partitions by ',', replicas by ':'; with --alter the
    whole list, of which the new partitions' part is sent (TopicCommand)."""
    def leaders(topic: str) -> list[str]:
        return [re.search(r"\tLeader: (\d+)\t", line)[1]  # type: ignore[index]
                for line in ok(run(cluster, "topics", "--describe", "--topic", topic)).lines[1:]]

    ok(run(cluster, "topics", "--create", "--topic", "tr-placed", "--replica-assignment",
           "2, 1,2"))
    assert leaders("tr-placed") == ["2", "1", "2"]
    assert ok(run(cluster, "topics", "--alter", "--topic", "tr-placed", "--partitions", "5",
                  "--replica-assignment", "2,1,2,1,1")).out == ""
    assert leaders("tr-placed") == ["2", "1", "2", "1", "1"]
    prefix = "Error while executing topic command : "
    for assignment, message in (
            ("1:1", "Partition replica lists may not contain duplicate entries: 1"),
            ("1,1:2", "Partition 1 has different replication factor: [1, 2]"),
            ("1,x", 'For input string: "x"'),
            ("0", "The manual partition assignment includes broker 0, but no such broker is "
                  "registered."),
            ("1:2", "Unable to replicate the partition 2 time(s): shmq keeps one replica per "
                    "partition for now.")):
        err = one_line_error(run(cluster, "topics", "--create", "--topic", "tr-bad",
                                 "--replica-assignment", assignment))
        assert err == prefix + message, assignment
    r = run(cluster, "topics", "--create", "--topic", "tr-bad", "--replica-assignment", "1",
            "--partitions", "1")
    assert r.code == 2 and 'Option "[replica-assignment]" can\'t be used with option ' \
        '"[partitions]"' in r.err
    assert "tr-bad" not in ok(run(cluster, "topics", "--list")).lines


def test_topics_create_with_bad_configs(cluster: RunningBroker) -> None:
    err = one_line_error(run(cluster, "topics", "--create", "--topic", "tb-bad",
                             "--config", "retention.ms=forever"))
    assert err == ("Error while executing topic command : Invalid value forever for "
                   "configuration retention.ms: Not a number of type LONG")
    err = one_line_error(run(cluster, "topics", "--create", "--topic", "tb-bad",
                             "--config", "colour=blue"))
    assert err == "Error while executing topic command : Unknown topic config name: colour"
    assert "tb-bad" not in ok(run(cluster, "topics", "--list")).lines


def test_topics_with_overrides(cluster: RunningBroker) -> None:
    ok(run(cluster, "topics", "--create", "--topic", "tw-plain"))
    ok(run(cluster, "topics", "--create", "--topic", "tw-custom", "--config",
           "cleanup.policy=compact"))
    r = ok(run(cluster, "topics", "--describe", "--topic", "tw-.*", "--topics-with-overrides"))
    assert len(r.lines) == 1
    assert re.fullmatch(rf"Topic: tw-custom\tTopicId: {TOPIC_ID}\tPartitionCount: 1\t"
                        r"ReplicationFactor: 1\tConfigs: cleanup.policy=compact", r.lines[0])


# --- shmq configs ---------------------------------------------------------------------------------


def test_configs_describe_alter_delete(cluster: RunningBroker) -> None:
    ok(run(cluster, "topics", "--create", "--topic", "cf-events", "--config",
           "retention.ms=3600000"))
    r = ok(run(cluster, "configs", "--entity-type", "topics", "--entity-name", "cf-events",
               "--describe"))
    assert r.lines == [
        "Dynamic configs for topic cf-events are:",
        "  retention.ms=3600000 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:retention.ms="
        "3600000}"]
    r = ok(run(cluster, "configs", "--entity-type", "topics", "--entity-name", "cf-events",
               "--alter", "--add-config", "segment.bytes=1048576,cleanup.policy=[delete,compact]",
               "--delete-config", "retention.ms"))
    assert r.out == "Completed updating config for topic cf-events.\n"
    r = ok(run(cluster, "configs", "--topic", "cf-events", "--describe"))  # shorthand
    assert r.lines == [
        "Dynamic configs for topic cf-events are:",
        "  cleanup.policy=delete,compact sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:"
        "cleanup.policy=delete,compact, DEFAULT_CONFIG:log.cleanup.policy=delete}",
        "  segment.bytes=1048576 sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:segment.bytes="
        "1048576, DEFAULT_CONFIG:log.segment.bytes=1073741824}"]
    r = ok(run(cluster, "configs", "--topic", "cf-events", "--describe", "--all"))
    head, *entries = r.lines
    assert head == "All configs for topic cf-events are:"
    names = []
    for line in entries:
        m = CONFIG_LINE.fullmatch(line)
        assert m, line
        names.append(m[1])
    assert names == sorted(names) and len(names) >= 25
    by_name = {CONFIG_LINE.fullmatch(line)[1]: line for line in entries}  # type: ignore[index]
    assert by_name["retention.ms"] == f"  retention.ms={WEEK_MS} sensitive=false synonyms={{}}"
    assert by_name["max.message.bytes"] == (
        "  max.message.bytes=1048588 sensitive=false synonyms={DEFAULT_CONFIG:"
        "message.max.bytes=1048588}")
    # the change reached the broker's view of the topic too
    head = ok(run(cluster, "topics", "--describe", "--topic", "cf-events")).lines[0]
    assert head.endswith("\tConfigs: cleanup.policy=delete,compact,segment.bytes=1048576")


def test_configs_brokers(cluster: RunningBroker) -> None:
    r = ok(run(cluster, "configs", "--entity-type", "brokers", "--entity-name", "1",
               "--describe", "--all"))
    assert r.lines[0] == "All configs for broker 1 are:"
    for line in r.lines[1:]:
        assert CONFIG_LINE.fullmatch(line), line
    assert "  broker.id=1 sensitive=false synonyms={STATIC_BROKER_CONFIG:broker.id=1}" in r.lines
    r = ok(run(cluster, "configs", "--broker-defaults", "--alter", "--add-config",
               "log.retention.ms=86400000"))
    assert r.out == "Completed updating default config for brokers in the cluster.\n"
    r = ok(run(cluster, "configs", "--broker", "1", "--alter", "--add-config",
               "log.segment.bytes=2000000"))
    assert r.out == "Completed updating config for broker 1.\n"
    r = ok(run(cluster, "configs", "--entity-type", "brokers", "--describe"))
    assert r.lines == [
        "Dynamic configs for broker 0 are:",
        "Dynamic configs for broker 1 are:",
        "  log.segment.bytes=2000000 sensitive=false synonyms={DYNAMIC_BROKER_CONFIG:"
        "log.segment.bytes=2000000, DEFAULT_CONFIG:log.segment.bytes=1073741824}",
        "Dynamic configs for broker 2 are:",
        "Default configs for brokers in the cluster are:",
        "  log.retention.ms=86400000 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:"
        "log.retention.ms=86400000}"]
    # a topic without an override now shows the cluster default
    ok(run(cluster, "topics", "--create", "--topic", "cb-topic"))
    r = ok(run(cluster, "configs", "--topic", "cb-topic", "--describe", "--all"))
    assert ("  retention.ms=86400000 sensitive=false synonyms={DYNAMIC_DEFAULT_BROKER_CONFIG:"
            "log.retention.ms=86400000, DEFAULT_CONFIG:log.retention.hours=168}") in r.lines
    ok(run(cluster, "configs", "--entity-type", "brokers", "--entity-default", "--alter",
           "--delete-config", "log.retention.ms"))
    ok(run(cluster, "configs", "--broker", "1", "--alter", "--delete-config",
           "log.segment.bytes"))
    r = ok(run(cluster, "configs", "--entity-type", "brokers", "--entity-default", "--describe"))
    assert r.lines == ["Default configs for brokers in the cluster are:"]


@pytest.mark.parametrize(("args", "message"), [
    (["--topic", "ce-topic", "--alter", "--add-config", "colour=blue"],
     "Unknown topic config name: colour"),
    (["--topic", "ce-topic", "--alter", "--add-config", "retention.ms=soon"],
     "Invalid value soon for configuration retention.ms: Not a number of type LONG"),
    (["--topic", "ce-topic", "--alter", "--add-config", "segment.bytes=5"],
     "Invalid value 5 for configuration segment.bytes: Value must be at least 1048576"),
    (["--broker", "1", "--alter", "--add-config", "num.partitions=4"],
     "Cannot update these configs dynamically: [num.partitions]"),
])
def test_configs_broker_refusals_are_one_line(cluster: RunningBroker, args: list[str],
                                              message: str) -> None:
    if "ce-topic" not in ok(run(cluster, "topics", "--list")).lines:
        ok(run(cluster, "topics", "--create", "--topic", "ce-topic"))
    r = run(cluster, "configs", *args)
    err = one_line_error(r)
    assert err.startswith("Error while executing config command with args '")
    assert err.endswith(f"': {message}")


@pytest.mark.parametrize(("args", "message"), [
    (["--topic", "ce-missing", "--alter", "--add-config", "retention.ms=1"],
     "The topic 'ce-missing' does not exist."),
    (["--topic", "ce-topic", "--alter", "--delete-config", "nope"], "Invalid config(s): nope"),
    (["--topic", "ce-topic", "--alter", "--add-config", "retention.ms"],
     'requirement failed: Invalid entity config: all configs to be added must be in the format '
     '"key=val".'),
    (["--broker", "one", "--describe"],
     "The entity name for brokers must be a valid integer broker id, but it is: one"),
])
def test_configs_command_line_refusals(cluster: RunningBroker, args: list[str],
                                       message: str) -> None:
    if "ce-topic" not in ok(run(cluster, "topics", "--list")).lines:
        ok(run(cluster, "topics", "--create", "--topic", "ce-topic"))
    assert one_line_error(run(cluster, "configs", *args)) == message


@pytest.mark.parametrize("args", [
    ["--topic", "x"],                                            # no action
    ["--topic", "x", "--describe", "--alter"],                   # two actions
    ["--topic", "x", "--alter", "--all", "--add-config", "a=b"],
    ["--topic", "x", "--describe", "--add-config", "a=b"],
    ["--topic", "x", "--alter"],                                 # nothing to change
    ["--describe"],                                              # no entity
    ["--entity-type", "users", "--describe"],
    ["--entity-type", "planets", "--describe"],
    ["--entity-type", "topics", "--entity-default", "--describe"],
])
def test_configs_usage_errors(cluster: RunningBroker, args: list[str]) -> None:
    err = one_line_error(run(cluster, "configs", *args), code=2)
    assert err.startswith("shmq configs: error: ")


def test_a_retention_change_from_the_cli_deletes_old_segments(cluster: RunningBroker) -> None:
    from confluent_kafka import Producer

    ok(run(cluster, "topics", "--create", "--topic", "cr-old", "--config",
           "internal.segment.bytes=1024"))
    p = Producer({"bootstrap.servers": cluster.bootstrap, "batch.num.messages": 1,
                  "linger.ms": 0, "log_level": 0})
    old = int(time.time() * 1000) - 2 * HOUR_MS
    for i in range(20):
        p.produce("cr-old", b"v" * 300, partition=0, timestamp=old + i)
    p.produce("cr-old", b"f" * 300, partition=0)  # fresh, in a segment of its own
    assert p.flush(30) == 0
    files = sorted(cluster.data_dir.glob("worker-*/cr-old-0/*.log"))
    assert len(files) >= 10
    assert ok(run(cluster, "get-offsets", "--topic", "cr-old", "--time", "earliest")
              ).out == "cr-old:0:0\n"
    ok(run(cluster, "configs", "--topic", "cr-old", "--alter", "--add-config",
           f"retention.ms={HOUR_MS}"))
    earliest = ok(run(cluster, "get-offsets", "--topic", "cr-old", "--time", "-2")).out
    assert earliest == "cr-old:0:20\n"
    assert len(sorted(cluster.data_dir.glob("worker-*/cr-old-0/*.log"))) < len(files)


# --- shmq get-offsets -------------------------------------------------------------------------


def test_get_offsets(cluster: RunningBroker) -> None:
    ok(run(cluster, "topics", "--create", "--topic", "go-a", "--partitions", "3"))
    ok(run(cluster, "topics", "--create", "--topic", "go-b"))
    start = int(time.time() * 1000)
    from confluent_kafka import Producer

    prod = Producer({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    for p, n in ((0, 5), (1, 2)):
        for i in range(n):
            prod.produce("go-a", b"v%d" % i, partition=p, timestamp=start + 1000 * i)
    prod.produce("go-b", b"only", partition=0)
    assert prod.flush(30) == 0

    assert ok(run(cluster, "get-offsets", "--topic", "go-a")).lines == [
        "go-a:0:5", "go-a:1:2", "go-a:2:0"]
    assert ok(run(cluster, "get-offsets", "--topic", "go-.*", "--time", "latest")).lines == [
        "go-a:0:5", "go-a:1:2", "go-a:2:0", "go-b:0:1"]
    assert ok(run(cluster, "get-offsets", "--topic", "go-a", "--partitions", "0,2",
                  "--time", "-2")).lines == ["go-a:0:0", "go-a:2:0"]
    assert ok(run(cluster, "get-offsets", "--topic", "go-a", "--time", "-3")).lines == [
        "go-a:0:4", "go-a:1:1"]
    # by timestamp: the first offset at or after it; none after the last record
    assert ok(run(cluster, "get-offsets", "--topic", "go-a", "--time", str(start + 2500))
              ).lines == ["go-a:0:3"]
    assert ok(run(cluster, "get-offsets", "--topic-partitions", "go-a:1-3,go-b")).lines == [
        "go-a:1:2", "go-a:2:0", "go-b:0:1"]
    # DeleteRecords moves what earliest answers
    a = AdminClient({"bootstrap.servers": cluster.bootstrap, "log_level": 0})
    (f,) = a.delete_records([TopicPartition("go-a", 0, 3)]).values()
    f.result()
    assert ok(run(cluster, "get-offsets", "--topic", "go-a", "--partitions", "0",
                  "--time", "earliest")).out == "go-a:0:3\n"


def test_get_offsets_errors(cluster: RunningBroker) -> None:
    assert one_line_error(run(cluster, "get-offsets", "--topic", "go-nothing-.*")) == (
        "Error: Could not match any topic-partitions with the specified filters")
    assert one_line_error(run(cluster, "get-offsets", "--time", "yesterday")) == (
        "Error: Malformed time argument yesterday. Please use -1 or latest / -2 or earliest / "
        "-3 or max-timestamp / -4 or earliest-local / -5 or latest-tiered, or a specified long "
        "format timestamp")
    one_line_error(run(cluster, "get-offsets", "--topic", "x", "--topic-partitions", "x:0"), 2)
    one_line_error(run(cluster, "get-offsets", "--partitions", "zero"), 2)


# --- console producer / consumer: the complete flag set ---------------------------------------


def test_console_tools_keys_headers_compression_acks_and_both_spellings(
        cluster: RunningBroker, tmp_path: Path) -> None:
    ok(run(cluster, "topics", "--create", "--topic", "ct-full"))
    config = tmp_path / "producer.properties"
    config.write_text("linger.ms=5\nclient.id=ct-producer\n")
    # headers equal to null.marker: no headers; a key equal to it: a null key
    lines = "h1:v1,h2:v2|k1|value one\nNULL|k2|value two\nh3:x|NULL|value three\n"
    for codec, acks, reader, command in (("lz4", "1", "--reader-property", "--command-property"),
                                         ("gzip", "all", "--property", "--producer-property")):
        ok(run(cluster, "console-producer", "--topic", "ct-full", "--compression-codec", codec,
               "--request-required-acks", acks, reader, "parse.key=true", reader,
               "key.separator=|", reader, "parse.headers=true", reader, "headers.delimiter=|",
               reader, "null.marker=NULL", command, "batch.size=1000",
               "--producer.config" if command == "--producer-property" else "--command-config",
               str(config), stdin=lines))
    r = run(cluster, "console-consumer", "--topic", "ct-full", "--from-beginning",
            "--max-messages", "6", "--formatter-property", "print.key=true",
            "--formatter-property", "print.offset=true", "--property", "print.partition=true",
            "--property", "print.headers=true", "--property", "print.timestamp=true",
            "--property", "key.separator= => ", "--consumer-property", "fetch.min.bytes=1")
    assert r.code == 0, r
    assert r.err.endswith("Processed a total of 6 messages\n")
    expected = [
        ("0", "h1:v1,h2:v2", "k1", "value one"),
        ("1", "NO_HEADERS", "k2", "value two"),
        ("2", "h3:x", "null", "value three"),
    ]
    soon = "is deprecated and will be removed in a future version."
    assert r.lines[:2] == [  # Kafka 4.3 names the old spellings on stdout first
        f"Option --consumer-property {soon} Use --command-property instead.",
        f"Option --property {soon} Use --formatter-property instead."]
    got = r.lines[2:]
    assert len(got) == 6
    for i, line in enumerate(got):
        offset, headers, key, value = expected[i % 3]
        m = re.fullmatch(r"CreateTime:(\d+) => Partition:0 => Offset:(\d+) => (.*) => (.*) => "
                         r"(.*)", line)
        assert m, line
        assert (int(m[2]) % 3, m[3], m[4], m[5]) == (int(offset), headers, key, value), line
    # print.value=false and a key only
    r = run(cluster, "console-consumer", "--topic", "ct-full", "--from-beginning",
            "--max-messages", "1", "--formatter-property", "print.key=true",
            "--formatter-property", "print.value=false")
    assert r.code == 0 and r.lines == ["k1"], r


def test_help_reads_like_kafkas() -> None:
    for command, flags in (
            ("configs", ("--entity-type", "--entity-name", "--entity-default", "--describe",
                         "--alter", "--all", "--add-config", "--delete-config",
                         "--add-config-file", "--topic", "--broker", "--broker-defaults",
                         "--command-config", "--bootstrap-server")),
            ("get-offsets", ("--topic", "--partitions", "--topic-partitions", "--time",
                             "--exclude-internal-topics", "--command-config")),
            ("topics", ("--alter", "--partitions", "--replication-factor", "--config",
                        "--if-exists", "--if-not-exists")),
            ("console-producer", ("--compression-codec", "--request-required-acks",
                                  "--producer-property", "--command-property", "--property",
                                  "--reader-property", "--producer.config")),
            ("console-consumer", ("--formatter-property", "--property", "--consumer-property",
                                  "--command-property", "--consumer.config"))):
        r = shmq(command, "--help")
        assert r.code == 0 and r.out.startswith(f"usage: shmq {command}"), r
        for flag in flags:
            assert flag in r.out, (command, flag)
    r = shmq("--help")
    assert "configs" in r.out and "get-offsets" in r.out
