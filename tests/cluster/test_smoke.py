"""The cluster profile end to end on the one-box cluster: Kafka (3 brokers) -> bronze
-> silver on an object store through s3a://, by Spark jobs on a standalone master;
a view replayed there; an analyst's query through Trino over HTTPS with a password.
The answers are the contract's, computed from what the generator sent.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from trino.exceptions import TrinoQueryError

from spark_jobs.testing.landing import fresh_seed
from tests.cluster.conftest import regauge
from tests.integration.test_views import accepted_events, expected_revenue_v1
from warehouse.base.registry import SILVER_EVENTS, gold_view_table
from warehouse.base.registry import SILVER_QUARANTINE as QUARANTINE
from warehouse.base.settings import Settings
from warehouse.ops import pipeline
from warehouse.ops.stack import cluster
from warehouse.sql import trino_client


def test_ingest_replay_and_an_analysts_query_on_the_cluster(cluster_settings: Settings):
    s = cluster_settings
    seed = fresh_seed()
    # A day of its own, so this run's windows hold only its own events even on a
    # cluster whose lake and topic outlive the test.
    start = datetime(2001, 1, 1, tzinfo=UTC) + timedelta(days=seed % 8000)
    run = pipeline.produce(s, seed=seed, count=1500, chaos=True, start=start, days=1)
    assert (run.summary.produced, run.summary.failed) == (1500, 0)
    expected = run.expected()

    out = regauge("ingest-once").stdout
    assert "silver.shop_events" in out

    # Silver holds the contract's winners of this run, each once.
    prefix = f"s{seed}-"
    found = trino_client.query(
        s,
        f'SELECT event_id, partition, "offset" FROM {SILVER_EVENTS.trino_name} '
        "WHERE starts_with(event_id, ?)",
        [prefix],
    )
    assert {r[0]: (r[1], r[2]) for r in found.rows} == expected.silver
    assert len(found.rows) == len(expected.silver)
    # The quarantine holds the rest, each for the contract's reason.
    held: dict[tuple[int, int], str] = {}
    for partition in {p for p, _ in expected.quarantine} | {p for p, _ in expected.silver.values()}:
        offsets = [
            o for p, o in [*expected.quarantine, *expected.silver.values()] if p == partition
        ]
        held |= {
            (partition, r[0]): r[1]
            for r in trino_client.query(
                s,
                f'SELECT "offset", reason FROM {QUARANTINE.trino_name} '
                'WHERE partition = ? AND "offset" BETWEEN ? AND ?',
                [partition, min(offsets), max(offsets)],
            ).rows
        }
    assert held == expected.quarantine

    regauge("views", "run", "revenue_hourly", "1", "--mode", "replay", "--until-caught-up")

    # The analyst logs in with their own password, over HTTPS; their rules apply.
    analyst = replace(s, trino_login=cluster.ANALYST, trino_password=cluster.analyst_password())
    table = gold_view_table("revenue_hourly", 1).trino_name
    rows = trino_client.query(
        analyst,
        f"SELECT window_start, window_end, currency, orders, revenue FROM {table} "
        "WHERE window_start >= ? AND window_start < ?",
        [start, start + timedelta(days=2)],
        user=cluster.ANALYST,
    ).rows
    assert set(rows) == expected_revenue_v1(accepted_events(run))
    assert len(rows) > 10
    with pytest.raises(TrinoQueryError, match="Access Denied"):
        trino_client.query(
            analyst, f"SELECT count(*) FROM {QUARANTINE.trino_name}", user=cluster.ANALYST
        )
