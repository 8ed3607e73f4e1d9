"""``shmq consumer-groups`` and ``shmq console-consumer --group`` as a user runs them: real
subprocesses against a real broker, groups made by real librdkafka consumers, and the exact text
Kafka's kafka-consumer-groups.sh prints (reference/ecosystem.md §4).  What a reset committed is
checked by a consumer of the group starting where the reset put it."""

from __future__ import annotations

import calendar
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from _broker import RunningBroker, start_broker

OLD = calendar.timegm((2024, 1, 1, 0, 0, 0)) * 1000  # 2024-01-01T00:00:00.000Z
HOST = r"/?127\.0\.0\.1"
WAIT = 60.0
_ADMINS: dict[str, Any] = {}  # bootstrap -> AdminClient


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


def shmq(*args: str, timeout: float = 90) -> Result:
    proc = subprocess.run([sys.executable, "-m", "shmq", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))
    return Result(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    home = tmp_path_factory.mktemp("cli-groups")
    b = start_broker(home / "data")
    try:
        yield b
    finally:
        _ADMINS.pop(b.bootstrap, None)  # before the broker goes: no reconnect noise
        code = b.stop()
        assert code == 0, b.log_path.read_text()
        shutil.rmtree(home)


def groups(b: RunningBroker, *args: str) -> Result:
    return shmq("consumer-groups", "--bootstrap-server", b.bootstrap, "--timeout", "30000", *args)


# --- in-process clients that set the scene -----------------------------------------------------


def admin(b: RunningBroker) -> Any:
    """One AdminClient per broker, kept alive (a collected client fails its pending futures)."""
    from confluent_kafka.admin import AdminClient

    if b.bootstrap not in _ADMINS:
        _ADMINS[b.bootstrap] = AdminClient({"bootstrap.servers": b.bootstrap})
    return _ADMINS[b.bootstrap]


def create_topic(b: RunningBroker, name: str, partitions: int = 1) -> None:
    from confluent_kafka.admin import NewTopic

    futures = admin(b).create_topics([NewTopic(name, partitions, 1)], request_timeout=WAIT)
    futures[name].result(WAIT)


def produce(b: RunningBroker, topic: str, count: int, partition: int = 0,
            timestamps: list[int] | None = None) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    for i in range(count):
        extra = {"timestamp": timestamps[i]} if timestamps else {}
        p.produce(topic, value=f"m{i}".encode(), partition=partition, **extra)
    assert p.flush(WAIT) == 0


def consumer(b: RunningBroker, group: str, **conf: Any) -> Any:
    from confluent_kafka import Consumer

    return Consumer({"bootstrap.servers": b.bootstrap, "group.id": group,
                     "client.id": "cg-test", "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "session.timeout.ms": 10000,
                     "heartbeat.interval.ms": 500, **conf})


def consume(c: Any, count: int) -> list[Any]:
    """Exactly ``count`` records (the consumer stores the offset after each one returned)."""
    got: list[Any] = []
    deadline = time.monotonic() + WAIT
    while len(got) < count and time.monotonic() < deadline:
        for msg in c.consume(count - len(got), 0.5):
            assert msg.error() is None, msg.error()
            got.append(msg)
    assert len(got) == count, f"consumed {len(got)} of {count}"
    return got


def wait_assigned(c: Any, partitions: int) -> None:
    deadline = time.monotonic() + WAIT
    while len(c.assignment()) != partitions:
        assert time.monotonic() < deadline, f"assignment {c.assignment()}"
        c.poll(0.2)  # a record read here is not committed (enable.auto.commit is off)


def commit(b: RunningBroker, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Commit as an admin (generation -1): the group is Empty, as after its consumers stopped."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    request = ConsumerGroupTopicPartitions(group, [TopicPartition(t, p, o)
                                                   for (t, p), o in offsets.items()])
    result = admin(b).alter_consumer_group_offsets([request], request_timeout=WAIT)[group]
    for tp in result.result(WAIT).topic_partitions:
        assert tp.error is None, tp.error


def committed(b: RunningBroker, group: str) -> dict[tuple[str, int], int]:
    from confluent_kafka import ConsumerGroupTopicPartitions

    future = admin(b).list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)],
                                                  request_timeout=WAIT)[group]
    return {(tp.topic, tp.partition): tp.offset for tp in future.result(WAIT).topic_partitions
            if tp.offset >= 0}


def first_offset(b: RunningBroker, group: str, topic: str) -> int:
    """Where a new member of ``group`` starts reading ``topic``."""
    c = consumer(b, group)
    try:
        c.subscribe([topic])
        return int(consume(c, 1)[0].offset())
    finally:
        c.close()


def offsets_line(group: str, topic: str, partition: object, current: object, end: object,
                 lag: object, member: str, host: str, client: str, widths: tuple[int, ...]
                 ) -> str:
    """One line of Kafka's ``--describe`` table (``printOffsets``): GROUP, TOPIC, CONSUMER-ID and
    HOST ``max(15, longest)`` wide, PARTITION 10, the offsets and LAG 15, CLIENT-ID bare."""
    g, t, m, h = widths
    return (f"{group:<{g}} {topic:<{t}} {partition!s:<10} {current!s:<15} {end!s:<15} "
            f"{lag!s:<15} {member:<{m}} {host:<{h}} {client}")


# --- --describe --------------------------------------------------------------------------------


def test_describe_shows_offsets_end_and_lag_of_a_known_state(cluster: RunningBroker) -> None:
    create_topic(cluster, "cgd-events")
    c = consumer(cluster, "cgd-group")
    try:
        c.subscribe(["cgd-events"])
        wait_assigned(c, 1)
        produce(cluster, "cgd-events", 10)
        consume(c, 6)
        c.commit(asynchronous=False)
        member = c.memberid()

        r = groups(cluster, "--describe", "--group", "cgd-group")
        assert (r.code, r.err) == (0, ""), r
        blank, header, row, *rest = r.out.split("\n")
        assert (blank, rest) == ("", [""])  # a blank line first, nothing after the row
        host = row.split()[-2]
        assert re.fullmatch(HOST, host), row
        widths = (15, 15, max(15, len(member)), 15)
        assert header == offsets_line("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET",
                                      "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST",
                                      "CLIENT-ID", widths)
        assert row == offsets_line("cgd-group", "cgd-events", 0, 6, 10, 4, member, host,
                                   "cg-test", widths)

        # --offsets is the default; --all-groups includes this group
        assert groups(cluster, "--describe", "--group", "cgd-group", "--offsets").out == r.out
        everything = groups(cluster, "--describe", "--all-groups")
        assert everything.code == 0 and row in everything.lines, everything
    finally:
        c.close()

    # the consumer left: the group is Empty, its offsets stay, nobody owns the partition
    r = groups(cluster, "--describe", "--group", "cgd-group")
    assert r.code == 0, r
    assert r.err == "\nConsumer group 'cgd-group' has no active members.\n"
    assert r.lines[2] == offsets_line("cgd-group", "cgd-events", 0, 6, 10, 4, "-", "-", "-",
                                      (15, 15, 15, 15))


def test_describe_state_and_members(cluster: RunningBroker) -> None:
    create_topic(cluster, "cgm-events", partitions=3)
    a = consumer(cluster, "cgm-group", **{"client.id": "cg-a"})
    b = consumer(cluster, "cgm-group", **{"client.id": "cg-b"})
    try:
        a.subscribe(["cgm-events"])
        b.subscribe(["cgm-events"])
        deadline = time.monotonic() + WAIT
        while len(a.assignment()) + len(b.assignment()) != 3 or not a.assignment() \
                or not b.assignment():
            assert time.monotonic() < deadline, (a.assignment(), b.assignment())
            a.poll(0.1)
            b.poll(0.1)
        members = {a.memberid(): ("cg-a", a.assignment()), b.memberid(): ("cg-b", b.assignment())}

        r = groups(cluster, "--describe", "--group", "cgm-group", "--state")
        assert (r.code, r.err) == (0, ""), r
        assert r.lines[0] == ""
        assert r.lines[1] == ("GROUP           COORDINATOR (ID)          ASSIGNMENT-STRATEGY  "
                              "STATE                #MEMBERS")
        m = re.fullmatch(r"cgm-group       (127\.0\.0\.1:\d+  \(\d+\)) +(\S+) +Stable +2",
                         r.lines[2])
        assert m, r.lines[2]
        assert len(r.lines) == 3
        assert r.lines[2].index(m[2]) == r.lines[1].index("ASSIGNMENT-STRATEGY")

        r = groups(cluster, "--describe", "--group", "cgm-group", "--members", "--verbose")
        assert (r.code, r.err) == (0, ""), r
        assert r.lines[0] == "" and len(r.lines) == 4
        width = max(15, *(len(mid) for mid in members))
        current_w = max(20, *(len("cgm-events:" + ",".join(str(tp.partition) for tp in a))
                              for _, a in members.values()))
        assert r.lines[1] == (f"{'GROUP':<15} {'CONSUMER-ID':<{width}} {'HOST':<15} "
                              f"{'CLIENT-ID':<15} {'#PARTITIONS':<15} {'CURRENT-EPOCH':<15} "
                              f"{'CURRENT-ASSIGNMENT':<{current_w}} {'TARGET-EPOCH':<15} "
                              f"{'TARGET-ASSIGNMENT':<20}")
        seen = set()
        for line in r.lines[2:]:
            mid = line.split()[1]
            client, assignment = members[mid]
            parts = ",".join(str(tp.partition) for tp in sorted(assignment,
                                                                 key=lambda t: t.partition))
            host = line.split()[2]
            assert re.fullmatch(HOST, host)
            assert line == (f"{'cgm-group':<15} {mid:<{width}} {host:<15} {client:<15} "
                            f"{len(assignment)!s:<15} {'-':<15} "
                            f"{'cgm-events:' + parts:<{current_w}} {'-':<15} {'-':<20}")
            seen.add(mid)
        assert seen == set(members)

        # --describe --offsets: a row per assigned partition, no committed offset yet
        r = groups(cluster, "--describe", "--group", "cgm-group")
        assert r.code == 0, r
        rows = [line.split() for line in r.lines[2:]]
        assert sorted((row[1], row[2], row[3], row[4], row[5]) for row in rows) == [
            ("cgm-events", str(p), "-", "0", "-") for p in range(3)]

        # --list, with and without states
        r = groups(cluster, "--list")
        assert r.code == 0 and "cgm-group" in r.lines, r
        r = groups(cluster, "--list", "--state")
        assert r.lines[0] == f"{'GROUP':<25} {'STATE':<20}"
        assert f"{'cgm-group':<25} {'Stable':<20}" in r.lines
        r = groups(cluster, "--list", "--state", "empty")
        assert r.code == 0 and all(line.split()[1] == "Empty" for line in r.lines[1:]), r
        assert not any(line.startswith("cgm-group ") for line in r.lines)
    finally:
        a.close()
        b.close()


def test_unknown_group_is_one_line_and_exit_1(cluster: RunningBroker) -> None:
    for extra in ((), ("--members",), ("--state",), ("--offsets",)):
        r = groups(cluster, "--describe", "--group", "cg-nobody", *extra)
        assert (r.code, r.out, r.err) == (  # Kafka 4.3's words (DescribeGroups v6)
            1, "", "Error: Executing consumer group command failed due to org.apache.kafka."
                   "common.errors.GroupIdNotFoundException: Group cg-nobody not found.\n"), \
            (extra, r)


# --- --delete ----------------------------------------------------------------------------------


def test_delete_refuses_an_active_group_then_deletes_it(cluster: RunningBroker) -> None:
    create_topic(cluster, "cgx-events")
    c = consumer(cluster, "cgx-group")
    try:
        c.subscribe(["cgx-events"])
        wait_assigned(c, 1)
        r = groups(cluster, "--delete", "--group", "cgx-group")
        assert (r.code, r.out) == (1, ""), r
        assert r.err == ("Error: Deletion of some consumer groups failed:\n* Group 'cgx-group' "
                         "could not be deleted due to: org.apache.kafka.common.errors."
                         "GroupNotEmptyException: The group is not empty.\n")
    finally:
        c.close()
    commit(cluster, "cgx-group", {("cgx-events", 0): 0})
    r = groups(cluster, "--delete", "--group", "cgx-group")
    assert (r.code, r.out, r.err) == (
        0, "Deletion of requested consumer groups ('cgx-group') was successful.\n", ""), r
    assert "cgx-group" not in groups(cluster, "--list").lines
    r = groups(cluster, "--delete", "--group", "cgx-group")
    assert (r.code, r.out) == (1, "")
    assert r.err == ("Error: Deletion of some consumer groups failed:\n* Group 'cgx-group' "
                     "could not be deleted due to: org.apache.kafka.common.errors."
                     "GroupIdNotFoundException: The group id does not exist.\n")


# --- --reset-offsets ---------------------------------------------------------------------------

NOW_MS = int(time.time() * 1000)
# offsets 0-4 two seconds apart from 2024-01-01T00:00:00Z, offsets 5-9 now
TIMESTAMPS = [OLD + 2000 * i for i in range(5)] + [NOW_MS] * 5


@pytest.mark.parametrize(("mode", "args", "expected"), [
    ("earliest", ["--to-earliest"], 0),
    ("latest", ["--to-latest"], 10),
    ("current", ["--to-current"], 6),
    ("offset", ["--to-offset", "3"], 3),
    ("shift", ["--shift-by", "-2"], 4),
    ("datetime", ["--to-datetime", "2024-01-01T00:00:03.000"], 2),
    ("duration", ["--by-duration", "PT1H"], 5),
])
def test_reset_offsets_dry_run_then_execute(cluster: RunningBroker, mode: str, args: list[str],
                                            expected: int) -> None:
    topic, group = f"cgr-{mode}", f"cgr-{mode}-group"
    create_topic(cluster, topic)
    produce(cluster, topic, 10, timestamps=TIMESTAMPS)
    commit(cluster, group, {(topic, 0): 6})
    gw, tw = max(15, len(group)), max(15, len(topic))
    table = ("\n"
             f"{'GROUP':<{gw}} {'TOPIC':<{tw}} {'PARTITION':<10} NEW-OFFSET\n"
             f"{group:<{gw}} {topic:<{tw}} {'0':<10} {expected}\n")

    for dry in (["--dry-run"], []):
        r = groups(cluster, "--reset-offsets", "--group", group, "--topic", topic, *args, *dry)
        assert (r.code, r.out) == (0, table), r
        if dry:
            assert r.err == "", r
        else:  # no --dry-run and no --execute: Kafka's warning, then the dry run
            assert r.err.startswith("WARN: No action will be performed as the --execute option "
                                    "is missing."), r
        assert committed(cluster, group) == {(topic, 0): 6}

    r = groups(cluster, "--reset-offsets", "--group", group, "--topic", f"{topic}:0", *args,
               "--execute")
    assert (r.code, r.out, r.err) == (0, table, ""), r
    assert committed(cluster, group) == {(topic, 0): expected}
    if expected == 10:
        produce(cluster, topic, 1)  # something to read at the new position
    assert first_offset(cluster, group, topic) == expected


def test_reset_offsets_clamps_exports_and_needs_an_inactive_group(cluster: RunningBroker) -> None:
    topic, group = "cgr-more", "cgr-more-group"
    create_topic(cluster, topic, partitions=2)
    produce(cluster, topic, 10, partition=0)
    produce(cluster, topic, 4, partition=1)
    commit(cluster, group, {(topic, 0): 6, (topic, 1): 1})

    r = groups(cluster, "--reset-offsets", "--group", group, "--all-topics", "--to-offset", "99",
               "--export", "--execute")
    assert (r.code, r.out) == (0, f"{topic},0,10\n{topic},1,4\n\n"), r
    assert r.err == (f"WARN: New offset (99) is higher than latest offset for topic partition "
                     f"{topic}-0. Value will be set to 10\n"
                     f"WARN: New offset (99) is higher than latest offset for topic partition "
                     f"{topic}-1. Value will be set to 4\n")
    assert committed(cluster, group) == {(topic, 0): 10, (topic, 1): 4}

    r = groups(cluster, "--reset-offsets", "--group", group, "--topic", f"{topic}:1",
               "--shift-by", "-100", "--execute")
    assert r.code == 0 and r.lines[-1].split() == [group, topic, "1", "0"], r
    assert committed(cluster, group) == {(topic, 0): 10, (topic, 1): 0}

    # a partition that does not exist
    r = groups(cluster, "--reset-offsets", "--group", group, "--topic", f"{topic}:7",
               "--to-earliest", "--execute")
    assert (r.code, r.out) == (1, "")
    assert r.err == ("Error: Executing consumer group command failed due to The partitions "
                     f"\"{topic}-7\" do not exist\n")

    c = consumer(cluster, group)
    try:
        c.subscribe([topic])
        wait_assigned(c, 2)
        r = groups(cluster, "--reset-offsets", "--group", group, "--all-topics", "--to-earliest",
                   "--execute")
        header = f"{'GROUP':<{max(15, len(group))}} {'TOPIC':<15} {'PARTITION':<10} NEW-OFFSET"
        assert (r.code, r.out) == (1, f"\n{header}\n"), r
        assert r.err == (f"Error: Assignments can only be reset if the group '{group}' is "
                         "inactive, but the current state is Stable.\n")
    finally:
        c.close()
    assert committed(cluster, group) == {(topic, 0): 10, (topic, 1): 0}


def test_reset_offsets_from_an_exported_plan(cluster: RunningBroker) -> None:
    topic, group = "cgf-events", "cgf-group"
    create_topic(cluster, topic, partitions=2)
    produce(cluster, topic, 8, partition=0)
    produce(cluster, topic, 8, partition=1)
    commit(cluster, group, {(topic, 0): 1, (topic, 1): 2})

    r = groups(cluster, "--reset-offsets", "--group", group, "--all-topics", "--shift-by", "3",
               "--export")
    assert (r.code, r.out) == (0, f"{topic},0,4\n{topic},1,5\n\n"), r
    plan = cluster.data_dir.parent / "plan.csv"
    plan.write_text(r.out.replace(f"{topic},1,5", f"{topic},1,7"))
    assert committed(cluster, group) == {(topic, 0): 1, (topic, 1): 2}  # a dry run

    r = groups(cluster, "--reset-offsets", "--group", group, "--from-file", str(plan),
               "--execute")
    assert (r.code, r.err) == (0, ""), r
    assert [line.split() for line in r.lines[2:]] == [[group, topic, "0", "4"],
                                                      [group, topic, "1", "7"]]
    assert committed(cluster, group) == {(topic, 0): 4, (topic, 1): 7}


# --- --delete-offsets --------------------------------------------------------------------------


def test_delete_offsets(cluster: RunningBroker) -> None:
    topic, group = "cgo-events", "cgo-group"
    create_topic(cluster, topic, partitions=2)
    produce(cluster, topic, 3)
    commit(cluster, group, {(topic, 0): 2, (topic, 1): 0})
    r = groups(cluster, "--delete-offsets", "--group", group, "--topic", f"{topic}:0")
    assert (r.code, r.err) == (0, ""), r
    assert r.out == (f"Request succeeded for deleting offsets from group {group}.\n"
                     "\n"
                     "TOPIC           PARTITION  STATUS         \n"
                     "cgo-events      0          Successful     \n")
    assert committed(cluster, group) == {(topic, 1): 0}

    r = groups(cluster, "--delete-offsets", "--group", "cg-nobody", "--topic", topic)
    assert (r.code, r.out, r.err) == (1, "", "Error: The group id does not exist.\n"), r


# --- shmq console-consumer --group -------------------------------------------------------------


def test_console_consumer_group_resumes_where_it_stopped(cluster: RunningBroker) -> None:
    topic = "cgc-events"
    create_topic(cluster, topic)
    produce(cluster, topic, 10)
    base = ["console-consumer", "--bootstrap-server", cluster.bootstrap, "--topic", topic,
            "--timeout-ms", "30000"]

    r = shmq(*base, "--max-messages", "4", "--group", "cgc-group", "--from-beginning")
    assert (r.code, r.out, r.err) == (0, "m0\nm1\nm2\nm3\n", "Processed a total of 4 messages\n")
    # the group committed 4 when the consumer stopped: the next one continues there
    r = shmq(*base, "--max-messages", "4", "--group", "cgc-group")
    assert (r.code, r.out, r.err) == (0, "m4\nm5\nm6\nm7\n", "Processed a total of 4 messages\n")
    assert committed(cluster, "cgc-group") == {(topic, 0): 8}
    r = groups(cluster, "--describe", "--group", "cgc-group")
    assert r.lines[2].split() == ["cgc-group", topic, "0", "8", "10", "2", "-", "-", "-"], r

    # the group named as a consumer property instead
    r = shmq(*base, "--max-messages", "2", "--command-property", "group.id=cgc-group")
    assert (r.code, r.out, r.err) == (0, "m8\nm9\n", "Processed a total of 2 messages\n")
    assert committed(cluster, "cgc-group") == {(topic, 0): 10}
    r = shmq(*base, "--group", "cgc-group", "--command-property", "group.id=other")
    assert r.code == 2 and "do not match" in r.err, r


def test_console_consumer_group_leaves_and_commits_on_sigterm(cluster: RunningBroker) -> None:
    topic, group = "cgt-events", "cgt-group"
    create_topic(cluster, topic)
    produce(cluster, topic, 5)
    proc = subprocess.Popen(
        [sys.executable, "-m", "shmq", "console-consumer", "--bootstrap-server",
         cluster.bootstrap, "--topic", topic, "--group", group, "--from-beginning"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert [proc.stdout.readline() for _ in range(5)] == [f"m{i}\n" for i in range(5)]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # like Kafka's shutdown hook: the consumer closed, committing what it printed and leaving
    assert (proc.returncode, out, err) == (143, "", "Processed a total of 5 messages\n")
    assert committed(cluster, group) == {(topic, 0): 5}
    r = groups(cluster, "--describe", "--group", group, "--state")
    assert r.lines[2].split()[-2:] == ["Empty", "0"], r


# --- bad input with a broker -------------------------------------------------------------------


@pytest.mark.parametrize(("args", "message"), [
    (["--reset-offsets", "--group", "g", "--to-earliest"],
     "One of the reset scopes should be defined: --all-topics, --topic."),
    (["--reset-offsets", "--group", "g", "--all-topics", "--to-offset", "x1"],
     "Cannot parse argument 'x1' of option to-offset"),
    (["--reset-offsets", "--group", "g", "--all-topics", "--to-latest", "--shift-by", "1"],
     'Option "[shift-by]" can\'t be used with option "[to-latest]"'),
    (["--list", "--describe"], "Command must include exactly one action"),
])
def test_malformed_command_lines(cluster: RunningBroker, args: list[str], message: str) -> None:
    r = groups(cluster, *args)
    assert (r.code, r.out) == (2, ""), r
    assert r.err.count("\n") == 1 and message in r.err, r


def test_no_broker_is_one_line() -> None:
    import socket

    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = shmq("consumer-groups", "--bootstrap-server", f"127.0.0.1:{port}", "--timeout", "1000",
             "--describe", "--group", "g")
    assert (r.code, r.out) == (1, ""), r
    assert r.err == ("Error: Executing consumer group command failed due to no answer from "
                     f"127.0.0.1:{port} within 1000 ms (--timeout)\n")
