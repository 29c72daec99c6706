"""One event log, three ways: shuffled micro-batches, one replay, one batch -- one answer."""

from __future__ import annotations

import random

import pytest

from spark_jobs import views
from spark_jobs.engine import gold_writes, lake, runner, session
from spark_jobs.engine.links import LinkIndex
from spark_jobs.engine.progress import Progress
from tests.frames import assert_df_equality
from tests.spark_jobs.conftest import (
    at,
    cancel,
    cart,
    item,
    jobs_so_far,
    order,
    web_session,
    web_view,
)
from warehouse.ops.stack.process import wait_until

LOG = [
    # two hours of orders in two currencies, with cancellations before, after and twice
    cancel("o2", at(-20)),
    order("o1", at(5), "10.00", customer_id="c1"),
    order("o2", at(15), "4.50", customer_id="c2"),
    order("o3", at(65), "3.25", currency="USD", customer_id="c1"),
    order("o3", at(66), "1.00", currency="USD", customer_id="c3"),  # repeated order_id
    cancel("o3", at(hours=30)),
    cancel("o3", at(hours=31)),
    order("o4", at(hours=-50), "7.00"),  # far beyond the allowed lateness
    # sessions: c1 0..30 (exactly 30 min), c1 again at 61 (bridged late by 45),
    # c2 alone; an order converts
    cart("c1", at(0)),
    cart("c1", at(30), 2),
    cart("c1", at(61)),
    cart("c1", at(45), 1, removed=True),
    cart("c2", at(10), 3),
    cart("c4", at(30, ms=1)),
    cart("c4", at(0)),
]


# What the web source adds for a view that reads it too (visits): c5 views a product
# and orders it (a converted visit), later views one and orders another; c1's views
# fall between its orders, one of them bridging two visits.
WEB_LOG = [
    web_session("c5", at(0), "s1"),
    web_view("c5", at(2), "s1", "prod-0001"),
    order("o9", at(10), "3.00", customer_id="c5", items=[item("prod-0001", 1, "3.00")]),
    web_view("c5", at(15), "s1", "prod-0002"),
    web_session("c5", at(hours=3), "s2", "ads"),
    web_view("c5", at(181), "s2", "prod-0003"),
    order("o8", at(185), "2.00", customer_id="c5", items=[item("prod-0004", 2, "1.00")]),
    web_session("c1", at(18), "s3", "email"),
    web_view("c1", at(20), "s3", "prod-0001"),
    web_view("c1", at(45), "s3", "prod-0005"),
]


def log_of(silver_df, view):
    """LOG in the view's input: with WEB_LOG for a view that reads the web source."""
    return silver_df(LOG + (WEB_LOG if "web" in view.sources else []), view=view)


def _compiles(spark) -> bool:
    """Whether `spark` plans with whole-stage generated code."""
    plan = spark.range(3).selectExpr("id + 1")._jdf.queryExecution().executedPlan()
    # A whole-stage codegen plan is rooted in WholeStageCodegenExec and prints "*(1)".
    return "WholeStageCodegen" in plan.getClass().getName() and "*(" in plan.toString()


# Each view version; those with linked events also as a live stream runs them,
# reading linked events by their link index (`links.LinkIndex`).
RUNS = [(*v, False) for v in sorted(views.discover())] + [
    (*v, True) for v in sorted(views.discover()) if views.get(*v).scope.linked
]


@pytest.mark.parametrize("name,version,indexed", RUNS)
def test_shuffled_micro_batches_replay_and_batch_agree(
    spark, tmp_path, silver_df, name, version, indexed
):
    """A view's gold is the same from shuffled micro-batches, from one replay and from
    one batch, and a micro-batch run again changes nothing.

    Over 20 s per case: LOG's 15 events as five micro-batches of three in shuffled order,
    each `apply_changes` on a real Delta table (a MERGE where rows change), one repeated,
    then all of it as one change into a second table, since what it proves is that
    arrival order and batch boundaries do not change what real MERGEs leave."""
    view = views.get(name, version)
    links = LinkIndex(view) if indexed else None
    log_df = log_of(silver_df, view)
    rows = log_df.collect()
    # The batch and the replay compile their plans, as a replay does on the host
    # (the tests' own session does not: tests/conftest.py).
    compiled = spark.newSession()
    for key in session.INTERPRETED_CONF:
        compiled.conf.unset(key)
    assert _compiles(compiled)
    log_df = compiled.createDataFrame(rows, log_df.schema)
    # Computed once: three comparisons below read it (the schema stays as computed).
    batch_answer = view.compute(log_df).localCheckpoint()

    # (a) live: small micro-batches in a shuffled arrival order; silver grows with each.
    # In a live query's session, as the view host runs them: without generated code.
    spark_live = runner.live_session(spark)
    assert not _compiles(spark_live)
    assert spark_live.conf.get("spark.sql.codegen.factoryMode") == "NO_CODEGEN"
    assert spark_live.conf.get("spark.sql.adaptive.enabled") == "false"
    live = str(tmp_path / "live")
    gold_writes.ensure_gold(spark_live, live, view)
    order_ = list(range(len(rows)))
    random.Random(version * 31 + len(name)).shuffle(order_)
    chunks = [order_[i : i + 3] for i in range(0, len(order_), 3)]
    seen: list[int] = []
    for chunk in chunks:
        seen += chunk
        changed = spark_live.createDataFrame([rows[i] for i in chunk], log_df.schema)
        silver = spark_live.createDataFrame([rows[i] for i in seen], log_df.schema)
        gold_writes.apply_changes(spark_live, live, view, changed, silver, links)
    # ...and a micro-batch replayed after a crash changes nothing: no row of gold
    # differs, so there is no commit (and no change a live version publishes).
    before = lake.newest_version(spark_live, live)
    assert gold_writes.apply_changes(spark_live, live, view, changed, silver, links).scopes > 0
    assert lake.newest_version(spark_live, live) == before

    # (b) replay: all of history as one change.
    replay = str(tmp_path / "replay")
    gold_writes.ensure_gold(compiled, replay, view)
    gold_writes.apply_changes(compiled, replay, view, log_df, log_df)

    read = compiled.read.format("delta").load
    for got in (read(live), read(replay)):
        assert_df_equality(
            got, batch_answer, ignore_row_order=True, ignore_nullable=True, ignore_column_order=True
        )
    assert batch_answer.count() > 1  # the log is not trivial for this view


def test_replay_progress_follows_the_jobs_tasks(spark, caplog):
    caplog.set_level("INFO", logger="spark_jobs.engine.progress")
    with Progress(spark, "replay t_v1", 1000, every_s=0.05) as progress:
        assert progress.share_done() == 0.0
        spark.range(0, 200_000, numPartitions=4).selectExpr("sum(id)").collect()
        # The status tracker hears of finished tasks through Spark's listener bus,
        # which can lag the action's return by a moment on busy cores, and for
        # longer in `make test`, where this runs beside the integration tests at the
        # lowest priority (infra/run-tests.sh).
        wait_until(lambda: progress.share_done() == 1.0, 300, interval=0.05)
        assert progress.share_done() == 1.0
    assert progress.summary().startswith("1,000 events in ")
    assert any("replay t_v1: ~" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("name,version", [("revenue_hourly", 1), ("revenue_hourly", 2)])
def test_a_batchs_scopes_picked_by_value_or_joined_past_the_limit_give_one_answer(
    spark, tmp_path, silver_df, monkeypatch, name, version
):
    """Hourly views: a live batch collects its few scopes and picks them out of silver
    and gold by value (`scoping.Listed`), one Spark job where materialising them,
    counting them and two broadcasts took four; past MAX_LISTED_SCOPES (a catch-up)
    they are joined as before. Both ways leave gold the view of the log, and the
    micro-batch picked by value is at least three jobs fewer (issue 67)."""
    view = views.get(name, version)
    live = runner.live_session(spark)
    log_df = log_of(silver_df, view)
    rows = log_df.collect()
    expected = view.compute(log_df).localCheckpoint()
    jobs = {}
    most = gold_writes.MAX_LISTED_SCOPES
    for limit in (most, 0):
        monkeypatch.setattr(gold_writes, "MAX_LISTED_SCOPES", limit)
        path = str(tmp_path / f"gold-{limit}")
        gold_writes.ensure_gold(live, path, view)
        first = live.createDataFrame(rows[1::2], log_df.schema)
        gold_writes.apply_changes(live, path, view, first, first)
        changed = live.createDataFrame(rows[::2], log_df.schema)
        silver = live.createDataFrame(rows, log_df.schema)
        links = LinkIndex(view) if view.scope.linked else None
        before = jobs_so_far(spark)
        applied = gold_writes.apply_changes(live, path, view, changed, silver, links)
        jobs[limit] = jobs_so_far(spark) - before
        assert applied.scopes > 1
        assert_df_equality(
            live.read.format("delta").load(path),
            expected,
            ignore_row_order=True,
            ignore_nullable=True,
            ignore_column_order=True,
        )
    picked, joined = jobs[most], jobs[0]
    print(f"{name} v{version}: a batch's jobs picked by value {picked}, joined {joined}")
    assert picked <= joined - 3, jobs
