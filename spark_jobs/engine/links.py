"""On which days silver holds the events of each linked key: kept by a live stream
of a view whose scope has linked events (revenue_hourly v2: a cancellation
links to its orders by order_id).

A linked event carries no time its scopes are bound by, so without this a live
micro-batch read every linked event in history for the orders in its scopes
(every `order_cancelled`), and every `order_placed` for the cancellations it
brought: reads that grow with history, 58 of v2's 68 s of task time in a
freshness phase of `make bench`. Silver is partitioned by event type and day,
so knowing the days is enough to read only their partitions.

The index holds, for each `of` event, its time and the 64-bit hash of its key;
and for each `of` and each linked event, the hash of its key and its day
(`event_date`, as days since 1970-01-01). A batch asks two things:
- which days hold the `of` events of its linked events' keys (`of_days`);
- which days hold the linked events of the `of` events in its scopes' times
  (`linked_days`).

The index never misses a row of a snapshot a batch reads, so the filters it
gives are exact. It is built from silver as of the first batch's last commit,
the snapshot that batch reads, and then adds every row each later batch's
change feed brings: inserts, pre- and post-images, deletes. The stream sees
every row of the view's event types that a later commit puts in silver, so
every such row of a later snapshot was in the first or came since. It never
takes rows out: a row silver dropped (an erasure, a replaced winner that moved
to another day) only adds a day to read, as does a key whose hash another key
shares. The answer still comes from silver, never from the index.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.engine.sorted_pairs import SortedPairs
from spark_jobs.views.base import View

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rows:
    """Some silver rows of a view's event types, on the driver: per row whether it is
    an `of` event, its key's hash, its time (UTC microseconds) and its day."""

    is_of: np.ndarray
    hashes: np.ndarray
    times: np.ndarray
    days: np.ndarray
    # The linked events' `linked_by` values (null for `of` events): what a live
    # batch names the `of` events it reads by (`linked_keys`). Not kept in the index.
    linked: pa.ChunkedArray

    @classmethod
    def of(cls, view: View, rows: DataFrame) -> Rows:
        """Collected through Arrow: 25 bytes a row, and a linked event's key."""
        assert view.scope.linked_by is not None, f"{view.table_name}: no linked events"
        table = (
            rows.where(F.col("event_type").isin(*view.event_types))
            .select(
                F.col("event_type").isin(*view.scope.of).alias("is_of"),
                F.xxhash64(view.scope.linked_by).alias("hash"),
                F.unix_micros("event_time").alias("time"),
                F.unix_date("event_date").alias("day"),
                F.when(
                    ~F.col("event_type").isin(*view.scope.of), F.col(view.scope.linked_by)
                ).alias("linked"),
            )
            .toArrow()
        )
        return cls(
            table.column("is_of").to_numpy(zero_copy_only=False).astype(bool),
            table.column("hash").to_numpy(),
            table.column("time").to_numpy(),
            table.column("day").to_numpy(),
            table.column("linked"),
        )

    @property
    def linked_hashes(self) -> np.ndarray:
        return self.hashes[~self.is_of]

    @property
    def linked_keys(self) -> list[str] | None:
        """The linked events' distinct `linked_by` values, where they are strings (None
        otherwise: SQL and Spark may spell other types differently)."""
        kind = self.linked.type
        if not any(
            f(kind) for f in (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view)
        ):
            return None
        return sorted({k for k in self.linked.to_pylist() if k is not None})


class LinkIndex:
    """Where silver holds each linked key's events, by day; see the module's doc."""

    def __init__(self, view: View) -> None:
        if not view.scope.linked:
            raise ValueError(f"{view.table_name}: its scope has no linked events")
        self.view = view
        self._built = False
        self._of_by_time = SortedPairs()  # `of` event time -> key hash
        self._of_days = SortedPairs()  # key hash -> day of an `of` event
        self._linked_days = SortedPairs()  # key hash -> day of a linked event

    def __len__(self) -> int:
        return len(self._of_days) + len(self._linked_days)

    def follow(self, changed: DataFrame, silver: Callable[[], DataFrame]) -> Rows:
        """Take in a micro-batch: its changed rows, and the snapshot of silver it reads
        (a function that reads it, called at the first batch only). Built from that
        snapshot at the first batch; later batches add their rows. Returns the changed
        rows, as the index read them."""
        rows = Rows.of(self.view, changed)
        if self._built:
            self._add(rows)
            return rows
        started = time.monotonic()
        self._add(Rows.of(self.view, silver()))
        self._built = True
        log.info(
            "%s: link index of %s events by %s in %.1f s",
            self.view.table_name,
            f"{len(self):,}",
            self.view.scope.linked_by,
            time.monotonic() - started,
        )
        return rows

    def _add(self, rows: Rows) -> None:
        of, linked = rows.is_of, ~rows.is_of
        self._of_by_time.add(rows.times[of], rows.hashes[of])
        self._of_days.add(rows.hashes[of], rows.days[of])
        self._linked_days.add(rows.hashes[linked], rows.days[linked])

    def of_days(self, hashes: np.ndarray) -> list[int]:
        """The days that can hold an `of` event of these key hashes."""
        return self._of_days.values_of(hashes).tolist()

    def linked_days(self, ranges: Iterable[tuple[int, int]]) -> list[int]:
        """The days that can hold a linked event of an `of` event whose time is in one
        of these [start, end) ranges (UTC microseconds)."""
        return self._linked_days.values_of(self._of_by_time.values_within(ranges)).tolist()
