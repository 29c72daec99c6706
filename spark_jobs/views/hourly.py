"""What the hourly views share: the UTC hour an order counts in, money, and the scope.

Not a view (the registry only loads `<view>_v<N>` modules), so any version may
import it and retiring one version never breaks another.
"""

from __future__ import annotations

from types import MappingProxyType

from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType

MONEY = DecimalType(18, 2)

# The hour a silver row counts in, as Spark SQL (the session time zone is UTC);
# `hour_of` and `window_end` below are the same expressions as Columns.
HOUR_START = "date_trunc('hour', event_time)"
HOUR_END = f"{HOUR_START} + INTERVAL 1 HOUR"

# An hourly view's scope: an hour and a currency. The window's end is in it too,
# so an event alone says which row it lands in (no gold read to place a
# restatement); it follows from the start, so it scopes nothing more finely.
SCOPE_COLUMNS = MappingProxyType(
    {"window_start": HOUR_START, "window_end": HOUR_END, "currency": "currency"}
)


# An order in an hourly scope happened within that hour: a live micro-batch
# then reads only the days of silver its hours fall on.
WITHIN = ("window_start", "window_end")


def hour_of(ts: str) -> F.Column:
    """The start of the UTC hour holding ts (the session time zone is UTC)."""
    return F.date_trunc("hour", F.col(ts))


def window_end() -> F.Column:
    """The end of the hour that starts at `window_start` (end-exclusive)."""
    return (F.col("window_start") + F.expr("INTERVAL 1 HOUR")).alias("window_end")
