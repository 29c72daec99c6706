"""The small-file phase: what a table's small files cost a Trino query, and what
maintenance gives back.

A table that grows by one-row appends, with Delta's auto compaction on (as
view versions' tables had it before they were laid out by time), gets
`small_file_commits` one-row commits, as a stream's quiet hours leave behind.
Trino's p50 over it then, divided by its p50 after `regauge maintain`'s work
on the table (OPTIMIZE, checkpoint, VACUUM), is the penalty. The table
lives in a schema of its own (`bench`) in the lake, so Trino can read it and
nothing else (maintenance, the audit) ever sees it; it is removed afterwards.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from warehouse.base.registry import Table
from warehouse.tools.bench.context import Bench
from warehouse.tools.bench.latency import percentile, query_latency

TABLE = Table("bench", "small_files")
SCHEMA = "window_start timestamp, currency string, revenue decimal(18,2), orders bigint"
PROGRESS_EVERY = 100  # commits between two progress lines


def small_files(bench: Bench, spark: Any) -> None:
    from pyspark.sql.types import StructType

    from spark_jobs.engine import gold_writes, lake, maintenance
    from warehouse.sql import catalog, trino_client

    settings, commits = bench.settings, bench.sizes.small_file_commits
    path = TABLE.path(settings)
    catalog.unpublish(TABLE, settings)
    lake.delete_tree(spark, path)
    schema = StructType.fromDDL(SCHEMA)
    assert isinstance(schema, StructType)
    # Auto compaction on, so the figure stays comparable with earlier runs'.
    lake.ensure_table(
        spark, path, schema, {**gold_writes.GOLD_PROPERTIES, gold_writes.AUTO_COMPACT: "true"}
    )
    started = time.monotonic()
    first = datetime(2026, 1, 1)
    for i in range(commits):
        row = (first + timedelta(hours=i), "EUR", Decimal(i) / 2, i)
        spark.createDataFrame([row], schema).write.format("delta").mode("append").save(path)
        if (i + 1) % PROGRESS_EVERY == 0:
            took = time.monotonic() - started
            bench.say(f"  {i + 1:,} of {commits:,} one-row commits ({took:.0f} s)")
    catalog.publish(TABLE, settings)
    sql = f"SELECT currency, sum(revenue), sum(orders) FROM {TABLE.trino_name} GROUP BY currency"
    try:
        trino_client.flush_lake_cache(settings)
        before = query_latency(settings, sql, bench.sizes.queries)
        files = maintenance.files_in(spark, path)
        with lake.vacuum_session(spark):
            done = maintenance.maintain(spark, path, 0.0)
        trino_client.flush_lake_cache(settings)
        after = query_latency(settings, sql, bench.sizes.queries)
    finally:
        catalog.unpublish(TABLE, settings)
        lake.delete_tree(spark, path)
    f, b = bench.report.figures, bench.report.baselines
    f["small_files_query_p50_ms"] = percentile(before, 50)
    b["maintained_query_p50_ms"] = percentile(after, 50)
    f["small_file_penalty"] = f["small_files_query_p50_ms"] / b["maintained_query_p50_ms"]
    bench.report.notes["small files"] = (
        f"{commits:,} one-row commits left {files:,} files; maintenance left "
        f"{done.files_after} ({done.seconds:.1f} s)"
    )
    bench.say(
        f"small files: Trino p50 {f['small_files_query_p50_ms']:.0f} ms over {files:,} files, "
        f"{b['maintained_query_p50_ms']:.0f} ms after maintenance: penalty "
        f"{f['small_file_penalty']:.2f}"
    )
