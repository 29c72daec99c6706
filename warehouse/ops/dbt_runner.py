"""`regauge dbt ARGS…`: dbt-spark (session method) in this process, on the lake.

Why no metastore: Spark's default catalog for dbt would be a Hive metastore in
an embedded Derby database, which one JVM at a time may open. A dbt run would
then lock out every other job that opens it, and two dbt tasks Airflow runs
side by side would lock out each other. Here, instead, every run rebuilds
Spark's in-memory catalog from the lake's own layout: `silver.shop_events`
plus every Delta table under `<lake>/staging` and `<lake>/marts`. The Delta
log is the only catalog there is. Streaming jobs read and write by path, so dbt
and the streams share nothing but Delta's optimistic concurrency, on tables
that neither writes to the other's.

dbt-spark's session method calls `SparkSession.builder.getOrCreate()`, which
returns the session made here (Delta, UTC, the cached jars), so dbt's SQL runs
in it. The profile is written from the settings; nobody edits it.

After a command that builds models, each mart is published to Trino as
`lakehouse.marts.<model>` (`<model>_v<N>` for a versioned one).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from warehouse.base import registry
from warehouse.base.settings import REPO_ROOT, Settings

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

DBT_DIR = REPO_ROOT / "dbt"
PROFILE = "regauge"
TARGET = "lake"
HELP = {"--help", "-h", "--version"}
# dbt commands that never run SQL get no Spark session, so `regauge dbt ls` stays quick.
NO_SQL = {"ls", "list", "parse", "deps", "clean", "debug", *HELP}
BUILDS = {"build", "run", "seed", "snapshot"}


def state_dir(settings: Settings) -> Path:
    return settings.state_dir / "dbt"


def profile(settings: Settings) -> dict[str, object]:
    """profiles.yml as data: one target, the in-process Spark session."""
    return {
        PROFILE: {
            "target": TARGET,
            "outputs": {
                TARGET: {
                    "type": "spark",
                    "method": "session",
                    "host": "NA",  # required by dbt-spark, unused by the session method
                    "schema": registry.MARTS_SCHEMA,
                    "threads": 1,
                }
            },
        }
    }


def write_profiles(settings: Settings) -> Path:
    """Write profiles.yml from the settings; return its directory."""
    target = state_dir(settings)
    target.mkdir(parents=True, exist_ok=True)
    (target / "profiles.yml").write_text(
        # JSON is YAML, and needs no YAML library here.
        "# Written by warehouse/ops/dbt_runner.py from the settings; edits are overwritten.\n"
        + json.dumps(profile(settings), indent=2)
    )
    return target


def lake_tables(spark: SparkSession, settings: Settings) -> list[registry.Table]:
    """silver.shop_events and every dbt relation the lake already holds.

    Listed through Hadoop's FileSystem, as Spark reaches the lake, so a local
    folder and an s3a:// bucket are read by the same code."""
    from spark_jobs.engine import lake

    found = [registry.SILVER_EVENTS]
    root = settings.lake_root.rstrip("/")
    for schema in registry.DBT_SCHEMAS:
        found += [
            registry.Table(schema, name)
            for name in sorted(lake.list_names(spark, f"{root}/{schema}"))
            if lake.exists(spark, f"{root}/{schema}/{name}/_delta_log")
        ]
    return found


def register_lake_tables(spark: SparkSession, settings: Settings) -> list[registry.Table]:
    """Spark's in-memory catalog, rebuilt from the lake's layout (see the module doc)."""
    from warehouse.base.sqlnames import check_identifier, quote_location

    tables = lake_tables(spark, settings)
    for schema in {"silver", *registry.DBT_SCHEMAS}:
        spark.sql(f"CREATE DATABASE IF NOT EXISTS `{check_identifier(schema, 'schema')}`")
    for t in tables:
        name = f"`{check_identifier(t.schema, 'schema')}`.`{check_identifier(t.name, 'table')}`"
        spark.sql(
            f"CREATE TABLE IF NOT EXISTS {name} USING delta "
            f"LOCATION {quote_location(t.path(settings))}"
        )
    return tables


def dbt_args(settings: Settings, args: Sequence[str], profiles: Path) -> list[str]:
    """The caller's args, plus the project, profile and lake unless the caller set them."""
    out = list(args)
    if not out or out[0] in HELP:
        return out
    if "--project-dir" not in out:
        out += ["--project-dir", str(DBT_DIR)]
    if "--profiles-dir" not in out:
        out += ["--profiles-dir", str(profiles)]
    if "--vars" not in out and out[0] not in ("clean", "deps"):
        out += ["--vars", json.dumps({"lake_root": settings.lake_root})]
    return out


def publish_marts(spark: SparkSession, settings: Settings) -> list[str]:
    """Register every mart in Trino (a no-op for those it knows already)."""
    from warehouse.sql import catalog

    marts = [t for t in lake_tables(spark, settings) if t.schema == registry.MARTS_SCHEMA]
    for t in marts:
        catalog.publish(t, settings)
    return [t.trino_name for t in marts]


def run(settings: Settings, args: Sequence[str]) -> int:
    """Run one dbt command the way `dbt` would; its exit code."""
    from dbt.cli.main import dbtRunner

    profiles = write_profiles(settings)
    # dbt's own files (manifest, logs) go beside the stack's state, not into the repo.
    os.environ.setdefault("DBT_TARGET_PATH", str(state_dir(settings) / "target"))
    os.environ.setdefault("DBT_LOG_PATH", str(state_dir(settings) / "logs"))
    # dbt would otherwise try to send usage events to the internet on every run.
    os.environ.setdefault("DBT_SEND_ANONYMOUS_USAGE_STATS", "false")
    command = next((a for a in args if not a.startswith("-")), "")
    spark = None
    if args and command not in NO_SQL and args[0] not in NO_SQL:
        from spark_jobs.engine.session import build_session

        # CREATE DATABASE makes a directory under the warehouse dir; keep it in the state.
        warehouse_dir = str(state_dir(settings) / "spark-warehouse")
        spark = build_session(
            "regauge-dbt",
            settings,
            ui=False,
            extra_conf={"spark.sql.warehouse.dir": warehouse_dir},
            one_shot=True,
        )
        tables = register_lake_tables(spark, settings)
        log.info("catalog rebuilt from the lake: %s", ", ".join(t.key for t in tables))
    try:
        # dbt logs its process's command line as `invocation_command`: in-process that
        # would be regauge's, e.g. an erasure's `forget customer ID` (docs/contract.md §8).
        argv, sys.argv = sys.argv, ["dbt", *args]
        try:
            result = dbtRunner().invoke(dbt_args(settings, args, profiles))
        finally:
            sys.argv = argv
        if result.exception is not None:
            print(f"regauge dbt: {result.exception}", file=sys.stderr)
            return 2
        if not result.success:
            return 1
        if command in BUILDS and spark is not None:
            for name in publish_marts(spark, settings):
                print(f"published {name}")
        return 0
    finally:
        if spark is not None:
            spark.stop()
