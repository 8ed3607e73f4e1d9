"""Where shmq may answer differently from Apache Kafka, and why: the one place that says so.

The differential tests (``test_kafka_*.py``) send the same requests and run the same clients and
tools against shmq and against Apache Kafka (tools/apache_kafka.py), pass both answers through
``normalise`` and require them to be equal.  ``normalise`` only rewrites fields whose values are
legitimately the broker's own: identities, addresses, clocks.  Anything else that differs is a
defect of shmq and is fixed there, unless it is in this table:

| # | what | shmq | Apache Kafka 4.3 | why a Kafka user accepts it |
|---|------|------|------------------|-----------------------------|
| 1 | nodes | node 0 is the controller (bootstrap, groups, admin), nodes 1..N are the partition workers; Metadata lists them all | one node (id 1) does everything | a worker is a process with its own listener; clients follow Metadata as with any cluster, so only the ids and the broker count differ |
| 2 | ApiVersions | the APIs shmq implements, at the versions Kafka 4.0 advertises (protocol.md §6.1), no feature levels | every Kafka 4.3 API (transactions, ACLs, quotas, share groups, KIP-848, ...) and newer versions, with `finalized_features` | clients negotiate the highest common version and use only what is advertised; shmq never advertises what it does not implement |
| 3 | eligible leader replicas (KIP-966) | no DescribeTopicPartitions: Kafka's admin client falls back to Metadata and `kafka-topics.sh --describe` prints `Elr: N/A LastKnownElr: N/A` | `Elr: ` and `LastKnownElr: ` (empty lists); with ELR on (the 4.3 default) also a cluster default `min.insync.replicas=1`, so the reference is formatted with `eligible.leader.replicas.version=0` | ELR elects among replicas; a shmq partition has one replica, so there is nothing to list |
| 4 | config documentation | DescribeConfigs documentation says what shmq does with the config (e.g. "no effect in shmq") | Kafka's text | the names, values, sources, types and synonyms are Kafka's; the text is for people |
| 5 | reference settings | shmq's defaults | run with `group.initial.rebalance.delay.ms=100` and one partition for `__consumer_offsets` and `__transaction_state` (tests/integration/conftest.py) | shmq's defaults for a local broker (README, "Consumer groups"); Kafka's would only make the tests wait |

Open defects of shmq that the differential tests hit are not here: those tests carry
``known_defect(issue, item)``, a strict xfail that turns red once the fix lands.
"""

from __future__ import annotations

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
