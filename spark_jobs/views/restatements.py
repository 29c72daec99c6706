"""Restatements (CONTRACT.md §3, lateness and finality): which final windows an event
changed, recorded in `gold.restatements` so an analyst sees which closed numbers
moved and why.

A window is final once the view's watermark has passed its end: the newest time
it has seen, minus the allowed lateness, where an event's time counts at most
up to its Kafka record timestamp (CONTRACT.md §3), so one producer with a clock
a day fast cannot make every on-time window "final". The runner calls `record` after
each micro-batch's MERGE; the view's declared scope says where an event lands.
"""

from __future__ import annotations

from typing import NamedTuple

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs import lake
from spark_jobs.views.base import View
from warehouse.base import registry
from warehouse.base.settings import Settings

RESTATEMENTS = registry.GOLD_RESTATEMENTS
RESTATEMENTS_SCHEMA = StructType(
    [
        StructField("view", StringType(), False),
        StructField("version", IntegerType(), False),
        StructField("window_start", TimestampType(), False),
        StructField("window_end", TimestampType(), False),
        # The key besides time: the currency of an hour, the customer of a session.
        StructField("window_key", StringType(), False),
        StructField("event_id", StringType(), False),
        StructField("event_time", TimestampType(), False),
        # Seconds the window had been over (in event time: the watermark's newest
        # time minus the window's end) when this event restated it.
        StructField("lateness", LongType(), False),
        StructField("restated_at", TimestampType(), False),
    ]
)
_RESTATEMENT_KEY = ("view", "version", "window_start", "window_key", "event_id")


def restated(
    view: View,
    landed: DataFrame,
    silver: DataFrame,
    gold: DataFrame | None,
    newest_before: DataFrame,
) -> DataFrame:
    """The final windows `landed` events restated.

    `newest_before` is one row, `newest`: the newest event time the view had
    seen before these events. A window is final once that minus the allowed
    lateness (the watermark) has passed its end.
    """
    lateness_s = int(view.allowed_lateness.total_seconds())
    where = view.lands_in(landed, silver, gold).crossJoin(newest_before)
    return where.where(
        F.col("newest").isNotNull()
        & (F.unix_micros("window_end") <= F.unix_micros("newest") - lateness_s * 1_000_000)
    ).select(
        F.lit(view.name).alias("view"),
        F.lit(view.version).alias("version"),
        "window_start",
        "window_end",
        "window_key",
        "event_id",
        "event_time",
        (F.unix_seconds("newest") - F.unix_seconds("window_end")).alias("lateness"),
        F.current_timestamp().alias("restated_at"),
    )


def ensure_table(spark: SparkSession, settings: Settings) -> None:
    lake.ensure_table(spark, RESTATEMENTS.path(settings), RESTATEMENTS_SCHEMA)


def newest_before(
    spark: SparkSession, settings: Settings, view: View, version: int, since: int | None
) -> DataFrame:
    """One row, `newest`: the newest time the view's events in silver as of `version`
    vouch for (null if none): max(min(event_time, kafka_timestamp)).

    `since` (UTC microseconds), when given, must be at most that answer: then only
    silver's days from it on are read, not all of history. Any earlier answer
    qualifies, because silver only grows: a replaced winner keeps its content. An
    event below `since` in event time is below it capped too, so the filter on
    event time loses nothing.
    """
    silver = lake.read_version(spark, registry.SILVER_EVENTS.path(settings), version).where(
        F.col("event_type").isin(*view.event_types)
    )
    if since is not None:
        at = F.timestamp_micros(F.lit(since))
        silver = silver.where(F.col("event_date") >= F.to_date(at)).where(F.col("event_time") >= at)
    return silver.agg(F.max(F.least("event_time", "kafka_timestamp")).alias("newest"))


class Recorded(NamedTuple):
    restatements: int
    # The newest event time (UTC microseconds) the view had seen before the batch:
    # the next batch's `since`.
    newest: int | None


def record(
    spark: SparkSession,
    settings: Settings,
    view: View,
    changes: DataFrame,
    silver: DataFrame,
    gold_path: str,
    first_version: int,
    since: int | None = None,
) -> Recorded:
    """Record what a change-feed micro-batch (already limited to the view's event
    types, from silver's commit `first_version` on) restated; idempotent (insert if
    absent).

    `silver` must hold every `of` event of the scopes the batch touched (it may
    hold no more: `View.narrowed`); `since` is as for `newest_before`.
    """
    landed = changes.where(F.col("_change_type").isin("insert", "update_postimage")).drop(
        *lake.CDF_COLUMNS
    )
    if first_version == 0:
        return Recorded(0, since)
    (micros,) = newest_before(spark, settings, view, first_version - 1, since).select(
        F.unix_micros("newest")
    ).first() or (None,)
    # As a literal: no second pass over silver where it is used.
    newest = spark.range(1).select(
        F.timestamp_micros(F.lit(micros)).alias("newest")
        if micros is not None
        else F.lit(None).cast("timestamp").alias("newest")
    )
    # Read after this batch's MERGE: a session is placed in gold as recomputed
    # (fixed windows, an hour say, are placed from the event alone).
    gold = None if view.fixed_windows else spark.read.format("delta").load(gold_path)
    found = restated(view, landed, silver, gold, newest).localCheckpoint(eager=True)
    n = found.count()
    if n:
        # Insert-if-absent, so a retry after a concurrent commit is harmless.
        lake.retry_on_conflict(
            lambda: (
                DeltaTable.forPath(spark, RESTATEMENTS.path(settings))
                .alias("t")
                .merge(found.alias("s"), lake.merge_condition(_RESTATEMENT_KEY))
                .whenNotMatchedInsertAll()
                .execute()
            ),
            f"restatements of {view.table_name}",
        )
    return Recorded(n, micros if micros is not None else since)
