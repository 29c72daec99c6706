"""What the contract says generated records must become: log order decides, and the
id checksum equals its Trino SQL."""

from __future__ import annotations

from pyspark.sql import functions as F

from spark_jobs import expectations, generator


def test_expected_outcome_follows_log_order_not_send_order():
    base = generator.records(4, 50)[0]
    assert base.content is not None
    other = generator.Record(base.key, b"{}", generator.VALID, base.event_id, {"x": 1})
    bad = generator.Record(b"k", b"nope", "malformed_json")
    exp = expectations.expected_outcome([(base, 2, 5), (base, 2, 9), (other, 0, 40), (bad, 1, 1)])
    # Partition 0 precedes partition 2 in log order, though it was sent last.
    assert exp.silver == {base.event_id: (0, 40)}
    assert exp.quarantine == {
        (2, 5): "conflicting_duplicate",
        (2, 9): "conflicting_duplicate",
        (1, 1): "malformed_json",
    }
    assert exp.duplicates == set()
    assert exp.per_partition() == {
        0: {"silver": 1, "quarantine": 0, "duplicates": 0},
        1: {"silver": 0, "quarantine": 1, "duplicates": 0},
        2: {"silver": 0, "quarantine": 2, "duplicates": 0},
    }


def test_id_checksum_matches_its_sql_definition(spark):
    ids = ["a", "s1-0000001", "s1-bad-0000002"]
    df = spark.createDataFrame([(i,) for i in ids], "event_id string")
    (row,) = df.select(
        F.sum(F.conv(F.substring(F.sha2("event_id", 256), 1, 8), 16, 10).cast("bigint"))
    ).collect()
    assert row[0] == expectations.id_checksum(ids)
