"""One module per Kafka API; ``HANDLERS`` maps API keys to ``handle(ctx, header, request)``."""

from __future__ import annotations

from shmq.broker.handlers import (
    alter_configs,
    api_versions,
    create_partitions,
    create_topics,
    delete_records,
    delete_topics,
    describe_cluster,
    describe_configs,
    describe_producers,
    fetch,
    find_coordinator,
    incremental_alter_configs,
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
    37: create_partitions.handle,
    32: describe_configs.handle,
    33: alter_configs.handle,
    44: incremental_alter_configs.handle,
    21: delete_records.handle,
    60: describe_cluster.handle,
    61: describe_producers.handle,
}
