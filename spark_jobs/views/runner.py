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

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.views.base import View

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
