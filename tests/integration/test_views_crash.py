"""kill -9 a view mid-replay and mid-stream; rerunning the same command leaves it exact."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from chispa import assert_df_equality

from spark_jobs import ingest, producer, views
from spark_jobs.views import runner
from tests.integration.landing import fresh_seed
from warehouse.settings import REPO_ROOT

VIEW = ("cart_sessions", 1)


def _views_run(log: Path, mode: str) -> subprocess.Popen[bytes]:
    name, version = VIEW
    with log.open("ab") as out:
        return subprocess.Popen(
            [
                *(sys.executable, "-m", "warehouse.cli", "views", "run", name),
                *("--version", str(version), "--mode", mode, "--until-caught-up"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            start_new_session=True,
        )


def _kill_when(proc: subprocess.Popen[bytes], log: Path, marker: str, extra_s: float) -> None:
    """kill -9 the run (driver and JVM) `extra_s` after `marker` shows in its log."""
    deadline = time.monotonic() + 240
    while marker not in log.read_text(errors="replace"):
        assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, f"never saw {marker!r}"
        time.sleep(0.2)
    time.sleep(extra_s)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def _finish(log: Path, mode: str) -> None:
    proc = _views_run(log, mode)
    assert proc.wait(600) == 0, log.read_text(errors="replace")[-3000:]


def test_a_view_killed_mid_replay_and_mid_stream_equals_its_batch_recompute(
    stack, settings, spark, tmp_path
):
    rng = random.Random()
    log = tmp_path / "views.log"
    producer.produce_generated(settings, seed=fresh_seed(), count=10_000, chaos=True)
    ingest.run_once(spark, settings)

    _kill_when(_views_run(log, "replay"), log, "events to process", rng.uniform(0, 4))
    _finish(log, "replay")

    producer.produce_generated(settings, seed=fresh_seed(), count=5_000, chaos=True)
    ingest.run_once(spark, settings)
    offset = log.stat().st_size
    proc = _views_run(log, "stream")
    # Killed while it applies the new events (after the stream has started).
    _kill_when(proc, log, "cart_sessions_v1", rng.uniform(5, 20))
    assert log.stat().st_size > offset
    _finish(log, "stream")

    view = views.get(*VIEW)
    gold = spark.read.format("delta").load(runner.gold_table(view).path(settings))
    expected = view.compute(runner.read_silver(spark, settings))
    assert_df_equality(
        gold, expected, ignore_row_order=True, ignore_nullable=True, ignore_column_order=True
    )
