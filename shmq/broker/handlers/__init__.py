"""One module per Kafka API; ``HANDLERS`` maps API keys to ``handle(ctx, header, request)``.

Produce (0) and Fetch (1) are not in it: the router parses them by hand and calls their
handlers directly."""

from __future__ import annotations

from shmq.broker.handlers import (
    alter_configs,
    api_versions,
    create_partitions,
    create_topics,
    delete_groups,
    delete_records,
    delete_topics,
    describe_cluster,
    describe_configs,
    describe_groups,
    describe_producers,
    find_coordinator,
    heartbeat,
    incremental_alter_configs,
    init_producer_id,
    join_group,
    leave_group,
    list_groups,
    list_offsets,
    metadata,
    offset_commit,
    offset_delete,
    offset_fetch,
    offset_for_leader_epoch,
    sync_group,
)

HANDLERS = {
    18: api_versions.handle,
    3: metadata.handle,
    2: list_offsets.handle,
    22: init_producer_id.handle,
    19: create_topics.handle,
    20: delete_topics.handle,
    23: offset_for_leader_epoch.handle,
    10: find_coordinator.handle,
    11: join_group.handle,
    14: sync_group.handle,
    12: heartbeat.handle,
    13: leave_group.handle,
    8: offset_commit.handle,
    9: offset_fetch.handle,
    15: describe_groups.handle,
    16: list_groups.handle,
    42: delete_groups.handle,
    47: offset_delete.handle,
    37: create_partitions.handle,
    32: describe_configs.handle,
    33: alter_configs.handle,
    44: incremental_alter_configs.handle,
    21: delete_records.handle,
    60: describe_cluster.handle,
    61: describe_producers.handle,
}
