"""Delta mechanics shared by every layer, under concurrent writers."""

from __future__ import annotations

import threading

from pyspark.sql.types import LongType, StructField, StructType

from spark_jobs import lake

SCHEMA = StructType([StructField("x", LongType(), False)])


def test_tables_created_by_writers_started_together_end_as_one_table(spark, tmp_path):
    """Several view queries start at once and each ensures gold.restatements: every
    one must succeed, and the table ends with exactly one creating commit."""
    writers = 4
    for round_ in range(3):
        path = str(tmp_path / f"shared{round_}")
        start = threading.Barrier(writers)
        errors: list[BaseException] = []

        def create(
            path: str = path, start: threading.Barrier = start, errors: list = errors
        ) -> None:
            start.wait()
            try:
                lake.ensure_table(spark, path, SCHEMA)
            except Exception as exc:  # collected and asserted below
                errors.append(exc)

        threads = [threading.Thread(target=create) for _ in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").collect()
        assert [r.operation for r in history].count("CREATE TABLE") == 1
        assert spark.read.format("delta").load(path).schema == SCHEMA
