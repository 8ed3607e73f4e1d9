"""Where shmq may answer differently from Apache Kafka, and why: the one place that says so.

The differential tests (``test_kafka_*.py``) send the same requests and run the same clients and
tools against shmq and against Apache Kafka (tools/apache_kafka.py), pass both answers through
``normalise`` and require them to be equal.  ``normalise`` only rewrites fields whose values are
legitimately the broker's own: identities, addresses, clocks.  Anything else that differs is a
defect of shmq and is fixed there, unless it is in this table:

| # | what | shmq | Apache Kafka 4.3 | why a Kafka user accepts it |
|---|------|------|------------------|-----------------------------|
| 1 | nodes | node 0 is the controller (bootstrap, groups, admin), nodes 1..N are the partition workers; Metadata lists them all | one node (id 1) does everything | a worker is a process with its own listener; clients follow Metadata as with any cluster, so only the ids and the broker count differ |
| 2 | ApiVersions | the APIs shmq implements, at the versions Kafka 4.0 advertises (protocol.md §6.1), one feature level (`transaction.version` 2, as Kafka's); also the versions Kafka 4.0 removed that carry no records (ListOffsets v0, OffsetCommit v0-1, OffsetFetch v0, ...), as Kafka 3.9 served them | every Kafka 4.3 API (ACLs, quotas, share groups, KIP-848, ...) and newer versions, with `finalized_features`; not the removed versions | clients negotiate the highest common version and use only what is advertised; shmq never advertises what it does not implement, and old clients (Burrow, sarama) keep working |
| 3 | eligible leader replicas (KIP-966) | no DescribeTopicPartitions: Kafka's admin client falls back to Metadata and `kafka-topics.sh --describe` prints `Elr: N/A LastKnownElr: N/A` | `Elr: ` and `LastKnownElr: ` (empty lists); with ELR on (the 4.3 default) also a cluster default `min.insync.replicas=1`, so the reference is formatted with `eligible.leader.replicas.version=0` | ELR elects among replicas; a shmq partition has one replica, so there is nothing to list |
| 4 | config documentation | DescribeConfigs documentation says what shmq does with the config (e.g. "no effect in shmq") | Kafka's text | the names, values, sources, types and synonyms are Kafka's; the text is for people |
| 5 | reference settings | shmq's defaults | run with `group.initial.rebalance.delay.ms=100` (tests/integration/_broker.py) | shmq's default for a local broker (README, "Consumer groups"); Kafka's 3000 ms would only make the tests wait |
| 6 | auto-created topics | created before the Metadata answer, which lists them | the first Metadata answer is UNKNOWN_TOPIC_OR_PARTITION while the controller creates the topic | clients retry that error; on shmq the topic is there one retry earlier |
| 7 | `__consumer_offsets` | the controller's own log (README, "Consumer groups"), listed and readable as Kafka's; DeleteTopics refuses it (INVALID_REQUEST); `offsets.topic.segment.bytes` 16 MiB | deletable; 100 MiB segments | deleting it drops every group's committed offsets at once; small segments keep the controller's replay at start short |
| 8 | KIP-848 | the classic group protocol only, so shmq's console consumer prints no invitation to try `group.protocol=consumer` | the console consumer prints one | a client that asks for the consumer protocol gets UNSUPPORTED_VERSION and uses the classic one |
| 9 | CLI errors | one line on stderr, exit code 1 | `Error: ...` on stdout (consumer-groups exits 0) or a Java stack trace on stderr | a script sees the failure in the exit code; the message is Kafka's |
| 10 | order of hash-kept lists | sorted (topics in a multi-topic `--describe`, groups in ListGroups, partitions of a reset plan) | a Java HashMap's order | Kafka documents no order; it changes with the names |
| 11 | offset commit records in `__consumer_offsets` | OffsetCommitValue v3 (as Kafka 3.x and 4.0 write it) | v4: the same fields, flexible, the topic id as a tagged field | Burrow (and other sarama-based lag monitors) decode versions 0, 1 and 3 only and report no group on v4 (tests/integration/test_burrow.py); Kafka's own formatters, tools and coordinator read v3 alike |
| 12 | `__transaction_state` values | `TransactionLogValue` v1 with `ClientTransactionVersion`, and `PreviousProducerId`/`NextProducerId` when the producer id rotates (an exhausted epoch) | v1 with `ClientTransactionVersion` only | the other two are tags Kafka's reader reads: a controller restarting between a rotating transaction's Prepare and its markers finishes it with the new producer id (test_txn_coordinator_v2.py); clients never read these records (README, "Transactions and exactly-once") |
| 13 | a retried transactional batch after its transaction ended | the batch is in the log (its answer was lost): answered as a duplicate, with its offsets | INVALID_TXN_STATE ("Partition was not added to the transaction"): the KIP-890 check comes before the duplicate check | the batch was written; "not written" let librdkafka give its sequence numbers to the next transaction's records, which the log then dropped as duplicates of the aborted batch (the kill soak lost 100 records so; test_transactions.py::test_retry_of_a_written_batch_after_its_transaction_ended). A batch never written is still INVALID_TXN_STATE |
| 14 | a compressed batch that does not decompress (valid CRC) | CORRUPT_MESSAGE | UNKNOWN_SERVER_ERROR: the codec's exception escapes `LogValidator` unhandled (`KafkaException: ... Not in GZIP format` in the broker log) | the cause is named; both refuse the batch and store nothing (test_kafka_wire_diff.py::test_produce_undecompressible_batch) |
| 15 | broker configs a change names | an unknown name is INVALID_CONFIG ("Unknown broker config name"); a broker-level topic default (`log.retention.ms`, ...) is checked against its topic config's range for one broker as for the cluster default (INVALID_REQUEST) | stores an unknown broker config name; takes `log.retention.ms=-5` for one broker (only the cluster-wide value is range-checked) | a typo or a value every topic would refuse is refused when it is set, not found later; Kafka's own tools set only known names |

Open defects of shmq that the differential tests hit are not here: those tests carry
``known_defect(issue, item)``, a strict xfail that turns red once the fix lands.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

# Field names whose values belong to the broker that answered (table row 1 and clocks); the value
# is replaced by a placeholder that keeps only what a client may rely on.
_IDENTITY = {
    "cluster_id": lambda v: "<cluster>" if v else v,
    "controller_id": lambda v: "<node>" if v is not None and v >= 0 else v,
    "node_id": lambda v: "<node>" if v is not None and v >= 0 else v,
    "leader_id": lambda v: "<node>" if v is not None and v >= 0 else v,
    "coordinator_id": lambda v: "<node>" if v is not None and v >= 0 else v,
    "host": lambda v: "<host>" if v else v,
    "port": lambda v: "<port>" if v else v,
    "throttle_time": lambda v: 0,
    "topic_id": lambda v: "<topic id>" if v and v != "00000000-0000-0000-0000-000000000000"
    else v,
    "member_id": lambda v: "<member>" if v else v,
    "leader": lambda v: "<member>" if v else v,
    "client_host": lambda v: "<client host>" if v else v,
    "replica_nodes": lambda v: len(v) if isinstance(v, list) else v,
    "isr_nodes": lambda v: len(v) if isinstance(v, list) else v,
    "offline_replicas": lambda v: len(v) if isinstance(v, list) else v,
    "eligible_leader_replicas": lambda v: None,
    "last_known_elr": lambda v: None,
    "log_append_time": lambda v: "<now>" if v is not None and v > 0 else v,
}


def normalise(value: Any, drop: tuple[str, ...] = ()) -> Any:
    """A response (``kafka_wire.plain`` values) with the broker's own identities and clocks
    replaced by placeholders, the broker list reduced to a count (row 1), and ``drop``ped keys
    left out."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if k in drop:
                continue
            if k == "brokers" and isinstance(v, list):
                out[k] = "<brokers>" if v else []
            elif k in _IDENTITY and not isinstance(v, dict | list) or k in (
                    "replica_nodes", "isr_nodes", "offline_replicas"):
                out[k] = _IDENTITY[k](v)
            else:
                out[k] = normalise(v, drop)
        return out
    if isinstance(value, list | tuple):
        return [normalise(v, drop) for v in value]
    return value


def assert_same(shmq: Any, kafka: Any) -> None:
    """shmq's normalised answer equals Kafka's; on failure a unified diff of the two (pytest's
    own diff of nested structures elides what matters)."""
    if shmq == kafka:
        return
    import difflib
    import pprint

    diff = difflib.unified_diff(pprint.pformat(kafka, width=100).splitlines(),
                                pprint.pformat(shmq, width=100).splitlines(),
                                "Apache Kafka", "shmq", lineterm="", n=4)
    pytest.fail("shmq answers differently from Apache Kafka:\n" + "\n".join(diff),
                pytrace=False)


def known_defect(issue: int, item: int) -> pytest.MarkDecorator:
    """A difference another issue fixes: strict, so the test turns red when the fix lands and
    the mark must go."""
    return pytest.mark.xfail(strict=True, reason=f"issue {issue} item {item}")


# -- command-line output ----------------------------------------------------------------------

_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_CLI_RULES = [
    # row 1: topic ids and node ids are the broker's own
    (re.compile(r"TopicId: \S+"), "TopicId: <topic id>"),
    (re.compile(r"\t(Leader|Replicas|Isr): [0-9,]+"), r"\t\1: <node>"),
    # row 3: ELR lists (Kafka's admin client asks DescribeTopicPartitions, shmq has none)
    (re.compile(r"\t(Elr|LastKnownElr): [^\t\n]*"), r"\t\1: <elr>"),
    # the coordinator's address and node id
    (re.compile(r"\d+\.\d+\.\d+\.\d+:\d+ +\(\d+\)"), "<coordinator>"),
    # a warning Kafka's tools log through log4j ("[time] WARN text (logger)"), shmq's print
    # as "WARN: text"
    (re.compile(r"^\[[^\]]+\] WARN (.*) \([\w.$]+\)$"), r"WARN: \1"),
]
# row 8: Kafka 4.3's console consumer advertises KIP-848, which shmq does not offer
_KIP848_BANNER = "The consumer rebalance protocol (KIP-848) is production-ready!"
_ERROR = re.compile(r"^Error\b")
_EXCEPTION = re.compile(r"^(?:Caused by: )?(?:[a-z_$][\w$]*\.)+[A-Z][\w$]*(?:: (.*))?$")
# log4j lines of Kafka's tools other than warnings (row 9: stack traces and error logs), and the
# continuation line with the logger's name
_LOG = re.compile(r"^\[[^\]]+\] (ERROR|INFO|DEBUG) |^ \([\w.$]+\)$")
# row 10: outputs whose order is a Java HashMap's in Kafka's tools or broker
_HASH_ORDERED = {("topics", "--describe"), ("consumer-groups", "--list"),
                 ("consumer-groups", "--reset-offsets"), ("consumer-groups", "--delete-offsets")}
_HEADER = re.compile(r"^(GROUP|TOPIC)\s")


def _sorted_rows(lines: list[str]) -> list[str]:
    """Blocks (a line and the tab-indented lines under it) sorted between table headers."""
    out: list[str] = []
    blocks: list[list[str]] = []
    for line in [*lines, None]:
        if line is None or line == "" or _HEADER.match(line):
            out += [x for b in sorted(blocks) for x in b]
            blocks = []
            if line is not None:
                out.append(line)
        elif line.startswith("\t") and blocks:
            blocks[-1].append(line)
        else:
            blocks.append([line])
    return out


def normalise_cli(run: Any, command: list[str]) -> dict:
    """A tool's run (``code``, ``out``, ``err``) as compared across tools and brokers: what
    belongs to the broker replaced (topic, node and member ids, the latter with their length
    kept so column widths still count; the coordinator's address), ELR lists (row 3), Kafka's
    KIP-848 banner (row 8) left out, hash ordered lists sorted (row 10), and errors taken out of the streams (row 9): ``error`` holds
    the error line(s), completed with the root cause of a Java stack trace, and ``failed``
    replaces the exit code."""
    def lines(text: str) -> list[str]:
        out = []
        for line in text.splitlines():
            if line.startswith(_KIP848_BANNER):
                continue
            line = _UUID.sub("u" * 36, line)
            for pattern, replacement in _CLI_RULES:
                line = pattern.sub(replacement, line)
            out.append(line)
        return out

    errors: list[str] = []
    cause = None
    kept: dict[str, list[str]] = {"out": [], "err": []}
    for stream, text in (("out", run.out), ("err", run.err)):
        for line in lines(text):
            if line.startswith(("\tat ", "\t... ")) or stream == "err" and _LOG.match(line):
                continue
            m = _EXCEPTION.match(line)
            if m and stream == "err":
                cause = m[1] or cause
                continue
            if _ERROR.match(line) or errors and line.startswith("* "):  # and its list
                if kept[stream] and kept[stream][-1] == "":
                    kept[stream].pop()  # Kafka's "\nError: ..."
                errors.append(line)
                continue
            kept[stream].append(line)
    if cause and errors and cause not in errors[0]:
        errors[0] += f": {cause}"
    if tuple(command[:2]) in _HASH_ORDERED:
        kept = {k: _sorted_rows(v) for k, v in kept.items()}
    return {"failed": bool(errors) or run.code != 0, "error": errors, **kept}
