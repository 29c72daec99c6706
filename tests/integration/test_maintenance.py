"""Table maintenance on the real lake, through its DAG: every table Trino publishes
reads the same afterwards, and the small files are gone from the newest version."""

from __future__ import annotations

import re

from spark_jobs.engine import lake, maintenance
from spark_jobs.testing.landing import fresh_seed
from warehouse.base import registry
from warehouse.ops import airflow_client, ingest_ctl, pipeline
from warehouse.sql import trino_client

DAG = "regauge_maintenance"


def _published(settings) -> list[str]:
    """The lake's tables Trino publishes (`schema.name`), views aside."""
    rows = trino_client.query(
        settings,
        f"SELECT table_schema || '.' || table_name FROM {registry.TRINO_LAKE_CATALOG}"
        ".information_schema.tables WHERE table_type = 'BASE TABLE' "
        "AND table_schema NOT IN ('information_schema', 'serving')",
    ).rows
    return sorted(str(r[0]) for r in rows)


def _counts(settings, versions: dict[str, int]) -> dict[str, int]:
    """Each table's row count at a version, through Trino, in one query (19 queries
    took half a minute)."""
    parts = [
        f"SELECT '{t}', count(*) FROM {registry.TRINO_LAKE_CATALOG}.{t} FOR VERSION AS OF {v}"
        for t, v in versions.items()
    ]
    rows = trino_client.query(settings, " UNION ALL ".join(parts)).rows
    return {str(t): int(n) for t, n in rows}


def test_the_dag_compacts_every_table_and_trino_reads_each_the_same(stack, settings, spark):
    # A small ingest: a new small file beside the ones bronze, silver and the ledger
    # have, whatever maintenance ran before.
    ingest_ctl.stop(settings)
    pipeline.produce(settings, seed=fresh_seed(), count=300)
    pipeline.ingest_once(spark, settings)
    paths = {maintenance.table_name(p): p for p in maintenance.lake_tables(spark, settings)}
    published = [t for t in _published(settings) if t in paths]
    assert set(registry.TABLES) <= set(published), published
    assert any(re.fullmatch(r"gold\.\w+_v\d+", t) for t in published), published
    # Fixed versions, so ingest or a stream committing meanwhile changes nothing compared.
    versions = {t: lake.newest_version(spark, paths[t]) for t in published}
    before = _counts(settings, versions)
    assert set(before) == set(published)
    files = {t: maintenance.files_in(spark, p) for t, p in paths.items()}

    airflow = airflow_client.Client(settings)
    run_id = airflow.run(DAG, {"retention_hours": 0})
    log = airflow.task_log(DAG, run_id, "maintain")

    # Below an hour, a write under way could lose files it has not committed yet.
    assert "retention 0 h raised to 1 h" in log
    # The one-shot driver's code cache held all the JIT compiled: with the first
    # tier's own 48 MB it filled in 27 s, and the compiler was off for the rest
    # (Settings.spark_one_shot_java_options).
    assert "CodeCache is full" not in log
    for table in paths:
        assert f"] {table}: retention " in log, table
    assert _counts(settings, versions) == before
    after = {t: maintenance.files_in(spark, p) for t, p in paths.items()}
    # Bin-packed, but a view version's table is laid out by time in files of a
    # fixed size: a table written in one big file can come out in several.
    by_time = set(maintenance.time_columns(settings))
    packed = [t for t, p in paths.items() if p not in by_time]
    assert len(packed) < len(paths)
    assert all(after[t] <= files[t] for t in packed), (files, after)
    for written in (registry.BRONZE_EVENTS, registry.SILVER_EVENTS, registry.SILVER_LEDGER):
        assert after[written.key] < files[written.key], (written.key, files, after)
    # The newest version reads too, after the cache Trino keeps of it was flushed.
    silver = registry.SILVER_EVENTS
    newest = trino_client.scalar(settings, f"SELECT count(*) FROM {silver.trino_name}")
    assert int(newest) >= before[silver.key]
