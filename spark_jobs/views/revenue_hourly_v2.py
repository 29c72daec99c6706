"""revenue_hourly v2: net of cancellations, attributed to the order's hour (docs/contract.md §3).

An order is cancelled if any `order_cancelled` with its order_id exists in
silver, whenever it arrived (before the order too); twice counts once. Each
accepted `order_placed` is its own order, so a cancellation of a repeated
order_id cancels all of them.
"""

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
from spark_jobs.views.base import Scope, View
from spark_jobs.views.hourly import MONEY, hour_of, window_end

SCHEMA = StructType(
    [
        StructField("window_start", TimestampType(), False),
        StructField("window_end", TimestampType(), False),
        StructField("currency", StringType(), False),
        StructField("orders_placed", LongType(), False),
        StructField("orders_cancelled", LongType(), False),
        StructField("gross_revenue", MONEY, False),
        StructField("cancelled_revenue", MONEY, False),
        StructField("net_revenue", MONEY, False),
    ]
)


def compute(silver: DataFrame) -> DataFrame:
    placed = silver.where(F.col("event_type") == "order_placed").select(
        "order_id", hour_of("event_time").alias("window_start"), "currency", "total"
    )
    cancelled = (
        silver.where(F.col("event_type") == "order_cancelled")
        .select("order_id")
        .distinct()
        .withColumn("is_cancelled", F.lit(True))
    )
    orders = placed.join(cancelled, "order_id", "left").fillna(False, ["is_cancelled"])
    zero = F.lit(0).cast(MONEY)
    return (
        orders.groupBy("window_start", "currency")
        .agg(
            F.count(F.lit(1)).alias("orders_placed"),
            F.count_if("is_cancelled").alias("orders_cancelled"),
            F.sum("total").cast(MONEY).alias("gross_revenue"),
            F.coalesce(
                F.sum(F.when(F.col("is_cancelled"), F.col("total"))).cast(MONEY), zero
            ).alias("cancelled_revenue"),
        )
        .select(
            "window_start",
            window_end(),
            "currency",
            "orders_placed",
            "orders_cancelled",
            "gross_revenue",
            "cancelled_revenue",
            (F.col("gross_revenue") - F.col("cancelled_revenue")).cast(MONEY).alias("net_revenue"),
        )
    )


VIEW = View(
    name="revenue_hourly",
    version=2,
    key=("window_start", "currency"),
    schema=SCHEMA,
    compute=compute,
    # An order counts in its own hour; a cancellation changes the hours of the
    # orders it cancels (none yet if the order has not arrived: then nothing
    # changes until it does, as the contract says), and restates those hours.
    scope=Scope(
        columns=hourly.SCOPE_COLUMNS,
        within=hourly.WITHIN,
        of=("order_placed",),
        linked_by="order_id",
        linked=("order_cancelled",),
    ),
    window=("window_start", "window_end"),
    description="revenue net of cancellations, each attributed to its order's hour",
    # Before cancellations are taken off, v2 is v1: same hours, orders and gross.
    agrees_with={
        1: {"window_end": "window_end", "orders_placed": "orders", "gross_revenue": "revenue"}
    },
)
