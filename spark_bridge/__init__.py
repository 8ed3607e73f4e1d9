"""shmq's PySpark data source: ``format("shmq")`` reads and writes topics like Spark's Kafka
source and sink, straight from a local broker's segment files (DESIGN.md §6).

    import spark_bridge                      # optional: format("shmq") is auto-registered
    spark = spark_bridge.session()           # a local SparkSession set up for the bridge
    df = spark.read.format("shmq").option("subscribe", "events").load()

Spark finds the source with no register call: on the first Python data source use it imports
every top-level ``pyspark_*`` module, and ``pyspark_shmq`` names ``ShmqDataSource``.

Python workers must run an interpreter that has shmq installed.  pyspark starts them with
``$PYSPARK_PYTHON`` (default: ``python3`` from the PATH), so importing this package in the
driver sets ``PYSPARK_PYTHON`` to the driver's interpreter when it is unset; set it yourself
when the driver does not import shmq before creating its SparkSession, or on a cluster.
"""

from __future__ import annotations

import os
import sys
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

__all__ = ["ShmqDataSource", "install", "session"]


def __getattr__(name: str) -> Any:
    if name == "ShmqDataSource":  # imports pyspark: only when asked for
        from spark_bridge.source import ShmqDataSource

        return ShmqDataSource
    raise AttributeError(name)


def install(spark: Any) -> None:
    """Register ``format("shmq")`` on ``spark`` explicitly (Spark also finds it on its own
    through the ``pyspark_shmq`` module)."""
    from spark_bridge.source import ShmqDataSource

    spark.dataSource.register(ShmqDataSource)


def session(app: str = "shmq", master: str = "local[2]",
            conf: dict[str, str] | None = None) -> Any:
    """A SparkSession for local work with the bridge: the workers run this interpreter, the
    session time zone is UTC (Kafka timestamps are UTC), no UI, quiet logs; ``conf`` adds Spark
    settings (e.g. ``{"spark.jars.packages": ...}``)."""
    os.environ["PYSPARK_PYTHON"] = os.environ.get("PYSPARK_PYTHON") or sys.executable
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app)
               .config("spark.pyspark.python", sys.executable)
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "4"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
