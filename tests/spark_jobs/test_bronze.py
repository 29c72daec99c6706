from datetime import datetime

from chispa import assert_df_equality
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spark_jobs.bronze import BRONZE_SCHEMA, KAFKA_SOURCE_SCHEMA, to_bronze_rows


def test_bronze_keeps_every_record_and_its_raw_bytes(spark):
    ts = datetime(2026, 1, 1, 12, 0, 0)
    records = spark.createDataFrame(
        [
            (b"c1", b'{"event_id":"a"}', "shop.events", 0, 7, ts, 0),
            (b"c2", b"\xff\xfe not utf-8", "shop.events", 3, 0, ts, 0),
            (None, None, "shop.events", 1, 42, ts, 0),
        ],
        KAFKA_SOURCE_SCHEMA,
    )
    bronze = to_bronze_rows(records)

    assert [f.name for f in bronze.schema] == [f.name for f in BRONZE_SCHEMA]
    assert bronze.filter(F.col("ingested_at").isNull()).count() == 0
    expected = spark.createDataFrame(
        [
            ("shop.events", 0, 7, ts, "c1", b'{"event_id":"a"}'),
            ("shop.events", 3, 0, ts, "c2", b"\xff\xfe not utf-8"),
            ("shop.events", 1, 42, ts, None, None),
        ],
        StructType([f for f in BRONZE_SCHEMA if f.name != "ingested_at"]),
    )
    assert_df_equality(
        bronze.drop("ingested_at"), expected, ignore_row_order=True, ignore_nullable=True
    )
