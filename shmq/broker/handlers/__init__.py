"""One module per Kafka API; ``HANDLERS`` maps API keys to ``handle(ctx, header, request)``."""

from __future__ import annotations

from shmq.broker.handlers import (
    api_versions,
    create_topics,
    delete_topics,
    fetch,
    find_coordinator,
    init_producer_id,
    list_offsets,
    metadata,
    offset_for_leader_epoch,
)

HANDLERS = {
    18: api_versions.handle,
    3: metadata.handle,
    1: fetch.handle,
    2: list_offsets.handle,
    22: init_producer_id.handle,
    19: create_topics.handle,
    20: delete_topics.handle,
    23: offset_for_leader_epoch.handle,
    10: find_coordinator.handle,
}
