"""Kafka -> bronze: the lake's durable, complete copy of the event log.

One row per Kafka record, bytes untouched, so every later layer can be rebuilt
from here even after Kafka's retention has dropped the records. Ingest's one
query appends each micro-batch here before settling it into silver
(`spark_jobs.engine.ingest`); the append carries Delta's txnAppId/txnVersion, so a
batch retried after a crash does not copy its records twice.

A lost checkpoint must not copy the log twice either: the transaction ids are
per checkpoint, and a new checkpoint starts its batch ids again. So a query that
starts without a checkpoint over a bronze that already holds records starts
each partition at the offset after bronze's last copy of it (`resume_offsets`);
bronze is thereby idempotent on (topic, partition, offset).
"""

from __future__ import annotations

import json
import logging

import pyarrow as pa
from confluent_kafka.admin import AdminClient
from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.engine import lake
from spark_jobs.engine.forgotten import read_forgotten, without_forgotten
from warehouse.base import kafka_conf, registry
from warehouse.base.settings import Settings

log = logging.getLogger(__name__)

BRONZE = registry.BRONZE_EVENTS  # the shop's; the IO below takes any source's (`src`)

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

# A live batch's bronze append is delta-rs's (`lake.append_live`), which checkpoints
# every 100 commits unless told; Spark's readers of bronze (a replay, a retry's
# `between`, the erasure) and Trino then replay up to 99 commits. Spark's own 10, as
# silver says (`silver.SILVER_PROPERTIES`). Set on existing lakes by `ingest.prepare`.
BRONZE_PROPERTIES = {"delta.checkpointInterval": "10"}

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


def resume_offsets(
    last: dict[int, int], partitions: list[int], topic: str = registry.TOPIC
) -> dict[str, dict[str, int]]:
    """Kafka startingOffsets: after each partition's last copied offset, else earliest (-2).

    Spark needs every partition of the topic named once specific offsets are given.
    """
    return {topic: {str(p): last[p] + 1 if p in last else -2 for p in sorted(partitions)}}


def topic_partitions(settings: Settings, topic: str = registry.TOPIC) -> list[int]:
    admin = AdminClient(kafka_conf.client_conf(settings))
    found = admin.list_topics(topic, timeout=30).topics[topic]
    if found.error is not None:
        raise RuntimeError(f"cannot list the partitions of {topic}: {found.error}")
    return list(found.partitions)


def starting_offsets(
    spark: SparkSession, settings: Settings, src: registry.SourceTables = registry.SHOP
) -> str:
    """Where ingest's query without a checkpoint starts (one with a checkpoint resumes there)."""
    path = src.bronze.path(settings)
    if lake.checkpoint_has_progress(spark, src.ingest_checkpoint(settings)) or not (
        DeltaTable.isDeltaTable(spark, path)
    ):
        return "earliest"
    # A forgotten record counts as copied: bronze no longer holds it, and must
    # not copy it again (docs/contract.md §8).
    copied = (
        spark.read.format("delta")
        .load(path)
        .where(F.col("topic") == src.topic)
        .select("partition", "offset")
        .unionByName(read_forgotten(spark, settings, src).select("partition", "offset"))
    )
    last = {
        r["partition"]: r["last"]
        for r in copied.groupBy("partition").agg(F.max("offset").alias("last")).collect()
    }
    if not last:
        return "earliest"
    offsets = resume_offsets(last, topic_partitions(settings, src.topic), src.topic)
    log.warning(
        "bronze has no checkpoint but already holds records: each partition resumes after "
        "its last copied offset, so nothing is copied twice: %s",
        offsets[src.topic],
    )
    return json.dumps(offsets)


def read_kafka(
    spark: SparkSession,
    settings: Settings,
    *,
    accept_data_loss: bool = False,
    starting: str = "earliest",
    src: registry.SourceTables = registry.SHOP,
) -> DataFrame:
    """The topic as an unbounded stream, from `starting` (default: the earliest retained offset).

    `accept_data_loss` is the operator's explicit decision to move past a gap
    in the log (records Kafka deleted before bronze copied them); never a default.
    """
    return (
        spark.readStream.format("kafka")
        .options(**kafka_conf.spark_options(settings))
        .option("subscribe", src.topic)
        .option("startingOffsets", starting)
        # A gap in the log (retention passed before we read it) must stop the
        # pipeline loudly, never skip silently.
        .option("failOnDataLoss", str(not accept_data_loss).lower())
        .option("maxOffsetsPerTrigger", settings.ingest_max_records_per_batch)
        .load()
    )


def forgotten_positions(
    spark: SparkSession, settings: Settings, src: registry.SourceTables = registry.SHOP
) -> DataFrame | None:
    """The Kafka positions an erasure forgot (docs/contract.md §8), which Kafka holds
    until its retention deletes them; None while nothing is forgotten.

    Read when ingest's query starts (an erasure stops ingest and starts it
    again), as local rows: a few bytes each, and no table scan or cached block
    that a long-running query could lose."""
    positions = read_forgotten(spark, settings, src).select("partition", "offset").collect()
    if not positions:
        return None
    return spark.createDataFrame(positions, "partition int, offset bigint")


def ignoring_forgotten(rows: DataFrame, forgotten: DataFrame | None) -> DataFrame:
    """Bronze rows read from Kafka, less the `forgotten` positions. Joined only once
    something has been forgotten: a join costs every micro-batch a Spark job."""
    return rows if forgotten is None else without_forgotten(rows, forgotten)


def append(
    rows: DataFrame,
    settings: Settings,
    app_id: str,
    batch_id: int,
    src: registry.SourceTables = registry.SHOP,
    writer: lake.Committer | None = None,
    arrow: pa.Table | None = None,
) -> None:
    """One micro-batch's bronze rows into bronze, once per (app_id, batch_id); by
    delta-rs with `writer`, bronze's (`lake.append_live`), from `arrow` if given."""
    path = src.bronze.path(settings)
    what = f"bronze batch {batch_id}"
    lake.append_live(rows, path, f"{app_id}/bronze", batch_id, writer, what, arrow)


def holds_batch(
    spark: SparkSession,
    settings: Settings,
    app_id: str,
    batch_id: int,
    src: registry.SourceTables = registry.SHOP,
    writer: lake.Committer | None = None,
) -> bool:
    """Whether bronze already committed this micro-batch (batches commit in order).
    Asked of `writer`, bronze's delta-rs `Committer`, if given: after its commits,
    Spark would rebuild bronze's state to answer."""
    txn = f"{app_id}/bronze"
    path = src.bronze.path(settings)
    last = writer.txn_version(txn) if writer is not None else lake.txn_version(spark, path, txn)
    return last is not None and last >= batch_id


def in_offsets(start: dict[int, int], end: dict[int, int]) -> Column:
    """Rows (of bronze or silver) at Kafka offsets [start, end) per partition of
    `end` (a partition missing from `start`: from its first offset)."""
    inside = F.lit(False)
    for p, stop in end.items():
        inside = inside | (
            (F.col("partition") == p)
            & (F.col("offset") >= max(start.get(p, 0), 0))
            & (F.col("offset") < stop)
        )
    return inside


def between(
    spark: SparkSession,
    settings: Settings,
    start: dict[int, int],
    end: dict[int, int],
    src: registry.SourceTables = registry.SHOP,
) -> DataFrame:
    """Bronze's rows of the topic at offsets [start, end) per partition. Delta's
    file statistics on partition and offset skip the files outside the range."""
    return (
        spark.read.format("delta")
        .load(src.bronze.path(settings))
        .where((F.col("topic") == src.topic) & in_offsets(start, end))
    )


def read_kafka_batch(
    spark: SparkSession, settings: Settings, src: registry.SourceTables = registry.SHOP
) -> DataFrame:
    """Every record the topic still holds, as one batch (a replay's source)."""
    return (
        spark.read.format("kafka")
        .options(**kafka_conf.spark_options(settings))
        .option("subscribe", src.topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
