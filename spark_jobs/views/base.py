"""What a view version is: a name, a version, its key and schema, a pure function,
and a declaration of which gold rows an event can touch.

The function takes the silver DataFrame (any subset of it that holds every
event the output rows depend on) and returns the gold rows. It never decides
how it runs: the runner makes it a live stream, a replay or a batch, and owns
checkpoints, triggers and writes (docs/contract.md §3, DESIGN.md).

What incremental work needs (which gold rows a changed event touches, which
silver rows decide them, where a late event lands) is derived from the
declared `Scope` and `window` by the engine (`spark_jobs/engine/scoping.py`): an
author writes `compute` and nothing else. This module, `hourly` and the view
versions beside them are the authors' room: they never import the engine
(`make lint` holds that).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from pyspark.sql import DataFrame, Window
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
    # rows within `gap` of it (`scoping.near`), so a live micro-batch reads the time
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
    it took out, and a live micro-batch folds that into gold's rows (`scoping.summed`)
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

    @property
    def fixed_windows(self) -> bool:
        """Whether an event alone says which row it lands in: the window's columns and
        the rest of the key are scope columns (an hour and a currency, say; not a
        session, which its neighbours decide)."""
        return all(c in self.scope.columns for c in (*self.window, *self.key))
