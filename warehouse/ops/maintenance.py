"""`regauge maintain`: compact, checkpoint and VACUUM every table regauge writes.

What runs on each table, and how long its files are kept, is in
`spark_jobs.engine.maintenance`: the configured retention
(`REGAUGE_MAINTENANCE_RETENTION_HOURS`, 7 days by default), made longer for a
table while a reader (a stream's checkpoint, a replay waiting for its stream,
the audit's time travel) still needs an older version. It runs beside ingest
and the streams: OPTIMIZE changes no data, and a writer it conflicts with
retries. The `regauge_maintenance` DAG runs it every day.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from warehouse.base.settings import Settings

log = logging.getLogger(__name__)


def maintain(
    settings: Settings,
    tables: Sequence[str] = (),
    retention_hours: float | None = None,
    dry_run: bool = False,
) -> list[list[str]]:
    """Maintain `tables` (`schema.name`; all when empty); the rows of a report table.
    With `dry_run`, only say what the retention of each would be and why."""
    from spark_jobs.engine import lake
    from spark_jobs.engine import maintenance as jobs
    from spark_jobs.engine.session import build_session

    floor = settings.maintenance_retention_hours if retention_hours is None else retention_hours
    if floor < jobs.MIN_RETENTION_HOURS:
        log.info(
            "retention %g h raised to %g h: a write under way has files it has not committed yet",
            floor,
            jobs.MIN_RETENTION_HOURS,
        )
        floor = jobs.MIN_RETENTION_HOURS
    spark = build_session("regauge-maintain", settings, ui=False, one_shot=True)
    try:
        every = jobs.lake_tables(spark, settings)
        paths = every
        if tables:
            by_name = {jobs.table_name(p): p for p in every}
            unknown = sorted(set(tables) - set(by_name))
            if unknown:
                raise ValueError(
                    f"no table {', '.join(unknown)} in the lake; known: {', '.join(by_name)}"
                )
            paths = [by_name[t] for t in tables]
        # The readers of every table, not only the chosen ones: a stream writing
        # one table reads another.
        pins = jobs.pins(spark, settings, every)
        for pin in pins:
            log.info("%s v%d is needed by %s", jobs.table_name(pin.path), pin.version, pin.reader)
        now = time.time()
        # View versions' tables are laid out by their window start, not bin-packed.
        orders = jobs.time_columns(settings)

        def one(n: int, path: str) -> list[str]:
            hours, held = jobs.retention_for(spark, path, pins, floor, now)
            why = f"kept for {held.reader} (v{held.version})" if held else "configured"
            name = jobs.table_name(path)
            if dry_run:
                return [name, str(jobs.files_in(spark, path)), f"{hours:g} h", why]
            log.info("[%d/%d] %s: retention %g h (%s)", n, len(paths), name, hours, why)
            done = jobs.maintain(spark, path, hours, held, orders.get(path))
            log.info(
                "[%d/%d] %s: %d files -> %d (OPTIMIZE replaced %d), checkpoint at v%s, "
                "VACUUM deleted %d files, %.1f s",
                n,
                len(paths),
                done.name,
                done.files_before,
                done.files_after,
                done.compacted,
                done.checkpoint,
                done.vacuumed,
                done.seconds,
            )
            return [
                done.name,
                f"{done.files_before} -> {done.files_after}",
                str(done.vacuumed),
                f"{hours:g} h",
                "; ".join([why, *done.notes]),
                f"{done.seconds:.1f}",
            ]

        # One table at a time: side by side (3 threads) took longer on 2 cores, 107 s
        # for 19 tables against 90 s, the work being Spark jobs that use the cores.
        with lake.vacuum_session(spark):
            rows = [one(n, path) for n, path in enumerate(paths, start=1)]
    finally:
        spark.stop()
    if not dry_run:
        from warehouse.sql import trino_client

        trino_client.flush_lake_cache(settings)
    return rows


HEADER = ["table", "files", "deleted", "retention", "why", "seconds"]
DRY_RUN_HEADER = ["table", "files", "retention", "why"]
