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


def compute(silver: DataFrame) -> DataFrame:
    orders = silver.where(F.col("event_type") == "order_placed")
    return (
        orders.groupBy(hour_of("event_time").alias("window_start"), "currency")
        .agg(F.count(F.lit(1)).alias("orders"), F.sum("total").cast(MONEY).alias("revenue"))
        .select(
            "window_start",
            (F.col("window_start") + F.expr("INTERVAL 1 HOUR")).alias("window_end"),
            "currency",
            "orders",
            "revenue",
        )
    )


VIEW = View(
    name="revenue_hourly",
    version=1,
    key=("window_start", "currency"),
    schema=SCHEMA,
    compute=compute,
    scope=("window_start", "currency"),
    event_types=("order_placed",),
    description="gross revenue per hour: orders placed and the sum of their totals",
)
