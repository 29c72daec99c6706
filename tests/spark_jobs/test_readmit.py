"""Re-admission (docs/contract.md §10) on a real Delta lake: v2 orders quarantined under
contract version 1 come back under version 2 as if they had passed when they arrived,
exactly once, with the accounting exact after every commit, and a killed run resumed.

Over 20 s: a lake of five tables, one ingest batch, then re-admissions (each a
ledger append, a quarantine MERGE and silver's commits) checked against settling all
of bronze at once, which is what proves "as if it had passed when it arrived"."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from datetime import datetime

import pytest

from spark_jobs.engine import bronze, contract, ingest, lake, readmit, restatements, silver
from tests.frames import assert_df_equality
from warehouse.base import registry

KAFKA_TS = datetime(2026, 1, 1, 12, 0, 0)
ITEMS = [{"product_id": "p1", "quantity": 2, "unit_price": 5}]  # Σ = 10.00


def _order(event_id: str, version: int, total: float = 10.0, **extra: object) -> bytes:
    payload = {"order_id": f"o-{event_id}", "currency": "EUR", "items": ITEMS, "total": total}
    return json.dumps(
        {
            "event_id": event_id,
            "event_type": "order_placed",
            "event_time": "2026-01-01T11:00:00.000Z",
            "customer_id": "c1",
            "schema_version": version,
            "payload": {**payload, **extra},
        }
    ).encode()


V2 = {"discount": 1.5, "total": 8.5}
# (partition, offset, value): log order is (partition, offset).
RECORDS = [
    (0, 0, _order("fresh", 2, **V2)),  # a new id: joins silver
    (0, 1, _order("earlier", 2, **V2)),  # precedes ...
    (1, 0, _order("earlier", 1)),  # ... this v1 winner, which becomes a conflict
    (1, 1, _order("later", 1)),  # a v1 winner that stays ...
    (1, 2, _order("later", 2, **V2)),  # ... so this one becomes a conflict
    (0, 2, _order("twice", 2, **V2)),  # the winner of two copies ...
    (1, 3, _order("twice", 2, **V2)),  # ... and its exact duplicate
    (0, 3, _order("wrong", 2, discount=1.5, total=9.0)),  # fails v2 too: total_mismatch
    (0, 4, b"{not json"),  # another reason: not examined
]
V2_PLAN = contract.shop_plan(2)


@pytest.fixture
def lake_settings(spark, settings, tmp_path):
    s = dataclasses.replace(settings, lake_root=str(tmp_path / "lake"))
    ingest.prepare(spark, s)
    rows = spark.createDataFrame(
        [(b"c1", v, registry.TOPIC, p, o, KAFKA_TS, 0) for p, o, v in RECORDS],
        bronze.KAFKA_SOURCE_SCHEMA,
    )
    ingest.process_batch(spark, s, rows, 0, "ingest", None, "/nowhere")  # contract 1
    return s


def _read(spark, table, s):
    return spark.read.format("delta").load(table.path(s))


def _positions(df):
    return sorted((r["partition"], r["offset"]) for r in df.select("partition", "offset").collect())


def _accounted(spark, s) -> None:
    """Every bronze record in exactly one place: silver, the quarantine, or (in the
    ledger and neither) an exact duplicate; no record in two."""
    in_silver = _positions(_read(spark, registry.SILVER_EVENTS, s))
    quarantined = _positions(_read(spark, registry.SILVER_QUARANTINE, s))
    ledger = _positions(_read(spark, registry.SILVER_LEDGER, s))
    duplicates = sorted(set(ledger) - set(in_silver) - set(quarantined))
    places = Counter(in_silver + quarantined + duplicates)
    assert places == Counter(_positions(_read(spark, registry.BRONZE_EVENTS, s)))


def _reasons(spark, s):
    q = _read(spark, registry.SILVER_QUARANTINE, s)
    return {(r["partition"], r["offset"]): r["reason"] for r in q.collect()}


def _equal(got, want):
    assert_df_equality(
        got.drop("quarantined_at"),
        want.drop("quarantined_at"),
        ignore_row_order=True,
        ignore_nullable=True,
        ignore_column_order=True,
    )


def test_readmitted_records_settle_as_if_they_had_passed_when_they_arrived(spark, lake_settings):
    """Over 20 s: a deploy, a re-admission (five commits), the lake compared with settling
    all of bronze under contract 2, and two reruns; the comparison is the proof."""
    s = lake_settings
    before = _reasons(spark, s)
    assert [p for p, r in before.items() if r == "unsupported_schema_version"] == [
        (0, 0),
        (0, 1),
        (1, 2),
        (0, 2),
        (1, 3),
        (0, 3),
    ]
    # A new lake runs contract version 1 (§1); deploying 2 is one metadata commit.
    assert silver.deployed_version(spark, s) == 1
    assert silver.deploy(spark, s, 2) == 1
    assert silver.deployed_plan(spark, s) == V2_PLAN
    with pytest.raises(
        ValueError, match="declares contract versions 1 to 2; there is no version 3"
    ):
        silver.deploy(spark, s, 3)
    silver_before = lake.newest_version(spark, registry.SILVER_EVENTS.path(s))
    done = readmit.readmit(spark, s, "r1", "unsupported_schema_version", V2_PLAN)
    assert (done.examined, done.admitted, done.replaced_winners) == (6, 4, 1)
    assert done.still_quarantined == {"total_mismatch": 1, "conflicting_duplicate": 1}
    _accounted(spark, s)
    # The lake now holds what settling all of bronze under contract 2 gives.
    everything = silver.settle(_read(spark, registry.BRONZE_EVENTS, s), V2_PLAN)
    _equal(_read(spark, registry.SILVER_EVENTS, s), everything.silver)
    _equal(_read(spark, registry.SILVER_QUARANTINE, s), everything.quarantine)
    _equal(_read(spark, registry.SILVER_LEDGER, s), everything.ledger)
    assert _reasons(spark, s) == {
        (1, 0): "conflicting_duplicate",  # the v1 winner an earlier record replaced
        (1, 2): "conflicting_duplicate",
        (0, 3): "total_mismatch",
        (0, 4): "malformed_json",
    }
    # Back to 1 would leave silver with records it does not know: refused.
    with pytest.raises(
        ValueError, match="silver holds 3 order_placed v2, which contract version 1"
    ):
        silver.deploy(spark, s, 1)
    assert silver.deployed_version(spark, s) == 2
    # Views name what re-admission's silver commits landed (its commits are tagged).
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", silver_before + 1)
        .load(registry.SILVER_EVENTS.path(s))
    )
    late = [
        ("v", 1, KAFKA_TS, KAFKA_TS, "EUR", e, KAFKA_TS, 1, KAFKA_TS, "late")
        for e in ("fresh", "x")
    ]
    found = spark.createDataFrame(late, restatements.RESTATEMENTS_SCHEMA)
    named = restatements._name_readmissions(spark, s, changes, found)
    assert {r.event_id: r.reason for r in named.collect()} == {"fresh": "readmission", "x": "late"}
    # Again, by the same id or another: nothing left to admit, and no commit.
    tables = (registry.SILVER_EVENTS, registry.SILVER_QUARANTINE, registry.SILVER_LEDGER)
    versions = [lake.newest_version(spark, t.path(s)) for t in tables]
    for rid in ("r1", "r2"):
        again = readmit.readmit(spark, s, rid, "unsupported_schema_version", V2_PLAN)
        assert again.examined == again.admitted == 0
    assert [lake.newest_version(spark, t.path(s)) for t in tables] == versions


def test_a_run_killed_after_its_quarantine_merge_is_finished_by_its_rerun(
    spark, lake_settings, monkeypatch
):
    """Killed between steps 2 and 3: the admitted records are in the ledger and out
    of the quarantine, silver does not have them yet; the rerun (same id) finishes
    them through `silver.reconcile`, and admits nothing twice. Over 20 s: two tries of
    a re-admission, and `silver.reconcile`, which reads the whole (small) lake."""
    s = lake_settings

    def killed(*args, **kwargs):
        raise RuntimeError("killed")

    with monkeypatch.context() as m:
        m.setattr(silver, "finish_admitted", killed)
        with pytest.raises(RuntimeError, match="killed"):
            readmit.readmit(spark, s, "r1", "unsupported_schema_version", V2_PLAN)
    _accounted(spark, s)  # the admitted records count as duplicates meanwhile
    ledger = _read(spark, registry.SILVER_LEDGER, s).count()
    done = readmit.readmit(spark, s, "r1", "unsupported_schema_version", V2_PLAN)
    assert done.resumed
    assert _read(spark, registry.SILVER_LEDGER, s).count() == ledger  # not appended twice
    _accounted(spark, s)
    everything = silver.settle(_read(spark, registry.BRONZE_EVENTS, s), V2_PLAN)
    _equal(_read(spark, registry.SILVER_EVENTS, s), everything.silver)
    _equal(_read(spark, registry.SILVER_QUARANTINE, s), everything.quarantine)


def test_conflicts_and_unknown_reasons_are_refused_by_name():
    with pytest.raises(ValueError, match="passed the contract already"):
        readmit.check_reason("conflicting_duplicate")
    with pytest.raises(ValueError, match="unknown reason 'late'; one of: oversize"):
        readmit.check_reason("late")
    assert readmit.check_reason("total_mismatch") == "total_mismatch"
