"""The broker's supported API versions: one table, advertised in ApiVersions and enforced on decode.

``SUPPORTED`` is the *advertised* range per API key: Kafka 4.0's (protocol.md §6.1), extended
down to Kafka 3.9's minimum wherever the older versions carry no record batches (ListOffsets v0,
OffsetCommit v0-1, OffsetFetch v0, CreateTopics v0-1, DeleteTopics v0, DescribeConfigs v0,
OffsetForLeaderEpoch v0-1: the versions KIP-896 removed in Kafka 4.0; their schemas are in
``protocol.legacy``).  Fetch v0-3 and Produce v0-2 carry message format v0/v1 and would need
record conversion: Fetch starts at v4, as in Kafka 4.0, and Produce is advertised from v0 but
served from v3, exactly like Kafka 4.0 (KAFKA-18659, apache/kafka PR #18727): librdkafka before
the fix only compresses when Produce v0 is in the advertised range, and silently sends
uncompressed batches otherwise.  A request of a version outside the served range ends the
connection, as Kafka 4's ``SocketServer`` does ("... which is not enabled"), except ApiVersions
(KIP-511).  ``implemented_min`` gives the lowest version actually served; ``is_supported``
answers with the served range.

Add an API here only together with its handler.
"""

from __future__ import annotations

import datetime
import functools
import sys
from typing import Any

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

# API keys (Kafka's ApiKeys.java names).  Only some are in SUPPORTED yet; the names of the
# others in protocol.md §6.1 are listed so handlers added later use the same constants.
PRODUCE = 0
FETCH = 1
LIST_OFFSETS = 2
METADATA = 3
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
SASL_HANDSHAKE = 17
API_VERSIONS = 18
CREATE_TOPICS = 19
DELETE_TOPICS = 20
DELETE_RECORDS = 21
INIT_PRODUCER_ID = 22
OFFSET_FOR_LEADER_EPOCH = 23
ADD_PARTITIONS_TO_TXN = 24
ADD_OFFSETS_TO_TXN = 25
END_TXN = 26
WRITE_TXN_MARKERS = 27
TXN_OFFSET_COMMIT = 28
DESCRIBE_CONFIGS = 32
ALTER_CONFIGS = 33
SASL_AUTHENTICATE = 36
CREATE_PARTITIONS = 37
DELETE_GROUPS = 42
INCREMENTAL_ALTER_CONFIGS = 44
OFFSET_DELETE = 47
DESCRIBE_CLUSTER = 60
DESCRIBE_PRODUCERS = 61
DESCRIBE_TRANSACTIONS = 65
LIST_TRANSACTIONS = 66

# api key -> (min, max) advertised in ApiVersions: protocol.md §6.1, with Kafka 3.9's minimum
# where the versions Kafka 4.0 removed carry no records.
SUPPORTED: dict[int, tuple[int, int]] = {
    PRODUCE: (0, 12),  # served from v3, see implemented_min (KAFKA-18659); 12: TV2
    FETCH: (4, 12),  # 0-3 need message format v0/v1; 13+ address topics by id only
    LIST_OFFSETS: (0, 8),  # v0: max_num_offsets / old_style_offsets (Kafka 4.0: 1-10)
    METADATA: (0, 12),
    API_VERSIONS: (0, 4),
    CREATE_TOPICS: (0, 7),  # Kafka 4.0: 2-7
    DELETE_TOPICS: (0, 6),  # Kafka 4.0: 1-6
    INIT_PRODUCER_ID: (0, 5),  # 6 is 2PC (KIP-939)
    OFFSET_FOR_LEADER_EPOCH: (0, 4),  # Kafka 4.0: 2-4
    FIND_COORDINATOR: (0, 6),  # librdkafka enables LZ4 only when FindCoordinator v0 is offered
    JOIN_GROUP: (0, 9),  # group APIs: min 0 for librdkafka 2.0.2's balanced-consumer check
    SYNC_GROUP: (0, 5),
    HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5),
    OFFSET_COMMIT: (0, 9),  # 10 addresses topics by id; Kafka 4.0: 2-10
    OFFSET_FETCH: (0, 9),  # Kafka 4.0: 1-10
    DESCRIBE_GROUPS: (0, 6),  # 6: an unknown group is GROUP_ID_NOT_FOUND (KIP-1043)
    LIST_GROUPS: (0, 5),
    DELETE_GROUPS: (0, 2),
    OFFSET_DELETE: (0, 0),
    CREATE_PARTITIONS: (0, 3),
    DESCRIBE_CONFIGS: (0, 4),  # Kafka 4.0: 1-4
    ALTER_CONFIGS: (0, 2),
    INCREMENTAL_ALTER_CONFIGS: (0, 1),
    DELETE_RECORDS: (0, 2),
    DESCRIBE_CLUSTER: (0, 1),
    DESCRIBE_PRODUCERS: (0, 0),
    ADD_PARTITIONS_TO_TXN: (0, 3),  # 4+ is KIP-890's broker-side verification
    ADD_OFFSETS_TO_TXN: (0, 4),
    END_TXN: (0, 5),  # 5 is transaction version 2 (KIP-890 part 2: the epoch bump)
    TXN_OFFSET_COMMIT: (0, 5),  # 5 is transaction version 2 (adds the offsets partition)
    DESCRIBE_TRANSACTIONS: (0, 0),
    LIST_TRANSACTIONS: (0, 1),
    WRITE_TXN_MARKERS: (1, 2),  # inter-broker; Kafka 4.3 advertises 1-2 on its client listener
}

# Feature levels (KIP-584), as Kafka 4.3 advertises them in ApiVersions v3+: name -> (min, max)
# supported, and the finalized level.  ``transaction.version`` 2 is KIP-890 part 2 (Kafka 4.x
# clients then bump the epoch at every EndTxn v5 and add partitions with Produce v12); clients
# that do not know it use the older versions, and the broker decides per request version.
SUPPORTED_FEATURES: dict[str, tuple[int, int]] = {"transaction.version": (0, 2)}
FINALIZED_FEATURES: dict[str, int] = {"transaction.version": 2}

# Versions advertised but rejected with UNSUPPORTED_VERSION when used.
_IMPLEMENTED_MIN: dict[int, int] = {PRODUCE: 3}

# api key -> Kafka's name ("OffsetForLeaderEpoch"), derived from the constants above.
API_NAMES: dict[int, str] = {
    value: name.title().replace("_", "")
    for name, value in list(globals().items())
    if name.isupper() and type(value) is int
}


# (after API_NAMES, which takes every upper-case int above for an API key)
# Kafka's is the metadata offset of the last feature change; shmq's levels never change while
# it runs.  Clients only take finalized features whose epoch is above the last they saw (-1).
FINALIZED_FEATURES_EPOCH = 1


def implemented_min(api_key: int) -> int:
    """The lowest version of ``api_key`` the broker serves (Produce: 3, else the advertised min)."""
    return _IMPLEMENTED_MIN.get(api_key, SUPPORTED[api_key][0])


def is_supported(api_key: int, version: int) -> bool:
    """True when the broker serves ``api_key`` at ``version`` (advertised-only versions: False)."""
    advertised = SUPPORTED.get(api_key)
    if advertised is None:
        return False
    return implemented_min(api_key) <= version <= advertised[1]


@functools.lru_cache(maxsize=16)
def api_versions_response(version: int, error_code: int = 0) -> Any:
    """The kio ApiVersionsResponse body (v0..v4) advertising ``SUPPORTED``.

    v1+ carries ``throttle_time`` (always 0 here); v3+ has the tagged feature fields:
    ``SUPPORTED_FEATURES`` (v3 leaves out those whose minimum is 0, as Kafka does for clients
    that predate KIP-1022) and ``FINALIZED_FEATURES`` with their epoch.  An error answer carries
    no features.  The body is immutable and cached per (version, error_code).
    """
    cls = load_response_schema(API_VERSIONS, version)
    module = sys.modules[cls.__module__]
    keys = tuple(
        module.ApiVersion(api_key=key, min_version=lo, max_version=hi)
        for key, (lo, hi) in sorted(SUPPORTED.items())
    )
    kwargs: dict[str, Any] = {"error_code": ErrorCode(error_code), "api_keys": keys}
    if version >= 1:
        kwargs["throttle_time"] = datetime.timedelta(0)
    if version >= 3 and error_code == 0:
        kwargs["supported_features"] = tuple(
            module.SupportedFeatureKey(name=name, min_version=lo, max_version=hi)
            for name, (lo, hi) in sorted(SUPPORTED_FEATURES.items()) if version >= 4 or lo > 0)
        kwargs["finalized_features"] = tuple(
            module.FinalizedFeatureKey(name=name, max_version_level=level,
                                       min_version_level=level)
            for name, level in sorted(FINALIZED_FEATURES.items()))
        kwargs["finalized_features_epoch"] = FINALIZED_FEATURES_EPOCH
    return cls(**kwargs)
