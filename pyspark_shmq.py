"""Spark imports every top-level ``pyspark_*`` module on the first use of a Python data source
and registers its ``DefaultSource`` under ``DefaultSource.name()``: with shmq installed,
``spark.read.format("shmq")`` works with no register call."""

from spark_bridge.source import ShmqDataSource as DefaultSource

__all__ = ["DefaultSource"]
