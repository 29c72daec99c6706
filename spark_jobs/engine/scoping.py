"""The scope logic: what incremental work derives from a view's declared `Scope`,
`window` and `Sums` (docs/contract.md §3). Which gold rows a changed silver event
touches, which silver rows decide them, where a late event lands, and what a change
adds to a view whose rows add up.

An author declares the scope (`spark_jobs.views.base`); the runner asks these
functions. They are pure transforms of DataFrames: no IO, no session state.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from datetime import date, timedelta
from functools import reduce
from typing import NamedTuple

from pyspark.sql import Column, DataFrame, Row, Window
from pyspark.sql import functions as F
from pyspark.sql.types import DataType

from spark_jobs.views.base import View

# Where a scope column is joined on it takes this name, so that silver's own
# columns are never replaced by a computed one of the same name.
_TMP = "__scope_"
# More time ranges than this in one filter cost more to plan than they save:
# past it, the ranges are bridged into one (still exact, just less selective).
MAX_RANGES = 64


def merged_ranges(
    bounds: Iterable[tuple[int, int]], limit: int = MAX_RANGES
) -> list[tuple[int, int]]:
    """[start, end) ranges -> the fewest ranges covering the same points, at most
    `limit` of them (past it, one range from the first start to the last end)."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(bounds):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    if len(out) > limit:
        return [(out[0][0], max(e for _, e in out))]
    return out


def _micros(value: int) -> Column:
    # A literal timestamp (folded to a constant before planning, so Delta can
    # prune partitions and skip files by it), from UTC microseconds.
    return F.timestamp_micros(F.lit(value))


def _micros_of(span: timedelta) -> int:
    return span // timedelta(microseconds=1)


def time_filter(ranges: Sequence[tuple[int, int]]) -> tuple[Column, Column]:
    """Event times in any of `ranges` (UTC microseconds, [start, end)), as a filter on
    silver's partition column event_date and one on event_time."""
    days = [
        (F.col("event_date") >= F.to_date(_micros(a)))
        & (F.col("event_date") <= F.to_date(_micros(b - 1)))
        for a, b in ranges
    ]
    times = [
        (F.col("event_time") >= _micros(a)) & (F.col("event_time") < _micros(b)) for a, b in ranges
    ]
    return reduce(operator.or_, days), reduce(operator.or_, times)


_EPOCH = date(1970, 1, 1)


def day_filter(days: Iterable[int]) -> Column:
    """Silver's partition column event_date on any of these days (days since
    1970-01-01), as literal dates so that Delta prunes partitions by it; no days,
    no rows. Past MAX_RANGES runs of days, one range from the first to the last."""
    ranges = merged_ranges((d, d + 1) for d in days)
    if not ranges:
        return F.lit(False)
    return reduce(
        operator.or_,
        [
            F.col("event_date").between(
                F.lit(_EPOCH + timedelta(days=a)), F.lit(_EPOCH + timedelta(days=b - 1))
            )
            for a, b in ranges
        ],
    )


# -- derived from the scope ----------------------------------------------------
def _of(view: View, silver: DataFrame) -> DataFrame:
    return silver.where(F.col("event_type").isin(*view.scope.of))


def _linked(view: View, silver: DataFrame) -> DataFrame:
    return silver.where(F.col("event_type").isin(*view.scope.linked))


def _scope_values(view: View, prefix: str = "") -> list[Column]:
    return [F.expr(e).alias(prefix + c) for c, e in view.scope.columns.items()]


def _linked_of(view: View, linked: DataFrame, silver: DataFrame) -> DataFrame:
    """The `of` events of silver that share `linked_by` with `linked`."""
    assert view.scope.linked_by is not None
    ids = linked.select(view.scope.linked_by).distinct()
    return _of(view, silver).join(F.broadcast(ids), view.scope.linked_by, "left_semi")


def scopes_of(view: View, changed: DataFrame, silver: DataFrame) -> DataFrame:
    """(changed silver rows, all of silver) -> the scopes (rows of the scope columns)
    whose gold rows the change can alter: each `of` event's own, and for a linked
    event the scopes of the `of` events it links to (none yet if they have not
    arrived: then nothing changes until they do)."""
    scopes = _of(view, changed).select(*_scope_values(view))
    if view.scope.linked:
        linked_of = _linked_of(view, _linked(view, changed), silver)
        scopes = scopes.unionByName(linked_of.select(*_scope_values(view)))
    return scopes.distinct()


def restrict(
    view: View, silver: DataFrame, scopes: DataFrame, listed: Listed | None = None
) -> DataFrame:
    """(all of silver, scopes) -> the silver rows that decide those scopes' gold rows:
    the `of` events in them and every linked event that shares `linked_by` with one.
    With `listed` (the same scopes, collected: `listed`), picked out by value, not
    joined."""
    if listed is None:
        names = [_TMP + c for c in view.scope_columns]
        wanted = scopes.select(*[F.col(c).alias(_TMP + c) for c in view.scope_columns])
        of = (
            _of(view, silver)
            .select("*", *_scope_values(view, _TMP))
            .join(F.broadcast(wanted), names, "left_semi")
            .drop(*names)
        )
    else:
        # A filter on the scope's own expressions, not columns added and dropped
        # again: over delta-rs's rows (a local relation) Spark's optimizer
        # evaluates each projection on the driver, row by row, at a cost that
        # grows with the square of its width (stop 103's spike, with Spark's second
        # filter after delta-rs's read left out too: the rule's time in v2's
        # batches 2.05 -> 0.55 s; docs/BENCHMARKS.md).
        of = _of(view, silver).where(listed.picks_events())
    if not view.scope.linked:
        return of
    assert view.scope.linked_by is not None
    theirs = _linked(view, silver).join(
        of.select(view.scope.linked_by).distinct(), view.scope.linked_by, "left_semi"
    )
    return of.unionByName(theirs)


class Listed(NamedTuple):
    """A batch's scopes, collected: each as one string of its scope columns (`key`),
    and their time bounds where the scope declares them (as `time_bounds`)."""

    view: View
    keys: list[str]
    bounds: list[tuple[int, int]] | None
    types: dict[str, DataType]

    def picks(self) -> Column:
        """Whether a row's scope columns (gold's) are one of these."""
        return _key(self.view, self.types).isin(self.keys)

    def picks_events(self) -> Column:
        """Whether a silver row's scope values (the scope's expressions) are one of these."""
        values = [F.expr(e) for e in self.view.scope.columns.values()]
        return _key(self.view, self.types, values).isin(self.keys)


def _key(view: View, types: dict[str, DataType], values: Sequence[Column] | None = None) -> Column:
    """A scope's key: its `values` (default: the scope columns) as one string."""
    # Cast to the scopes' own types first, so that gold's columns give the same
    # strings as silver's expressions; a null as a character no string holds.
    # (`Spans.hold` writes the same in SQL.)
    columns = [F.col(c) for c in view.scope_columns] if values is None else values
    return F.concat_ws(
        "\x1f",
        *[
            F.coalesce(v.cast(types[c]).cast("string"), F.lit("\x00"))
            for v, c in zip(columns, view.scope_columns, strict=True)
        ],
    )


def listing(view: View, scopes: DataFrame) -> DataFrame:
    """(scopes) -> a row per scope to collect for `listed`: its key, and its time
    bounds where the scope declares them."""
    columns = [_key(view, _types(scopes)).alias("key")]
    if view.scope.within is not None:
        start, end = view.scope.within
        columns += [F.unix_micros(start).alias("start"), F.unix_micros(end).alias("end")]
    return scopes.select(*columns)


def listed(view: View, scopes: DataFrame, rows: Sequence[Row]) -> Listed:
    """(scopes, the rows of their `listing`, collected) -> them as a `Listed`."""
    bounds = None if view.scope.within is None else [(r["start"], r["end"]) for r in rows]
    return Listed(view, [r["key"] for r in rows], bounds, _types(scopes))


def _types(scopes: DataFrame) -> dict[str, DataType]:
    return {f.name: f.dataType for f in scopes.schema.fields}


def time_bounds(view: View, scopes: DataFrame) -> DataFrame | None:
    """(scopes) -> each scope's time bounds as UTC microseconds (start, end), or
    None if the scope declares none."""
    if view.scope.within is None:
        return None
    start, end = view.scope.within
    return scopes.select(F.unix_micros(start).alias("start"), F.unix_micros(end).alias("end"))


def narrowed(
    view: View,
    silver: DataFrame,
    ranges: Sequence[tuple[int, int]],
    linked_days: Iterable[int] | None = None,
) -> DataFrame:
    """Silver without the `of` events outside `ranges` (the scopes' time bounds,
    merged): what `restrict` and `lands_in` need of it for those scopes, and
    no more. Linked events are kept whatever their time (a cancellation can
    come days after its order), or, given `linked_days`, those on these days
    only: the days that hold every linked event of the `of` events in `ranges`
    (`links.LinkIndex.linked_days`)."""
    if not ranges:
        return silver
    days, times = time_filter(ranges)
    of = F.col("event_type").isin(*view.scope.of)
    if not view.scope.linked:
        return silver.where(of & days).where(times)
    other = F.col("event_type").isin(*view.scope.linked)
    on_their_days = other if linked_days is None else other & day_filter(linked_days)
    # Two filters, so the first holds partition columns only and prunes directories.
    return silver.where(on_their_days | (of & days)).where(other | (of & times))


def of_on_days(view: View, silver: DataFrame, days: Iterable[int]) -> DataFrame:
    """Silver's `of` events on these days (since 1970-01-01) only: all `scopes_of`
    reads of silver, given the days that hold the `of` events of a batch's
    linked events (`links.LinkIndex.of_days`)."""
    return _of(view, silver).where(day_filter(days))


# -- the same filters as SQL, for a read by delta-rs (lake.read_where) ---------
# A live batch reads these rows of silver without Spark's scan, and does not filter
# them again with the functions above (Spark would evaluate that filter on the
# driver, row by row: ConvertToLocalRelation). Each keeps at least the rows its
# namesake does, and they are held equal by tests; what decides gold's rows is
# picked out of them by scope (`restrict`, `restrict_near`), exactly.
_DAY_MICROS = 86_400_000_000


def _sql_date(day: int) -> str:
    return f"DATE '{(_EPOCH + timedelta(days=day)).isoformat()}'"


def sql_micros(value: int) -> str:
    return f"arrow_cast({int(value)}, 'Timestamp(Microsecond, Some(\"UTC\"))')"


def _sql_from(value: int) -> str:
    # A lower bound, down to its millisecond: Delta's statistics keep a file's
    # newest timestamp in milliseconds, cut down, so a reader that skips files by
    # them could skip one whose newest row is a few microseconds past the bound.
    # delta-rs 1.6.6 allows for it, as delta-spark does. Silver's rows under the
    # bound that it then keeps belong to other scopes, which `restrict` and
    # `restrict_near` leave out (an hourly bound is a whole hour; a row of the same
    # customer that close before a span would be within its gap, which `near` rules
    # out); gold's, `starting_in` and `around` filter again.
    return sql_micros(int(value) - int(value) % 1000)


def _sql_types(types: Iterable[str]) -> str:
    quoted = ", ".join("'" + t.replace("'", "''") + "'" for t in types)
    return f'"event_type" IN ({quoted})'


def _sql_any(terms: Sequence[str]) -> str:
    return "(" + " OR ".join(terms) + ")" if terms else "false"


def days_sql(days: Iterable[int]) -> str:
    """`day_filter` as SQL."""
    return _sql_any(
        [
            f'"event_date" BETWEEN {_sql_date(a)} AND {_sql_date(b - 1)}'
            for a, b in merged_ranges((d, d + 1) for d in days)
        ]
    )


def _time_sql(ranges: Sequence[tuple[int, int]]) -> tuple[str, str]:
    """`time_filter` as SQL."""
    days = [
        f'"event_date" BETWEEN {_sql_date(a // _DAY_MICROS)} AND '
        f"{_sql_date((b - 1) // _DAY_MICROS)}"
        for a, b in ranges
    ]
    times = [
        f'"event_time" >= {_sql_from(a)} AND "event_time" < {sql_micros(b)}' for a, b in ranges
    ]
    return _sql_any(days), _sql_any([f"({t})" for t in times])


def narrowed_sql(
    view: View, ranges: Sequence[tuple[int, int]], linked_days: Iterable[int] | None
) -> str | None:
    """`narrowed` as SQL; None where it keeps every linked event (no `linked_days`),
    which no read of a few rows can serve."""
    if not ranges:
        return None
    days, times = _time_sql(ranges)
    of = _sql_types(view.scope.of)
    if not view.scope.linked:
        return f"{of} AND {days} AND {times}"
    if linked_days is None:
        return None
    other = _sql_types(view.scope.linked)
    return (
        f"(({other} AND {days_sql(linked_days)}) OR ({of} AND {days})) "
        f"AND ({other} OR ({of} AND {times}))"
    )


def scopes_sql(view: View, rows: Sequence[Row]) -> str | None:
    """The silver rows whose scope columns hold a value of `rows`' (each column on its
    own: a superset of the scopes), where every scope column is a silver column of
    strings; None otherwise (a computed scope, or values SQL may spell otherwise)."""
    terms = []
    for column, expression in view.scope.columns.items():
        values = {r[column] for r in rows}
        if expression != column or not all(isinstance(v, str) for v in values):
            return None
        quoted = ", ".join("'" + v.replace("'", "''") + "'" for v in sorted(values))
        terms.append(f'"{column}" IN ({quoted})' if values else "false")
    return " AND ".join(terms) or None


def around_sql(view: View, ranges: Sequence[tuple[int, int]]) -> str:
    """`around` as SQL, for changes at times in any of `ranges` ([start, end), UTC
    microseconds): a batch's changes can lie years apart (a late event), and one
    range from the first to the last would read every row of gold in between."""
    assert view.scope.gap is not None, f"{view.table_name}: its scope has no gap"
    start, end = view.window
    gap = _micros_of(view.scope.gap)
    return _sql_any(
        [
            f'("{start}" <= {sql_micros(b - 1 + gap)} AND "{end}" >= {_sql_from(a)})'
            for a, b in ranges
        ]
    )


def starting_in_sql(view: View, ranges: Sequence[tuple[int, int]]) -> str:
    """`starting_in` as SQL, for windows that start in any of `ranges` ([start, end),
    UTC microseconds), as `around_sql`."""
    return _sql_any(
        [f'"{view.window[0]}" BETWEEN {_sql_from(a)} AND {sql_micros(b - 1)}' for a, b in ranges]
    )


def of_on_days_sql(view: View, days: Iterable[int], keys: Sequence[str] | None = None) -> str:
    """`of_on_days` as SQL; given `keys` (string values of `linked_by`), only the `of`
    events of those keys, all that `scopes_of` then reads of it."""
    sql = f"{_sql_types(view.scope.of)} AND {days_sql(days)}"
    if keys is None:
        return sql
    quoted = ", ".join("'" + k.replace("'", "''") + "'" for k in keys)
    return f'{sql} AND "{view.scope.linked_by}" IN ({quoted})' if keys else "false"


# -- sums (a view whose rows add up) -------------------------------------------
def summed(view: View, rows: DataFrame, sign: Column) -> DataFrame:
    """(silver rows, each one's `sign`: 1 for a row put in silver, -1 for one taken
    out) -> what they change in gold: per scope (the scope columns) they touch,
    each measure's signed sum. A row whose events all came and went again has
    every measure 0."""
    assert view.sums is not None, f"{view.table_name}: its rows do not add up"
    return (
        _of(view, rows)
        .groupBy(*_scope_values(view))
        .agg(
            *[
                F.sum(sign * F.coalesce(F.expr(e), F.lit(0))).alias(c)
                for c, e in view.sums.measures.items()
            ]
        )
    )


# -- sessions (a scope with a gap) ---------------------------------------------
def near(view: View, changed: DataFrame, gold: DataFrame) -> DataFrame:
    """(changed silver rows, gold) -> spans: the scope columns, `lo` and `hi` (UTC
    microseconds, both inclusive), holding every event that decides a row the
    change can alter. Each changed event's time is widened to the rows of gold
    within `gap` of it (a new event there joins them; one taken out can split
    only its own), and spans at most `gap` apart become one.

    No event outside the spans is then within `gap` of one inside: a row of
    gold is wholly inside a span or wholly out, and the rows recomputed from
    the events inside are whole sessions. That holds with gold as it was
    before the change or after it (a retried micro-batch), since either is the
    view's function of silver then, and a changed event lies in a span."""
    assert view.scope.gap is not None, f"{view.table_name}: its scope has no gap"
    gap = _micros_of(view.scope.gap)
    cols = list(view.scope_columns)
    start, end = view.window
    at = (
        _of(view, changed)
        .select(*_scope_values(view), F.unix_micros("event_time").alias("lo"))
        .distinct()
    )
    # A row's events run from its start to its end minus the gap (its last event).
    rows = gold.select(
        *cols, F.unix_micros(start).alias("_s"), (F.unix_micros(end) - gap).alias("_l")
    )
    touched = (
        rows.join(F.broadcast(at), cols)
        .where((F.col("lo") >= F.col("_s") - gap) & (F.col("lo") <= F.col("_l") + gap))
        .select(*cols, F.col("_s").alias("lo"), F.col("_l").alias("hi"))
    )
    spans = at.withColumn("hi", F.col("lo")).unionByName(touched)
    in_time = Window.partitionBy(*cols).orderBy("lo", "hi")
    reach = F.max("hi").over(in_time.rowsBetween(Window.unboundedPreceding, -1))
    opens = (reach.isNull() | (F.col("lo") > reach + gap)).cast("int")
    return (
        spans.withColumn("_opens", opens)
        .withColumn(
            "_span",
            F.sum("_opens").over(in_time.rowsBetween(Window.unboundedPreceding, 0)),
        )
        .groupBy(*cols, "_span")
        .agg(F.min("lo").alias("lo"), F.max("hi").alias("hi"))
        .drop("_span")
    )


def around(view: View, gold: DataFrame, lo: int, hi: int) -> DataFrame:
    """(gold, the earliest and latest time of the changed events, UTC microseconds)
    -> the rows of gold `near` can widen a change to: those within `gap` of a time
    in [lo, hi]. Literal bounds on the window's start and end, so Delta reads only
    the files of gold that can hold one (gold's files are laid out by time)."""
    assert view.scope.gap is not None, f"{view.table_name}: its scope has no gap"
    start, end = view.window
    reach = _micros(hi + _micros_of(view.scope.gap))
    return gold.where((F.col(start) <= reach) & (F.col(end) >= _micros(lo)))


def starting_in(view: View, gold: DataFrame, lo: int, hi: int) -> DataFrame:
    """The rows of gold whose window starts in [lo, hi] (UTC microseconds): a
    literal bound, so Delta reads only the files that can hold one."""
    return gold.where(F.col(view.window[0]).between(_micros(lo), _micros(hi)))


class Spans(NamedTuple):
    """`near`'s spans, collected (`keyed`, then `spans`): up to
    `gold_writes.MAX_SPANS_BY_VALUE` of them, a batch's rows are picked out of silver
    and gold by a condition on their values, where a broadcast join of the spans runs
    a Spark job in each plan that uses them. Its cost grows with the spans times the
    rows: on a local relation (rows read by delta-rs) Spark evaluates it on the driver,
    building its map for each row."""

    view: View
    rows: Sequence[Row]
    types: dict[str, DataType]

    def hold(self, scope: Sequence[str], time: str) -> str:
        """Whether a row's scope values (`scope`, SQL for each scope column) and `time`
        (SQL) are in one of the spans, as Spark SQL: its key among the spans' (a hash
        lookup once Spark has optimised the IN; a scan of the list where it evaluates
        the condition on the driver first, on a local relation), then looked up in a
        map of each key's spans. SQL text, parsed once
        in the JVM: the same built of Column calls took about ten Py4J calls a span.
        A span of a null scope value holds nothing, as the join's equality."""
        by_key: dict[str, list[tuple[int, int]]] = {}
        for r in self.rows:
            if all(r[c] is not None for c in self.view.scope_columns):
                by_key.setdefault(r["_key"], []).append((int(r["lo"]), int(r["hi"])))
        if not by_key:
            return "false"
        # As `_key`: cast to the spans' own types, then to strings, joined.
        parts = [
            f"coalesce(CAST(CAST(({value}) AS {self.types[c].simpleString()}) AS STRING), chr(0))"
            for value, c in zip(scope, self.view.scope_columns, strict=True)
        ]
        key = f"concat_ws(chr(31), {', '.join(parts)})"
        keys = ", ".join(_spark_string(k) for k in sorted(by_key))
        lookup = (
            "map("
            + ", ".join(
                f"{_spark_string(k)}, array("
                + ", ".join(f"named_struct('lo', {lo}L, 'hi', {hi}L)" for lo, hi in spans)
                + ")"
                for k, spans in sorted(by_key.items())
            )
            + ")"
        )
        at = f"unix_micros({time})"
        return (
            f"({key} IN ({keys}) AND coalesce(exists(try_element_at({lookup}, {key}), "
            f"s -> {at} >= s.lo AND {at} <= s.hi), false))"
        )


def _spark_string(value: str) -> str:
    """`value` as a Spark SQL string literal (backslash escapes, Spark's default)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def keyed(view: View, near: DataFrame) -> DataFrame:
    """`near`'s spans with their scope's key, to collect for `spans`."""
    return near.withColumn("_key", _key(view, _types(near)))


def spans(view: View, near: DataFrame, rows: Sequence[Row]) -> Spans:
    """(`keyed` spans, their rows collected) -> them as `Spans`."""
    return Spans(view, rows, _types(near))


def _in_spans(
    view: View, rows: DataFrame, time: str, scope: list[str], near: DataFrame | Spans
) -> DataFrame:
    """`rows` whose scope values and time (SQL of `rows`' columns) fall in one of
    `near`'s spans."""
    if isinstance(near, Spans):
        return rows.where(F.expr(near.hold(scope, time)))
    names = ["_near_" + c for c in view.scope_columns]
    spans = near.select(
        *[F.col(c).alias(n) for c, n in zip(view.scope_columns, names, strict=True)],
        F.col("lo").alias("_near_lo"),
        F.col("hi").alias("_near_hi"),
    )
    at = F.unix_micros(F.expr(time))
    on = reduce(
        operator.and_,
        [F.expr(v) == F.col(n) for v, n in zip(scope, names, strict=True)],
        (at >= F.col("_near_lo")) & (at <= F.col("_near_hi")),
    )
    return rows.join(F.broadcast(spans), on, "left_semi")


def restrict_near(view: View, silver: DataFrame, near: DataFrame | Spans) -> DataFrame:
    """(silver, `near`'s spans) -> the `of` events inside them: what decides every
    row of gold that starts inside them."""
    return _in_spans(
        view, _of(view, silver), "`event_time`", list(view.scope.columns.values()), near
    )


def rows_near(view: View, gold: DataFrame, near: DataFrame | Spans) -> DataFrame:
    """(gold, `near`'s spans) -> the rows of gold that start inside them."""
    return _in_spans(
        view, gold, f"`{view.window[0]}`", [f"`{c}`" for c in view.scope_columns], near
    )


def lands_in(
    view: View, events: DataFrame, silver: DataFrame | None, gold: DataFrame | None
) -> DataFrame:
    """(events that landed, all of silver, gold) -> where each landed: event_id,
    event_time, window_start, window_end, window_key (the key besides time).

    An `of` event lands in the row of its scope whose window holds it; a linked
    event lands where the `of` events it links to land (each cancellation in its
    orders' hours). With fixed windows that row is the event's scope itself and
    gold is not read; otherwise (sessions) it is found in gold, which the runner
    passes as it is after replacing the batch's scopes. Silver is read for
    linked events only (None will do without them).
    """
    landing = _of(view, events).select(
        "event_id", "event_time", F.col("event_time").alias("_at"), *_scope_values(view, _TMP)
    )
    if view.scope.linked:
        assert view.scope.linked_by is not None
        if silver is None:
            raise ValueError(f"{view.table_name}: linked events are placed in silver: pass it")
        by = view.scope.linked_by
        linked = _linked(view, events).select(
            by, F.col("event_id").alias("_id"), F.col("event_time").alias("_time")
        )
        landing = landing.unionByName(
            _of(view, silver)
            .join(linked, by)
            .select(
                F.col("_id").alias("event_id"),
                F.col("_time").alias("event_time"),
                F.col("event_time").alias("_at"),
                *_scope_values(view, _TMP),
            )
        )
    start, end = view.window
    if view.fixed_windows:
        return landing.select(
            "event_id",
            "event_time",
            F.col(_TMP + start).alias("window_start"),
            F.col(_TMP + end).alias("window_end"),
            _key_string(view, _TMP).alias("window_key"),
        )
    if gold is None:
        raise ValueError(f"{view.table_name}: its scope does not fix its windows: pass gold")
    g = gold.select(*dict.fromkeys((*view.scope_columns, *view.window, *view.key)))
    on = [F.col(_TMP + c) == g[c] for c in view.scope_columns]
    return landing.join(g, [*on, F.col("_at") >= g[start], F.col("_at") < g[end]]).select(
        "event_id",
        "event_time",
        g[start].alias("window_start"),
        g[end].alias("window_end"),
        _key_string(view).alias("window_key"),
    )


def _key_string(view: View, prefix: str = "") -> Column:
    """The window_key: the one key column besides the window start, or several joined."""
    cols = [F.col(prefix + c).cast("string") for c in view.window_key]
    return cols[0] if len(cols) == 1 else F.concat_ws("|", *cols)
