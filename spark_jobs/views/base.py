"""What a view version is: a name, a version, its key and schema, a pure function,
and a declaration of which gold rows an event can touch.

The function takes the silver DataFrame (any subset of it that holds every
event the output rows depend on) and returns the gold rows. It never decides
how it runs: the runner makes it a live stream, a replay or a batch, and owns
checkpoints, triggers and writes (docs/contract.md §3, DESIGN.md).

What incremental work needs (which gold rows a changed event touches, which
silver rows decide them, where a late event lands) is derived from the
declared `Scope` and `window`: an author writes `compute` and nothing else.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, timedelta
from functools import reduce

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

DEFAULT_ALLOWED_LATENESS = timedelta(hours=2)


@dataclass(frozen=True)
class Scope:
    """What a change is scoped by: the runner recomputes, and replaces, every gold
    row whose scope a changed silver event touches.

    `columns` maps each scope column (a gold column) to a Spark SQL expression over
    a silver row: strings, because Column objects cannot be built without a
    running Spark. The `of` events carry their scope themselves. A `linked` event
    (e.g. a cancellation) carries none: it touches the scopes of every `of` event
    that shares its `linked_by` column (its order_id), whenever either arrived.
    """

    columns: Mapping[str, str]
    of: tuple[str, ...]
    linked_by: str | None = None
    linked: tuple[str, ...] = ()
    # Two scope columns (start, end) that bound the event time of every `of` event
    # in a scope: an hour's orders happened within the hour. With them a live
    # micro-batch reads only the days of silver its scopes cover, not all history.
    within: tuple[str, str] | None = None
    # Sessions: a scope's events at most `gap` apart share a row, whose window runs
    # from its first event to its last plus `gap`. A change then alters only the
    # rows within `gap` of it (`View.near`), so a live micro-batch reads the time
    # around each change, not the scope's whole history.
    gap: timedelta | None = None

    def __post_init__(self) -> None:
        if not self.columns or not self.of:
            raise ValueError("a scope needs at least one column and one event type")
        if self.within is not None and not set(self.within) <= set(self.columns):
            raise ValueError("the time bounds of a scope (within) must be scope columns")
        if self.gap is not None and (self.within is not None or self.linked):
            # A linked event's time says nothing about the sessions it would touch,
            # and a scope bounded in time (within) has fixed windows, not sessions.
            raise ValueError("a scope with a gap (sessions) takes no within and no linked events")
        if self.gap is not None and self.gap <= timedelta(0):
            raise ValueError("a session gap must be positive")
        if bool(self.linked) != (self.linked_by is not None):
            raise ValueError("linked events need linked_by, and linked_by needs linked events")
        if set(self.of) & set(self.linked):
            raise ValueError("an event type carries its scope (of) or is linked, not both")


@dataclass(frozen=True)
class Sums:
    """A view whose gold rows add up: each measure of a row is the sum, over the `of`
    events in its scope, of one expression of each event (an order's total; 1 to
    count it). A change to silver then changes gold by what it put in minus what
    it took out, and a live micro-batch folds that into gold's rows (`View.summed`)
    instead of recomputing its scopes from silver.

    `compute` still defines the view: a replay, validation and the audit run it,
    and the fold must give the same rows exactly (tests/spark_jobs/views/test_fold.py),
    so the measures are exact types (integers, decimals), never floating point.
    """

    # Gold column -> Spark SQL expression over a silver row: its share of the column.
    measures: Mapping[str, str]
    # The measure that counts a row's events (its expression is 1): the row exists
    # while it is above 0, as `compute` makes no row for a scope without events.
    count: str

    def __post_init__(self) -> None:
        if self.measures.get(self.count) != "1":
            raise ValueError(f"the count of sums ({self.count!r}) must be a measure of 1")


# Where a scope column is joined on it takes this name, so that silver's own
# columns are never replaced by a computed one of the same name.
_TMP = "__scope_"
# More time ranges than this in one filter cost more to plan than they save:
# past it, the ranges are bridged into one (still exact, just less selective).
MAX_RANGES = 64


def gap_sessions(events: DataFrame, by: str, gap: timedelta, number: str) -> DataFrame:
    """`events` with `number`, the count of sessions so far of its `by` (a customer)
    in event-time order: events at most `gap` apart share one, as with Spark's
    `session_window`. A window over each one's events in time order rather than
    `session_window`, so that a late event that bridges two sessions merges them
    when the runner recomputes that one's sessions from silver."""
    in_order = Window.partitionBy(by).orderBy("event_time")
    previous = F.lag("event_time").over(in_order)
    starts = previous.isNull() | (
        F.col("event_time") > previous + F.expr(f"INTERVAL {int(gap.total_seconds())} SECONDS")
    )
    return events.withColumn("_starts", starts.cast("int")).withColumn(
        number,
        F.sum("_starts").over(in_order.rowsBetween(Window.unboundedPreceding, Window.currentRow)),
    )


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


@dataclass(frozen=True)
class View:
    name: str
    version: int
    # The gold table's key: one row per distinct key.
    key: tuple[str, ...]
    schema: StructType
    compute: Callable[[DataFrame], DataFrame]
    scope: Scope
    # The gold columns (start, end) of the window a row stands for: the start is
    # in the key, and the rest of the key is a restatement's `window_key`.
    window: tuple[str, str]
    allowed_lateness: timedelta = DEFAULT_ALLOWED_LATENESS
    description: str = ""
    # What this version must share with an earlier one, checked before it goes
    # live: {earlier version: {column here: column there}}, row by row on the key.
    agrees_with: dict[int, dict[str, str]] = field(default_factory=dict)
    # Declared where the view's rows add up (`Sums`): its live batches fold changes.
    sums: Sums | None = None
    # The declared sources whose silver it reads (docs/contract.md §10). Over several,
    # `compute` gets the union of their silvers by column name, and each event type
    # the view reads belongs to one of them (`inputs.event_types_by_source`).
    sources: tuple[str, ...] = ("shop",)

    def __post_init__(self) -> None:
        columns = set(self.schema.fieldNames())
        # The runner replaces gold rows by scope, so a scope column is a gold column.
        missing = [c for c in (*self.key, *self.scope.columns, *self.window) if c not in columns]
        if missing:
            raise ValueError(f"{self.table_name}: no such gold columns: {', '.join(missing)}")
        if self.window[0] not in self.key:
            raise ValueError(f"{self.table_name}: the window start must be in the key")
        if self.sums is not None:
            self._check_sums(self.sums, columns)
        if not self.sources or len(set(self.sources)) != len(self.sources):
            raise ValueError(f"{self.table_name}: name each source it reads once")

    def _check_sums(self, sums: Sums, columns: set[str]) -> None:
        """A fold needs each gold row to follow from its own events alone: fixed
        windows (an event says which row it adds to), no linked events (a
        cancellation changes other events' rows) and every other column a measure."""
        if self.scope.linked or not self.fixed_windows:
            raise ValueError(
                f"{self.table_name}: sums need fixed windows and no linked events: "
                "each event must add to one row, whatever the others"
            )
        rest = columns - set(self.scope.columns) - set(sums.measures)
        stray = set(sums.measures) & set(self.scope.columns)
        if rest or stray or not set(sums.measures) <= columns:
            raise ValueError(
                f"{self.table_name}: with sums every gold column is a scope column or a "
                f"measure, not both (left over: {', '.join(sorted(rest | stray)) or 'none'})"
            )

    @property
    def table_name(self) -> str:
        return f"{self.name}_v{self.version}"

    @property
    def scope_columns(self) -> tuple[str, ...]:
        return tuple(self.scope.columns)

    @property
    def event_types(self) -> tuple[str, ...]:
        """The silver events this view reads (by event_type)."""
        return (*self.scope.of, *self.scope.linked)

    @property
    def window_key(self) -> tuple[str, ...]:
        """The key besides the window start: a currency, a customer."""
        return tuple(c for c in self.key if c != self.window[0])

    # -- derived from the scope -----------------------------------------------------
    def _of(self, silver: DataFrame) -> DataFrame:
        return silver.where(F.col("event_type").isin(*self.scope.of))

    def _linked(self, silver: DataFrame) -> DataFrame:
        return silver.where(F.col("event_type").isin(*self.scope.linked))

    def _scope_values(self, prefix: str = "") -> list[Column]:
        return [F.expr(e).alias(prefix + c) for c, e in self.scope.columns.items()]

    def _linked_of(self, linked: DataFrame, silver: DataFrame) -> DataFrame:
        """The `of` events of silver that share `linked_by` with `linked`."""
        assert self.scope.linked_by is not None
        ids = linked.select(self.scope.linked_by).distinct()
        return self._of(silver).join(F.broadcast(ids), self.scope.linked_by, "left_semi")

    def scopes_of(self, changed: DataFrame, silver: DataFrame) -> DataFrame:
        """(changed silver rows, all of silver) -> the scopes (rows of the scope columns)
        whose gold rows the change can alter: each `of` event's own, and for a linked
        event the scopes of the `of` events it links to (none yet if they have not
        arrived: then nothing changes until they do)."""
        scopes = self._of(changed).select(*self._scope_values())
        if self.scope.linked:
            linked_of = self._linked_of(self._linked(changed), silver)
            scopes = scopes.unionByName(linked_of.select(*self._scope_values()))
        return scopes.distinct()

    def restrict(self, silver: DataFrame, scopes: DataFrame) -> DataFrame:
        """(all of silver, scopes) -> the silver rows that decide those scopes' gold rows:
        the `of` events in them and every linked event that shares `linked_by` with one."""
        names = [_TMP + c for c in self.scope_columns]
        wanted = scopes.select(*[F.col(c).alias(_TMP + c) for c in self.scope_columns])
        of = (
            self._of(silver)
            .select("*", *self._scope_values(_TMP))
            .join(F.broadcast(wanted), names, "left_semi")
            .drop(*names)
        )
        if not self.scope.linked:
            return of
        assert self.scope.linked_by is not None
        theirs = self._linked(silver).join(
            of.select(self.scope.linked_by).distinct(), self.scope.linked_by, "left_semi"
        )
        return of.unionByName(theirs)

    def time_bounds(self, scopes: DataFrame) -> DataFrame | None:
        """(scopes) -> each scope's time bounds as UTC microseconds (start, end), or
        None if the scope declares none."""
        if self.scope.within is None:
            return None
        start, end = self.scope.within
        return scopes.select(F.unix_micros(start).alias("start"), F.unix_micros(end).alias("end"))

    def narrowed(
        self,
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
        of = F.col("event_type").isin(*self.scope.of)
        if not self.scope.linked:
            return silver.where(of & days).where(times)
        other = F.col("event_type").isin(*self.scope.linked)
        on_their_days = other if linked_days is None else other & day_filter(linked_days)
        # Two filters, so the first holds partition columns only and prunes directories.
        return silver.where(on_their_days | (of & days)).where(other | (of & times))

    def of_on_days(self, silver: DataFrame, days: Iterable[int]) -> DataFrame:
        """Silver's `of` events on these days (since 1970-01-01) only: all `scopes_of`
        reads of silver, given the days that hold the `of` events of a batch's
        linked events (`links.LinkIndex.of_days`)."""
        return self._of(silver).where(day_filter(days))

    # -- sums (a view whose rows add up) ----------------------------------------------
    def summed(self, rows: DataFrame, sign: Column) -> DataFrame:
        """(silver rows, each one's `sign`: 1 for a row put in silver, -1 for one taken
        out) -> what they change in gold: per scope (the scope columns) they touch,
        each measure's signed sum. A row whose events all came and went again has
        every measure 0."""
        assert self.sums is not None, f"{self.table_name}: its rows do not add up"
        return (
            self._of(rows)
            .groupBy(*self._scope_values())
            .agg(
                *[
                    F.sum(sign * F.coalesce(F.expr(e), F.lit(0))).alias(c)
                    for c, e in self.sums.measures.items()
                ]
            )
        )

    # -- sessions (a scope with a gap) -----------------------------------------------
    def near(self, changed: DataFrame, gold: DataFrame) -> DataFrame:
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
        assert self.scope.gap is not None, f"{self.table_name}: its scope has no gap"
        gap = _micros_of(self.scope.gap)
        cols = list(self.scope_columns)
        start, end = self.window
        at = (
            self._of(changed)
            .select(*self._scope_values(), F.unix_micros("event_time").alias("lo"))
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

    def around(self, gold: DataFrame, lo: int, hi: int) -> DataFrame:
        """(gold, the earliest and latest time of the changed events, UTC microseconds)
        -> the rows of gold `near` can widen a change to: those within `gap` of a time
        in [lo, hi]. Literal bounds on the window's start and end, so Delta reads only
        the files of gold that can hold one (gold's files are laid out by time)."""
        assert self.scope.gap is not None, f"{self.table_name}: its scope has no gap"
        start, end = self.window
        reach = _micros(hi + _micros_of(self.scope.gap))
        return gold.where((F.col(start) <= reach) & (F.col(end) >= _micros(lo)))

    def starting_in(self, gold: DataFrame, lo: int, hi: int) -> DataFrame:
        """The rows of gold whose window starts in [lo, hi] (UTC microseconds): a
        literal bound, so Delta reads only the files that can hold one."""
        return gold.where(F.col(self.window[0]).between(_micros(lo), _micros(hi)))

    def _in_spans(
        self, rows: DataFrame, time: Column, scope: list[Column], near: DataFrame
    ) -> DataFrame:
        """`rows` whose scope values and time fall in one of `near`'s spans."""
        names = ["_near_" + c for c in self.scope_columns]
        spans = near.select(
            *[F.col(c).alias(n) for c, n in zip(self.scope_columns, names, strict=True)],
            F.col("lo").alias("_near_lo"),
            F.col("hi").alias("_near_hi"),
        )
        on = reduce(
            operator.and_,
            [v == F.col(n) for v, n in zip(scope, names, strict=True)],
            (F.unix_micros(time) >= F.col("_near_lo")) & (F.unix_micros(time) <= F.col("_near_hi")),
        )
        return rows.join(F.broadcast(spans), on, "left_semi")

    def restrict_near(self, silver: DataFrame, near: DataFrame) -> DataFrame:
        """(silver, `near`'s spans) -> the `of` events inside them: what decides every
        row of gold that starts inside them."""
        return self._in_spans(
            self._of(silver),
            F.col("event_time"),
            [F.expr(e) for e in self.scope.columns.values()],
            near,
        )

    def rows_near(self, gold: DataFrame, near: DataFrame) -> DataFrame:
        """(gold, `near`'s spans) -> the rows of gold that start inside them."""
        return self._in_spans(
            gold, F.col(self.window[0]), [F.col(c) for c in self.scope_columns], near
        )

    @property
    def fixed_windows(self) -> bool:
        """Whether an event alone says which row it lands in: the window's columns and
        the rest of the key are scope columns (an hour and a currency, say; not a
        session, which its neighbours decide)."""
        return all(c in self.scope.columns for c in (*self.window, *self.key))

    def lands_in(
        self, events: DataFrame, silver: DataFrame | None, gold: DataFrame | None
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
        landing = self._of(events).select(
            "event_id", "event_time", F.col("event_time").alias("_at"), *self._scope_values(_TMP)
        )
        if self.scope.linked:
            assert self.scope.linked_by is not None
            if silver is None:
                raise ValueError(f"{self.table_name}: linked events are placed in silver: pass it")
            by = self.scope.linked_by
            linked = self._linked(events).select(
                by, F.col("event_id").alias("_id"), F.col("event_time").alias("_time")
            )
            landing = landing.unionByName(
                self._of(silver)
                .join(linked, by)
                .select(
                    F.col("_id").alias("event_id"),
                    F.col("_time").alias("event_time"),
                    F.col("event_time").alias("_at"),
                    *self._scope_values(_TMP),
                )
            )
        start, end = self.window
        if self.fixed_windows:
            return landing.select(
                "event_id",
                "event_time",
                F.col(_TMP + start).alias("window_start"),
                F.col(_TMP + end).alias("window_end"),
                self._key_string(_TMP).alias("window_key"),
            )
        if gold is None:
            raise ValueError(f"{self.table_name}: its scope does not fix its windows: pass gold")
        g = gold.select(*dict.fromkeys((*self.scope_columns, *self.window, *self.key)))
        on = [F.col(_TMP + c) == g[c] for c in self.scope_columns]
        return landing.join(g, [*on, F.col("_at") >= g[start], F.col("_at") < g[end]]).select(
            "event_id",
            "event_time",
            g[start].alias("window_start"),
            g[end].alias("window_end"),
            self._key_string().alias("window_key"),
        )

    def _key_string(self, prefix: str = "") -> Column:
        """The window_key: the one key column besides the window start, or several joined."""
        cols = [F.col(prefix + c).cast("string") for c in self.window_key]
        return cols[0] if len(cols) == 1 else F.concat_ws("|", *cols)
