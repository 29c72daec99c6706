"""Running a view version: the same code for a live stream, a replay and a batch.

The unit of work is `apply_changes`: given silver rows that changed (a
micro-batch of silver's change feed, or all of silver), find the scopes they
touch, recompute exactly those from silver, and replace them in the gold
table with one MERGE. Recomputing from silver rather than folding the change
into old results is what makes the answer independent of arrival order,
micro-batch boundaries and lateness; replacing whole scopes makes a repeated
micro-batch harmless.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from spark_jobs.views.base import View
from warehouse import catalog, registry
from warehouse.settings import Settings

SILVER = registry.SILVER_EVENTS

log = logging.getLogger(__name__)


def ensure_gold(spark: SparkSession, path: str, view: View) -> None:
    DeltaTable.createIfNotExists(spark).location(path).addColumns(view.schema).execute()


def apply_changes(
    spark: SparkSession, path: str, view: View, changed: DataFrame, silver: DataFrame
) -> int:
    """Recompute the scopes `changed` touches from `silver`; replace them in gold at `path`.

    Returns the number of scopes recomputed.
    """
    scopes = view.scopes_of(changed, silver).localCheckpoint(eager=True)
    n_scopes = scopes.count()
    if not n_scopes:
        return 0
    scope_cols = list(view.scope)
    key = list(view.key)
    fresh = view.compute(view.restrict(silver, scopes)).select(
        *[F.col(f.name).cast(f.dataType) for f in view.schema.fields]
    )
    gold = DeltaTable.forPath(spark, path)
    # Rows of a touched scope that the recompute no longer produces (e.g. two
    # sessions merged into one) are deleted; the rest are upserted.
    gone = (
        gold.toDF()
        .join(F.broadcast(scopes), scope_cols, "left_semi")
        .join(fresh.select(*key), key, "left_anti")
    )
    source = fresh.withColumn("_op", F.lit("upsert")).unionByName(
        gone.withColumn("_op", F.lit("delete"))
    )
    condition = " AND ".join(f"t.{k} = s.{k}" for k in key)
    values: dict[str, str | Column] = {f.name: f"s.{f.name}" for f in view.schema.fields}
    (
        gold.alias("t")
        .merge(source.alias("s"), condition)
        .whenMatchedDelete(condition="s._op = 'delete'")
        .whenMatchedUpdate(condition="s._op = 'upsert'", set=values)
        .whenNotMatchedInsert(condition="s._op = 'upsert'", values=values)
        .execute()
    )
    return n_scopes


# -- modes -------------------------------------------------------------------------------
def gold_table(view: View) -> registry.Table:
    return registry.gold_view_table(view.name, view.version)


def silver_version(spark: SparkSession, settings: Settings) -> int:
    """The newest commit of silver: the log position a replay is built from."""
    (last,) = (
        DeltaTable.forPath(spark, SILVER.path(settings)).history(1).select("version").collect()
    )
    return int(last["version"])


def read_silver(spark: SparkSession, settings: Settings, version: int | None = None) -> DataFrame:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(SILVER.path(settings))


def batch(spark: SparkSession, settings: Settings, view: View, *, as_of: int | None = None) -> int:
    """Recompute the whole view from silver (as of a version) into its gold table.

    Returns the silver version the table now reflects.
    """
    version = silver_version(spark, settings) if as_of is None else as_of
    table = gold_table(view)
    answer = view.compute(read_silver(spark, settings, version)).select(
        *[F.col(f.name).cast(f.dataType) for f in view.schema.fields]
    )
    (
        answer.write.format("delta")
        .mode("overwrite")
        .option("overwriteSchema", "true")
        .save(table.path(settings))
    )
    catalog.publish(table, settings)
    log.info("%s: recomputed from silver version %d", table.trino_name, version)
    return version


def stream(
    spark: SparkSession,
    settings: Settings,
    view: View,
    *,
    after_version: int | None = None,
    trigger: str | None = None,
    available_now: bool = False,
) -> StreamingQuery:
    """Follow silver's change feed into the view's gold table.

    `after_version` is where a replay ended: the stream starts at the next
    commit, so nothing is missed and nothing counted twice. Once the stream
    has a checkpoint, the checkpoint decides and `after_version` is ignored.
    """
    table = gold_table(view)
    path = table.path(settings)
    ensure_gold(spark, path, view)
    catalog.publish(table, settings)
    checkpoint = table.checkpoint(settings)
    # Where the replay ended, kept beside the stream's checkpoint. The stream
    # starts *at* that commit (a change feed cannot start at a version that
    # does not exist yet) and skips it and everything before.
    marker = Path(checkpoint) / "regauge_replayed_through"
    if after_version is not None:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(f"{after_version}\n")
    floor = int(marker.read_text()) if marker.exists() else -1
    reader = spark.readStream.format("delta").option("readChangeFeed", "true")
    if floor >= 0:
        reader = reader.option("startingVersion", floor)
    relevant = F.col("event_type").isin(*view.event_types) & (F.col("_commit_version") > floor)

    def each_batch(changes: DataFrame, batch_id: int) -> None:
        # Pre-images matter too: a replaced winner may leave a scope it was in.
        changed = changes.where(relevant).drop(
            "_change_type", "_commit_version", "_commit_timestamp"
        )
        n = apply_changes(spark, path, view, changed, read_silver(spark, settings))
        if n:
            log.info("%s batch %d: %d scopes recomputed", table.trino_name, batch_id, n)

    writer = (
        reader.load(SILVER.path(settings))
        .writeStream.queryName(f"{view.table_name}")
        .foreachBatch(each_batch)
        .option("checkpointLocation", checkpoint)
    )
    writer = (
        writer.trigger(availableNow=True)
        if available_now
        else writer.trigger(processingTime=trigger or settings.trigger_interval)
    )
    return writer.start()


def has_checkpoint(settings: Settings, view: View) -> bool:
    return (Path(gold_table(view).checkpoint(settings)) / "offsets").is_dir()


def replay(spark: SparkSession, settings: Settings, view: View) -> int:
    """Rebuild the view from all of silver up to its newest commit; return that position.

    The stream to follow it must start right after the returned version
    (`stream(after_version=...)`), with a fresh checkpoint, which this clears.
    """
    shutil.rmtree(gold_table(view).checkpoint(settings), ignore_errors=True)
    return batch(spark, settings, view)
