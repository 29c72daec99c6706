"""visits v1 on small inputs, the union of the web's and the shop's silvers
(docs/contract.md §3). Every expected row is computed by hand from the rule: a
visit is a per-customer session window with a 30-minute gap over session starts,
product views and orders, whichever source they came from; it converted if an
order in it holds a product viewed at or before the order, in the same visit."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal

import pytest

from spark_jobs.engine import gold_writes, inputs, marks
from spark_jobs.views import visits_v1
from tests.frames import assert_df_equality
from tests.spark_jobs.conftest import at, cart, item, order, web_session, web_view

VIEW = visits_v1.VIEW


def _visits(spark, rows):
    return spark.createDataFrame(rows, visits_v1.SCHEMA)


def _check(spark, silver_df, events, expected):
    got = visits_v1.compute(silver_df(events, VIEW))
    assert_df_equality(got, _visits(spark, expected), ignore_row_order=True, ignore_nullable=True)


def test_a_view_then_an_order_of_that_product_converts_across_sources(spark, silver_df):
    events = [
        web_session("c1", at(0), "s1"),
        web_view("c1", at(5), "s1", "p1"),
        web_view("c1", at(6), "s1", "p2"),
        # the shop's order, from the other source, within the gap of the last view
        order("o1", at(20), "3.00", customer_id="c1", items=[item("p2", 3)]),
    ]
    _check(spark, silver_df, events, [("c1", at(0), at(50), 4, 1, 2, 1, True)])


def test_an_order_of_a_product_not_viewed_or_viewed_only_after_it_does_not_convert(
    spark, silver_df
):
    events = [
        web_session("c1", at(0), "s1"),
        web_view("c1", at(1), "s1", "p1"),
        order("o1", at(2), "1.00", customer_id="c1", items=[item("p9")]),
        web_view("c1", at(3), "s1", "p9"),  # viewed after it was ordered
    ]
    _check(spark, silver_df, events, [("c1", at(0), at(33), 4, 1, 2, 1, False)])


def test_a_view_and_an_order_in_the_same_millisecond_convert(spark, silver_df):
    events = [
        web_view("c1", at(0), "s1", "p1"),
        order("o1", at(0), "1.00", customer_id="c1", items=[item("p1")]),
    ]
    _check(spark, silver_df, events, [("c1", at(0), at(30), 2, 1, 1, 1, True)])


def test_the_gap_is_30_minutes_whichever_source_the_events_came_from(spark, silver_df):
    events = [
        web_view("c1", at(0), "s1", "p1"),
        order("o1", at(30), "1.00", customer_id="c1", items=[item("p1")]),  # exactly 30: same
        web_view("c1", at(60, ms=1), "s2", "p1"),  # 30 min and 1 ms later: a new visit
        order("o2", at(61), "1.00", customer_id="c1", items=[item("p1")]),
    ]
    _check(
        spark,
        silver_df,
        events,
        [
            ("c1", at(0), at(60), 2, 1, 1, 1, True),
            ("c1", at(60, ms=1), at(91), 2, 1, 1, 1, True),
        ],
    )


def test_a_view_in_an_earlier_visit_does_not_convert_a_later_order(spark, silver_df):
    events = [
        web_view("c1", at(0), "s1", "p1"),
        order("o1", at(45), "1.00", customer_id="c1", items=[item("p1")]),
    ]
    _check(
        spark,
        silver_df,
        events,
        [
            ("c1", at(0), at(30), 1, 1, 1, 0, False),
            ("c1", at(45), at(75), 1, 0, 0, 1, False),
        ],
    )


def test_visits_are_per_customer_and_count_distinct_web_sessions(spark, silver_df):
    events = [
        web_session("c1", at(0), "s1"),
        web_session("c1", at(10), "s2"),  # a second tab: another web session, same visit
        web_view("c1", at(11), "s2", "p1"),
        web_view("c2", at(5), "s3", "p1"),
        # not the view's: another shop event type, and a web event of no customer's visit
        cart("c1", at(12)),
        order("o1", at(12), "1.00", customer_id="c2", items=[item("p1"), item("p2")]),
    ]
    _check(
        spark,
        silver_df,
        events,
        [
            ("c1", at(0), at(41), 3, 2, 1, 0, False),
            ("c2", at(5), at(42), 2, 1, 1, 1, True),
        ],
    )


def test_a_late_web_event_bridging_two_visits_merges_them(spark, silver_df):
    before = [
        web_view("c1", at(0), "s1", "p1"),
        order("o1", at(50), "1.00", customer_id="c1", items=[item("p1")]),
    ]
    assert visits_v1.compute(silver_df(before, VIEW)).count() == 2
    _check(
        spark,
        silver_df,
        [*before, web_session("c1", at(25), "s1")],
        [("c1", at(0), at(80), 3, 1, 1, 1, True)],
    )


def test_each_event_type_comes_from_exactly_one_source():
    assert inputs.event_types_by_source(VIEW) == {
        "shop": ("order_placed",),
        "web": ("session_started", "product_viewed"),
    }
    # A view naming a type no source of it declares is refused, saying which.
    scope = replace(VIEW.scope, of=(*VIEW.scope.of, "page_scrolled"))
    stray = replace(VIEW, scope=scope)
    with pytest.raises(ValueError, match="no source of shop, web declares page_scrolled"):
        inputs.event_types_by_source(stray)
    # And a source it reads nothing of.
    web_only = replace(VIEW, scope=replace(VIEW.scope, of=visits_v1.WEB_TYPES))
    with pytest.raises(ValueError, match="none of the event types of shop"):
        inputs.event_types_by_source(web_only)


def _append(silver_df, lake_settings, source: str, rows: list[dict]) -> None:
    """Rows (each with its own event_id and offset) committed to `source`'s silver."""
    table = inputs.silver_table(source)
    # As silver holds them: an order of contract version 1 reads a discount of 0.00
    # (left null, silver's schema evolution would fill it in, with a commit of its own).
    rows = [
        {"discount": Decimal("0.00"), **r} if r["event_type"] == "order_placed" else r for r in rows
    ]
    columns = [f.name for f in inputs.schema(replace(VIEW, sources=(source,))).fields]
    frame = silver_df(rows, VIEW).select(*columns)
    frame.write.format("delta").mode("append").save(table.path(lake_settings))


def test_a_live_stream_follows_both_change_feeds_and_restates_a_late_web_event(
    spark, settings, tmp_path, silver_df
):
    """The live path over two sources: a replay, then late events in each silver as
    separate commits; the stream reads both change feeds, its gold equals the view
    over both silvers' newest versions, its commits and marker name a version per
    source, and a late web view restates the visit it lands in.

    Over 20 s: a replay and two runs of the real stream (available-now), since what
    it proves is what the runner does with two real change feeds and a restart."""
    from spark_jobs.engine import lake, restatements, runner

    s = replace(settings, lake_root=str(tmp_path / "lake"))
    inputs.ensure(spark, s, VIEW)
    _append(
        silver_df,
        s,
        "web",
        [
            web_session("c1", at(0), "s1") | {"event_id": "w1", "offset": 1},
            web_view("c1", at(1), "s1", "p1") | {"event_id": "w2", "offset": 2},
        ],
    )
    _append(
        silver_df,
        s,
        "shop",
        [
            order("o1", at(hours=5), "1.00", customer_id="c2", items=[item("p1")])
            | {"event_id": "s1", "offset": 1},
        ],
    )
    replayed = runner.replay(spark, s, VIEW)
    assert replayed == inputs.newest(spark, s, VIEW)
    assert str(replayed) == f"shop@{replayed['shop']},web@{replayed['web']}"

    # Late, hours behind the newest event: c1 orders what it viewed (a shop commit),
    # then a web view of another product lands in the same visit (a web commit).
    _append(
        silver_df,
        s,
        "shop",
        [
            order("o2", at(10), "1.00", customer_id="c1", items=[item("p1")])
            | {"event_id": "s2", "offset": 2},
        ],
    )
    _append(
        silver_df,
        s,
        "web",
        [
            web_view("c1", at(5), "s1", "p2") | {"event_id": "w3", "offset": 3},
        ],
    )

    def stream_once() -> list[int]:
        query = runner.stream(spark, s, VIEW, available_now=True)
        query.awaitTermination()
        return [p.batchId for p in query.recentProgress if p.numInputRows]

    assert stream_once() == [0]  # both feeds' late commits, in one batch
    newest = inputs.newest(spark, s, VIEW)
    gold_path = gold_writes.gold_table(VIEW).path(s)
    gold = spark.read.format("delta").load(gold_path)
    assert_df_equality(
        gold,
        visits_v1.compute(runner.read_input(spark, s, VIEW, newest)),
        ignore_row_order=True,
        ignore_nullable=True,
        ignore_column_order=True,
    )
    assert sorted(tuple(r) for r in gold.drop("visit_start", "visit_end").collect()) == [
        ("c1", 4, 1, 2, 1, True),
        ("c2", 1, 0, 0, 1, False),
    ]
    tagged = marks.latest_tag(spark, gold_path)
    assert tagged is not None and tagged[1] == newest
    table = spark.read.format("delta").load(restatements.RESTATEMENTS.path(s))
    assert {r.event_id for r in table.where("view = 'visits'").collect()} == {"s2", "w3"}

    # Started again: the checkpoint holds both feeds' offsets, nothing is read twice.
    before = lake.newest_version(spark, gold_path)
    assert stream_once() == []
    assert lake.newest_version(spark, gold_path) == before


def test_a_replay_from_kafka_is_refused_before_any_work_for_a_view_over_two_sources(settings):
    from spark_jobs.engine import runner
    from spark_jobs.views import revenue_hourly_v1
    from warehouse.ops import lifecycle
    from warehouse.sql.versions import VersionError

    runner.check_replay_source(revenue_hourly_v1.VIEW, "kafka")  # the shop's own: fine
    with pytest.raises(ValueError, match="visits_v1 reads shop, web: a replay from Kafka"):
        runner.check_replay_source(VIEW, "kafka")
    with pytest.raises(ValueError, match="unknown replay source 'tape'"):
        runner.check_replay_source(VIEW, "tape")
    # The reprocess DAG's first task refuses it before the registry is asked.
    with pytest.raises(VersionError, match="replay it from bronze"):
        lifecycle.register(settings, "visits", 1, "kafka")
