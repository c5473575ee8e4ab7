"""A Spark driver of its own, for a test to kill: a streaming query copying a stream's events to text files.

``python stream_driver.py ENDPOINT SCOPE/STREAM OUTPUT CHECKPOINT TRIGGER`` reads the stream with the
``segstore`` format and writes each event as a line of text under ``OUTPUT`` (Spark's file sink, which
lists the files of each committed micro-batch in ``OUTPUT/_spark_metadata``). ``TRIGGER`` is
``continuous`` (a micro-batch every 200 ms, until the process is killed) or ``available-now`` (read
what the stream holds, then exit). A test restarts the query from its checkpoint with ``start_copy``.
"""

from __future__ import annotations

import sys
from typing import Any

from pyspark.sql import SparkSession

from client.spark import SegstoreDataSource


def start_copy(session: Any, endpoint: str, stream: str, output: str, checkpoint: str, trigger: str) -> Any:
    """The streaming query this driver runs, started in ``session``: a test restarts it in its own."""
    events = session.readStream.format("segstore").option("endpoint", endpoint).option("stream", stream)
    writer = (
        events.load()
        .selectExpr("CAST(value AS STRING) AS value")
        .writeStream.format("text")
        .option("path", output)
        .option("checkpointLocation", checkpoint)
    )
    if trigger == "continuous":
        writer = writer.trigger(processingTime="200 milliseconds")
    else:
        writer = writer.trigger(availableNow=True)
    return writer.start()


def main(endpoint: str, stream: str, output: str, checkpoint: str, trigger: str) -> None:
    session = (
        SparkSession.builder.master("local[2]")
        .appName("segstore-stream-driver")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "512m")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    session.dataSource.register(SegstoreDataSource)
    start_copy(session, endpoint, stream, output, checkpoint, trigger).awaitTermination()
    session.stop()


if __name__ == "__main__":
    main(*sys.argv[1:])
