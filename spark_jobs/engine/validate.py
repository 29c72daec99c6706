"""The validation gate a new view version passes before anyone is routed to it.

Two checks, both against one silver snapshot so they hold while events keep
flowing:

1. *Its own code*: the gold table, as of its newest commit tagged with a
   silver version E, equals a batch recompute of the view over silver as of E.
   The runner tags every gold commit with the silver version it was computed
   from, which is what makes this exact rather than "close enough".
2. *What it shares with the current version*: the columns a view declares in
   `agrees_with` (revenue_hourly v2's gross_revenue is v1's revenue) match the
   current version's function over the same snapshot, key by key.

Same-named columns must also have the same type, or the serving view could
not union them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import reduce
from typing import Any, NamedTuple

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.engine import gold_writes, marks, runner
from spark_jobs.engine.inputs import Position
from spark_jobs.engine.progress import Progress
from spark_jobs.views.base import View
from warehouse.base.settings import Settings

log = logging.getLogger(__name__)

EXAMPLES = 3


def type_clashes(view: View, other: View) -> list[str]:
    """Same-named columns whose types differ between two versions."""
    theirs = {f.name: f.dataType for f in other.schema.fields}
    return [
        f"{f.name}: {f.dataType.simpleString()} in v{view.version}, "
        f"{theirs[f.name].simpleString()} in v{other.version}"
        for f in view.schema.fields
        if f.name in theirs and theirs[f.name] != f.dataType
    ]


def disagreements(
    key: list[str], mine: DataFrame, other: DataFrame, columns: Mapping[str, str]
) -> DataFrame:
    """Keys where a shared column differs, or that only one side has (NULL-safe)."""
    return compared(key, mine, other, columns).where("_differs").drop("_differs")


def compared(
    key: list[str], mine: DataFrame, other: DataFrame, columns: Mapping[str, str]
) -> DataFrame:
    """Every key of either side, its shared columns from both, and `_differs`:
    whether they disagree or only one side has the key (NULL-safe)."""
    left = mine.select(*key, *[F.col(c).alias(f"new_{c}") for c in columns])
    right = other.select(
        *key,
        *[F.col(theirs).alias(f"old_{c}") for c, theirs in columns.items()],
        F.lit(True).alias("_old"),
    )
    joined = left.withColumn("_new", F.lit(True)).join(right, key, "full_outer")
    differs: list[Column] = [F.col("_new").isNull(), F.col("_old").isNull()] + [
        ~F.col(f"new_{c}").eqNullSafe(F.col(f"old_{c}")) for c in columns
    ]
    return joined.withColumn("_differs", reduce(lambda a, b: a | b, differs)).drop("_new", "_old")


class Difference(NamedTuple):
    """Two tables compared as multisets of rows (what exceptAll both ways finds)."""

    rows: int
    expected_rows: int
    missing: int
    unexpected: int
    # Rows with `_count`: how many more times the side they are missing from needs them.
    missing_rows: DataFrame
    unexpected_rows: DataFrame


def difference(have: DataFrame, want: DataFrame) -> Difference:
    """Compare `have` with `want` row for row, duplicates counted, NULLs equal.

    One job groups both sides' rows by every column, counts them per side and
    totals the counts. That is `exceptAll` both ways (which Spark plans as the
    same grouping, once per direction) and four counts in one job instead of
    six: on 2 cores each job's fixed cost, not the rows, was most of the gate's
    time. The rows themselves are computed again only when there is a
    difference to show.
    """
    columns = have.columns
    sides = (have.withColumn("_have", F.lit(1)).withColumn("_want", F.lit(0))).unionByName(
        want.withColumn("_have", F.lit(0)).withColumn("_want", F.lit(1))
    )
    grouped = sides.groupBy(*columns).agg(
        F.sum("_have").alias("_have"), F.sum("_want").alias("_want")
    )
    totals = grouped.agg(
        F.sum("_have"),
        F.sum("_want"),
        F.sum(F.greatest(F.col("_want") - F.col("_have"), F.lit(0))),
        F.sum(F.greatest(F.col("_have") - F.col("_want"), F.lit(0))),
    ).first()
    rows, expected, missing, unexpected = (int(v or 0) for v in (totals or (0, 0, 0, 0)))
    return Difference(
        rows,
        expected,
        missing,
        unexpected,
        grouped.where("_want > _have").select(
            *columns, (F.col("_want") - F.col("_have")).alias("_count")
        ),
        grouped.where("_have > _want").select(
            *columns, (F.col("_have") - F.col("_want")).alias("_count")
        ),
    )


def _examples(df: DataFrame) -> list[dict[str, Any]]:
    return [
        {k: (v.isoformat() if isinstance(v, datetime) else str(v)) for k, v in r.asDict().items()}
        for r in df.limit(EXAMPLES).collect()
    ]


def _self_check(
    spark: SparkSession, settings: Settings, view: View, found: tuple[int, Position, str]
) -> dict[str, Any]:
    gold_version, position, source = found
    have = runner.read_gold(spark, settings, view, gold_version)
    silver = runner.read_input(spark, settings, view, position)
    want = gold_writes.gold_rows(view, silver)
    events = silver.where(F.col("event_type").isin(*view.event_types)).count()
    label = f"validate {view.table_name} against {position.describe()}"
    with Progress(spark, label, events) as progress:
        diff = difference(have, want)
    log.info("%s: %s", label, progress.summary())
    return {
        "gold_version": gold_version,
        "silver_version": position.json(),
        "built_from": source,
        "rows": diff.rows,
        "expected_rows": diff.expected_rows,
        "missing": diff.missing,
        "unexpected": diff.unexpected,
        # Examples only when there is something to show: each is a job of its own.
        "missing_examples": _examples(diff.missing_rows) if diff.missing else [],
        "unexpected_examples": _examples(diff.unexpected_rows) if diff.unexpected else [],
    }


def validate(
    spark: SparkSession,
    settings: Settings,
    view: View,
    current: View | None,
    settle_s: float = 0.0,
) -> dict[str, Any]:
    """Run the gate; return its report (`passed`, `summary` and the details).

    `settle_s`: how long a mismatch may be waited out while the live stream
    moves on. Zero for a replay from bronze, which is exact at once; a replay
    from Kafka can be ahead of silver until ingest catches up.
    """
    path = gold_writes.gold_table(view).path(settings)
    deadline = time.monotonic() + settle_s
    attempts = 0
    while True:
        attempts += 1
        found = marks.latest_tag(spark, path)
        if found is None:
            check: dict[str, Any] = {"error": "no gold commit is tagged with a silver version"}
        else:
            check = _self_check(spark, settings, view, found)
            position = found[1]
            log.info(
                "%s v%d as of gold version %d = batch over %s? %d rows, %d missing, %d unexpected",
                view.name,
                view.version,
                check["gold_version"],
                position.describe(),
                check["rows"],
                check["missing"],
                check["unexpected"],
            )
            if not (check["missing"] or check["unexpected"]):
                break
        if time.monotonic() >= deadline:
            break
        # Wait for the live stream's next commit, then look again.
        while time.monotonic() < deadline and marks.latest_tag(spark, path) == found:
            time.sleep(5)
    check["attempts"] = attempts
    report: dict[str, Any] = {
        "view": view.name,
        "version": view.version,
        "checked_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "self_check": check,
    }
    ok = "error" not in check and not (check["missing"] or check["unexpected"])
    problems: list[str] = []
    if not ok:
        problems.append(
            check.get("error")
            or f"the table differs from its own code: {check['missing']} rows missing, "
            f"{check['unexpected']} unexpected"
        )
    if current is not None and current.version != view.version:
        clashes = type_clashes(view, current)
        report["type_clashes"] = clashes
        if clashes:
            problems.append("column types differ from the current version: " + "; ".join(clashes))
        columns = view.agrees_with.get(current.version)
        if columns and ok and found is not None:
            # The current version's input as of the same snapshot of each source.
            silver = runner.read_input(
                spark, settings, current, Position.of(current, found[1].as_dict())
            )
            mine = (
                spark.read.format("delta").option("versionAsOf", check["gold_version"]).load(path)
            )
            theirs = gold_writes.gold_rows(current, silver)
            both = compared(list(view.key), mine, theirs, columns)
            counts = both.agg(F.count(F.lit(1)), F.count_if(F.col("_differs"))).first()
            keys, n = (int(c or 0) for c in (counts or (0, 0)))
            report["shared_with"] = {
                "version": current.version,
                "columns": columns,
                "silver_version": check["silver_version"],
                "keys_compared": keys,
                "disagreements": n,
                "examples": _examples(both.where("_differs").drop("_differs")) if n else [],
            }
            if n:
                problems.append(
                    f"{n} keys disagree with v{current.version} on "
                    + ", ".join(f"{c}={theirs_c}" for c, theirs_c in columns.items())
                )
        elif not columns:
            report["shared_with"] = {
                "version": current.version,
                "note": f"v{view.version} declares no columns it shares with v{current.version}",
            }
    report["passed"] = not problems
    # Without problems a tagged commit was found (no tag is a problem).
    over = found[1].describe() if found is not None else ""
    report["summary"] = (
        "; ".join(problems)
        if problems
        else f"equals its batch recompute over {over}"
        + (
            f" and agrees with v{current.version}"
            if current is not None and "disagreements" in report.get("shared_with", {})
            else ""
        )
    )
    return report
