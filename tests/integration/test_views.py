"""Views through real Kafka, ingest, Delta and Trino, against answers computed in plain Python.

The expected answers below are written from docs/contract.md §3 directly, over the
events the generator says silver holds; they never call the view code.
"""

from __future__ import annotations

import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest

from spark_jobs import producer, views
from spark_jobs.engine import gold_writes, runner
from spark_jobs.testing.landing import fresh_seed
from warehouse.base.registry import GOLD_RESTATEMENTS as RESTATEMENTS
from warehouse.base.registry import SILVER_EVENTS
from warehouse.ops import pipeline
from warehouse.sql import trino_client

GAP = timedelta(minutes=30)
WEB = "web"


def _utc(text: str) -> datetime:
    return datetime.fromisoformat(text).astimezone(UTC)


def accepted_events(*runs: producer.GeneratedRun) -> list[dict[str, Any]]:
    """The content of every record the contract keeps in silver, for these runs."""
    out = []
    for run in runs:
        winners = set(run.expected().silver.values())
        for rec, pos in zip(run.records, run.positions, strict=True):
            if pos in winners:
                assert rec.content is not None
                out.append(rec.content)
    return out


def _hour(t: datetime) -> datetime:
    return t.replace(minute=0, second=0, microsecond=0)


def expected_revenue_v1(events: list[dict[str, Any]]) -> set[tuple]:
    acc: dict[tuple, list] = defaultdict(lambda: [0, Decimal("0.00")])
    for e in events:
        if e["event_type"] == "order_placed":
            key = (_hour(_utc(e["event_time"])), e["payload"]["currency"])
            acc[key][0] += 1
            acc[key][1] += Decimal(e["payload"]["total"])
    return {(w, w + timedelta(hours=1), c, n, r) for (w, c), (n, r) in acc.items()}


def expected_revenue_v2(events: list[dict[str, Any]]) -> set[tuple]:
    cancelled = {e["payload"]["order_id"] for e in events if e["event_type"] == "order_cancelled"}
    acc: dict[tuple, list] = defaultdict(lambda: [0, 0, Decimal("0.00"), Decimal("0.00")])
    for e in events:
        if e["event_type"] == "order_placed":
            p = e["payload"]
            row = acc[(_hour(_utc(e["event_time"])), p["currency"])]
            row[0] += 1
            row[2] += Decimal(p["total"])
            if p["order_id"] in cancelled:
                row[1] += 1
                row[3] += Decimal(p["total"])
    return {
        (w, w + timedelta(hours=1), c, placed, n_cancel, gross, lost, gross - lost)
        for (w, c), (placed, n_cancel, gross, lost) in acc.items()
    }


def expected_sessions(events: list[dict[str, Any]]) -> set[tuple]:
    kinds = {"cart_item_added", "cart_item_removed", "order_placed"}
    by_customer: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e["event_type"] in kinds:
            by_customer[e["customer_id"]].append(e)
    out = set()
    for customer, evs in by_customer.items():
        evs.sort(key=lambda e: _utc(e["event_time"]))
        session: list[dict[str, Any]] = []
        nxt: dict[str, Any] | None
        for nxt in [*evs, None]:
            if session and (
                nxt is None or _utc(nxt["event_time"]) - _utc(session[-1]["event_time"]) > GAP
            ):
                qty: defaultdict[str, int] = defaultdict(int)
                for s in session:
                    qty[s["event_type"]] += s["payload"].get("quantity", 0)
                out.add(
                    (
                        customer,
                        _utc(session[0]["event_time"]),
                        _utc(session[-1]["event_time"]) + GAP,
                        len(session),
                        qty["cart_item_added"],
                        qty["cart_item_removed"],
                        any(s["event_type"] == "order_placed" for s in session),
                    )
                )
                session = []
            if nxt is not None:
                session.append(nxt)
    return out


def expected_visits(events: list[dict[str, Any]]) -> set[tuple]:
    """visits v1 over the shop's and the web's events: per customer, a 30-minute gap
    over session starts, product views and orders; converted if an order holds a
    product viewed at or before it in the same visit."""
    kinds = {"session_started", "product_viewed", "order_placed"}
    by_customer: dict[str, list[tuple[datetime, dict[str, Any]]]] = defaultdict(list)
    for e in events:
        if e["event_type"] in kinds:
            by_customer[e["customer_id"]].append((_utc(e["event_time"]), e))
    out = set()
    for customer, evs in by_customer.items():
        evs.sort(key=lambda te: te[0])
        visits = [[evs[0]]]
        for t, e in evs[1:]:
            if t - visits[-1][-1][0] > GAP:
                visits.append([])
            visits[-1].append((t, e))
        for visit in visits:
            views_ = [
                (t, e["payload"]["product_id"])
                for t, e in visit
                if e["event_type"] == "product_viewed"
            ]
            orders = [(t, e) for t, e in visit if e["event_type"] == "order_placed"]
            converted = any(
                seen <= t and product in {i["product_id"] for i in o["payload"]["items"]}
                for t, o in orders
                for seen, product in views_
            )
            sessions = {
                e["payload"]["session_id"] for _, e in visit if e["event_type"] != "order_placed"
            }
            out.add(
                (
                    customer,
                    visit[0][0],
                    visit[-1][0] + GAP,
                    len(visit),
                    len(sessions),
                    len(views_),
                    len(orders),
                    converted,
                )
            )
    return out


EXPECTED = {
    ("revenue_hourly", 1): (expected_revenue_v1, "window_start"),
    ("revenue_hourly", 2): (expected_revenue_v2, "window_start"),
    ("cart_sessions", 1): (expected_sessions, "session_start"),
    ("visits", 1): (expected_visits, "visit_start"),
}


def _gold_through_trino(settings, view, time_col: str, start: datetime, end: datetime) -> set:
    table = gold_writes.gold_table(view).trino_name
    cols = ", ".join(f.name for f in view.schema.fields)
    result = trino_client.query(
        settings,
        f"SELECT {cols} FROM {table} WHERE {time_col} >= ? AND {time_col} < ?",
        [start, end],
    )
    return {
        tuple(v.astimezone(UTC) if isinstance(v, datetime) else v for v in row)
        for row in result.rows
    }


@pytest.fixture(scope="module")
def two_runs(stack, settings, spark):
    """A chaos run in its own years-ago week, replayed into every view; then a second run
    in the same week (all of it late), applied live through the views' streams. Each run
    has the web's browsing of the same seed beside it (its customers view what they
    then buy), which visits v1 joins to the shop's orders.

    Returns the week's start, the accepted events of both sources, the shop's two runs
    and the newest order time before the second."""
    seed = fresh_seed()
    start = datetime(2001, 1, 1, tzinfo=UTC) + timedelta(days=seed % 8000)
    first = pipeline.produce(settings, seed=seed, count=4000, chaos=True, start=start, days=1)
    web_first = pipeline.produce(
        settings, seed=seed, count=1500, chaos=True, start=start, days=1, source=WEB
    )
    pipeline.ingest_once(spark, settings)
    # No catch-up after the replay: it would process nothing (the stream starts at
    # the replay's commit), and the one below starts from the same marker.
    for view in views.discover().values():
        pipeline.replay(spark, settings, view)

    newest_order = trino_client.scalar(
        settings,
        f"SELECT max(event_time) FROM {SILVER_EVENTS.trino_name} WHERE event_type = 'order_placed'",
    )
    seed = fresh_seed()
    second = pipeline.produce(settings, seed=seed, count=2000, chaos=True, start=start, days=1)
    web_second = pipeline.produce(
        settings, seed=seed, count=800, chaos=True, start=start, days=1, source=WEB
    )
    pipeline.ingest_once(spark, settings)
    for view in views.discover().values():
        pipeline.catch_up(spark, settings, view)
    events = accepted_events(first, second, web_first, web_second)
    return start, events, first, second, newest_order


@pytest.mark.parametrize("name,version", sorted(EXPECTED))
def test_gold_through_trino_equals_the_contract(settings, two_runs, name, version):
    start, events, *_ = two_runs
    expect, time_col = EXPECTED[(name, version)]
    view = views.get(name, version)
    end = start + timedelta(days=10)
    got = _gold_through_trino(settings, view, time_col, start, end)
    # The same window on both sides: a web session can open minutes before the week's
    # first shop event, so a visit may start before `start`, where the query (which
    # must not read other runs' weeks) does not look.
    at = view.schema.fieldNames().index(time_col)
    want = {row for row in expect(events) if start <= row[at] < end}
    assert len(want) > 10
    assert got == want


def test_late_orders_restate_final_hours_and_the_replay_restates_nothing(settings, two_runs):
    _, _, first, second, newest_order = two_runs
    result = trino_client.query(
        settings,
        f"SELECT event_id, window_start, window_key, lateness FROM {RESTATEMENTS.trino_name} "
        "WHERE view = 'revenue_hourly' AND version = 1",
    )
    restated = {row[0]: row for row in result.rows}
    assert not set(restated) & {e["event_id"] for e in accepted_events(first)}
    watermark = newest_order.astimezone(UTC) - timedelta(hours=2)
    must = {
        e["event_id"]: (_hour(_utc(e["event_time"])), e["payload"]["currency"])
        for e in accepted_events(second)
        if e["event_type"] == "order_placed"
        and _hour(_utc(e["event_time"])) + timedelta(hours=1) <= watermark
    }
    assert len(must) > 10
    for event_id, (window_start, currency) in must.items():
        row = restated[event_id]
        assert (row[1].astimezone(UTC), row[2]) == (window_start, currency)
        assert row[3] >= 2 * 3600  # a window restated is at least the allowed lateness old


def test_a_replay_straight_from_kafka_gives_the_same_answer(settings, spark, two_runs):
    """v1 is left as the replay from Kafka made it: the suite's Kafka holds every
    record (its stack is younger than the 7 days Kafka keeps), the replay drops the
    forgotten as bronze does, and its tag hands the stream over at silver's newest
    commit. (It was replayed from bronze again after, for the suite's time: every
    later module that reads v1 rebuilds it first.)"""
    start, events, *_ = two_runs
    view = views.get("revenue_hourly", 1)
    pipeline.replay(spark, settings, view, source="kafka")
    got = _gold_through_trino(settings, view, "window_start", start, start + timedelta(days=10))
    assert got == expected_revenue_v1(events)


def test_releasing_a_query_closes_its_change_publisher(settings, spark, two_runs):
    # The view host starts a version's query again after a failure: each start's
    # Kafka producer (a transactional id, librdkafka's threads) must end with it.
    view = views.get("revenue_hourly", 1)
    query = pipeline.stream(spark, settings, view, trigger="1 second")
    try:
        deadline = time.monotonic() + 60
        while query.lastProgress is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert query.isActive and query.lastProgress is not None
        publisher = runner._PUBLISHERS[str(query.runId)]
        assert publisher._producer is not None  # the start renewed its mark through Kafka
    finally:
        runner.release(query)
    assert not query.isActive
    assert str(query.runId) not in runner._PUBLISHERS
    assert (publisher._producer, publisher._consumer) == (None, None)
    runner.release(query)  # a second release (the host's loop, then its stop) is harmless
