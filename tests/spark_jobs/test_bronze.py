from datetime import datetime

from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spark_jobs.engine.bronze import BRONZE_SCHEMA, KAFKA_SOURCE_SCHEMA, to_bronze_rows
from tests.frames import assert_df_equality


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


def test_after_a_lost_checkpoint_each_partition_resumes_after_its_last_copied_offset():
    from spark_jobs.engine.bronze import resume_offsets

    # p2 was never copied: it starts at the earliest offset Kafka has (-2).
    assert resume_offsets({0: 41, 1: 0, 3: 9}, [3, 2, 1, 0]) == {
        "shop.events": {"0": 42, "1": 1, "2": -2, "3": 10}
    }


def test_a_checkpoint_counts_as_started_once_it_planned_a_batch(spark, tmp_path):
    from spark_jobs.engine import lake

    assert not lake.checkpoint_has_progress(spark, str(tmp_path / "none"))
    (tmp_path / "cp" / "offsets").mkdir(parents=True)
    assert not lake.checkpoint_has_progress(spark, str(tmp_path / "cp"))
    (tmp_path / "cp" / "offsets" / "0").write_text("v1\n")
    assert lake.checkpoint_has_progress(spark, str(tmp_path / "cp"))
    # Markers beside it are written whole, through the same file system API.
    marker = str(tmp_path / "cp" / "marker")
    assert lake.read_text(spark, marker) is None
    lake.write_text(spark, marker, "one\n")
    lake.write_text(spark, marker, "two\n")
    assert lake.read_text(spark, marker) == "two\n"
    assert sorted(lake.list_names(spark, str(tmp_path / "cp"))) == ["marker", "offsets"]
