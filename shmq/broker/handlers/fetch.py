"""Fetch (1): whole batches from the one holding the fetch offset, up to the high watermark
(the last stable offset for read_committed), as file slices for ``sendfile``.

Long poll: the response waits until ``min_bytes`` are available or ``max_wait`` passed; appends
wake waiting fetches through the context's per-partition events.  Every requested partition is in
the response.  The first partition with data gets at least one whole batch even when it is
larger than the byte limits (KIP-74), later ones only what still fits.  Fetch sessions are not
kept: ``session_id`` is always 0, which makes clients send full fetches (legal, KIP-227).

The request is the hand-parsed ``FetchRequest`` of ``protocol.fetch_request`` (the router parses
it; kio's decode cost ~47 us a request), whose fields a version lacks hold Kafka's defaults
(``current_leader_epoch`` -1 before v9, ``isolation_level`` present from v4).
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
from shmq.errors import OffsetOutOfRangeError
from shmq.protocol.fetch_request import FetchRequest
from shmq.protocol.fetch_response import FetchPartitionData, encode_fetch_response

NONE, OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER = 0, 1, 3, 6
FENCED_EPOCH, UNKNOWN_EPOCH = 73, 74


def _read_all(ctx: BrokerContext, request: FetchRequest,
              committed: bool) -> tuple[list, int, bool]:
    # replica_id >= 0 claims to be a follower: no client may read as one (CVE-2018-1288 pattern)
    follower = request.replica_id >= 0
    budget = request.max_bytes if request.max_bytes > 0 else 0x7FFFFFFF
    total, errors, topics = 0, False, []
    for t in request.topics:
        parts = []
        for p in t.partitions:
            info = ctx.metadata.topics.get(t.topic)
            code, hw, lso, start, slices = NONE, -1, -1, -1, []
            log = ctx.log_for(t.topic, p.partition)
            if info is None or not 0 <= p.partition < len(info.partitions):
                code = UNKNOWN_TOPIC_OR_PARTITION
            elif log is None or follower:
                code = NOT_LEADER
            else:
                epoch = info.partitions[p.partition].leader_epoch
                current = p.current_leader_epoch
                hw, lso, start = log.high_watermark, log.high_watermark, log.log_start_offset
                if 0 <= current < epoch:
                    code = FENCED_EPOCH
                elif current > epoch:
                    code = UNKNOWN_EPOCH
                else:
                    limit = min(p.partition_max_bytes, budget)
                    try:
                        result = log.read(p.fetch_offset, max(limit, 0),
                                          upper_bound=lso if committed else hw,
                                          min_one_batch=total == 0)
                    except OffsetOutOfRangeError:
                        code = OFFSET_OUT_OF_RANGE
                    else:
                        slices = result.slices
                        size = result.size
                        total += size
                        budget -= size
            errors |= code != NONE
            parts.append(FetchPartitionData(
                partition_index=p.partition, error_code=code, high_watermark=hw,
                last_stable_offset=lso, log_start_offset=start,
                aborted_transactions=[] if committed else None, records=slices))
        topics.append((t.topic, parts))
    return topics, total, errors


def _count(ctx: BrokerContext, request: FetchRequest, topics: list) -> None:
    """Kafka's BrokerTopicMetrics for the partitions answered (per partition, as Kafka marks
    them), plus messages out: the offsets from the fetch offset to the bound when the answer
    reached it, else (cut by a byte limit) estimated from the partition's bytes per message."""
    metrics = ctx.metrics
    for t, (_name, parts) in zip(request.topics, topics, strict=True):
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
    committed = request.isolation_level == 1
    wait_s = max(request.max_wait_ms / 1000, 0.0)
    deadline = loop.time() + wait_s
    waited = 0
    while True:
        # register before reading: an append between the read and the wait must wake us
        events = [ctx.data_event(t.topic, p.partition) for t in request.topics
                  for p in t.partitions]
        topics, total, errors = _read_all(ctx, request, committed)
        remaining = deadline - loop.time()
        if total >= request.min_bytes or errors or remaining <= 0 or not events:
            break
        waiters = [asyncio.ensure_future(ev.wait()) for ev in events]
        if ctx.metrics is not None:
            ctx.metrics.add(FETCH_WAITS_STARTED)
        started = perf_counter_ns()
        try:
            await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
            waited += perf_counter_ns() - started or 1
            if ctx.metrics is not None:
                ctx.metrics.add(FETCH_WAITS_DONE)
    if ctx.metrics is not None:
        _count(ctx, request, topics)
        if waited:  # Kafka's fetch purgatory (RemoteTimeMs)
            ctx.remote_ns = waited
            ctx.metrics.observe(FETCH_WAIT_HIST, waited)
    return encode_fetch_response(api_version, correlation_id, topics, session_id=0)
