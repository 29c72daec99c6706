"""The validation gate's parts: shared-column disagreements, type clashes, commit tags."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

from pyspark.sql.types import IntegerType, StructField, StructType

from spark_jobs.engine import gold_writes, marks
from spark_jobs.engine.inputs import Position
from spark_jobs.engine.validate import difference, disagreements, type_clashes
from spark_jobs.views import revenue_hourly_v1, revenue_hourly_v2
from tests.spark_jobs.conftest import at, cancel, order
from warehouse.base import registry


def test_v2_agrees_with_v1_on_what_they_share(spark, silver_df):
    silver = silver_df(
        [
            order("o1", at(5), "10.00"),
            order("o2", at(10), "5.50", currency="USD"),
            order("o3", at(70), "7.25"),
            cancel("o1", at(80)),
        ]
    )
    v1 = gold_writes.gold_rows(revenue_hourly_v1.VIEW, silver)
    v2 = gold_writes.gold_rows(revenue_hourly_v2.VIEW, silver)
    shared = revenue_hourly_v2.VIEW.agrees_with[1]
    assert disagreements(["window_start", "currency"], v2, v1, shared).count() == 0


def test_a_changed_value_and_a_missing_key_are_both_disagreements(spark, silver_df):
    silver = silver_df([order("o1", at(5), "10.00"), order("o2", at(70), "4.00")])
    v1 = gold_writes.gold_rows(revenue_hourly_v1.VIEW, silver)
    v2 = gold_writes.gold_rows(revenue_hourly_v2.VIEW, silver)
    shared = revenue_hourly_v2.VIEW.agrees_with[1]
    wrong = v2.withColumn("gross_revenue", v2.gross_revenue + 1).where(
        "window_start = '2026-01-01 10:00:00'"
    )
    found = disagreements(["window_start", "currency"], wrong, v1, shared).collect()
    by_hour = {r.window_start.hour: r for r in found}
    assert set(by_hour) == {10, 11}
    assert by_hour[10].new_gross_revenue == Decimal("11.00")
    assert by_hour[10].old_gross_revenue == Decimal("10.00")
    # Hour 11 exists only in v1.
    assert by_hour[11].new_gross_revenue is None and by_hour[11].old_gross_revenue == Decimal(
        "4.00"
    )


def test_same_named_columns_of_another_type_clash():
    v1 = revenue_hourly_v1.VIEW
    assert type_clashes(revenue_hourly_v2.VIEW, v1) == []
    fields = [
        StructField("orders", IntegerType(), False) if f.name == "orders_placed" else f
        for f in revenue_hourly_v2.VIEW.schema.fields
    ]
    clashing = replace(revenue_hourly_v2.VIEW, schema=StructType(fields))
    assert type_clashes(clashing, v1) == ["orders: int in v2, bigint in v1"]


def test_the_newest_tagged_commit_names_its_silver_version(spark, tmp_path):
    path = str(tmp_path / "gold")
    df = spark.range(3)
    df.write.format("delta").option("userMetadata", marks.tag(7, "silver")).save(path)
    df.write.format("delta").mode("append").save(path)  # untagged: someone else's commit
    assert marks.latest_tag(spark, path) == (0, Position(((registry.SHOP_SOURCE, 7),)), "silver")
    spark.conf.set(marks.TAG_CONF, marks.tag(9, "stream"))
    try:
        df.write.format("delta").mode("append").save(path)
    finally:
        spark.conf.unset(marks.TAG_CONF)
    assert marks.latest_tag(spark, path) == (2, Position(((registry.SHOP_SOURCE, 9),)), "stream")


def test_difference_counts_rows_as_a_multiset_with_nulls_equal(spark):
    have = spark.createDataFrame(
        [("a", 1), ("a", 1), ("b", None), ("c", 3), ("x", 9)], "k string, v int"
    )
    want = spark.createDataFrame(
        [("a", 1), ("b", None), ("c", 3), ("c", 3), ("c", 4)], "k string, v int"
    )
    diff = difference(have, want)
    assert (diff.rows, diff.expected_rows) == (5, 5)
    # What exceptAll finds each way, duplicates included.
    assert diff.missing == want.exceptAll(have).count() == 2
    assert diff.unexpected == have.exceptAll(want).count() == 2
    assert sorted(tuple(r) for r in diff.missing_rows.collect()) == [("c", 3, 1), ("c", 4, 1)]
    assert sorted(tuple(r) for r in diff.unexpected_rows.collect()) == [("a", 1, 1), ("x", 9, 1)]


def test_equal_tables_have_no_difference(spark, silver_df):
    silver = silver_df([order("o1", at(5), "10.00"), order("o2", at(70), "4.00")])
    v1 = gold_writes.gold_rows(revenue_hourly_v1.VIEW, silver)
    diff = difference(v1, v1)
    assert (diff.rows, diff.expected_rows, diff.missing, diff.unexpected) == (2, 2, 0, 0)
