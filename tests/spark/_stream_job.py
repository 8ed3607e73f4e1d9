"""A streaming job for the kill tests, run as its own process (its own driver and JVM):

    python _stream_job.py BOOTSTRAP TOPIC CHECKPOINT OUTPUT SCRATCH

``format("shmq")`` micro-batches of at most 300 offsets into Parquet (Spark's file sink commits
each batch exactly once through its metadata log), until the test SIGKILLs it.  The test then
restarts the same query from the same checkpoint in its own driver (``test_stream.finish``).
Spark's scratch files (block manager and ``spark-*`` dirs, the native libraries the JVM unpacks)
go under SCRATCH, a directory of the test: a SIGKILLed driver runs no shutdown hook, and by
default they would stay in /tmp.
"""

from __future__ import annotations

import sys

import spark_bridge


def main() -> int:
    bootstrap, topic, checkpoint, output, scratch = sys.argv[1:6]
    spark = spark_bridge.session("shmq-kill-test", conf={
        "spark.sql.shuffle.partitions": "2", "spark.local.dir": scratch,
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={scratch}"})
    query = (spark.readStream.format("shmq").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("startingOffsets", "earliest")
             .option("maxOffsetsPerTrigger", "300").load()
             .selectExpr("partition", "offset", "value")
             .writeStream.format("parquet").option("path", output)
             .option("checkpointLocation", checkpoint)
             .trigger(processingTime="200 milliseconds").start())
    query.awaitTermination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
