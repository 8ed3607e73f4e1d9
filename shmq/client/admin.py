"""``shmq.AdminClient``: confluent-kafka's ``AdminClient`` (futures API), over the Kafka
protocol whatever the transport (admin requests are few; the broker's admin APIs answer them).
shmq's own keys (``shmq.transport``, ``shmq.data.dir``) are accepted and dropped."""

from __future__ import annotations

from typing import Any

import confluent_kafka.admin

from shmq.client.config import ClientConfig


class AdminClient(confluent_kafka.admin.AdminClient):
    """confluent-kafka's ``AdminClient``: ``create_topics``, ``delete_topics``,
    ``create_partitions``, ``describe_configs`` / ``alter_configs`` /
    ``incremental_alter_configs``, ``list_groups`` / ``describe_consumer_groups`` /
    ``delete_consumer_groups``, ``list_consumer_group_offsets`` /
    ``alter_consumer_group_offsets``, ``list_offsets``, ``delete_records``, ``list_topics``,
    ``describe_cluster`` ... each returning futures."""

    def __init__(self, conf: Any = None, **kwargs: Any) -> None:
        config = ClientConfig(conf if conf is not None else {}, "admin", kwargs)
        if config.py:
            from shmq.client.config import invalid

            key = next(iter(config.py))
            raise invalid(key, None, "not an admin client property")
        super().__init__(config.rd)
