"""Fetch (1): whole batches from the one holding the fetch offset, up to the high watermark
(the last stable offset for read_committed), as file slices for ``sendfile``.

Kafka's rules (``KafkaApis.handleFetchRequest``, ``ReplicaManager.fetchMessages/readFromLog``,
``Partition.fetchRecords``):

* Each partition is answered once: one asked twice is answered at the place it was first asked,
  with the offsets and limits it was last asked with (Kafka keys the request by partition).
* The response holds at most ``min(max_bytes, fetch.max.bytes)`` bytes (broker default 55 MiB),
  except that the first partition with data gets one whole batch even when it is larger (KIP-74);
  ``max_bytes`` 0 therefore means one batch, and a negative limit is UNKNOWN_SERVER_ERROR for a
  partition that has data to read (Kafka's segment read refuses a negative size).
* A ``current_leader_epoch`` older than the partition's is FENCED_LEADER_EPOCH, newer
  UNKNOWN_LEADER_EPOCH.  From v12 a ``last_fetched_epoch`` is checked against the epoch history
  (KIP-595): a consumer whose last epoch ended before its fetch offset gets ``diverging_epoch``
  (the epoch and where it ended) and no records; an epoch that cannot be placed is
  OFFSET_OUT_OF_RANGE.
* read_committed reads stop at the last stable offset (the first offset of the earliest open
  transaction, or the HW) and list the aborted transactions (producer id, first offset) that
  overlap the range read, from the log's ``.txnindex`` entries (``collectAbortedTransactions``);
  the consumer drops those producers' batches until it meets their ABORT marker.
* A partition answered with an error carries -1 for its high watermark, last stable offset and
  log start offset.

Long poll: the response waits until ``min_bytes`` (capped by the byte limit) are available or
``max_wait`` passed.  Appends wake waiting fetches through the context (``BrokerContext.park``:
one future per parked fetch, registered under each of its partitions), and so does every
metadata change (``BrokerContext.wake_fetches``): a fetch parked on a partition
that is deleted, moves or changes epoch is answered at once with its error, as Kafka's
``DelayedFetch`` completes.  Errors answer at once, except for partitions that were unknown when
the request arrived (Kafka leaves those out of the delayed fetch).  Fetch sessions are not kept:
``session_id`` is always 0, which makes clients send full fetches (legal, KIP-227).  They would
not help librdkafka (kcat, confluent-kafka): its Fetch request always carries session id 0 and
epoch -1, whatever the broker answered (``rd_kafka_broker_fetch_toppars`` in
``src/rdkafka_fetcher.c``, librdkafka 2.x), so every Fetch names every partition it reads; the
Java client and kafka-python's pending KIP-227 work are the ones a session would serve.

The request is the hand-parsed ``FetchRequest`` of ``protocol.fetch_request`` (the router parses
it; kio's decode cost ~47 us a request), whose fields a version lacks hold Kafka's defaults
(``current_leader_epoch`` -1 before v9, ``last_fetched_epoch`` -1 before v12).
"""

from __future__ import annotations

import asyncio
from time import perf_counter_ns
from typing import Any

from shmq._fast._metrics_reference import (
    FETCH_WAIT_HIST,
    FETCH_WAITS_DONE,
    FETCH_WAITS_STARTED,
    P_BYTES_IN,
    P_MESSAGES_IN,
)
from shmq.broker.context import BrokerContext
from shmq.broker.handlers._epochs import check_leader_epoch
from shmq.errors import OffsetOutOfRangeError
from shmq.protocol.fetch_request import FetchPartition, FetchRequest, FetchTopic
from shmq.protocol.fetch_response import FetchPartitionData, encode_fetch_response
from shmq.storage.log import UNDEFINED_EPOCH, PartitionLog
from shmq.storage.slices import FileSlice

NONE, UNKNOWN_SERVER_ERROR, OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION = 0, -1, 1, 3
NOT_LEADER = 6


def _each_partition_once(topics: list[FetchTopic]) -> list[FetchTopic]:
    """The request's topics with every partition once, at its first place with its last
    parameters (Kafka's ``fetchData`` is a LinkedHashMap keyed by topic-partition); consecutive
    partitions of one topic share a topic entry, as in Kafka's ``FetchResponse``."""
    if len({t.topic for t in topics}) == len(topics):  # each topic named once, the usual case
        if all(len({p.partition for p in t.partitions}) == len(t.partitions) for t in topics):
            return topics  # no duplicates: sets of ints, no (topic, partition) tuple made for
            # each of the thousands of partitions librdkafka names in every Fetch
    elif len({(t.topic, p.partition) for t in topics for p in t.partitions}) == sum(
            len(t.partitions) for t in topics):
        return topics  # a topic named twice, each time other partitions
    wanted: dict[tuple[str, int], FetchPartition] = {}
    for t in topics:
        for p in t.partitions:
            wanted[(t.topic, p.partition)] = p  # an existing key keeps its place
    out: list[FetchTopic] = []
    for (topic, _), p in wanted.items():
        if not out or out[-1].topic != topic:
            out.append(FetchTopic(topic, []))
        out[-1].partitions.append(p)
    return out


def _read_partition(log: PartitionLog, p: FetchPartition, epoch: int, limit: int,
                    upper_bound: int, min_one_batch: bool) -> tuple[int, list[FileSlice], Any]:
    """(error code, file slices, diverging epoch or None) of one led partition
    (``Partition.readRecords``)."""
    if p.last_fetched_epoch >= 0:
        found_epoch, end = log.end_offset_for_epoch(p.last_fetched_epoch, epoch)
        if found_epoch == UNDEFINED_EPOCH or end < 0 or p.fetch_offset < log.log_start_offset:
            return OFFSET_OUT_OF_RANGE, [], None
        if found_epoch < p.last_fetched_epoch or end < p.fetch_offset:
            return NONE, [], (found_epoch, end)
    if p.fetch_offset == upper_bound and log.log_start_offset <= upper_bound:
        return NONE, [], None  # caught up: what ``log.read`` answers at the bound, ~4x cheaper
    try:
        result = log.read(p.fetch_offset, max(limit, 0), upper_bound=upper_bound,
                          min_one_batch=min_one_batch)
    except OffsetOutOfRangeError:
        return OFFSET_OUT_OF_RANGE, [], None
    if limit < 0 and p.fetch_offset < upper_bound:
        return UNKNOWN_SERVER_ERROR, [], None  # LogSegment.read: "Invalid max size"
    return NONE, result.slices, None


def _read_all(ctx: BrokerContext, topics: list[FetchTopic], request: FetchRequest,
              budget: int) -> tuple[list, int, set[tuple[str, int]], bool]:
    """Read every partition once: (response topics, bytes, partitions in error, whether an
    epoch diverged).

    librdkafka names every partition it reads in every Fetch (no KIP-227 session), and most of
    them are usually caught up: the loop does for each what ``ctx.log_for`` and
    ``check_leader_epoch`` do, inline, and answers a caught-up partition without
    ``_read_partition``: 1.6-2.0 us a caught-up partition where it took 3.1-8.4 (500 partitions,
    one process, loaded box, 3 interleaved runs each)."""
    # replica_id >= 0 claims to be a follower: no client may read as one (CVE-2018-1288 pattern)
    follower = request.replica_id >= 0
    committed = request.isolation_level == 1
    total, errors, diverged, out = 0, set(), False, []
    node = ctx.node_id
    get_log = ctx.logs.get_log if ctx.logs is not None and not follower else None
    known = ctx.metadata.topics
    new = tuple.__new__  # a FetchPartitionData without its Python-level __new__
    for t in topics:
        name = t.topic
        info = known.get(name)
        leaders = info.partitions if info is not None else ()
        count = len(leaders)
        parts: list[FetchPartitionData] = []
        for p in t.partitions:
            index = p.partition
            log = None
            if not 0 <= index < count:
                code = UNKNOWN_TOPIC_OR_PARTITION
            else:
                leader = leaders[index]
                if get_log is None or leader.leader != node:
                    code = NOT_LEADER
                elif (log := get_log(name, index) or ctx.log_for(name, index)) is None:
                    code = NOT_LEADER
                else:
                    epoch = leader.leader_epoch
                    current = p.current_leader_epoch
                    code = NONE if current < 0 or current == epoch else check_leader_epoch(
                        current, epoch)
            if code != NONE or log is None:  # Kafka: no offsets, no aborted list (an empty
                # one for a partition it does not know, answered early)
                errors.add((name, index))
                aborted: list[tuple[int, int]] | None = (
                    [] if code == UNKNOWN_TOPIC_OR_PARTITION else None)
                parts.append(FetchPartitionData(index, code, -1, -1, -1, aborted, -1, []))
                continue
            hw = log.high_watermark
            lso = log.last_stable_offset
            bound = lso if committed else hw
            start = log.log_start_offset
            if p.fetch_offset == bound and p.last_fetched_epoch < 0 and start <= bound:
                # caught up: no records, nothing aborted to list (what the read answers)
                parts.append(new(FetchPartitionData, (index, NONE, hw, lso, start,
                                                      [] if committed else None, -1, (), None)))
                continue
            code, slices, diverging = _read_partition(
                log, p, epoch, min(p.partition_max_bytes, budget), bound, total == 0)
            if code != NONE:
                errors.add((name, index))
                parts.append(FetchPartitionData(index, code, -1, -1, -1, None, -1, []))
                continue
            size = sum(s.length for s in slices)
            total += size
            budget = max(0, budget - size)
            diverged |= diverging is not None
            aborted = None
            if committed:  # the aborted transactions the records sent overlap
                aborted = log.aborted_transactions(p.fetch_offset, lso) \
                    if slices and log.aborted else []
            parts.append(FetchPartitionData(
                index, NONE, hw, lso, log.log_start_offset, aborted, -1, slices, diverging))
        out.append((name, parts))
    return out, total, errors, diverged


def _count(ctx: BrokerContext, request: FetchRequest, asked: list[FetchTopic],
           topics: list) -> None:
    """Kafka's BrokerTopicMetrics for the partitions answered (per partition, as Kafka marks
    them), plus messages out: the offsets from the fetch offset to the bound when the answer
    reached it, else (cut by a byte limit) estimated from the partition's bytes per message."""
    metrics = ctx.metrics
    for t, (_name, parts) in zip(asked, topics, strict=True):
        info = ctx.metadata.topics.get(t.topic)
        for p, part in zip(t.partitions, parts, strict=True):
            slot = (info.partitions[p.partition].slot
                    if info is not None and 0 <= p.partition < len(info.partitions) else -1)
            if part.error_code:
                metrics.fetch_failed(slot)
                metrics.error(1, part.error_code)
                continue
            size = sum(s.length for s in part.records) if part.records else 0
            messages = 0
            if size:
                bound = part.last_stable_offset if request.isolation_level == 1 \
                    else part.high_watermark
                if size < p.partition_max_bytes:
                    messages = max(0, bound - p.fetch_offset)
                else:
                    nbytes = metrics.partition_value(slot, P_BYTES_IN)
                    if nbytes:
                        messages = min(max(0, bound - p.fetch_offset),
                                       size * metrics.partition_value(slot, P_MESSAGES_IN)
                                       // nbytes)
            metrics.fetched(slot, messages, size)


async def handle(ctx: BrokerContext, request: FetchRequest, api_version: int,
                 correlation_id: int) -> list[Any]:
    loop = asyncio.get_running_loop()
    # KafkaApis: fetchMaxBytes = min(max_bytes, fetch.max.bytes); fetchMinBytes = min(min, that)
    budget = min(request.max_bytes, ctx.config.fetch_max_bytes)
    min_bytes = min(request.min_bytes, budget)
    topics = _each_partition_once(request.topics)
    deadline = loop.time() + max(request.max_wait_ms / 1000, 0.0)
    unknown_at_first: set[tuple[str, int]] | None = None
    watched = True
    waited = 0
    keys: list[tuple[str, int]] | None = None
    while True:
        out, total, errors, diverged = _read_all(ctx, topics, request, budget)
        if unknown_at_first is None:  # Kafka answers these at once and waits for the others
            unknown_at_first = {(t, p.partition_index) for t, parts in out for p in parts
                                if p.error_code == UNKNOWN_TOPIC_OR_PARTITION} \
                if errors else set()  # no error, none unknown: no walk over every partition
            watched = len(unknown_at_first) < sum(len(t.partitions) for t in topics)
        remaining = deadline - loop.time()
        if (total >= min_bytes or diverged or remaining <= 0 or not watched
                or not errors <= unknown_at_first):
            break
        # parked right after the read, with no await between: appends run on this event loop,
        # so none can slip in between the read and the registration
        if keys is None:
            keys = [(t.topic, p.partition) for t in topics for p in t.partitions]
        woken = ctx.park(keys)
        if ctx.metrics is not None:
            ctx.metrics.add(FETCH_WAITS_STARTED)
        started = perf_counter_ns()
        try:
            await asyncio.wait((woken,), timeout=remaining)
        finally:
            woken.cancel()
            ctx.unpark(keys, woken)
            waited += perf_counter_ns() - started or 1
            if ctx.metrics is not None:
                ctx.metrics.add(FETCH_WAITS_DONE)
    if ctx.metrics is not None:
        _count(ctx, request, topics, out)
        if waited:  # Kafka's fetch purgatory (RemoteTimeMs)
            ctx.remote_ns = waited
            ctx.metrics.observe(FETCH_WAIT_HIST, waited)
    return encode_fetch_response(api_version, correlation_id, out, session_id=0)
