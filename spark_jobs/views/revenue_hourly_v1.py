"""revenue_hourly v1: gross revenue per UTC hour and currency (CONTRACT.md §3)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    DecimalType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.views.base import View

MONEY = DecimalType(18, 2)

SCHEMA = StructType(
    [
        StructField("window_start", TimestampType(), False),
        StructField("window_end", TimestampType(), False),
        StructField("currency", StringType(), False),
        StructField("orders", LongType(), False),
        StructField("revenue", MONEY, False),
    ]
)


def hour_of(ts: str) -> F.Column:
    """The start of the UTC hour holding ts (the session time zone is UTC)."""
    return F.date_trunc("hour", F.col(ts))


def window_end() -> F.Column:
    """The end of the hour that starts at `window_start` (end-exclusive)."""
    return (F.col("window_start") + F.expr("INTERVAL 1 HOUR")).alias("window_end")


def compute(silver: DataFrame) -> DataFrame:
    orders = silver.where(F.col("event_type") == "order_placed")
    return (
        orders.groupBy(hour_of("event_time").alias("window_start"), "currency")
        .agg(F.count(F.lit(1)).alias("orders"), F.sum("total").cast(MONEY).alias("revenue"))
        .select(
            "window_start",
            window_end(),
            "currency",
            "orders",
            "revenue",
        )
    )


def placed_orders(silver: DataFrame) -> DataFrame:
    return silver.where(F.col("event_type") == "order_placed").withColumn(
        "window_start", hour_of("event_time")
    )


SCOPE = ("window_start", "currency")


def scopes_of(changed: DataFrame, silver: DataFrame) -> DataFrame:
    return placed_orders(changed).select(*SCOPE).distinct()


def restrict(silver: DataFrame, scopes: DataFrame) -> DataFrame:
    return (
        placed_orders(silver)
        .join(F.broadcast(scopes), list(SCOPE), "left_semi")
        .drop("window_start")
    )


def order_windows(orders: DataFrame) -> DataFrame:
    """Placed orders (with window_start) -> the hour and currency each counts in."""
    return orders.select(
        "event_id",
        "event_time",
        "window_start",
        window_end(),
        F.col("currency").alias("window_key"),
    )


def lands_in(events: DataFrame, silver: DataFrame, gold: DataFrame) -> DataFrame:
    return order_windows(placed_orders(events))


VIEW = View(
    name="revenue_hourly",
    version=1,
    key=("window_start", "currency"),
    schema=SCHEMA,
    compute=compute,
    scope=SCOPE,
    event_types=("order_placed",),
    scopes_of=scopes_of,
    restrict=restrict,
    lands_in=lands_in,
    description="gross revenue per hour: orders placed and the sum of their totals",
)
