"""Kafka -> bronze: the lake's durable, complete copy of the event log.

One row per Kafka record, bytes untouched, so every later layer can be rebuilt
from here even after Kafka's retention has dropped the records. Exactly once
comes from Structured Streaming's checkpoint together with the Delta sink,
which commits each micro-batch idempotently under the query's id.

A lost checkpoint must not copy the log twice: the Delta sink's idempotence is
per query id, and a new checkpoint is a new query. So a query that starts
without a checkpoint over a bronze that already holds records starts each
partition at the offset after bronze's last copy of it (`resume_offsets`);
bronze is thereby idempotent on (topic, partition, offset).
"""

from __future__ import annotations

import json
import logging

from confluent_kafka.admin import AdminClient
from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs import erasure, lake
from warehouse.base import kafka_conf, registry
from warehouse.base.settings import Settings

log = logging.getLogger(__name__)

BRONZE = registry.BRONZE_EVENTS

# What Spark's Kafka source yields, one row per record.
KAFKA_SOURCE_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)

BRONZE_SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("kafka_timestamp", TimestampType(), False),
        StructField("key", StringType(), True),
        # Raw bytes: a record that is not UTF-8 still lands, for silver to quarantine.
        StructField("value", BinaryType(), True),
        StructField("ingested_at", TimestampType(), False),
    ]
)


def to_bronze_rows(records: DataFrame) -> DataFrame:
    """Kafka source rows (one per record) -> bronze rows (one per record)."""
    return records.select(
        F.col("topic"),
        F.col("partition").cast(IntegerType()).alias("partition"),
        F.col("offset").cast(LongType()).alias("offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("key").cast(StringType()).alias("key"),
        F.col("value"),
        F.current_timestamp().alias("ingested_at"),
    )


def resume_offsets(last: dict[int, int], partitions: list[int]) -> dict[str, dict[str, int]]:
    """Kafka startingOffsets: after each partition's last copied offset, else earliest (-2).

    Spark needs every partition of the topic named once specific offsets are given.
    """
    return {registry.TOPIC: {str(p): last[p] + 1 if p in last else -2 for p in sorted(partitions)}}


def topic_partitions(settings: Settings) -> list[int]:
    admin = AdminClient(kafka_conf.client_conf(settings))
    topic = admin.list_topics(registry.TOPIC, timeout=30).topics[registry.TOPIC]
    if topic.error is not None:
        raise RuntimeError(f"cannot list the partitions of {registry.TOPIC}: {topic.error}")
    return list(topic.partitions)


def starting_offsets(spark: SparkSession, settings: Settings) -> str:
    """Where a bronze query without a checkpoint starts (one with a checkpoint resumes there)."""
    path = BRONZE.path(settings)
    if lake.checkpoint_has_progress(spark, BRONZE.checkpoint(settings)) or not (
        DeltaTable.isDeltaTable(spark, path)
    ):
        return "earliest"
    # A forgotten record counts as copied: bronze no longer holds it, and must
    # not copy it again (CONTRACT.md §8).
    copied = (
        spark.read.format("delta")
        .load(path)
        .where(F.col("topic") == registry.TOPIC)
        .select("partition", "offset")
        .unionByName(erasure.read_forgotten(spark, settings).select("partition", "offset"))
    )
    last = {
        r["partition"]: r["last"]
        for r in copied.groupBy("partition").agg(F.max("offset").alias("last")).collect()
    }
    if not last:
        return "earliest"
    offsets = resume_offsets(last, topic_partitions(settings))
    log.warning(
        "bronze has no checkpoint but already holds records: each partition resumes after "
        "its last copied offset, so nothing is copied twice: %s",
        offsets[registry.TOPIC],
    )
    return json.dumps(offsets)


def read_kafka(
    spark: SparkSession,
    settings: Settings,
    *,
    accept_data_loss: bool = False,
    starting: str = "earliest",
) -> DataFrame:
    """The topic as an unbounded stream, from `starting` (default: the earliest retained offset).

    `accept_data_loss` is the operator's explicit decision to move past a gap
    in the log (records Kafka deleted before bronze copied them); never a default.
    """
    return (
        spark.readStream.format("kafka")
        .options(**kafka_conf.spark_options(settings))
        .option("subscribe", registry.TOPIC)
        .option("startingOffsets", starting)
        # A gap in the log (retention passed before we read it) must stop the
        # pipeline loudly, never skip silently.
        .option("failOnDataLoss", str(not accept_data_loss).lower())
        .option("maxOffsetsPerTrigger", settings.ingest_max_records_per_batch)
        .load()
    )


def ignoring_forgotten(spark: SparkSession, settings: Settings, rows: DataFrame) -> DataFrame:
    """Bronze rows read from Kafka, less the positions an erasure forgot (CONTRACT.md
    §8), which Kafka holds until its retention deletes them.

    The list is read when the query starts (an erasure stops ingest and starts
    it again), and joined only once something has been forgotten: a join costs
    every micro-batch a Spark job."""
    positions = erasure.read_forgotten(spark, settings).select("partition", "offset").collect()
    if not positions:
        return rows
    # As local rows: a few bytes each, and no table scan or cached block that a
    # long-running query could lose.
    forgotten = spark.createDataFrame(positions, "partition int, offset bigint")
    return erasure.without_forgotten(rows, forgotten)


def read_kafka_batch(spark: SparkSession, settings: Settings) -> DataFrame:
    """Every record the topic still holds, as one batch (a replay's source)."""
    return (
        spark.read.format("kafka")
        .options(**kafka_conf.spark_options(settings))
        .option("subscribe", registry.TOPIC)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )


def start(
    spark: SparkSession,
    settings: Settings,
    *,
    available_now: bool = False,
    trigger: str | None = None,
    accept_data_loss: bool = False,
) -> StreamingQuery:
    """Start the Kafka -> bronze query: continuous, or until caught up (available_now)."""
    rows = to_bronze_rows(
        read_kafka(
            spark,
            settings,
            accept_data_loss=accept_data_loss,
            starting=starting_offsets(spark, settings),
        )
    )
    writer = (
        ignoring_forgotten(spark, settings, rows)
        .writeStream.format("delta")
        .queryName("bronze")
        .outputMode("append")
        .option("checkpointLocation", BRONZE.checkpoint(settings))
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime=trigger or settings.trigger_interval)
    )
    return writer.start(BRONZE.path(settings))


def run_once(spark: SparkSession, settings: Settings) -> int:
    """Copy everything new in Kafka into bronze; return its row count."""
    query = start(spark, settings, available_now=True)
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"bronze ingest failed: {query.exception()}")
    return spark.read.format("delta").load(BRONZE.path(settings)).count()


def mark(spark: SparkSession, settings: Settings, erasure_id: str) -> int:
    """A commit that changes no rows (a table property: the last erasure), for a
    silver query that is to start after bronze's newest commit when no traffic
    comes (Delta makes no commit for an empty append). Returns its version."""
    path = BRONZE.path(settings)
    spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('regauge.last_erasure' = '{erasure_id}')"
    )
    return lake.newest_version(spark, path)
