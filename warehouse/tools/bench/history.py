"""The history phase: one live micro-batch of a few events, over a small and a large
history, for every view version. Their ratio says whether a batch's work follows
the change (about 1) or the size of history (about the sizes' ratio).

Both histories live in scratch lakes of their own, so the bench never writes
into the real lake's silver. The small one is generator traffic validated into
silver; the large one is the small one and `history_factor - 1` copies of it,
each a week later than the one before, with ids made unique: the same shop
running for longer, which is how a lake grows.
"""

from __future__ import annotations

import shutil
import statistics
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from warehouse.base.settings import Settings
from warehouse.tools.bench import replay
from warehouse.tools.bench.context import Bench

SEED = 4242
# The generator spreads its traffic over this many days; each copy starts one span later.
SPAN_DAYS = 7
# Micro-batches measured per view and size (after one warm-up); the median is reported.
PROBES = 3
# How long a probe may wait for its micro-batch.
WAIT_S = 120.0
# How long a batch that missed WAIT_S may take to finish before the next probe.
IDLE_WAIT_S = 600.0


def history(bench: Bench, spark: Any) -> None:
    """One-event micro-batches at `history_events` and at `history_factor` times as
    many, per view version; the figure is the worst view's ratio."""
    from spark_jobs import views

    scratch = bench.settings.state_dir / "bench" / "history"
    shutil.rmtree(scratch, ignore_errors=True)
    small_n = bench.sizes.history_events
    large_n = small_n * bench.sizes.history_factor
    small = _lake(bench.settings, scratch / "small")
    large = _lake(bench.settings, scratch / "large")
    base = _silver_rows(spark, small_n)
    _write_silver(spark, small, base)
    _write_silver(spark, large, _copies(base, bench.sizes.history_factor))
    f = bench.report.figures
    _replay_large(bench, spark, large, scratch / "replay")
    ratios = {}
    unseen: dict[str, int] = {}
    for _, view in sorted(views.of_the_shop().items()):
        seconds = {}
        for label, settings, n in (("small", small, small_n), ("large", large, large_n)):
            took = _one_event_batches(spark, settings, view, bench.run_id)
            missed = sum(1 for s in took if s is None)
            if missed:
                unseen[f"{view.table_name} at {n:,}"] = missed
            seconds[label] = statistics.median(WAIT_S if s is None else s for s in took)
            bench.say(
                f"  {view.table_name}: {PROBES} one-event micro-batches over {n:,} events "
                f"of history, median {seconds[label]:.2f} s"
                + (f" ({missed} not taken within {WAIT_S:.0f} s)" if missed else "")
            )
        ratios[view.table_name] = seconds["large"] / seconds["small"]
        f[f"view_batch_s_{view.table_name}_{small_n}"] = seconds["small"]
        f[f"view_batch_s_{view.table_name}_{large_n}"] = seconds["large"]
        f[f"view_batch_history_ratio_{view.table_name}"] = ratios[view.table_name]
    worst = max(ratios, key=lambda k: ratios[k])
    f["view_batch_history_ratio"] = ratios[worst]
    # A probe never taken makes its view's ratio meaningless (the wait stands in for
    # an unknown time), so the count is a figure of its own with a target of zero.
    f["view_batch_probes_unseen"] = sum(unseen.values())
    if unseen:
        bench.report.notes["history"] = "probes not taken within " + (
            f"{WAIT_S:.0f} s: " + ", ".join(f"{k}: {n}" for k, n in unseen.items())
        )
    f["history_events_small"] = small_n
    f["history_events_large"] = large_n
    bench.say(
        f"history: a one-event micro-batch at {large_n:,} events of history takes "
        + ", ".join(f"{k} {r:.2f}x" for k, r in ratios.items())
        + f" its time at {small_n:,} (worst: {worst})"
    )
    shutil.rmtree(scratch, ignore_errors=True)


def _replay_large(bench: Bench, spark: Any, large: Settings, scratch: Path) -> None:
    """The replay phase's measurement over the large lake: beside the replay figures
    (no targets of their own), it shows how much of them is fixed cost per write."""
    got = replay.measure(bench, spark, large, scratch)
    got.record(bench.report, "replay_large")
    bench.say(
        f"replay over {got.events:,} events: the slowest view, {got.slowest}, "
        f"{got.events_per_s():,.0f} events/s; revenue_hourly v1 "
        f"{got.seconds['revenue_hourly_v1']:.1f} s, DuckDB {got.duckdb_s:.2f} s "
        f"({got.vs_duckdb():.2f}x)"
    )


def _lake(settings: Settings, root: Path) -> Settings:
    return replace(settings, lake_root=str(root))


def _silver_rows(spark: Any, n: int) -> Any:
    """n generator events validated into silver rows, as ingest would make them."""
    from spark_jobs import generator
    from spark_jobs.engine import silver as silver_mod

    records = generator.traffic(SEED, n)
    return silver_mod.from_records(_kafka_rows(spark, records, 0)).localCheckpoint(eager=True)


def _kafka_rows(spark: Any, events: list[dict[str, Any]], first_offset: int) -> Any:
    """Events as the Kafka source's rows (one partition, consecutive offsets)."""
    from spark_jobs import generator
    from spark_jobs.engine import bronze

    # Stamped long after every event, so none is "from the future".
    stamp = datetime(2030, 1, 1, tzinfo=UTC)
    topic = "bench.history"
    rows = [
        (e["customer_id"].encode(), generator.encode(e), topic, 0, first_offset + i, stamp, 0)
        for i, e in enumerate(events)
    ]
    return bronze.to_bronze_rows(spark.createDataFrame(rows, bronze.KAFKA_SOURCE_SCHEMA))


def _copies(base: Any, factor: int) -> Any:
    """base and factor - 1 copies, copy k shifted k spans later, with its own ids
    and offsets (a cancellation still finds its order: both ids get the suffix)."""
    from pyspark.sql import functions as F

    out = base
    n = base.count()
    for k in range(1, factor):

        def suffixed(col: str, k: int = k) -> Any:
            return F.when(F.col(col).isNotNull(), F.concat(F.col(col), F.lit(f"-h{k}")))

        shifted = F.col("event_time") + F.expr(f"INTERVAL {k * SPAN_DAYS} DAYS")
        out = out.unionByName(
            base.withColumn("event_id", suffixed("event_id"))
            .withColumn("order_id", suffixed("order_id"))
            .withColumn("event_time", shifted)
            .withColumn("event_date", F.to_date(shifted))
            .withColumn("offset", F.col("offset") + F.lit(k * n))
        )
    return out


def _write_silver(spark: Any, settings: Settings, rows: Any) -> None:
    """Silver (as ingest lays it out) holding rows, and every view replayed over it."""
    from spark_jobs import views
    from spark_jobs.engine import runner
    from spark_jobs.engine import silver as silver_mod

    silver_mod.ensure_tables(spark, settings)
    rows.write.format("delta").mode("append").save(silver_mod.SILVER.path(settings))
    for view in views.of_the_shop().values():
        runner.replay(spark, settings, view)


def _one_event_batches(
    spark: Any, settings: Settings, view: Any, run_id: str
) -> list[float | None]:
    """Seconds of PROBES live micro-batches of one running stream (None: not taken
    within WAIT_S), each over one silver commit of one order and one cart event in
    the history's first week.

    One warm-up commit first, not counted: a stream's first batch also pays for
    what it learns once (the newest event time the view has seen).
    """
    from spark_jobs.engine import runner
    from spark_jobs.engine import silver as silver_mod

    query = runner.stream(spark, settings, view, trigger="500 milliseconds")
    took: list[float | None] = []
    try:
        for k in range(PROBES + 1):
            when = datetime(2026, 1, 3, 10, tzinfo=UTC) + timedelta(hours=k)
            probe = [_order(f"hist-{run_id}-{view.table_name}-{k}", when), _cart(when)]
            rows = silver_mod.from_records(_kafka_rows(spark, probe, 10**9 + k * 10))
            # Only batches that read something: an idle trigger reports the id the
            # next batch will have, so counting it would hide the probe's batch.
            seen = {p.batchId for p in query.recentProgress if p.numInputRows > 0}
            rows.write.format("delta").mode("append").save(silver_mod.SILVER.path(settings))
            batch = _next_batch_with_input(query, seen)
            if batch is None:
                # A missed target is a figure to record, not a reason to stop the
                # run; the slow batch finishes first, so the next probe is timed alone.
                _wait_idle(query, IDLE_WAIT_S)
            if k:
                took.append(None if batch is None else batch.durationMs["triggerExecution"] / 1000)
    finally:
        _stop_when_idle(query)
    return took


def _wait_idle(query: Any, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while query.status.get("isTriggerActive") and time.monotonic() < deadline:
        time.sleep(0.1)


def _stop_when_idle(query: Any, wait_s: float = 30) -> None:
    """Stop between micro-batches: a stop inside one interrupts its Spark jobs, and
    Spark then logs pages of stack trace for what is only an interruption."""
    _wait_idle(query, wait_s)
    query.stop()


def _next_batch_with_input(query: Any, seen: set[int]) -> Any:
    """The stream's first new micro-batch that read something, or None after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if query.exception() is not None:
            raise RuntimeError(f"the view's stream failed: {query.exception()}")
        for p in query.recentProgress:
            if p.batchId not in seen and p.numInputRows > 0:
                return p
        time.sleep(0.2)
    return None


def _order(event_id: str, when: datetime) -> dict[str, Any]:
    return {
        "event_id": event_id,
        "event_type": "order_placed",
        "event_time": when.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
        "customer_id": "cust-00001",
        "schema_version": 1,
        "payload": {
            "order_id": event_id,
            "currency": "EUR",
            "items": [{"product_id": "prod-0001", "quantity": 1, "unit_price": 1.0}],
            "total": 1.0,
        },
    }


def _cart(when: datetime) -> dict[str, Any]:
    return {
        "event_id": f"hist-cart-{when:%Y%m%d%H}-{int(datetime.now().timestamp() * 1000)}",
        "event_type": "cart_item_added",
        "event_time": (when + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S.000Z"),
        "customer_id": "cust-00001",
        "schema_version": 1,
        "payload": {"product_id": "prod-0001", "quantity": 1},
    }
