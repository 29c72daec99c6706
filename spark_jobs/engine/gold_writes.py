"""Writing a view version's gold table: the unit of work of every mode.

`apply_changes`: given silver rows that changed (a micro-batch of silver's change
feed, or all of silver), find the scopes they touch, recompute exactly those from
silver, and replace them in the gold table with one MERGE. Recomputing from silver
rather than folding the change into old results is what makes the answer
independent of arrival order, micro-batch boundaries and lateness; replacing whole
scopes makes a repeated micro-batch harmless.

A view whose rows add up (`View.sums`: counts and sums per hour) is the exception in
a live stream: `fold_changes` adds what a micro-batch put in silver to gold's rows
and takes off what it took out, reading no silver. The sum of the changes is as
independent of their order as the recompute, and the batch's transaction id on its
commit keeps a retried batch from counting twice.
"""

from __future__ import annotations

import functools
import logging
import operator
from collections.abc import Callable, Iterable
from functools import reduce
from typing import NamedTuple

from delta.tables import DeltaTable
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from spark_jobs.engine import changes, lake, restatements, scoping
from spark_jobs.engine.links import LinkIndex
from spark_jobs.views.base import View
from warehouse.base import registry

log = logging.getLogger(__name__)


# Every view version's table: with its change feed on, since a live version
# publishes its commits from it; and without Delta's auto compaction, which
# bin-packs a table's small files (under 64 MiB: every file of a view's table)
# into one as soon as the writer has seen 50 of them, mixing the times that
# gold's layout keeps apart (GOLD_FILE_ROWS). Tried: the first live MERGE after
# a replay of 60 files compacted them into one. A live MERGE replaces the files
# it touches rather than adding one per commit, and maintenance lays the table
# out again daily.
AUTO_COMPACT = "delta.autoOptimize.autoCompact"
# A live stream's commits on a local lake are delta-rs's (`lake.Committer`), which
# writes a checkpoint every delta.checkpointInterval commits, 100 where the table
# does not say; Spark's default is 10. Said, so that readers of gold (Spark, Trino)
# replay at most 10 commits of log whichever wrote them.
CHECKPOINT_INTERVAL = "delta.checkpointInterval"
GOLD_PROPERTIES = {changes.CDF_PROPERTY: "true", AUTO_COMPACT: "false", CHECKPOINT_INTERVAL: "10"}


# Gold's files are laid out by time: a replay writes them sorted by the window
# start, at most this many rows each (about 250 KiB of cart_sessions), and
# maintenance Z-orders them by it into files of about GOLD_FILE_BYTES. A live
# MERGE then rewrites only the files whose hours its rows start in, which a live
# batch's recent rows keep to the newest few: Delta rewrites every file holding a
# row a MERGE changes. Profiled in `make bench`, with gold in 3 files of mixed
# times, each cart_sessions batch rewrote all 546,000 rows (12-15 s of task time);
# alone, a 2,200-row MERGE into 581,000 rows took 3.3-4.6 s in 3 such files and
# 1.1-1.3 s in 13 files by time. Small, since the newest file takes every new
# row until the next maintenance, and a live batch rewrites it whole: with
# 1 MiB files that was 45,000 rows of older sessions in each cart batch.
GOLD_FILE_ROWS = 10_000
GOLD_FILE_BYTES = 256 << 10


def ensure_gold(spark: SparkSession, path: str, view: View) -> None:
    """Create the view version's table if it is new; set GOLD_PROPERTIES on one made
    before they were what they are (auto compaction was on)."""
    lake.ensure_table(spark, path, view.schema, GOLD_PROPERTIES)
    lake.ensure_properties(spark, path, GOLD_PROPERTIES)


def gold_rows(view: View, silver: DataFrame) -> DataFrame:
    """The view's function, its output held to the declared schema (types and order).

    Cast by type name: over Spark Connect a StringType object arrives with an
    explicit UTF8_BINARY collation, which Delta then writes into the table's
    schema as "string collate UTF8_BINARY", a type Trino 476 cannot read."""
    return view.compute(silver).select(
        *[F.col(f.name).cast(f.dataType.simpleString()) for f in view.schema.fields]
    )


# Past this many changed rows in one batch (a catch-up after an outage, a replay
# through the runner), sessions are recomputed whole, customer by customer: the
# spans near each change are one broadcast row per changed event and one row per
# span collected here, which a backlog of a million recent events made a 10 GiB
# view host in `make bench`; and a backlog touches most of history anyway.
MAX_NEAR_CHANGES = 20_000


# Up to this many scopes, a batch collects its scopes with their time bounds in one
# Spark job and picks them out of silver and gold by value (`scoping.Listed`). A
# broadcast join of them runs a job of its own to broadcast them, in each of the two
# plans that use them. Past it (a catch-up), they are materialised and joined.
MAX_LISTED_SCOPES = 1_000


# Up to this many spans, a sessions batch picks its rows out of silver and gold by
# value (`scoping.Spans`); past it, by a broadcast join of the spans, a job in each of
# the two plans. The rows delta-rs reads are a local relation, which Spark's optimizer
# filters on the driver, row by row, before it folds constants: the condition's map of
# every key's spans is built again for each row. In stop 99's bench a `cart_sessions`
# batch of 960 spans spent 37 s of the view host's driver in that filter (28,281 rows
# kept). Alone on 2 cores: 960 spans over 20,000 rows, 2.4 s by value and 0.4 s
# joined; 200 over 12,000, 0.4 s by value; 100 over 6,000, 0.2 s (docs/BENCHMARKS.md).
MAX_SPANS_BY_VALUE = 100


# A live batch reads the rows of silver and gold it names by delta-rs, onto the
# driver (`apply_changes`' `pick`, `pick_gold`), while the time ranges they lie in
# (merged, `scoping.merged_ranges`) sum to at most this much event time and their
# linked keys are listed; past it (a catch-up), Spark's scans read them across its
# tasks. A late event days old adds its own range, not the days in between.
MAX_PICKED_MICROS = 24 * 3600 * 1_000_000


def _few(ranges: Iterable[tuple[int, int]]) -> bool:
    return sum(b - a for a, b in ranges) <= MAX_PICKED_MICROS


# A batch's changes to gold are read off the MERGE's source (one Spark job, which
# also gives the hours the MERGE may touch) when they are at most this many rows:
# they then go to the view's topic from the driver (`changes.Staged`). A larger
# source (a catch-up) stays in Spark, and the change feed publishes it.
MAX_STAGED_ROWS = 50_000


class Applied(NamedTuple):
    """What `apply_changes` or `fold_changes` did: how many scopes it changed, the part
    of silver it read them from (a fold reads none), the rows it recomputed (what
    placing the batch's restatements in sessions needs: every event it landed is
    in one of them), and the gold commit it made with its records for the view's
    topic, when read off the MERGE; and whether it folded the change in."""

    scopes: int
    silver: DataFrame | None
    rows: DataFrame | None = None
    staged: changes.Staged | None = None
    folded: bool = False


# Delta's idempotent DML: a MERGE under a (txnAppId, txnVersion) that the table
# has committed already is skipped, and the commit records the pair otherwise.
TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


def apply_changes(
    spark: SparkSession,
    path: str,
    view: View,
    changed: DataFrame,
    silver: DataFrame | Callable[[], DataFrame],
    links: LinkIndex | None = None,
    txn: tuple[str, int] | None = None,
    span: tuple[int, int | None, int | None, list[int]] | None = None,
    pick: Callable[[str], DataFrame] | None = None,
    pick_gold: Callable[[int, str], DataFrame] | None = None,
    writer: lake.Committer | None = None,
) -> Applied:
    """Recompute the scopes `changed` touches from `silver`; replace them in gold at `path`.

    `silver`: the snapshot of silver the batch reads, or a function that reads it,
    called only where the batch reads through Spark (a live batch: Spark builds the
    snapshot of a version as it reads it, two jobs for each source that delta-rs
    committed, where delta-rs's picks below serve most batches).
    With `links` (a view with linked events, run batch after batch by a live
    stream), linked events and the `of` events they link to are read from the
    days of silver the index names, not from all of history. With `txn` (a live
    stream's txnAppId and batch id) the commit records it, for `fold_changes`.
    With `span` (`span_columns` of `changed`, already read: a live batch observes
    them as it materialises its rows), a view of sessions does not read them again.
    With `pick` (a live batch: the rows of the same snapshot of silver that meet a
    SQL condition, read by delta-rs, `inputs.read_where`), the rows of silver a
    batch of few scopes needs are read that way, not by Spark's scans of silver,
    and not filtered again by Spark (`scoping.narrowed`: over rows on the driver,
    Spark's optimizer evaluates a filter row by row, interpreted, before any job);
    with `pick_gold` (the same of gold: a version and a condition), gold's rows in
    their windows too. With `writer` (a live stream's on a local lake), gold's newest
    version is read by delta-rs and a small MERGE committed by it (`_merge`): then
    a batch whose rows `pick_gold` reads touches gold through Spark not at all."""
    gold = _spark_table(spark, path)
    whole = _once(silver)
    # The commit the MERGE below makes is this one's successor, unless another
    # writer commits in between (then the change feed publishes both).
    before = writer.version() if writer is not None else lake.newest_version(spark, path)
    # Gold in Spark, only where a batch reads it so: building Spark's snapshot costs
    # jobs over the log wherever its version has no checksum.
    target: DataFrame | None = None

    def current() -> DataFrame:
        return target if target is not None else gold().toDF()

    # The changed rows' times (UTC microseconds), for sessions when the batch is
    # small enough to follow change by change. One job counts and bounds them, and
    # names the hours they fall in.
    times: tuple[int, int] | None = None
    hours: list[int] = []
    if view.scope.gap is not None:
        size, first, last, hours = span or changed.agg(*span_columns()).first() or _NO_SPAN
        if first is not None and last is not None and size <= MAX_NEAR_CHANGES:
            times = (first, last)
    if times is not None:
        # Sessions: only the rows within the gap of a change can move, and gold
        # says where they are. Read the events in their spans, from the days the
        # spans cover: the work then follows the change, not the customer's history.
        # Gold's rows by the changes' hours, not from the first to the last: under
        # chaos traffic nearly every batch holds an event years late, and then
        # Spark read all of gold in every batch (stop 100's bench). Each change lies
        # in its hour, and `around_sql` widens each hour by the gap, as `around`.
        changed_in = scoping.merged_ranges((h, h + _HOUR_MICROS) for h in hours)
        around = (
            pick_gold(before, scoping.around_sql(view, changed_in))
            if pick_gold is not None and changed_in and _few(changed_in)
            else current()
        )
        found = scoping.near(view, changed, scoping.around(view, around, *times))
        found = scoping.keyed(view, found)
        spans = found.collect()
        # On the driver, the spans are used again: a batch's few pick rows by value.
        # Past MAX_SPANS_BY_VALUE, as a DataFrame to join, which classic PySpark makes
        # an RDD of: broadcasting it runs a job in each plan that joins it.
        near: DataFrame | scoping.Spans = (
            scoping.spans(view, found, spans)
            if len(spans) <= MAX_SPANS_BY_VALUE
            else spark.createDataFrame(spans, found.schema)
        )
        n_scopes = len({tuple(r[c] for c in view.scope_columns) for r in spans})
        if not n_scopes:
            return Applied(0, None)
        # Only the customers near a change: the spans' times alone hold everyone's.
        theirs = scoping.scopes_sql(view, spans)
        ranges = scoping.merged_ranges((r["lo"], r["hi"] + 1) for r in spans)
        lo, hi = min(r["lo"] for r in spans), max(r["hi"] for r in spans)
        if pick_gold is not None and theirs is not None and _few(ranges):
            picked = f"{scoping.starting_in_sql(view, ranges)} AND {theirs}"
            target = pick_gold(before, picked)
        target = scoping.starting_in(view, current(), lo, hi)
        condition = scoping.narrowed_sql(view, ranges, None)
        silver_rows = (
            pick(f"({condition}) AND {theirs}")
            if pick is not None and condition is not None and theirs is not None and _few(ranges)
            else scoping.narrowed(view, whole(), ranges)
        )
        deciding = scoping.restrict_near(view, silver_rows, near)
        replaced = scoping.rows_near(view, current(), near)
    else:
        if links is None:
            of_silver = whole()
        else:
            taken = links.follow(changed, whole)
            days = links.of_days(taken.linked_hashes)
            keys = taken.linked_keys
            # Only the `of` events of the batch's linked keys, on their days.
            of_silver = scoping.of_on_days(
                view,
                pick(scoping.of_on_days_sql(view, days, keys))
                if pick is not None and keys is not None and len(keys) <= MAX_LISTED_SCOPES
                else whole(),
                days,
            )
        scopes = scoping.scopes_of(view, changed, of_silver)
        # A live batch's few scopes, collected with their time bounds in one job and
        # then picked out by value; a catch-up's many, materialised and joined.
        listing = scoping.listing(view, scopes).coalesce(1).limit(MAX_LISTED_SCOPES + 1).collect()
        listed = (
            scoping.listed(view, scopes, listing) if len(listing) <= MAX_LISTED_SCOPES else None
        )
        if listed is None:
            scopes = scopes.localCheckpoint(eager=True)
            of_bounds = scoping.time_bounds(view, scopes)
            bounds = None if of_bounds is None else [(r[0], r[1]) for r in of_bounds.collect()]
        else:
            bounds = listed.bounds
        # Where the scopes bound their events' time (an hour), read only those days of
        # silver: the work then follows the change, not the size of history. (One row
        # of bounds per scope, so they count the scopes too.)
        n_scopes = (
            len(bounds)
            if bounds is not None
            else len(listed.keys)
            if listed is not None
            else scopes.count()
        )
        if not n_scopes:
            return Applied(0, None)
        if bounds is None:
            silver_rows = whole()
        else:
            ranges = scoping.merged_ranges(bounds)
            if view.scope.within and view.scope.within[0] == view.window[0]:
                # A scope's rows start at its own time bound's start: gold's rows by
                # the scopes' ranges, as silver's below (a late event's hour years
                # back no longer makes the batch read all of gold in between).
                lo, hi = min(r[0] for r in bounds), max(r[0] for r in bounds)
                if pick_gold is not None and listed is not None and _few(ranges):
                    target = pick_gold(before, scoping.starting_in_sql(view, ranges))
                target = scoping.starting_in(view, current(), lo, hi)
            linked_days = None if links is None else links.linked_days(ranges)
            condition = scoping.narrowed_sql(view, ranges, linked_days)
            silver_rows = (
                pick(condition)
                if pick is not None
                and condition is not None
                and listed is not None
                and _few(ranges)
                else scoping.narrowed(view, whole(), ranges, linked_days)
            )
        deciding = scoping.restrict(view, silver_rows, scopes, listed)
        replaced = (
            current().join(F.broadcast(scopes), list(view.scope_columns), "left_semi")
            if listed is None
            else current().where(listed.picks())
        )
    # Materialised first: the rows are used twice (what differs from gold, and
    # placing the batch's restatements), and Spark would otherwise read silver and
    # recompute for each (profiled: two scans of 3.9 M rows in one cart batch).
    fresh = gold_rows(view, deciding).localCheckpoint(eager=True)
    source = differences(view, fresh, replaced)
    what = f"{view.table_name}: replacing {n_scopes} scopes"
    staged = _merge(spark, gold, view, source, before, txn, retry_as=what, writer=writer)
    return Applied(n_scopes, silver_rows, fresh, staged)


def _once(silver: DataFrame | Callable[[], DataFrame]) -> Callable[[], DataFrame]:
    """`silver`, or what the function `silver` reads, read at the first call only."""
    if isinstance(silver, DataFrame):
        return lambda: silver
    return functools.cache(silver)


def _spark_table(spark: SparkSession, path: str) -> Callable[[], DeltaTable]:
    """Gold as Spark's DeltaTable, made at the first call only."""
    return functools.cache(lambda: DeltaTable.forPath(spark, path))


def span_columns() -> list[Column]:
    """How many changed rows, their first and last event time, and the hours they fall
    in, in order (UTC microseconds): what a view of sessions follows a small change by
    (`apply_changes`' `span`). The hours by arithmetic on the microseconds, not
    `date_trunc`, which works in the session's time zone."""
    micros = F.unix_micros("event_time")
    return [
        F.count(F.lit(1)),
        F.min(micros),
        F.max(micros),
        F.array_sort(F.collect_set(micros - F.pmod(micros, F.lit(_HOUR_MICROS)))),
    ]


# `span_columns` of no rows, and an hour, in UTC microseconds.
_NO_SPAN: tuple[int, None, None, list[int]] = (0, None, None, [])
_HOUR_MICROS = 3_600_000_000


def _merge(
    spark: SparkSession,
    gold: Callable[[], DeltaTable],
    view: View,
    changed: DataFrame,
    before: int,
    txn: tuple[str, int] | None,
    *,
    retry_as: str | None,
    writer: lake.Committer | None = None,
) -> changes.Staged | None:
    """MERGE `changed` (gold's columns and `_op`, see `differences`) into `gold`, whose
    newest commit was `before`; the commit's records for the view's topic, when
    read off the source (None: published from the change feed, or no commit).
    With `retry_as` (what to call it in the log), again after a conflicting commit
    (safe where `changed` replaces whole rows as silver decides them); without, a
    conflict is raised. With `writer` (a live stream's, `txn` its batch), a source
    of at most MAX_STAGED_ROWS rows is committed by delta-rs (`_merge_rs`)."""
    if writer is not None and txn is not None:
        done, staged = _merge_rs(spark, view, changed, before, txn, writer, retry_as)
        if done:
            return staged
    # Materialised once: a MERGE reads its source twice (to find the files it
    # touches, then to write them), and the source reads the gold the MERGE changes.
    source = changed.localCheckpoint(eager=True)
    key = list(view.key)
    names = [f.name for f in view.schema.fields]
    commit = before + 1
    # In one partition before the limit: a limit's collect over several partitions
    # reads the first, finds it short, and runs a second job for the rest.
    written: list[Row] = (
        source.select(*changes.staged_columns(view, commit), _hour_micros(view).alias("hour"))
        .coalesce(1)
        .limit(MAX_STAGED_ROWS + 1)
        .collect()
    )
    fits = len(written) <= MAX_STAGED_ROWS
    staged_rows = written if fits else []
    hour_rows = (
        written if fits else source.select(_hour_micros(view).alias("hour")).distinct().collect()
    )
    hour_starts = [r["hour"] for r in hour_rows]
    if not hour_starts:
        # Every recomputed row came out as gold has it (a micro-batch retried after
        # its commit, a change that moves no total): nothing to write. Gold's
        # newest tag names an older silver version, of which gold is the view too.
        return None
    values: dict[str, str | Column] = {c: f"s.{c}" for c in names}
    # Only rows whose values moved are in the source, so the change feed (and the
    # published view changes) holds only those. Checked again here, null-safe, in
    # case a retry after a conflict meets a gold that already has them.
    differs = " OR ".join(f"NOT (t.`{c}` <=> s.`{c}`)" for c in names if c not in key)
    update_when = f"s._op = 'upsert' AND ({differs})" if differs else "false"
    condition = lake.merge_condition(key) + (
        _within_hours(view, hour_starts, lambda v: f"timestamp_micros({v})") or ""
    )

    def run() -> DataFrame:
        return (
            gold()
            .alias("t")
            .merge(source.alias("s"), condition)
            .whenMatchedDelete(condition="s._op = 'delete'")
            .whenMatchedUpdate(condition=update_when, set=values)
            .whenNotMatchedInsert(condition="s._op = 'upsert'", values=values)
            .execute()
        )

    ids = {} if txn is None else {TXN_APP_ID: txn[0], TXN_VERSION: str(txn[1])}
    with lake.source_checkpointed(spark), lake.session_conf(spark, ids):
        # Replacing whole scopes is safe to repeat after a conflicting commit
        # (table maintenance, an operator's fix) aborted the first try.
        merged = run() if retry_as is None else lake.retry_on_conflict(run, retry_as)
    # The MERGE's metrics are one local row. A MERGE that changed no row may make no
    # commit at all: then `commit` is not its own, and the change feed decides.
    if staged_rows and (merged.first() or {"num_affected_rows": 0})["num_affected_rows"]:
        return changes.Staged(commit, [(commit, r["key"], r["value"]) for r in staged_rows])
    return None


# The columns `_merge_rs` adds to a MERGE's source, read on the driver, not merged.
_STAGED = ("_staged_key", "_staged_value", "_staged_hour")


def _merge_rs(
    spark: SparkSession,
    view: View,
    changed: DataFrame,
    before: int,
    txn: tuple[str, int],
    writer: lake.Committer,
    retry_as: str | None,
) -> tuple[bool, changes.Staged | None]:
    """`_merge` by delta-rs: whether it was done (False: the source has more than
    MAX_STAGED_ROWS rows, for Spark's MERGE), and its records. The source, its
    records and its hours come to the driver in one Spark job, and the commit takes
    none, where Spark's MERGE runs 4 or 5 and builds the new snapshot's state from
    the log (docs/design/issue-67-design-b-delta-rs.md)."""
    app_id, batch = txn
    done = writer.txn_version(app_id)
    if done is not None and done >= batch:
        # A batch retried after its commit (a crash before the stream recorded it):
        # Spark's MERGE skips such a txn by itself, delta-rs does not.
        log.info("%s: batch %d is in gold already; not merging it again", view.table_name, batch)
        return True, None
    commit = before + 1
    key, value = changes.staged_columns(view, commit)
    # In one partition before the limit, as in `_merge`.
    table = (
        changed.select(
            *changed.columns,
            key.alias(_STAGED[0]),
            value.alias(_STAGED[1]),
            _hour_micros(view).alias(_STAGED[2]),
        )
        .coalesce(1)
        .limit(MAX_STAGED_ROWS + 1)
        .toArrow()
    )
    if table.num_rows > MAX_STAGED_ROWS:
        return False, None
    hours = _within_hours(view, table.column(_STAGED[2]).to_pylist(), scoping.sql_micros)
    if hours is None:
        return True, None  # nothing differs: see `_merge`
    keys, values = table.column(_STAGED[0]).to_pylist(), table.column(_STAGED[1]).to_pylist()
    records = [(commit, k, v) for k, v in zip(keys, values, strict=True)]
    rows = table.drop_columns(list(_STAGED))
    names = [f.name for f in view.schema.fields]
    # Null-safe, as Spark's `<=>` in `_merge`; parenthesised, since DataFusion's
    # parser binds IS DISTINCT FROM more loosely than OR.
    moved = " OR ".join(f"(t.`{c}` IS DISTINCT FROM s.`{c}`)" for c in names if c not in view.key)
    tag = spark.conf.get(lake.USER_METADATA, None)

    # Quoted: DataFusion folds unquoted names to lower case.
    on = " AND ".join(f"t.`{k}` = s.`{k}`" for k in view.key)

    def run() -> int | None:
        return writer.merge(
            rows,
            on + hours,
            columns=names,
            delete_when="s._op = 'delete'",
            update_when=f"s._op = 'upsert' AND ({moved})" if moved else "false",
            insert_when="s._op = 'upsert'",
            txn=txn,
            user_metadata=tag or None,
            # Without `retry_as` the rows were read from gold as of `before` (a fold):
            # a gold that moved since is a conflict, as Spark's MERGE would not see.
            expected=before if retry_as is None else None,
        )

    try:
        made = run() if retry_as is None else lake.retry_on_conflict(run, retry_as)
    except lake.MergeRefused as exc:
        log.warning(
            "%s: delta-rs could not merge batch %d (%s); merging it with Spark instead",
            view.table_name,
            batch,
            exc,
        )
        return False, None
    # Another writer's commit came first (then the change feed publishes both), or
    # the merge changed no row and made no commit.
    return True, changes.Staged(commit, records) if made == commit else None


def fold_changes(
    spark: SparkSession,
    path: str,
    view: View,
    feed: DataFrame,
    txn: tuple[str, int],
    writer: lake.Committer | None = None,
) -> Applied | None:
    """Fold a micro-batch of silver's change feed (`feed`, with `_change_type`) into
    the gold table at `path` of a view whose rows add up (`View.sums`): each row
    it touches, plus what it put in silver, minus what it took out. None where
    `apply_changes` must recompute instead: the batch touches more than
    MAX_STAGED_ROWS rows (a catch-up), or another writer's commit conflicted.

    Gold must be the view of silver as of the commit before the batch's first,
    as every batch before it leaves it. A fold is not safe to repeat, as a
    recompute is: so its commit carries the batch's transaction id (`txn`, the
    stream's txnAppId and the batch id), and a batch retried after its commit
    (a crash before the stream recorded it) finds the id in gold and folds
    nothing. With `writer`, gold is read and written by delta-rs, as in
    `apply_changes`."""
    assert view.sums is not None, f"{view.table_name}: its rows do not add up"
    app_id, batch_id = txn
    sign = F.when(F.col("_change_type").isin(*restatements.REMOVED), -1).otherwise(1)
    sums = scoping.summed(view, feed, sign)
    moved = reduce(operator.or_, [F.col(c) != 0 for c in view.sums.measures])
    # One small job over the materialised batch: the rows it touches, and their hours.
    touched = (
        sums.select(F.unix_micros(view.window[0]).alias("start"), moved.alias("moved"))
        .coalesce(1)  # one job, as in `_merge`
        .limit(MAX_STAGED_ROWS + 1)
        .collect()
    )
    if len(touched) > MAX_STAGED_ROWS:
        return None
    starts = [r["start"] for r in touched if r["moved"]]
    if not starts:
        # No event of the view, or its events came and went again within the batch.
        return Applied(len(touched), None, folded=True)
    done = (
        writer.txn_version(app_id) if writer is not None else lake.txn_version(spark, path, app_id)
    )
    if done is not None and done >= batch_id:
        log.info(
            "%s: batch %d is in gold already (its commit came before a restart); "
            "not folding it twice",
            view.table_name,
            batch_id,
        )
        return Applied(len(touched), None, folded=True)
    gold = _spark_table(spark, path)
    # Read before gold's rows: the MERGE's commit follows it unless another writer's
    # comes between (then the change feed publishes both).
    before = writer.version() if writer is not None else lake.newest_version(spark, path)
    lo, hi = min(starts), max(starts)
    # By the rows' own starts: a late event's hour years back would otherwise make
    # the read span every row in between.
    at_starts = scoping.merged_ranges((s, s + 1) for s in starts)
    rows = (
        writer.read_where(spark, before, scoping.starting_in_sql(view, at_starts))
        if writer is not None and _few(at_starts)
        else gold().toDF()
    )
    old = scoping.starting_in(view, rows, lo, hi)
    source = folded(view, sums.where(moved), old)
    try:
        staged = _merge(spark, gold, view, source, before, txn, retry_as=None, writer=writer)
    except lake.CONFLICTS as exc:
        # The rows were read before the other commit: recompute them from silver.
        log.info(
            "%s: folding batch %d met a concurrent commit (%s); recomputing its rows instead",
            view.table_name,
            batch_id,
            type(exc).__name__,
        )
        return None
    return Applied(len(touched), None, None, staged, folded=True)


def differences(view: View, fresh: DataFrame, replaced: DataFrame) -> DataFrame:
    """(the rows recomputed, the rows of gold they replace) -> what gold must change,
    as gold's columns and `_op`: "upsert" for a row that is new or whose values
    moved, "delete" for a row the recompute no longer produces (two sessions
    merged into one, say). Rows that came out as gold has them are left out: a
    MERGE rewrites every file holding a row its source matches."""
    key = list(view.key)
    rest = [f.name for f in view.schema.fields if f.name not in key]
    new = fresh.select(
        *key, *[F.col(c).alias("_new_" + c) for c in rest], F.lit(True).alias("_new")
    )
    old = replaced.select(
        *key, *[F.col(c).alias("_old_" + c) for c in rest], F.lit(True).alias("_old")
    )
    moved = [~F.col("_new_" + c).eqNullSafe(F.col("_old_" + c)) for c in rest]
    op = (
        F.when(F.col("_old").isNull(), "upsert")
        .when(F.col("_new").isNull(), "delete")
        .when(reduce(operator.or_, moved, F.lit(False)), "upsert")
    )
    return (
        new.join(old, key, "full_outer")
        .withColumn("_op", op)
        .where(F.col("_op").isNotNull())
        .select(*key, *[F.col("_new_" + c).alias(c) for c in rest], "_op")
    )


def folded(view: View, sums: DataFrame, old: DataFrame) -> DataFrame:
    """(a batch's change per row, `scoping.summed`, each moving a measure; rows of gold
    holding at least those it touches) -> the MERGE's source, as `differences`
    makes it: each touched row with the change added ("upsert"), or "delete" where
    its count falls to 0.

    A count below 0, or a change to a row gold does not hold that leaves it no
    event, fails the job: gold did not hold what the batch took out, so it is not
    the view of silver it follows on from, and folding on would keep it wrong."""
    assert view.sums is not None, f"{view.table_name}: its rows do not add up"
    key = list(view.key)
    measures = list(view.sums.measures)
    before = old.select(
        *key, *[F.col(c).alias("_old_" + c) for c in measures], F.lit(True).alias("_old")
    )
    joined = sums.join(before, key, "left")
    after = {c: F.coalesce(F.col("_old_" + c), F.lit(0)) + F.col(c) for c in measures}
    count = after[view.sums.count]
    op = (
        F.when(
            (count < 0) | ((count == 0) & F.col("_old").isNull()),
            F.raise_error(
                F.lit(
                    f"{view.table_name}: a fold took {view.sums.count} below what gold "
                    "holds: gold is not the view of silver as of its last batch; "
                    "replay the version to rebuild it"
                )
            ),
        )
        .when(count > 0, "upsert")
        .otherwise("delete")
    )
    return joined.select(
        *[
            (after[f.name] if f.name in after else F.col(f.name))
            .cast(f.dataType.simpleString())
            .alias(f.name)
            for f in view.schema.fields
        ],
        op.alias("_op"),
    )


def _hour_micros(view: View) -> Column:
    """The UTC hour a gold row's window starts in, as microseconds."""
    return F.unix_micros(F.date_trunc("hour", view.window[0]))


def _within_hours(view: View, hours: Iterable[int], micros: Callable[[int], str]) -> str | None:
    """A condition on the MERGE's target (to AND to its key match): its window start
    in `hours` (the hours the source's rows start in, `_hour_micros`, as literals
    merged into ranges, each written by `micros`: Spark's SQL or DataFusion's); None
    if there are none (the source is empty). The key
    match implies it, since the window start is part of the key; Delta uses it to
    skip gold's files outside those hours, which gold's layout by time makes most
    of them (GOLD_FILE_ROWS)."""
    start = view.window[0]
    hour = 3_600_000_000
    ranges = scoping.merged_ranges((h, h + hour) for h in set(hours))
    if not ranges:
        return None
    if start not in view.key:
        return ""
    column = f"t.`{start}`"
    return (
        " AND ("
        + " OR ".join(
            f"({column} >= {micros(lo)} AND {column} < {micros(hi)})" for lo, hi in ranges
        )
        + ")"
    )


def gold_table(view: View) -> registry.Table:
    return registry.gold_view_table(view.name, view.version)
