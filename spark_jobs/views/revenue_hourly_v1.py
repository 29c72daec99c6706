"""revenue_hourly v1: gross revenue per UTC hour and currency (docs/contract.md §3)."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.views import hourly
from spark_jobs.views.base import Scope, Sums, View
from spark_jobs.views.hourly import MONEY, hour_of, window_end

SCHEMA = StructType(
    [
        StructField("window_start", TimestampType(), False),
        StructField("window_end", TimestampType(), False),
        StructField("currency", StringType(), False),
        StructField("orders", LongType(), False),
        StructField("revenue", MONEY, False),
    ]
)


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


VIEW = View(
    name="revenue_hourly",
    version=1,
    key=("window_start", "currency"),
    schema=SCHEMA,
    compute=compute,
    # An order counts in its own hour and currency.
    scope=Scope(columns=hourly.SCOPE_COLUMNS, of=("order_placed",), within=hourly.WITHIN),
    window=("window_start", "window_end"),
    description="gross revenue per hour: orders placed and the sum of their totals",
    # Both add up, order by order: a live batch folds its changes into gold.
    sums=Sums(measures={"orders": "1", "revenue": "total"}, count="orders"),
)
