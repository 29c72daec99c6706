"""Excision (docs/contract.md §8) against real Delta tables in a temp lake: what is matched,
what is deleted, the erasure restatements, and that no file keeps the id afterwards."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from spark_jobs.engine import (
    audit,
    erasure,
    forgotten,
    gold_writes,
    marks,
    restatements,
    runner,
    silver,
)
from spark_jobs.engine.bronze import BRONZE_SCHEMA
from spark_jobs.testing.residue import residue
from spark_jobs.views import cart_sessions_v1
from warehouse.base import registry

GONE = "cust-forget-me"
KEPT = "cust-keep"
KAFKA_TS = datetime(2026, 1, 1, 18, 0, 0)


def _event(event_id: str, customer: str, when: str, quantity: int = 1) -> bytes:
    return json.dumps(
        {
            "event_id": event_id,
            "event_type": "cart_item_added",
            "event_time": f"2026-01-01T{when}:00.000Z",
            "customer_id": customer,
            "schema_version": 1,
            "payload": {"product_id": "p1", "quantity": quantity},
        }
    ).encode()


# (offset, key, value): positions 0..6 of partition 0.
RECORDS = [
    (0, GONE, _event("e-gone-1", GONE, "10:00")),
    (1, KEPT, _event("e-kept-1", KEPT, "10:05")),
    # The forgotten event's id again, under another key and content: a conflicting
    # duplicate that would become the winner if only the customer's record went.
    (2, KEPT, _event("e-gone-1", KEPT, "10:00", quantity=7)),
    # Not JSON, but it names the customer.
    (3, "", f'{{"customer_id": "{GONE}", broken'.encode()),
    # Parses, names the customer, fails validation (no event_type).
    (4, GONE, json.dumps({"event_id": "e-gone-2", "customer_id": GONE}).encode()),
    (5, KEPT, _event("e-kept-2", KEPT, "15:00")),
    (6, KEPT, b"not json at all"),
]
FORGOTTEN = {0, 2, 3, 4}


@pytest.fixture
def lake(spark, settings, tmp_path):
    s = dataclasses.replace(settings, lake_root=str(tmp_path / "lake"))
    silver.ensure_tables(spark, s)
    batch = spark.createDataFrame(
        [("shop.events", 0, o, KAFKA_TS, k, v, KAFKA_TS) for o, k, v in RECORDS], BRONZE_SCHEMA
    )
    batch.write.format("delta").mode("append").save(registry.BRONZE_EVENTS.path(s))
    silver.process_batch(spark, s, batch, 0, "app")
    return s


def test_names_the_customer_by_key_content_and_raw_text_and_closes_over_event_ids(spark, lake):
    found = erasure.find(spark, lake, GONE)
    assert {r.offset for r in found.collect()} == FORGOTTEN
    # An id that is a prefix of another names nobody else.
    assert erasure.find(spark, lake, "cust").count() == 0


ODD = 'o\'brien "x"\nzoë; DROP TABLE t'


def test_names_any_id_silver_keeps(spark):
    """Issue 68, B: silver keeps any id of 1-64 characters (docs/contract.md §1), so
    `forget` names every one: quotes, a newline, SQL, a non-ASCII letter. By key, by
    the parsed field, and in a malformed record's raw text, written either way."""
    escaped = json.dumps({"customer_id": ODD}).encode()
    raw = json.dumps({"customer_id": ODD}, ensure_ascii=False).encode()
    rows = [
        ("k0", ODD, b"{}"),
        ("k1", "other", escaped),
        ("k2", "other", escaped[:-1] + b" broken"),
        ("k3", "other", raw[:-1] + b" broken"),
        ("k4", "other", json.dumps({"customer_id": ODD[:-1]}).encode()),
        ("k5", "other", ODD[:-1].encode()),
    ]
    df = spark.createDataFrame(rows, "name string, key string, value binary")
    found = df.where(erasure.names_customer(ODD)).select("name").collect()
    assert sorted(r.name for r in found) == ["k0", "k1", "k2", "k3"]


def test_forget_removes_every_row_records_erasures_and_leaves_no_residue(spark, lake, tmp_path):
    """Forgetting a customer deletes their rows from every table, records the erasure
    once, and leaves no file of the lake holding their id or their event's.

    Over 20 s: every step of `regauge forget` on real Delta tables, after a batch settled
    into four of them and a view MERGEd into gold: the positions recorded twice by MERGE,
    six MERGE-deletes and an UPDATE, then the lake's seven tables compacted and gold
    replayed and compacted (a VACUUM, a checkpoint and two property commits a table),
    since what it proves is that no file on disk keeps the id afterwards."""
    view = cart_sessions_v1.VIEW
    gold_path = gold_writes.gold_table(view).path(lake)
    gold_writes.ensure_gold(spark, gold_path, view)
    silver_path = registry.SILVER_EVENTS.path(lake)
    gold_writes.apply_changes(
        spark, gold_path, view, *[spark.read.format("delta").load(silver_path)] * 2
    )
    gold = spark.read.format("delta").load(gold_path)
    assert gold.where(F.col("customer_id") == GONE).count() == 1

    found = erasure.find(spark, lake, GONE)
    assert erasure.record(spark, lake, found, "er-1") == len(FORGOTTEN)
    assert erasure.record(spark, lake, found, "er-1") == len(FORGOTTEN)  # a rerun adds nothing
    kept_positions = forgotten.read_forgotten(spark, lake)
    assert sorted(r.offset for r in kept_positions.collect()) == sorted(FORGOTTEN)
    assert GONE not in str(kept_positions.collect())

    silver_before = spark.read.format("delta").load(silver_path).localCheckpoint()
    gone = erasure.silver_rows_at(spark, lake, found)
    assert [r.customer_id for r in gone.collect()] == [GONE]
    restated = erasure.erasure_restatements(view, gone, silver_before, gold, GONE)
    assert erasure.record_restatements(spark, lake, restated, "er-1") == 1
    # The same erasure again (resumed before its deletion) appends none twice.
    erasure.record_restatements(spark, lake, restated, "er-1")
    erased = F.col("reason") == restatements.ERASURE
    recorded = spark.read.format("delta").load(restatements.RESTATEMENTS.path(lake))
    assert recorded.where(erased).count() == 1
    # An earlier audit named the customer's session and one of their events.
    audits = registry.GOLD_AUDIT_RUNS.path(lake)
    finding = ("run-1", KAFKA_TS, KAFKA_TS, "gold", "cart_sessions_v1", False)
    spark.createDataFrame(
        [
            (*finding, f"1 key differs: {GONE}", json.dumps({"keys": [GONE, "e-gone-1"]})),
            (*finding, "1 key differs: cust-keep", json.dumps({"keys": [KEPT]})),
        ],
        audit.AUDIT_RUNS_SCHEMA,
    ).write.format("delta").save(audits)
    removed = erasure.delete_everywhere(spark, lake, found, GONE)
    assert removed == {
        registry.SILVER_EVENTS.trino_name: 1,
        registry.SILVER_LEDGER.trino_name: 2,  # the customer's record and the conflict
        registry.SILVER_QUARANTINE.trino_name: 3,  # the conflict and two malformed
        registry.BRONZE_EVENTS.trino_name: 4,
        restatements.RESTATEMENTS.trino_name: 0,
        registry.GOLD_AUDIT_RUNS.trino_name: 1,  # the finding that named them
    }
    read = spark.read.format("delta").load
    assert sorted((r.summary, r.detail) for r in read(audits).collect()) == [
        ("1 key differs: (erased)", json.dumps({"keys": ["(erased)", "(erased)"]})),
        ("1 key differs: cust-keep", json.dumps({"keys": [KEPT]})),
    ]
    (row,) = read(restatements.RESTATEMENTS.path(lake)).collect()
    assert (row.reason, row.window_key, row.event_id, row.event_time) == (
        restatements.ERASURE,
        erasure.ERASED_KEY,
        None,
        None,
    )
    assert [r.offset for r in read(registry.BRONZE_EVENTS.path(lake)).collect()] == [1, 5, 6]
    assert sorted(r.event_id for r in read(silver_path).collect()) == ["e-kept-1", "e-kept-2"]

    root = Path(lake.lake_root)
    assert residue(root, GONE), "the history still holds the id before compacting"
    # As `regauge forget` does it: the lake's tables, then each view replayed from
    # silver's final version and compacted with the replay's tag on top.
    compacted = erasure.compact_all(spark, [t.path(lake) for t in registry.TABLES.values()])
    assert len(compacted) == 7
    through = runner.replay(spark, lake, view)
    with erasure.removing_history(spark, marks.tag(through, "bronze")):
        erasure.compact(spark, gold_path)
    assert residue(root, GONE) == []
    assert residue(root, "e-gone-1") == []

    assert {r.customer_id for r in read(gold_path).collect()} == {KEPT}
    with pytest.raises(Exception, match=r"(?i)version|not.*(exist|found)|timestamp|reconstruct"):
        spark.read.format("delta").option("versionAsOf", 0).load(silver_path).collect()
    # What the audit and the stream read afterwards still reads: the tag on gold's
    # newest commit, silver as of that version, its change feed from there.
    tagged = marks.latest_tag(spark, gold_path)
    assert tagged is not None and tagged[1:] == (through, "bronze")
    # (a later commit: time travel to a version before the newest must still work)
    spark.sql(f"ALTER TABLE delta.`{silver_path}` SET TBLPROPERTIES ('regauge.test' = 'x')")
    assert read(silver_path).count() == 2
    assert (
        spark.read.format("delta").option("versionAsOf", through.single).load(silver_path).count()
        == 2
    )
    changes = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", through.single)
        .load(silver_path)
    )
    assert changes.count() == 0


def test_the_ignore_list_drops_forgotten_positions(spark):
    records = spark.createDataFrame([(0, 1), (0, 2), (1, 2)], "partition int, offset bigint")
    gone = spark.createDataFrame([(0, 2)], "partition int, offset bigint")
    kept = forgotten.without_forgotten(records, gone)
    assert sorted(tuple(r) for r in kept.collect()) == [(0, 1), (1, 2)]


def test_redaction_takes_names_literally(spark):
    """Event ids come from producers: a dot, a bracket or a `\\E` in one is text."""
    pattern = erasure._quoted_alternatives(["a.c", "x\\Ey", "[z]"])
    df = spark.createDataFrame([("a.c abc x\\Ey [z] z",)], "t string")
    (row,) = df.select(F.regexp_replace("t", pattern, "#").alias("t")).collect()
    assert row.t == "# abc # # z"


def test_replacing_a_table_logs_no_column_statistics(spark, tmp_path):
    """dbt rebuilds a model with CREATE OR REPLACE, which gives the table a new id.
    Delta then warns, and by default prints both snapshots whole, min/max column
    statistics included: a forgotten customer's id in a task log. The project's
    log4j2.properties drops that message and keeps OptimisticTransaction's short one."""
    jvm = spark.sparkContext._jvm
    context = jvm.org.apache.logging.log4j.LogManager.getContext(False)
    root = context.getConfiguration().getRootLogger()
    captured = jvm.java.io.StringWriter()
    appender = jvm.org.apache.logging.log4j.core.appender.WriterAppender.createAppender(
        jvm.org.apache.logging.log4j.core.layout.PatternLayout.createDefaultLayout(),
        None,
        captured,
        "test-capture",
        False,
        True,
    )
    appender.start()
    root.addAppender(appender, None, None)
    context.updateLoggers()
    location = str(tmp_path / "model")
    try:
        for _ in range(2):
            spark.sql(
                "CREATE OR REPLACE TABLE default.replaced_model USING delta "
                f"LOCATION '{location}' AS SELECT '{GONE}' AS customer_id"
            )
            spark.sql("SELECT count(*) FROM default.replaced_model").collect()
    finally:
        root.removeAppender("test-capture")
        context.updateLoggers()
        appender.stop()
        spark.sql("DROP TABLE IF EXISTS default.replaced_model")
    text = captured.toString()
    # The capture works: Delta's short warning about the new table id is there.
    assert "Change in the table id detected in txn" in text, text
    assert "Previous snapshot" not in text
    assert GONE not in text
