"""The audit's pure parts: finding holes in offset runs, reading a serving view's routes."""

from __future__ import annotations

from warehouse.ops.audit import gaps, routed_versions
from warehouse.sql.serving import Column, view_sql


def test_no_gap_when_runs_cover_the_range():
    assert gaps(0, [(0, 9)], 9) == []
    assert gaps(5, [(5, 7), (8, 20)], 20) == []


def test_gaps_at_the_start_middle_and_end():
    assert gaps(0, [(3, 5), (9, 10)], 12) == [(0, 2), (6, 8), (11, 12)]


def test_offsets_below_kafkas_low_watermark_are_not_gaps():
    # Bronze keeps offsets Kafka has deleted; the range starts at Kafka's low mark.
    assert gaps(100, [(100, 150)], 150) == []


def test_an_empty_bronze_partition_has_the_whole_range_missing():
    assert gaps(10, [], 14) == [(10, 14)]


def test_routes_are_read_from_the_serving_views_tables():
    cols = [Column("window_start", "timestamp(3) with time zone"), Column("n", "bigint")]
    sql = view_sql("revenue_hourly", {1: cols, 3: cols})
    assert routed_versions(sql, "revenue_hourly") == {1, 3}
    assert routed_versions(sql.upper(), "revenue_hourly") == {1, 3}
    assert routed_versions(sql, "cart_sessions") == set()
    assert routed_versions('FROM "lakehouse"."gold"."revenue_hourly_v2" g', "revenue_hourly") == {2}
