"""The scope functions a View derives from its declaration, for every view version:
the scopes cover gold, a restricted silver decides its scopes' rows exactly as all
of silver does, and an event's declared window is the window of the row it is in."""

from __future__ import annotations

import shutil
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, Row
from pyspark.sql import functions as F
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

from spark_jobs import views
from spark_jobs.engine import gold_writes, lake, scoping
from spark_jobs.views import hourly
from spark_jobs.views.base import Scope, View
from tests.frames import assert_df_equality
from tests.spark_jobs.conftest import (
    assert_staged_is_the_newest_commit,
    at,
    cart,
    order,
    silver_rows,
)
from tests.spark_jobs.views.test_runner import LOG, log_of

VERSIONS = sorted(views.discover())
# Views whose windows follow from the event alone (hourly); sessions are placed in gold.
FIXED = sorted(k for k, v in views.discover().items() if v.fixed_windows)


@pytest.fixture
def log_df(silver_df):
    return silver_df(LOG)


@pytest.mark.parametrize("name,version", VERSIONS)
def test_restricted_silver_decides_its_scopes_rows_exactly(silver_df, name, version):
    """Every gold row is in a scope its own events yield, and silver restricted to every
    other scope computes exactly those scopes' rows of gold.

    Over 20 s in its first case only (cart_sessions 1), the file's first test: it pays
    the Spark session's start when its worker runs this file first, then four Spark
    actions, since what it proves is what the view's plans compute from a restricted
    silver."""
    view = views.get(name, version)
    log_df = log_of(silver_df, view)
    cols = list(view.scope_columns)
    gold = gold_writes.gold_rows(view, log_df)
    scopes = scoping.scopes_of(view, log_df, log_df)
    # Every gold row is in a scope that its own events yield.
    assert gold.select(*cols).distinct().exceptAll(scopes).count() == 0
    # Every other scope, by the scope columns' order.
    ordered = [tuple(r) for r in scopes.orderBy(*cols).collect()]
    half = scopes.sparkSession.createDataFrame(ordered[::2], scopes.schema)
    assert len(ordered) > 1
    assert_df_equality(
        gold_writes.gold_rows(view, scoping.restrict(view, log_df, half)),
        gold.join(half, cols, "left_semi"),
        ignore_row_order=True,
    )


@pytest.mark.parametrize("name,version", VERSIONS)
def test_scopes_picked_by_value_keep_what_the_join_keeps(silver_df, name, version):
    """A live batch's few scopes, collected (`listed`) and picked out of silver's rows
    by value, keep the rows the join of the scopes keeps (linked events too). Over
    delta-rs's rows Spark's optimizer evaluates each projection on the driver, row by
    row, so the pick adds no column to silver's rows: a filter on the scope's own
    expressions (with Spark's second filter after delta-rs's read left out too, the
    rule's time in v2's batches fell from 2.05 to 0.55 s in stop 103's spike,
    docs/BENCHMARKS.md)."""
    view = views.get(name, version)
    log_df = log_of(silver_df, view)
    scopes = scoping.scopes_of(view, log_df, log_df)
    ordered = [tuple(r) for r in scopes.orderBy(*view.scope_columns).collect()]
    half = scopes.sparkSession.createDataFrame(ordered[::2], scopes.schema)
    listed = scoping.listed(view, half, scoping.listing(view, half).collect())
    local = log_df.sparkSession.createDataFrame(log_df.toArrow(), log_df.schema)
    picked = scoping.restrict(view, local, half, listed)
    assert_df_equality(picked, scoping.restrict(view, log_df, half), ignore_row_order=True)
    assert 0 < picked.count() < log_df.count()
    plan = picked._jdf.queryExecution().analyzed().toString()
    assert "__scope_" not in plan, plan


@pytest.mark.parametrize(
    "name,version", sorted(k for k, v in views.discover().items() if v.scope.within)
)
def test_silver_narrowed_to_the_scopes_times_decides_them_alike(log_df, name, version):
    """What a live micro-batch reads (the days its scopes' time bounds cover, and
    every linked event) yields the same rows and places events alike, and leaves
    out the rest of history."""
    view = views.get(name, version)
    scopes = scoping.scopes_of(view, log_df, log_df)
    ordered = [tuple(r) for r in scopes.orderBy(*view.scope_columns).collect()]
    one = scopes.sparkSession.createDataFrame(ordered[:1], scopes.schema)
    bounds = scoping.time_bounds(view, one)
    assert bounds is not None
    narrow = scoping.narrowed(
        view, log_df, scoping.merged_ranges((r[0], r[1]) for r in bounds.collect())
    )
    assert 0 < narrow.count() < log_df.count()
    assert narrow.where(F.col("event_type").isin(*view.scope.linked)).count() == (
        log_df.where(F.col("event_type").isin(*view.scope.linked)).count()
    )
    assert_df_equality(
        gold_writes.gold_rows(view, scoping.restrict(view, narrow, one)),
        gold_writes.gold_rows(view, scoping.restrict(view, log_df, one)),
        ignore_row_order=True,
    )
    landed = log_df.join(
        scoping.restrict(view, log_df, one).select("event_id"), "event_id", "left_semi"
    )
    assert_df_equality(
        scoping.lands_in(view, landed, narrow, None),
        scoping.lands_in(view, landed, log_df, None),
        ignore_row_order=True,
    )


def test_time_ranges_merge_where_they_meet_and_bridge_past_the_limit():
    assert scoping.merged_ranges([(5, 7), (0, 2), (2, 3), (6, 9)]) == [(0, 3), (5, 9)]
    assert scoping.merged_ranges([(0, 1), (2, 3), (4, 5)], limit=2) == [(0, 5)]
    assert scoping.merged_ranges([]) == []


def test_a_scopes_time_bounds_must_be_scope_columns():
    with pytest.raises(ValueError, match="within"):
        Scope(columns={"customer_id": "customer_id"}, of=("order_placed",), within=("a", "b"))


@pytest.mark.parametrize("name,version", FIXED)
def test_an_event_lands_in_the_gold_row_that_holds_it(log_df, name, version):
    """With fixed windows, lands_in places an event from its declared scope alone;
    placed in gold instead, by the scope without the window's end, it lands alike."""
    view = views.get(name, version)
    in_gold = replace(
        view,
        scope=replace(
            view.scope,
            columns={c: e for c, e in view.scope.columns.items() if c != view.window[1]},
            within=None,
        ),
        # Sums need fixed windows; this copy only places events.
        sums=None,
    )
    assert not in_gold.fixed_windows
    gold = gold_writes.gold_rows(view, log_df)
    declared = scoping.lands_in(view, log_df, log_df, None)
    assert declared.count() > 1
    assert_df_equality(
        declared, scoping.lands_in(in_gold, log_df, log_df, gold), ignore_row_order=True
    )


def test_a_view_declares_its_scope_in_its_own_gold_columns():
    schema = StructType(
        [
            StructField("window_start", TimestampType(), False),
            StructField("window_end", TimestampType(), False),
            StructField("currency", StringType(), False),
        ]
    )

    def make(**changes):
        spec = {
            "name": "t",
            "version": 1,
            "key": ("window_start", "currency"),
            "schema": schema,
            "compute": lambda silver: silver,
            "scope": Scope(columns={"currency": "currency"}, of=("order_placed",)),
            "window": ("window_start", "window_end"),
        }
        return View(**{**spec, **changes})

    assert make().event_types == ("order_placed",)
    with pytest.raises(ValueError, match="no such gold columns: country"):
        make(scope=Scope(columns={"country": "country"}, of=("order_placed",)))
    with pytest.raises(ValueError, match="window start must be in the key"):
        make(key=("currency",))
    with pytest.raises(ValueError, match="linked_by"):
        Scope(columns={"currency": "currency"}, of=("order_placed",), linked=("order_cancelled",))
    with pytest.raises(ValueError, match="not both"):
        Scope(
            columns={"currency": "currency"},
            of=("order_placed",),
            linked_by="order_id",
            linked=("order_placed",),
        )


def test_a_scope_column_named_like_a_silver_column_never_replaces_it(silver_df):
    """restrict returns silver's rows as they are, whatever the scope computes."""
    view = replace(
        views.get("revenue_hourly", 1),
        scope=Scope(
            columns={"window_start": hourly.HOUR_START, "currency": "lower(currency)"},
            of=("order_placed",),
        ),
        sums=None,
    )
    silver = silver_df([order("o1", at(5), "1.00"), order("o2", at(5), "1.00", currency="USD")])
    eur = scoping.scopes_of(view, silver.where("order_id = 'o1'"), silver)
    assert [r.currency for r in eur.collect()] == ["eur"]
    kept = scoping.restrict(view, silver, eur)
    assert kept.columns == silver.columns
    assert [(r.order_id, r.currency) for r in kept.collect()] == [("o1", "EUR")]


# Sessions (a scope with a gap): a customer's events at 0 and 30 min (one session),
# 75, 100 and 125 (another), 200, and two days later; another customer at 10.
SESSION_LOG = [
    cart("c1", at(0)),
    cart("c1", at(30)),
    cart("c1", at(75)),
    cart("c1", at(100)),
    cart("c1", at(125)),
    cart("c1", at(200)),
    cart("c1", at(hours=48)),
    cart("c2", at(10)),
]
# (events added, indexes of SESSION_LOG taken out, the spans the change decides)
SESSION_CHANGES = {
    # 25 min after one session and 20 before the next: bridges them.
    "bridging": ([cart("c1", at(55))], [], [("c1", 0, 125)]),
    # The last event of a session: only that session is recomputed.
    "taken out": ([], [1], [("c1", 0, 30)]),
    # The middle of a session, its neighbours 50 min apart: it splits.
    "split": ([], [3], [("c1", 75, 125)]),
    # Two changes, each joining a session exactly 30 min away; 45 min apart.
    "two spans": (
        [cart("c1", at(155)), cart("c1", at(230))],
        [],
        [("c1", 75, 155), ("c1", 200, 230)],
    ),
    # Two changes whose spans are exactly 30 min apart: one span.
    "spans meet": ([cart("c1", at(150)), cart("c1", at(180))], [], [("c1", 75, 200)]),
    # A new customer's events 20 min apart: one span, though gold has no row near them.
    "new customer": ([cart("c3", at(0)), cart("c3", at(20))], [], [("c3", 0, 20)]),
}


def _session_change(silver_df, added, taken):
    """SESSION_LOG as (before, after, changed) for a change that adds `added` and
    takes out the events at `taken`: silver before and after it, and the rows it
    changed (added or taken out)."""
    everything = silver_df([*SESSION_LOG, *added])
    rows = everything.collect()
    n = len(SESSION_LOG)
    spark = everything.sparkSession

    def frame(kept):
        return spark.createDataFrame(kept, everything.schema)

    return (
        frame(rows[:n]),
        frame([r for i, r in enumerate(rows) if i not in taken]),
        frame([r for i, r in enumerate(rows) if i >= n or i in taken]),
    )


@pytest.fixture(scope="module")
def session_gold(spark, tmp_path_factory) -> Path:
    """cart_sessions v1's gold of SESSION_LOG, as the runner's path writes it (a
    MERGE into the made table): every case below starts from it, a copy each."""
    view = views.get("cart_sessions", 1)
    path = tmp_path_factory.mktemp("sessions") / "gold"
    before = silver_rows(spark, SESSION_LOG)
    gold_writes.ensure_gold(spark, str(path), view)
    gold_writes.apply_changes(spark, str(path), view, before, before)
    return path


@pytest.mark.parametrize("case", sorted(SESSION_CHANGES))
def test_a_sessions_change_is_decided_by_the_events_near_it(
    silver_df, tmp_path, case, session_gold
):
    """Rows of gold outside the spans near a change, with the rows recomputed from
    the events inside them (read from only the days they cover), are the view of
    silver after the change; alike when gold already holds the change (a
    micro-batch retried after its commit); and so is gold after `apply_changes`.

    Over 20 s: the spans checked against gold before and after the change (ten Spark
    actions, each pick by value checked against the join), then `apply_changes`
    three times on a real Delta table holding the gold of before (a MERGE by
    delta-rs, and two repeats that write nothing) and its change feed read back,
    since what it proves is the runner's own path, the MERGE and what it publishes
    included. The gold of before is made once for the module (`session_gold`)."""
    view = views.get("cart_sessions", 1)
    added, taken, want = SESSION_CHANGES[case]
    before, after, changed = _session_change(silver_df, added, taken)
    spark = before.sparkSession
    # Each computed once and held, as `apply_changes` holds `near`: every use below
    # would compute it from silver again (two shuffles each).
    expected = gold_writes.gold_rows(view, after).localCheckpoint(eager=True)
    t0 = at(0).timestamp()

    before_gold = gold_writes.gold_rows(view, before).localCheckpoint(eager=True)
    for gold in (before_gold, expected):
        spans_df = scoping.keyed(view, scoping.near(view, changed, gold)).localCheckpoint(
            eager=True
        )
        found = spans_df.collect()
        near = scoping.spans(view, spans_df, found)
        spans = sorted(
            (r.customer_id, round((r.lo / 1e6 - t0) / 60), round((r.hi / 1e6 - t0) / 60))
            for r in found
        )
        assert spans == want
        narrow = scoping.narrowed(
            view, after, scoping.merged_ranges((r.lo, r.hi + 1) for r in found)
        )
        deciding = scoping.restrict_near(view, narrow, near)
        # Picked by value (`scoping.Spans`), the same rows as a broadcast join of the
        # spans picks (a batch past MAX_SPANS_BY_VALUE of them), of silver and of gold.
        assert_df_equality(
            deciding, scoping.restrict_near(view, narrow, spans_df), ignore_row_order=True
        )
        # Nothing of the customer's other days is read.
        assert deciding.where(F.col("event_time") >= at(hours=47)).count() == 0
        fresh = gold_writes.gold_rows(view, deciding)
        replaced = scoping.rows_near(view, gold, near)
        assert_df_equality(replaced, scoping.rows_near(view, gold, spans_df), ignore_row_order=True)
        kept = gold.join(replaced, list(view.key), "left_anti")
        assert_df_equality(kept.unionByName(fresh), expected, ignore_row_order=True)

    # The runner's own path on a Delta table, as a live stream on a local lake takes
    # it: the MERGE, committed by delta-rs (`lake.Committer`), bounded by the spans'
    # times, its deletes (a split or merged session's old rows), and the rows it
    # recomputed, where restatements are placed. (Spark's MERGE, a catch-up's:
    # `test_a_batch_of_many_changes_recomputes_its_customers_whole`.)
    path = str(tmp_path / "gold")
    shutil.copytree(session_gold, path)  # the gold of `before`, at its versions 0-1
    writer = lake.Committer(path, {})
    applied = gold_writes.apply_changes(
        spark, path, view, changed, after, txn=("t", 1), writer=writer
    )
    assert_df_equality(
        spark.read.format("delta").load(path), expected, ignore_row_order=True, ignore_nullable=True
    )
    # What the batch publishes, read off its MERGE: the records its commit's change
    # feed gives (as Spark reads delta-rs's commit), tombstones of the old sessions
    # included.
    assert_staged_is_the_newest_commit(spark, path, view, applied.staged)
    newest = writer.version()
    # Repeated (a micro-batch retried after its commit): its transaction id is in
    # gold, so nothing is written or published; and under a new id, nothing differs.
    for txn in [("t", 1), ("t", 2)]:
        again = gold_writes.apply_changes(spark, path, view, changed, after, txn=txn, writer=writer)
        assert again.staged is None
    assert writer.version() == newest
    assert lake.txn_version(spark, path, "t") == 1
    assert applied.rows is not None
    assert_df_equality(
        applied.rows,
        expected.join(
            scoping.rows_near(view, expected, scoping.near(view, changed, expected)),
            list(view.key),
            "left_semi",
        ),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_a_sessions_batch_picked_by_delta_rs_takes_its_spans_by_value_or_joined(
    spark, silver_df, tmp_path, monkeypatch
):
    """A live sessions batch reads its rows of silver and gold by delta-rs (`pick`,
    `pick_gold`): local relations, which Spark's optimizer filters on the driver,
    row by row. Up to MAX_SPANS_BY_VALUE spans they are picked by value
    (`scoping.Spans`); past it, joined, since the condition's map of every key's
    spans is built for each row (37 s of a 960-span batch in stop 99's bench). Both
    ways give gold the view of silver after the change, from the rows delta-rs read.

    c2's session at 100-160 min straddles c1's span at 75-155 and is near no change
    of c2's: picked by time alone, or by customer alone, its event at 100 would be
    recomputed without the one at 160 (outside every span, so never read).

    c3's event three years late is the batch's too, as under chaos traffic: gold is
    still read by delta-rs, around each change's hour and in each span, not in one
    range from the first change to the last (then Spark's scan of all of gold). It
    joins c3's session of then, which only a read around its hour finds."""
    view = views.get("cart_sessions", 1)
    late = cart("c3", at(hours=-3 * 365 * 24))
    log = [
        *SESSION_LOG,
        cart("c2", at(100)),
        cart("c2", at(160)),
        cart("c3", at(-10, hours=-3 * 365 * 24)),
    ]
    added = [cart("c1", at(155)), cart("c1", at(230)), cart("c2", at(300)), late]
    everything = silver_df([*log, *added])
    rows, schema = everything.collect(), everything.schema
    before = spark.createDataFrame(rows[: len(log)], schema)
    after = spark.createDataFrame(rows, schema)
    changed = spark.createDataFrame(rows[len(log) :], schema)
    silver_path = str(tmp_path / "silver")
    after.write.format("delta").save(silver_path)
    expected = gold_writes.gold_rows(view, after).localCheckpoint(eager=True)
    made = str(tmp_path / "gold-before")
    gold_writes.ensure_gold(spark, made, view)
    gold_writes.apply_changes(spark, made, view, before, before)
    real_in_spans = scoping._in_spans
    for limit, way in ((gold_writes.MAX_SPANS_BY_VALUE, scoping.Spans), (0, DataFrame)):
        monkeypatch.setattr(gold_writes, "MAX_SPANS_BY_VALUE", limit)
        path = str(tmp_path / f"gold-{limit}")
        shutil.copytree(made, path)
        conditions: list[str] = []
        ways: list[type] = []

        def pick(condition: str, conditions: list[str] = conditions) -> DataFrame:
            conditions.append(condition)
            return lake.read_where(spark, silver_path, {}, 0, condition)

        def pick_gold(
            version: int, condition: str, path: str = path, conditions: list[str] = conditions
        ) -> DataFrame:
            conditions.append(condition)
            return lake.read_where(spark, path, {}, version, condition)

        def in_spans(
            view: View,
            rows: DataFrame,
            time: str,
            scope: list[str],
            near: DataFrame | scoping.Spans,
            ways: list[type] = ways,
        ) -> DataFrame:
            ways.append(type(near))
            return real_in_spans(view, rows, time, scope, near)

        monkeypatch.setattr(scoping, "_in_spans", in_spans)
        spark_reads: list[int] = []

        def whole(spark_reads: list[int] = spark_reads) -> DataFrame:
            spark_reads.append(1)
            return after

        gold_writes.apply_changes(
            spark,
            path,
            view,
            changed,
            whole,
            txn=("t", 1),
            pick=pick,
            pick_gold=pick_gold,
            writer=lake.Committer(path, {}),
        )
        # Silver once, gold around the changes and where the spans start; the spans
        # picked silver's rows and gold's the one way.
        assert len(conditions) == 3, conditions
        # ...and none of silver through Spark, which would build its snapshot.
        assert not spark_reads
        assert len(ways) == 2 and all(issubclass(w, way) for w in ways), ways
        assert_df_equality(
            spark.read.format("delta").load(path),
            expected,
            ignore_row_order=True,
            ignore_nullable=True,
        )


@pytest.mark.parametrize("case", ["bridging", "split"])
def test_a_batch_of_many_changes_recomputes_its_customers_whole(
    silver_df, tmp_path, monkeypatch, case
):
    """Past MAX_NEAR_CHANGES changed rows the runner recomputes each touched customer
    from all of their events instead: the same gold. So large a batch also stays in
    Spark past MAX_STAGED_ROWS: nothing is staged, and the change feed publishes it."""
    monkeypatch.setattr(gold_writes, "MAX_NEAR_CHANGES", 0)
    monkeypatch.setattr(gold_writes, "MAX_STAGED_ROWS", 0)
    view = views.get("cart_sessions", 1)
    added, taken, _ = SESSION_CHANGES[case]
    before, after, changed = _session_change(silver_df, added, taken)
    spark = before.sparkSession
    path = str(tmp_path / "gold")
    gold_writes.ensure_gold(spark, path, view)
    gold_writes.apply_changes(spark, path, view, before, before)
    applied = gold_writes.apply_changes(spark, path, view, changed, after)
    assert_df_equality(
        spark.read.format("delta").load(path),
        gold_writes.gold_rows(view, after),
        ignore_row_order=True,
        ignore_nullable=True,
    )
    assert applied.staged is None
    # Whole customers: the rows recomputed include c1's session two days later.
    assert applied.rows is not None
    assert applied.rows.where(F.col("session_start") >= at(hours=47)).count() == 1


def test_a_session_gap_needs_a_scope_of_its_own():
    cols = {"customer_id": "customer_id"}
    with pytest.raises(ValueError, match="gap"):
        Scope(columns=cols, of=("cart_item_added",), gap=timedelta(0))
    with pytest.raises(ValueError, match="no within and no linked"):
        Scope(
            columns={"a": "a", "b": "b"},
            of=("cart_item_added",),
            within=("a", "b"),
            gap=timedelta(minutes=30),
        )
    with pytest.raises(ValueError, match="no within and no linked"):
        Scope(
            columns=cols,
            of=("order_placed",),
            linked_by="order_id",
            linked=("order_cancelled",),
            gap=timedelta(minutes=30),
        )


def test_spans_picked_by_value_hold_no_null_scope_and_quote_their_keys():
    """`scoping.Spans.hold`'s SQL: a span of a null scope value holds nothing (as the
    join's equality), a key is quoted as a Spark string literal, and each key's
    spans are listed under it."""
    view = views.get("cart_sessions", 1)
    rows = [
        Row(customer_id="o'neil\\x", lo=10, hi=20, _key="o'neil\\x"),
        Row(customer_id="o'neil\\x", lo=30, hi=40, _key="o'neil\\x"),
        Row(customer_id=None, lo=1, hi=2, _key="\x00"),
    ]
    sql = scoping.Spans(view, rows, {"customer_id": StringType()}).hold(["`c`"], "`t`")
    assert "'o\\'neil\\\\x'" in sql
    assert "named_struct('lo', 10L, 'hi', 20L), named_struct('lo', 30L, 'hi', 40L)" in sql
    assert "1L" not in sql and "\x00" not in sql
    only_null = scoping.Spans(view, rows[2:], {"customer_id": StringType()})
    assert only_null.hold(["`c`"], "`t`") == "false"
