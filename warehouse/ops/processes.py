"""The main loops of the processes regauge runs for a long time: ingest, and each
view version's stream (`regauge ingest run`, `regauge views run`).

Each builds one Spark session, runs its queries until SIGTERM or SIGINT, and
stops them between micro-batches. `ingest_ctl` and `streams` start these same
commands detached, with pid and status files, so a daemon and a foreground run
are one code path.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from datetime import UTC, datetime

from spark_jobs import ingest
from spark_jobs.session import build_session
from spark_jobs.views import runner
from spark_jobs.views.base import View
from warehouse.base.settings import Settings
from warehouse.ops import ingest_ctl, pipeline, streams

log = logging.getLogger(__name__)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def run_ingest(settings: Settings, trigger: str | None) -> int:
    """Kafka -> bronze -> silver until stopped; exit 3 on a gap in the log."""
    stop = _stop_on_signals()
    spark = build_session("regauge-ingest", settings)
    try:
        pipeline.run_ingest(
            spark,
            settings,
            stop,
            trigger=trigger,
            status_file=ingest_ctl.daemon(settings).status_file,
        )
    except ingest.DataLossError as exc:
        print(f"regauge: {exc}", file=sys.stderr)
        return 3
    finally:
        spark.stop()
    log.info("ingest stopped")
    return 0


def run_view(
    settings: Settings,
    view: View,
    *,
    mode: str,
    source: str,
    trigger: str | None = None,
    until_caught_up: bool = False,
) -> int:
    """One view version: recompute once (batch), or replay then stream, or stream on."""
    table = runner.gold_table(view)
    spark = build_session(f"regauge-view-{view.table_name}", settings)
    try:
        if mode == "batch":
            version = pipeline.batch(spark, settings, view, source=source)
            print(f"{table.trino_name}: recomputed from {source} (silver version {version})")
            return 0
        if mode == "replay":
            after = pipeline.replay(spark, settings, view, source=source)
            print(
                f"{table.trino_name}: replayed {source} (silver up to version {after}); "
                "continuing live"
            )
        elif (
            not runner.has_checkpoint(settings, view)
            and runner.replayed_through(settings, view) < 0
        ):
            print(
                f"regauge: {table.trino_name} has no stream yet; start it with --mode replay",
                file=sys.stderr,
            )
            return 2
        query = pipeline.stream(
            spark, settings, view, trigger=trigger, available_now=until_caught_up
        )
        # `regauge streams` reads this to know the stream is up.
        status = streams.daemon(settings, view.name, view.version)
        status.write_status(state="running", pid=os.getpid(), since=datetime.now(UTC))
        stop = _stop_on_signals()
        while query.isActive and not stop.is_set():
            stop.wait(1.0)
        if query.isActive:
            query.stop()
        if query.exception() is not None:
            status.write_status(state="failed", error=str(query.exception()))
            print(
                f"regauge: {table.trino_name} stream failed: {query.exception()}", file=sys.stderr
            )
            return 1
        status.write_status(state="stopped", at=datetime.now(UTC))
        print(f"{table.trino_name}: stream stopped")
        return 0
    finally:
        spark.stop()
