"""cart_sessions v1 on small silver tables (docs/contract.md §3)."""

from __future__ import annotations

from spark_jobs.engine import scoping
from spark_jobs.views import cart_sessions_v1
from tests.frames import assert_df_equality
from tests.spark_jobs.conftest import at, cart, order, restated

VIEW = cart_sessions_v1.VIEW


def _sessions(spark, rows):
    return spark.createDataFrame(rows, cart_sessions_v1.SCHEMA)


def test_events_exactly_30_minutes_apart_share_a_session(spark, silver_df):
    silver = silver_df([cart("c1", at(0)), cart("c1", at(30))])
    expected = _sessions(spark, [("c1", at(0), at(60), 2, 2, 0, False)])
    assert_df_equality(
        cart_sessions_v1.compute(silver), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_events_30_minutes_and_1_ms_apart_are_two_sessions(spark, silver_df):
    silver = silver_df([cart("c1", at(0), 2), cart("c1", at(30, ms=1), 1, removed=True)])
    expected = _sessions(
        spark,
        [
            ("c1", at(0), at(30), 1, 2, 0, False),
            ("c1", at(30, ms=1), at(60, ms=1), 1, 0, 1, False),
        ],
    )
    assert_df_equality(
        cart_sessions_v1.compute(silver), expected, ignore_row_order=True, ignore_nullable=True
    )


def test_a_late_event_bridging_two_sessions_merges_them(spark, silver_df):
    before = [cart("c1", at(0)), cart("c1", at(50))]
    assert cart_sessions_v1.compute(silver_df(before)).count() == 2
    bridged = cart_sessions_v1.compute(silver_df([*before, cart("c1", at(25))]))
    expected = _sessions(spark, [("c1", at(0), at(80), 3, 3, 0, False)])
    assert_df_equality(bridged, expected, ignore_row_order=True, ignore_nullable=True)


def test_sessions_are_per_customer_and_an_order_converts(spark, silver_df):
    silver = silver_df(
        [
            cart("c2", at(10)),
            cart("c1", at(0), 3),
            order("o1", at(5), "1.00", customer_id="c1"),
            {"event_type": "payment_captured", "customer_id": "c1", "event_time": at(6)},
        ]
    )
    expected = _sessions(
        spark,
        [
            ("c1", at(0), at(35), 2, 3, 0, True),
            ("c2", at(10), at(40), 1, 1, 0, False),
        ],
    )
    assert_df_equality(
        cart_sessions_v1.compute(silver), expected, ignore_row_order=True, ignore_nullable=True
    )


# -- scopes: derived from the declaration --------------------------------------------------
def test_a_late_event_bridging_two_sessions_rescopes_its_customer(spark, silver_df):
    silver = silver_df(
        [
            cart("c1", at(0)),
            cart("c1", at(50)),
            {**cart("c1", at(25)), "event_id": "bridge"},
            order("o1", at(55), "1.00", customer_id="c1"),
            {"event_type": "payment_captured", "customer_id": "c1", "event_time": at(56)},
            cart("c2", at(10)),
        ]
    )
    late = silver.where("event_id = 'bridge'")
    scopes = scoping.scopes_of(VIEW, late, silver)
    assert [tuple(r) for r in scopes.collect()] == [("c1",)]
    # Every cart event and order of the customer, nothing else.
    kept = scoping.restrict(VIEW, silver, scopes)
    got = sorted((r.customer_id, r.event_type, r.event_time) for r in kept.collect())
    assert got == [
        ("c1", "cart_item_added", at(0)),
        ("c1", "cart_item_added", at(25)),
        ("c1", "cart_item_added", at(50)),
        ("c1", "order_placed", at(55)),
    ]
    expected = _sessions(spark, [("c1", at(0), at(85), 4, 3, 0, True)])
    assert_df_equality(
        cart_sessions_v1.compute(kept), expected, ignore_row_order=True, ignore_nullable=True
    )


# -- restatements -------------------------------------------------------------------------
def test_sessions_a_late_event_restates_the_session_that_holds_it(spark, silver_df):
    silver = silver_df([cart("c1", at(0)), cart("c1", at(20)), cart("c1", at(hours=5))])
    gold = VIEW.compute(silver)
    landed = silver_df([{**cart("c1", at(20)), "event_id": "late"}])
    got = restated(spark, VIEW, landed, silver, gold, at(hours=5))
    assert got == [("late", at(0), "c1", (5 * 60 - 50) * 60)]
