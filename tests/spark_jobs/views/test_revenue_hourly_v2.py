"""revenue_hourly v2 on small silver tables (docs/contract.md §3)."""

from __future__ import annotations

from decimal import Decimal

from pyspark.sql import functions as F

from spark_jobs.engine import gold_writes, scoping
from spark_jobs.views import revenue_hourly_v2
from tests.frames import assert_df_equality
from tests.spark_jobs.conftest import at, cancel, order, restated

VIEW = revenue_hourly_v2.VIEW
H10, H11, H12 = at(), at(hours=1), at(hours=2)


def _v2(spark, rows):
    return spark.createDataFrame(rows, revenue_hourly_v2.SCHEMA)


def test_v2_attributes_cancellations_to_the_orders_hour(spark, silver_df):
    silver = silver_df(
        [
            cancel("o1", at(-30)),  # a cancellation before its order
            order("o1", at(10), "10.00"),
            order("o2", at(20), "4.50"),
            cancel("o2", at(hours=50)),  # days later
            cancel("o2", at(hours=51)),  # twice: counts once
            order("o3", at(70), "1.00"),
            cancel("ghost", at(5)),  # no such order: changes nothing
        ]
    )
    expected = _v2(
        spark,
        [
            (H10, H11, "EUR", 2, 2, Decimal("14.50"), Decimal("14.50"), Decimal("0.00")),
            (H11, H12, "EUR", 1, 0, Decimal("1.00"), Decimal("0.00"), Decimal("1.00")),
        ],
    )
    assert_df_equality(
        revenue_hourly_v2.compute(silver), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_v2_a_repeated_order_id_is_two_orders_and_one_cancel_cancels_both(spark, silver_df):
    silver = silver_df(
        [
            order("dup", at(1), "2.00"),
            order("dup", at(2), "3.00"),
            order("keep", at(3), "5.00"),
            cancel("dup", at(4)),
        ]
    )
    (row,) = revenue_hourly_v2.compute(silver).collect()
    assert (row.orders_placed, row.orders_cancelled) == (3, 2)
    assert (row.gross_revenue, row.cancelled_revenue, row.net_revenue) == (
        Decimal("10.00"),
        Decimal("5.00"),
        Decimal("5.00"),
    )


def test_v2_hours_with_no_orders_have_no_rows(spark, silver_df):
    silver = silver_df([cancel("o9", at()), order("o1", at(hours=5), "1.00")])
    assert revenue_hourly_v2.compute(silver).count() == 1


# -- scopes: derived from the declaration --------------------------------------------------
def test_v2_a_cancellation_scopes_its_orders_hours_whenever_it_arrives(silver_df):
    silver = silver_df(
        [
            order("o1", at(10), "1.00"),
            order("o1", at(70), "2.00", currency="USD"),  # the same order_id again
            order("o2", at(20), "1.00"),
            cancel("o1", at(hours=30), event_id="late"),
            cancel("ghost", at(5), event_id="orphan"),
        ]
    )
    late = silver.where("event_id = 'late'")
    got = {tuple(r) for r in scoping.scopes_of(VIEW, late, silver).collect()}
    assert got == {(H10, H11, "EUR"), (H11, H12, "USD")}
    # A cancellation of an order not (yet) in silver changes nothing.
    assert scoping.scopes_of(VIEW, silver.where("event_id = 'orphan'"), silver).count() == 0


def test_v2_restrict_keeps_the_scopes_orders_and_every_cancellation_of_them(spark, silver_df):
    silver = silver_df(
        [
            order("o1", at(10), "10.00"),
            order("o1", at(70), "2.00"),  # o1 again, another hour
            order("o2", at(20), "4.50"),
            order("o3", at(30), "1.00", currency="USD"),
            cancel("o1", at(-30)),
            cancel("o1", at(hours=40)),
            cancel("o3", at(35)),
            cancel("ghost", at(5)),
        ]
    )
    h10_eur = scoping.scopes_of(VIEW, silver.where("order_id = 'o2'"), silver)
    kept = scoping.restrict(VIEW, silver, h10_eur)
    got = sorted((r.event_type, r.order_id, r.event_time) for r in kept.collect())
    assert got == [
        ("order_cancelled", "o1", at(-30)),
        ("order_cancelled", "o1", at(hours=40)),
        ("order_placed", "o1", at(10)),
        ("order_placed", "o2", at(20)),
    ]
    # ...and they decide that hour's row exactly as all of silver does.
    everything = gold_writes.gold_rows(VIEW, silver).where(
        (F.col("window_start") == H10) & (F.col("currency") == "EUR")
    )
    assert_df_equality(gold_writes.gold_rows(VIEW, kept), everything, ignore_row_order=True)


# -- restatements -------------------------------------------------------------------------
def test_v2_a_cancellation_restates_its_orders_hour_even_though_it_is_recent(spark, silver_df):
    silver = silver_df(
        [
            order("o1", at(0), "5.00", event_id="placed"),
            cancel("o1", at(hours=30), event_id="late-cancel"),
            cancel("nobody", at(hours=30), event_id="orphan"),
        ]
    )
    landed = silver.where("event_type = 'order_cancelled'")
    got = restated(spark, VIEW, landed, silver, None, at(hours=30))
    assert got == [("late-cancel", at(0), "EUR", 29 * 3600)]
