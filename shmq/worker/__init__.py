"""A partition-worker process: owns its partitions' logs and serves them over the Kafka protocol."""
