"""Metadata (3): brokers, controller, topics with partitions, leaders and epochs.

v0: an empty topic list means all topics; v1+: null means all, empty means none.  Unknown topics
are created when the request (v4+) and ``auto.create.topics.enable`` allow it; illegal names get
INVALID_TOPIC_EXCEPTION.  An internal topic is never created as a client's topic: asking for
``__consumer_offsets`` that way lists it with its coordinator's partitions, as Kafka's
``AutoTopicCreationManager`` creates it (``shmq.broker.internal_topics``).  Brokers are advertised as IPv4 literals (librdkafka may resolve
"localhost" to ::1).

A partition whose last write failed (a full disk, an I/O error: the state table's STORAGE_ERROR
flag) lists its leader in ``offline_replicas``, as Kafka lists a replica in a failed log
directory.  Unlike Kafka, which takes the whole directory offline until a restart, the leader
stays: it still serves reads and takes appends again once one succeeds, so the error code stays
NONE (an error there would make clients drop the leader and stop reading).

Answers are cached (DESIGN.md §3): kio builds and encodes a 1,000-partition answer in ~28 ms (loaded box),
and clients ask again on every refresh, error and new assignment.  The key holds everything an
answer is made of: the version, the topics asked, the metadata (its identity and generation:
every change of topics, partitions, leaders, epochs or brokers is a new generation,
``MetadataStore.save``, and a worker replaces its copy on each update) and the partitions
flagged with a storage error.  A change never meets an old answer; the cache holds one
generation, at most ``_CACHED_ANSWERS`` answers; two requests' answers differ only in the
correlation id.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

from shmq.broker.context import BrokerContext, TopicRequest
from shmq.broker.handlers._build import build, response_module
from shmq.broker.metadata import INTERNAL_TOPICS, validate_topic_name
from shmq.ipc.state_table import STORAGE_ERROR
from shmq.protocol.codec import encode_response

NONE, UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE, INVALID_TOPIC = 0, 3, 5, 17
NO_AUTHORIZED_OPS = -2147483648
METADATA = 3
_CACHED_ANSWERS = 64
_SIZE_CORRELATION = struct.Struct(">ii")


async def handle(ctx: BrokerContext, header: Any, request: Any) -> Any:
    version = header.api_version
    meta = ctx.metadata
    if request.topics is None or (version == 0 and not request.topics):
        names = sorted(meta.topics)
    else:
        names = [t.name for t in request.topics]
    auto = ctx.config.auto_create_topics and (version < 4 or request.allow_auto_topic_creation)
    missing = [n for n in names if n is not None and n not in meta.topics
               and validate_topic_name(n) is None]
    if missing and auto:
        internal = [n for n in missing if n in INTERNAL_TOPICS]
        for name in internal:
            await ctx.controller.create_internal_topic(name)
        if len(internal) < len(missing):
            await ctx.controller.create_topics(
                [TopicRequest(n, ctx.config.num_partitions, 1, {}) for n in missing
                 if n not in INTERNAL_TOPICS], False)
        meta = ctx.metadata
    reader = ctx.state_reader
    failing = reader.flagged(STORAGE_ERROR) if reader is not None and not reader.closed \
        else set()
    generation = (id(meta), meta.generation, frozenset(failing))
    cache = ctx.metadata_answers
    if cache.get(None) != generation:  # a new generation: every cached answer is stale
        cache.clear()
        cache[None] = generation
    key = (version, tuple(names))
    framed = cache.get(key)
    if framed is None:
        framed = encode_response(METADATA, version, 0, _answer(meta, version, names, failing))
        if len(cache) > _CACHED_ANSWERS:
            cache.clear()
            cache[None] = generation
        cache[key] = framed
    return [_SIZE_CORRELATION.pack(len(framed) - 4, header.correlation_id),
            memoryview(framed)[8:]]


def _answer(meta: Any, version: int, names: Sequence[str | None],
            failing: set[int]) -> Any:
    """The kio response object for ``names`` (already created when auto-creation applied)."""
    cls, m = response_module(METADATA, version)
    topics = []
    for name in names:
        info = meta.topics.get(name) if name is not None else None
        if info is None:
            code = INVALID_TOPIC if name is None or validate_topic_name(name) else (
                UNKNOWN_TOPIC_OR_PARTITION)
            topics.append(build(m.MetadataResponseTopic, error_code=code, name=name,
                                topic_id=_nil_uuid(), is_internal=name in INTERNAL_TOPICS,
                                partitions=(),
                                topic_authorized_operations=NO_AUTHORIZED_OPS))
            continue
        parts = tuple(
            build(m.MetadataResponsePartition, error_code=NONE, partition_index=p.partition,
                  leader_id=p.leader, leader_epoch=p.leader_epoch,
                  replica_nodes=tuple(p.replicas), isr_nodes=tuple(p.isr),
                  offline_replicas=(p.leader,) if p.slot in failing else ())
            for p in info.partitions)
        topics.append(build(m.MetadataResponseTopic, error_code=NONE, name=name,
                            topic_id=info.uuid, is_internal=info.internal, partitions=parts,
                            topic_authorized_operations=NO_AUTHORIZED_OPS))
    brokers = tuple(build(m.MetadataResponseBroker, node_id=node, host=host, port=port, rack=None)
                    for node, (host, port) in sorted(meta.brokers.items()))
    return build(cls, brokers=brokers, cluster_id=meta.cluster_id,
                 controller_id=meta.controller_id, topics=tuple(topics),
                 cluster_authorized_operations=NO_AUTHORIZED_OPS)


def _nil_uuid() -> Any:
    import uuid

    return uuid.UUID(int=0)
