"""Schema evolution on the real stack (docs/contract.md §10): v2 orders sent before the
lake knows them are quarantined, `regauge sources deploy shop 2` moves the lake on, and
`regauge readmit shop`, killed once after its quarantine MERGE and run again, brings
them back exactly once, with the accounting exact and the run logged, and a live view
restates the hour they land in by reason `readmission`.

Runs last (tests/integration/conftest.py): it leaves the lake at contract version 2,
which the generator's expectations (written for §1) do not know. About 2 minutes: an
ingest catch-up and one CLI run, a Spark driver of its own (183 s wall, 327 CPU-s in
the suite, with four CLI runs it no longer makes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime

import pytest
from trino.exceptions import TrinoUserError

from spark_jobs import producer, views
from spark_jobs.engine import faults
from spark_jobs.testing.landing import fresh_seed
from warehouse.base import registry
from warehouse.ops import audit, ingest_ctl, pipeline, streams
from warehouse.ops import readmit as readmit_ops
from warehouse.sql import accounting, trino_client

ITEMS = [{"product_id": "p1", "quantity": 2, "unit_price": 5}]  # Σ = 10.00
# The live view that restates the hour the re-admitted orders land in.
VIEW = ("revenue_hourly", 1)


def _order(
    event_id: str, version: int, total: float, at: str = "2026-01-01T11:00:00.000Z", **extra: object
) -> bytes:
    payload = {"order_id": f"o-{event_id}", "currency": "EUR", "items": ITEMS, "total": total}
    return json.dumps(
        {
            "event_id": event_id,
            "event_type": "order_placed",
            "event_time": at,
            "customer_id": "evolving-customer",
            "schema_version": version,
            "payload": {**payload, **extra},
        }
    ).encode()


def _live_view_held(settings) -> bool:
    """Stop the view host's stream of VIEW if one runs (test_versions.py leaves
    revenue_hourly's wanted): this test runs VIEW's jobs itself. True if it ran."""
    held = VIEW in streams.wanted(settings)
    if held:
        streams.stop(settings, *VIEW)
    return held


def _cli(*args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != faults.ENV}
    if fault:
        env[faults.ENV] = fault
    return subprocess.run(
        [sys.executable, "-m", "warehouse.cli", *args], capture_output=True, text=True, env=env
    )


def _where(settings, table: registry.Table, ids: list[str], column: str) -> dict[str, str]:
    marks = ", ".join("?" for _ in ids)
    rows = trino_client.query(
        settings,
        f"SELECT event_id, {column} FROM {table.trino_name} WHERE event_id IN ({marks})",
        ids,
    ).rows
    return {r[0]: str(r[1]) for r in rows}


def _web_rows(settings, table: registry.Table, column: str) -> dict[tuple[int, int], str]:
    rows = trino_client.query(
        settings, f'SELECT partition, "offset", {column} FROM {table.trino_name}'
    ).rows
    return {(r[0], r[1]): str(r[2]) for r in rows}


def test_a_second_source_is_ingested_live_into_its_own_tables_by_its_own_contract(stack, settings):
    """The web source (warehouse/sources/web.py) with its generator's chaos, through the
    view host's ingest (one query per declared source): each record lands where the
    web's contract says, in its own tables (docs/contract.md §10), the accounting
    exact per partition; analysts read its silver, not its quarantine."""
    ingest_ctl.start(settings, None)
    seed = fresh_seed()
    run = producer.produce_generated(settings, seed=seed, count=300, chaos=True, source="web")
    assert run.summary.ok, run.summary.errors
    expected = run.expected()
    sent = {p for p in run.positions if p is not None}
    web = registry.source_tables("web")
    deadline = time.monotonic() + 240
    while True:
        # A batch commits bronze, the ledger, silver, then the quarantine: settled
        # once bronze holds every record sent and the accounting adds up.
        held = _web_rows(settings, web.bronze, "topic")
        rows = accounting.per_partition(settings, source="web").rows
        settled = sent <= held.keys() and all(r[-1] == 0 for r in rows)
        if settled or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert sent <= held.keys(), f"{len(sent - held.keys())} web records not in bronze in 240 s"
    assert rows and all(r[-1] == 0 for r in rows), rows
    assert set(held.values()) == {web.topic}
    silver = _web_rows(settings, web.silver, "event_id")
    assert {e: p for p, e in silver.items() if p in sent} == expected.silver
    quarantined = _web_rows(settings, web.quarantine, "reason")
    assert {p: r for p, r in quarantined.items() if p in sent} == expected.quarantine
    assert set(expected.by_reason()) >= {
        "malformed_json",
        "missing_field",
        "invalid_field",
        "unknown_event_type",
        "unsupported_schema_version",
        "event_time_out_of_range",
        "conflicting_duplicate",
    }
    # Nothing of the web's in the shop's tables.
    shop_web = trino_client.query(
        settings,
        f"SELECT count(*) FROM {registry.BRONZE_EVENTS.trino_name} WHERE topic = ?",
        [web.topic],
    ).rows
    assert [list(r) for r in shop_web] == [[0]]
    analyst = "analyst.alice"
    seen = trino_client.query(
        settings, f"SELECT count(*) FROM {web.silver.trino_name}", user=analyst
    ).rows
    assert seen[0][0] >= len(expected.silver)
    for hidden in (web.quarantine, web.bronze):
        with pytest.raises(TrinoUserError, match="Access Denied"):
            trino_client.query(settings, f"SELECT count(*) FROM {hidden.trino_name}", user=analyst)
    # The audit's Kafka -> bronze -> silver checks, on the web's own tables and topic.
    findings = audit.check_kafka_bronze(settings, web) + audit.check_bronze_silver(
        settings, attempts=2, wait_s=5, src=web
    )
    assert [f for f in findings if not f.passed] == []
    subjects = {f.subject for f in findings}
    assert {f"{web.topic}[0]", "web partition 0", "web event ids", "web forgotten"} <= subjects
    assert "partition 0" not in subjects  # the shop's are not asked here


def test_v2_orders_wait_in_quarantine_and_come_back_once_the_contract_learns_them(
    stack, settings, spark
):
    ingest_ctl.stop(settings)  # ingest in this process, as test_ingest.py does
    seed = fresh_seed()
    fresh, earlier, wrong = (f"v2-{seed}-{n}" for n in ("fresh", "earlier", "wrong"))
    key = b"evolving-customer"  # one key, one partition: log order is send order
    records = [
        (key, _order(fresh, 2, 8.5, discount=1.5)),
        (key, _order(earlier, 2, 8.5, discount=1.5)),  # first in log order ...
        (key, _order(earlier, 1, 10.0)),  # ... of this v1 order, silver's until then
        (key, _order(wrong, 2, 9.0, discount=1.5)),  # Σ - discount = 8.50: fails v2 too
        # A day later: the hour of the others is over (for a lake holding only these).
        (key, _order(f"v2-{seed}-later", 1, 10.0, at="2026-01-02T11:00:00.000Z")),
    ]
    summary, positions = producer.produce_records(settings, records)
    assert summary.produced == len(records), summary.errors
    pipeline.ingest_once(spark, settings)
    # The live view the re-admission will restate, built from silver as it is now.
    held = _live_view_held(settings)
    view = views.get(*VIEW)
    pipeline.replay(spark, settings, view)
    quarantine = registry.SILVER_QUARANTINE
    ids = [fresh, earlier, wrong]
    assert _where(settings, quarantine, ids, "reason") == dict.fromkeys(
        ids, "unsupported_schema_version"
    )
    assert _where(settings, registry.SILVER_EVENTS, ids, "schema_version") == {earlier: "1"}

    # `regauge sources deploy shop 2` and the resumed `regauge readmit shop` run in
    # this process's driver, each a Spark driver fewer (about 15 s of the suite's
    # time each); the CLI's own lines for them are held in tests/warehouse/cli/.
    # The killed run stays a CLI process: exit 137 is the fault.
    deployed = readmit_ops.deploy(settings, "shop", 2, spark=spark)
    lines = deployed.lines()
    assert lines[0] == "shop: contract version moved from 1 to 2"
    assert "`regauge readmit shop` validates them again under version 2" in lines[1]

    # Killed after its quarantine MERGE: the admitted records are in the ledger and
    # out of the quarantine, silver does not have them yet; the accounting holds.
    killed = _cli("readmit", "shop", fault="readmit_after_quarantine:0")
    assert killed.returncode == 137, killed.stdout + killed.stderr
    assert all(r[-1] == 0 for r in accounting.per_partition(settings).rows)
    again = readmit_ops.readmit(settings, "shop", spark=spark)
    assert again.resumed and again.contract_version == 2, again

    assert _where(settings, registry.SILVER_EVENTS, ids, "schema_version") == {
        fresh: "2",
        earlier: "2",
    }
    assert _where(settings, quarantine, ids, "reason") == {
        earlier: "conflicting_duplicate",  # the v1 order it replaced
        wrong: "total_mismatch",
    }
    p_v1, o_v1 = positions[2] or (None, None)
    detail = [
        list(r)
        for r in trino_client.query(
            settings,
            f'SELECT detail FROM {quarantine.trino_name} WHERE partition = ? AND "offset" = ?',
            [p_v1, o_v1],
        ).rows
    ]
    p_v2, o_v2 = positions[1] or (None, None)
    assert detail == [
        [
            f"event_id {earlier} was first accepted at partition {p_v2} offset {o_v2} "
            "with different content"
        ]
    ]
    # Exactly once, per partition, over the whole lake.
    rows = accounting.per_partition(settings).rows  # the partitions holding records
    assert rows and all(r[-1] == 0 for r in rows), rows
    ledger = trino_client.query(
        settings,
        f"SELECT count(*) FROM {registry.SILVER_LEDGER.trino_name} WHERE event_id IN (?, ?, ?)",
        ids,
    ).rows
    assert [list(r) for r in ledger] == [[3]]  # fresh, earlier's v2 and v1; `wrong` never passed

    # One run in the log, done, under contract version 2, its counts adding up.
    runs = trino_client.query(
        settings,
        "SELECT status, contract_version, reason, examined, admitted, "
        "json_format(still_quarantined) FROM ops.control.readmissions "
        "WHERE source = 'shop' ORDER BY requested_at",
    ).rows
    assert len(runs) == 1, runs
    status, version, reason, examined, admitted, still = runs[0]
    assert (status, version, reason) == ("done", 2, "unsupported_schema_version")
    still_by_reason = json.loads(still)
    assert admitted >= 2 and still_by_reason.get("total_mismatch", 0) >= 1
    assert examined == admitted + sum(still_by_reason.values())

    # The live view takes the re-admission in and names it: the hour of `fresh`
    # (new) and of `earlier` (now its v2, 8.50 where its v1 said 10.00) restated,
    # by reason `readmission`, not `late`.
    pipeline.catch_up(spark, settings, view)
    if held:
        streams.want(settings, *VIEW, True)
    restated = trino_client.query(
        settings,
        f"SELECT event_id, reason, window_start, window_key FROM "
        f"{registry.GOLD_RESTATEMENTS.trino_name} WHERE view = ? AND version = ? "
        "AND event_id IN (?, ?, ?)",
        [*VIEW, *ids],
    ).rows
    hour = datetime(2026, 1, 1, 11, tzinfo=UTC)
    assert sorted((e, r, at.astimezone(UTC), k) for e, r, at, k in restated) == sorted(
        [(fresh, "readmission", hour, "EUR"), (earlier, "readmission", hour, "EUR")]
    )
    # A rerun that admits nothing, and the refusal to deploy 1 again, are shown in
    # tests/spark_jobs/test_readmit.py: each would cost a Spark driver here (about 30 s).
