"""The second source, `web` (warehouse/sources/web.py), through ingest's batch: its
own tables (docs/contract.md §10), its own contract, the same rules as the shop's."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime

import pytest
from pyspark.sql.types import StringType

from spark_jobs.engine import bronze, contract, ingest, lake, silver
from warehouse.base import registry

WEB = registry.source_tables("web")
KAFKA_TS = datetime(2026, 1, 1, 12, 0, 0)


def _view(event_id: str, product: str = "p1", **changes: object) -> bytes:
    event = {
        "event_id": event_id,
        "event_type": "product_viewed",
        "event_time": "2026-01-01T10:00:00.000Z",
        "customer_id": "c1",
        "schema_version": 1,
        "payload": {"session_id": "s1", "product_id": product},
    }
    return json.dumps({**event, **changes}).encode()


def _session(event_id: str, referrer: str) -> bytes:
    return _view(
        event_id,
        event_type="session_started",
        payload={"session_id": "s1", "referrer": referrer},
    )


# (partition, offset, value)
RECORDS = [
    (0, 0, _view("w1")),
    (0, 1, _session("w2", "search")),
    (1, 0, _view("w1")),  # an exact duplicate
    (1, 1, _view("w2", "p9")),  # w2 again, other content: a conflict
    (1, 2, _session("w3", "billboard")),  # not a declared referrer
    (1, 3, _view("w4", event_type="order_placed")),  # the shop's type, not the web's
    (1, 4, _view("w5", schema_version=2)),  # no version 2 declared
]


@pytest.fixture
def web_lake(spark, settings, tmp_path):
    s = dataclasses.replace(settings, lake_root=str(tmp_path / "lake"))
    ingest.prepare(spark, s, "web")
    return s


def _kafka(spark, rows):
    return spark.createDataFrame(
        [(b"c1", v, WEB.topic, p, o, KAFKA_TS, 0) for p, o, v in rows],
        bronze.KAFKA_SOURCE_SCHEMA,
    )


def _read(spark, table, s):
    return spark.read.format("delta").load(table.path(s))


def test_a_web_batch_settles_into_the_web_tables_by_the_web_contract(spark, web_lake):
    s = web_lake
    plan = silver.deployed_plan(spark, s, "web")
    assert (plan.source.name, plan.contract_version) == ("web", 1)
    result = ingest.process_batch(
        spark, s, _kafka(spark, RECORDS), 0, "app", None, "/nowhere", plan=plan
    )
    again = ingest.process_batch(
        spark, s, _kafka(spark, RECORDS), 0, "app", None, "/nowhere", plan=plan
    )

    assert (result.rows_in, result.accepted, result.duplicates, result.conflicts) == (7, 2, 1, 1)
    assert result.rejected == {
        "invalid_field": 1,
        "unknown_event_type": 1,
        "unsupported_schema_version": 1,
    }
    assert again.rows_in == 7
    # The retry committed nothing: one commit each after the tables' creation.
    assert [lake.newest_version(spark, t.path(s)) for t in (WEB.bronze, WEB.ledger)] == [1, 1]

    assert [(r.topic, r.partition) for r in _read(spark, WEB.bronze, s).collect()].count(
        (WEB.topic, 1)
    ) == 5
    rows = _read(spark, WEB.silver, s).orderBy("event_id").collect()
    assert [(r.event_id, r.event_type, r.session_id, r.product_id, r.referrer) for r in rows] == [
        ("w1", "product_viewed", "s1", "p1", None),
        ("w2", "session_started", "s1", None, "search"),
    ]
    quarantined = {
        (r.offset, r.reason): r.detail for r in _read(spark, WEB.quarantine, s).collect()
    }
    assert set(quarantined) == {
        (1, "conflicting_duplicate"),
        (2, "invalid_field"),
        (3, "unknown_event_type"),
        (4, "unsupported_schema_version"),
    }
    # The reason names what is wrong, in the web's own words.
    assert "referrer" in quarantined[(2, "invalid_field")]
    assert "order_placed" in quarantined[(3, "unknown_event_type")]
    # Nothing of the shop's: its tables were never made in this lake.
    assert not lake.exists(spark, registry.SILVER_EVENTS.path(s))


def test_web_silver_holds_the_web_declaration_s_columns(spark, web_lake):
    fields = {f.name: f.dataType for f in _read(spark, WEB.silver, web_lake).schema.fields}
    assert fields["session_id"] == fields["referrer"] == fields["product_id"] == StringType()
    assert "order_id" not in fields and "items" not in fields
    assert [n for n in contract.source_plan("web").payload_names] == [
        "product_id",
        "referrer",
        "session_id",
    ]


def test_the_audit_re_derives_the_web_s_tables_by_the_web_s_contract(spark, web_lake):
    """The audit's content check per source (spark_jobs/engine/audit.py): the web's
    silver, quarantine and ledger equal what the web's contract makes of its bronze,
    and a row changed behind ingest's back is named under the web's subject."""
    from delta.tables import DeltaTable

    from spark_jobs.engine import audit as spark_audit

    s = web_lake
    plan = silver.deployed_plan(spark, s, "web")
    ingest.process_batch(spark, s, _kafka(spark, RECORDS), 0, "app", None, "/nowhere", plan=plan)
    found = spark_audit.check_silver_content(spark, s, attempts=1, src=WEB)
    assert {f.subject: f.passed for f in found} == {
        "web silver content": True,
        "web quarantine content": True,
        "web ledger content": True,
    }
    DeltaTable.forPath(spark, WEB.silver.path(s)).update("event_id = 'w1'", {"product_id": "'p7'"})
    found = spark_audit.check_silver_content(spark, s, attempts=1, src=WEB)
    (bad,) = [f for f in found if not f.passed]
    assert bad.subject == "web silver content"
    assert bad.detail["keys"][0]["event_id"] == "w1"
    assert "product_id" in bad.detail["keys"][0]["columns"]
