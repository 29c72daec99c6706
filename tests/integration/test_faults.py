"""A crash between a micro-batch's Delta commits and its checkpoint commit.

`REGAUGE_FAULT` (spark_jobs/faults.py) makes the process exit abruptly right
after the batch's commits, before Spark records the batch as done. On restart
the batch runs again, and the lake must come out exactly as if it had not.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from spark_jobs import faults, ingest, producer, views
from spark_jobs.views import runner
from tests.integration.landing import assert_exact, fresh_seed, landing
from warehouse import registry
from warehouse.settings import Settings


def next_batch(checkpoint: str) -> int:
    done = [int(p.name) for p in (Path(checkpoint) / "commits").glob("[0-9]*")]
    return max(done, default=-1) + 1


def crash_between_commit_and_checkpoint(checkpoint: str, point: str, argv: list[str]) -> int:
    """Run argv with the fault armed for its next batch; check where it died."""
    batch = next_batch(checkpoint)
    proc = subprocess.run(
        [sys.executable, "-m", "warehouse.cli", *argv],
        env={**os.environ, faults.ENV: f"{point}:{batch}"},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 137, proc.stdout[-2000:] + proc.stderr[-2000:]
    # The batch was planned (its offsets written) but never marked done.
    assert (Path(checkpoint) / "offsets" / str(batch)).exists()
    assert not (Path(checkpoint) / "commits" / str(batch)).exists()
    return batch


def test_silver_crashing_after_its_commits_loses_and_doubles_nothing(
    stack, settings: Settings, spark: SparkSession
):
    run = producer.produce_generated(settings, seed=fresh_seed(), count=3000, chaos=True)
    crash_between_commit_and_checkpoint(
        registry.SILVER_EVENTS.checkpoint(settings), "silver_after_commit", ["ingest-once"]
    )
    # The crashed batch's appends are already in the lake; the rerun must skip them.
    ingest.run_once(spark, settings)
    assert_exact(run, landing(spark, settings, run))


def test_a_view_crashing_after_its_commit_ends_equal_to_its_code(
    stack, settings: Settings, spark: SparkSession
):
    view = views.get("revenue_hourly", 1)
    if not runner.has_checkpoint(settings, view):
        runner.replay(spark, settings, view)
        runner.stream(spark, settings, view, available_now=True).awaitTermination()
    producer.produce_generated(settings, seed=fresh_seed(), count=2000, chaos=True)
    ingest.run_once(spark, settings)
    argv = [
        "views",
        "run",
        view.name,
        "--version",
        str(view.version),
        "--mode",
        "stream",
        "--until-caught-up",
    ]
    crash_between_commit_and_checkpoint(
        runner.gold_table(view).checkpoint(settings), "view_after_commit", argv
    )
    runner.stream(spark, settings, view, available_now=True).awaitTermination()
    gold = spark.read.format("delta").load(runner.gold_table(view).path(settings))
    want = runner.gold_rows(view, runner.read_silver(spark, settings))
    assert gold.exceptAll(want).count() == 0
    assert want.exceptAll(gold).count() == 0
    assert gold.count() > 0
