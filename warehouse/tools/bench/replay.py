"""The replay phase: every view's code over all of silver, and DuckDB doing
revenue_hourly v1 alone over the same snapshot.

The history phase measures the same over its large scratch lake (`measure`), so
a run says how the replay scales: at the bench's default size, Spark's and
Delta's fixed cost per write is most of a view's time (docs/BENCHMARKS.md)."""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from warehouse.base.settings import Settings
from warehouse.tools.bench.context import Bench
from warehouse.tools.bench.report import Report


@dataclass(frozen=True)
class Replayed:
    """One measurement: silver's events, each view's seconds, DuckDB's seconds for v1."""

    events: int
    seconds: dict[str, float]
    duckdb_s: float

    @property
    def slowest(self) -> str:
        return max(self.seconds, key=lambda name: self.seconds[name])

    def events_per_s(self) -> float:
        """The slowest view's rate: the target is per view (issue 16)."""
        return self.events / self.seconds[self.slowest]

    def all_views_events_per_s(self) -> float:
        return self.events / sum(self.seconds.values())

    def vs_duckdb(self) -> float:
        return self.seconds["revenue_hourly_v1"] / self.duckdb_s

    def record(self, report: Report, prefix: str) -> None:
        """Into the run's figures and baselines, each name starting with `prefix`."""
        f, b = report.figures, report.baselines
        f[f"{prefix}_events"] = self.events
        f[f"{prefix}_events_per_s"] = self.events_per_s()
        f[f"{prefix}_vs_duckdb_time"] = self.vs_duckdb()
        for name, s in self.seconds.items():
            f[f"{prefix}_s_{name}"] = s
        b[f"{prefix}_duckdb_s"] = self.duckdb_s
        b[f"{prefix}_duckdb_events_per_s"] = self.events / self.duckdb_s


def replay(bench: Bench, spark: Any) -> None:
    """Every view's code over all of silver into scratch tables; DuckDB does v1 alone."""
    got = measure(bench, spark, bench.settings, bench.settings.state_dir / "bench" / "replay")
    got.record(bench.report, "replay")
    # The three views one after the other, beside the figure.
    bench.report.figures["replay_all_views_events_per_s"] = got.all_views_events_per_s()
    bench.report.notes["replay"] = f"the slowest view: {got.slowest}"
    bench.say(
        f"replay: {got.events:,} events through {len(got.seconds)} views in "
        f"{sum(got.seconds.values()):.1f} s ({got.all_views_events_per_s():,.0f} events/s); "
        f"the slowest, {got.slowest}, {got.events_per_s():,.0f} events/s; revenue_hourly v1 "
        f"alone {got.seconds['revenue_hourly_v1']:.1f} s, DuckDB {got.duckdb_s:.2f} s"
    )


def measure(bench: Bench, spark: Any, settings: Settings, scratch: Path) -> Replayed:
    """Every view's code over all of `settings`' silver at its newest version, each
    written as Delta under `scratch`, then DuckDB's v1 over the same version."""
    from spark_jobs import views
    from spark_jobs.engine import gold_writes, runner

    shutil.rmtree(scratch, ignore_errors=True)
    version = runner.silver_version(spark, settings)
    events = runner.read_silver(spark, settings, version).count()
    seconds: dict[str, float] = {}
    for (name, v), view in sorted(views.of_the_shop().items()):
        started = time.monotonic()
        (
            gold_writes.gold_rows(view, runner.read_silver(spark, settings, version))
            .write.format("delta")
            .mode("overwrite")
            .save(str(scratch / f"{name}_v{v}"))
        )
        seconds[f"{name}_v{v}"] = time.monotonic() - started
        bench.say(f"  replay {name}_v{v}: {events:,} events in {seconds[f'{name}_v{v}']:.1f} s")
    duck = _duckdb(settings, scratch, version)
    shutil.rmtree(scratch, ignore_errors=True)
    return Replayed(events, seconds, duck)


def _duckdb(settings: Settings, scratch: Path, version: int) -> float:
    """DuckDB's revenue_hourly v1 over the same silver snapshot, written as Delta too;
    its answer must equal Spark's, or the comparison means nothing."""
    import duckdb
    from deltalake import DeltaTable, write_deltalake

    from warehouse.base import registry

    started = time.monotonic()
    silver = DeltaTable(registry.SILVER_EVENTS.path(settings), version=version)
    con = duckdb.connect()
    con.register("dataset", silver.to_pyarrow_dataset())
    answer = con.sql(
        "SELECT date_trunc('hour', event_time AT TIME ZONE 'UTC') AS window_start, "
        "date_trunc('hour', event_time AT TIME ZONE 'UTC') + INTERVAL 1 HOUR AS window_end, "
        "currency, count(*) AS orders, CAST(sum(total) AS DECIMAL(18, 2)) AS revenue "
        "FROM dataset WHERE event_type = 'order_placed' GROUP BY ALL"
    ).to_arrow_table()
    write_deltalake(str(scratch / "duckdb_revenue_hourly_v1"), answer, mode="overwrite")
    seconds = time.monotonic() - started
    con.register("answer", answer)
    con.register(
        "spark_answer", DeltaTable(str(scratch / "revenue_hourly_v1")).to_pyarrow_dataset()
    )
    differ = con.execute(
        "SELECT count(*) FROM ("
        "(SELECT window_start, currency, orders, revenue FROM answer "
        " EXCEPT ALL SELECT timezone('UTC', window_start), currency, orders, revenue "
        " FROM spark_answer) UNION ALL "
        "(SELECT timezone('UTC', window_start), currency, orders, revenue FROM spark_answer "
        " EXCEPT ALL SELECT window_start, currency, orders, revenue FROM answer))"
    ).fetchone()
    if differ is None or differ[0] != 0:
        raise RuntimeError(
            f"DuckDB and Spark disagree on revenue_hourly v1 in {differ} rows: the replay "
            "comparison would compare different answers"
        )
    return seconds
