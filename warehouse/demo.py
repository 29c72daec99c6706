"""`make demo`: the pipeline on the local stack, ending with Trino queries a person can read."""

from __future__ import annotations

import logging
import time

from warehouse import accounting, registry, trino_client
from warehouse.registry import SILVER_EVENTS
from warehouse.settings import Settings
from warehouse.stack import services

log = logging.getLogger(__name__)


def _step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run(settings: Settings, events: int) -> int:
    from spark_jobs import ingest, producer, views
    from spark_jobs.generator import id_checksum
    from spark_jobs.session import build_session
    from spark_jobs.views import runner

    _step("starting the local stack (PostgreSQL, Kafka, Trino, Airflow)")
    services.up(settings)

    # A new seed per demo: its event ids are new, so what it expects is exact.
    seed = int(time.time())
    _step(f"producing {events:,} records of shop traffic with chaos (seed {seed})")
    sent = producer.produce_generated(settings, seed=seed, count=events, chaos=True)
    print(sent.summary.describe())
    expected = sent.expected()
    reasons = ", ".join(f"{r}={n}" for r, n in sorted(expected.by_reason().items()))
    print(
        f"the contract expects: {len(expected.silver):,} events in silver, "
        f"{len(expected.duplicates):,} exact duplicates, quarantine: {reasons}"
    )

    _step("ingesting: Kafka -> bronze -> silver + quarantine (Spark, Delta)")
    spark = build_session("regauge-demo", settings, ui=False)
    try:
        for table, rows in ingest.run_once(spark, settings).items():
            print(f"  {table:<34} {rows:>10,} rows")
        _step("views: replayed once from all of silver, then kept up live from its change feed")
        for view in views.discover().values():
            how = runner.catch_up(spark, settings, view)
            print(f"  {runner.gold_table(view).trino_name:<38} {how}")
    finally:
        spark.stop()

    _step("asking Trino: every bronze record accounted for, per Kafka partition")
    print(trino_client.format_table(accounting.per_partition(settings)))
    _step("asking Trino: the quarantine by reason")
    print(trino_client.format_table(accounting.by_reason(settings)))

    _step(f"asking Trino: did this demo's events land in {SILVER_EVENTS.trino_name} exactly?")
    found = trino_client.query(
        settings,
        "SELECT count(*) AS events, "
        "sum(from_base(substr(to_hex(sha256(to_utf8(event_id))), 1, 8), 16)) AS id_checksum, "
        "count_if(event_type = 'order_placed') AS orders, sum(total) AS order_total "
        f"FROM {SILVER_EVENTS.trino_name} WHERE starts_with(event_id, ?)",
        [f"s{seed}-"],
    )
    print(trino_client.format_table(found))
    events_found, checksum = found.rows[0][0], found.rows[0][1]
    ok = events_found == len(expected.silver) and checksum == id_checksum(expected.silver)
    print(
        f"\n{'exact' if ok else 'MISMATCH'}: silver holds {events_found:,} of this demo's "
        f"events; the generator expected {len(expected.silver):,}"
    )
    _step("asking Trino: revenue_hourly v1 (gross) and v2 (net of cancellations), same hours")
    print(trino_client.format_table(trino_client.query(settings, SIDE_BY_SIDE_SQL)))
    _step("asking Trino: closed windows that late events restated, per view version")
    print(trino_client.format_table(trino_client.query(settings, RESTATEMENTS_SQL)))
    print("\nthe stack keeps running: `make status` to look, `make down` to stop it")
    return 0 if ok else 1


V1 = registry.gold_view_table("revenue_hourly", 1).trino_name
V2 = registry.gold_view_table("revenue_hourly", 2).trino_name
SIDE_BY_SIDE_SQL = f"""
SELECT v1.window_start, v1.currency, v1.orders, v1.revenue AS v1_revenue,
       v2.orders_cancelled AS v2_cancelled, v2.net_revenue AS v2_net_revenue
FROM {V1} AS v1
JOIN {V2} AS v2 ON v2.window_start = v1.window_start AND v2.currency = v1.currency
WHERE v1.currency = 'EUR'
ORDER BY v2.orders_cancelled DESC, v1.revenue DESC, v1.window_start
LIMIT 8
"""
RESTATEMENTS_SQL = f"""
SELECT view, version, count(*) AS restatements, count(DISTINCT window_start) AS windows,
       round(avg(lateness) / 3600.0, 1) AS avg_hours_late
FROM {registry.GOLD_RESTATEMENTS.trino_name}
GROUP BY view, version
ORDER BY view, version
"""
