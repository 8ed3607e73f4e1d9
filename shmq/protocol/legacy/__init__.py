"""The request versions Kafka 4.0 removed (KIP-896) that shmq serves again, as Kafka 3.9 did.

kio 0.6.5 is generated from Kafka 4's message schemas, which no longer describe these versions.
The modules here describe them in kio's own form (frozen dataclasses whose fields carry their
``kafka_type``), written from Kafka 3.9's ``clients/src/main/resources/common/message/*.json``,
one module per API version with the request and the response.  kio's generic reader and writer
and ``kio_guard`` handle them like kio's own classes; ``codec.request_class`` and
``codec.response_class`` look here first.

None of them carries record batches, so serving them needs no message-format conversion:

=================================  ========================================================
ListOffsets v0                     ``max_num_offsets`` in, ``old_style_offsets`` out
OffsetCommit v0, v1                v0: no generation or member (-1, ""); v1: commit timestamp
OffsetFetch v0                     the layout of v1 (v0 read ZooKeeper-stored offsets)
CreateTopics v0, v1                v0: no ``validate_only``; responses without throttle time
DeleteTopics v0                    the request of v1, the response without throttle time
DescribeConfigs v0                 ``is_default`` instead of the config source and synonyms
OffsetForLeaderEpoch v0, v1        no current leader epoch; v0 answers no leader epoch
=================================  ========================================================

Produce v0-v2 and Fetch v0-v3 stay refused: they carry message format v0/v1, which would need
record conversion both ways.
"""

from __future__ import annotations

import importlib
from typing import Any

# (api key, version) -> module name, for the versions below Kafka 4's floor served here.
MODULES: dict[tuple[int, int], str] = {
    (2, 0): "list_offsets_v0",
    (8, 0): "offset_commit_v0",
    (8, 1): "offset_commit_v1",
    (9, 0): "offset_fetch_v0",
    (19, 0): "create_topics_v0",
    (19, 1): "create_topics_v1",
    (20, 0): "delete_topics_v0",
    (32, 0): "describe_configs_v0",
    (23, 0): "offset_for_leader_epoch_v0",
    (23, 1): "offset_for_leader_epoch_v1",
}


def _module(api_key: int, version: int) -> Any:
    name = MODULES.get((api_key, version))
    return None if name is None else importlib.import_module(f"{__name__}.{name}")


def request_class(api_key: int, version: int) -> Any:
    """The request body class of a legacy version, or None (ask kio)."""
    module = _module(api_key, version)
    return None if module is None else module.REQUEST


def response_class(api_key: int, version: int) -> Any:
    """The response body class of a legacy version, or None (ask kio)."""
    module = _module(api_key, version)
    return None if module is None else module.RESPONSE
