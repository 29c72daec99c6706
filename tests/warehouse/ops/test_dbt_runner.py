"""How `regauge dbt` calls dbt, and which lake tables it puts in Spark's catalog."""

from __future__ import annotations

import json
from dataclasses import replace

from pyspark.sql import SparkSession

from warehouse.base import registry
from warehouse.base.settings import Settings
from warehouse.ops import dbt_runner


def test_project_profile_and_lake_are_added_unless_given(settings: Settings):
    args = dbt_runner.dbt_args(settings, ["build", "--select", "fct_orders+"], dbt_runner.DBT_DIR)
    assert args[:3] == ["build", "--select", "fct_orders+"]
    assert args[args.index("--project-dir") + 1] == str(dbt_runner.DBT_DIR)
    assert json.loads(args[args.index("--vars") + 1]) == {"lake_root": settings.lake_root}
    mine = dbt_runner.dbt_args(settings, ["ls", "--project-dir", "/x"], dbt_runner.DBT_DIR)
    assert mine.count("--project-dir") == 1 and "/x" in mine
    assert dbt_runner.dbt_args(settings, ["--help"], dbt_runner.DBT_DIR) == ["--help"]


def test_the_profile_is_the_in_process_session_on_the_marts_schema(settings: Settings):
    out = dbt_runner.profile(settings)["regauge"]
    assert isinstance(out, dict)
    target = out["outputs"][out["target"]]
    assert (target["type"], target["method"], target["schema"]) == ("spark", "session", "marts")


def test_the_catalog_is_silver_and_the_delta_tables_the_lake_holds(
    spark: SparkSession, settings: Settings, tmp_path
):
    s = replace(settings, lake_root=str(tmp_path))
    (tmp_path / "marts" / "fct_orders" / "_delta_log").mkdir(parents=True)
    (tmp_path / "marts" / "half_written").mkdir(parents=True)  # no Delta log: not a table
    (tmp_path / "staging" / "stg_shop__orders" / "_delta_log").mkdir(parents=True)
    assert dbt_runner.lake_tables(spark, s) == [
        registry.SILVER_EVENTS,
        registry.Table("staging", "stg_shop__orders"),
        registry.mart("fct_orders"),
    ]
