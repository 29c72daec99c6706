"""tests/frames.py: row order ignored without a Spark sort, and still a real check."""

from __future__ import annotations

import pytest
from chispa import DataFramesNotEqualError
from chispa.schema_comparer import SchemasNotEqualError

from tests.frames import assert_df_equality


def test_rows_in_another_order_are_equal_and_other_rows_are_not(spark):
    left = spark.createDataFrame(
        [(1, "a", [1, 2]), (2, None, [])], "n int, s string, xs array<int>"
    )
    right = spark.createDataFrame(
        [(2, None, []), (1, "a", [1, 2])], "n int, s string, xs array<int>"
    )
    assert_df_equality(left, right, ignore_row_order=True)
    # A row twice is not the same as once: multisets, as chispa's sorted lists.
    twice = right.unionByName(right.limit(1))
    with pytest.raises(DataFramesNotEqualError):
        assert_df_equality(left, twice, ignore_row_order=True)
    other = spark.createDataFrame(
        [(2, None, []), (1, "a", [2, 1])], "n int, s string, xs array<int>"
    )
    with pytest.raises(DataFramesNotEqualError):
        assert_df_equality(left, other, ignore_row_order=True)


def test_schemas_are_held_as_chispa_holds_them(spark):
    narrow = spark.createDataFrame([(1, "a")], "n int, s string")
    wide = spark.createDataFrame([(1, "a")], "n long, s string")
    with pytest.raises(SchemasNotEqualError):
        assert_df_equality(narrow, wide, ignore_row_order=True)
    swapped = spark.createDataFrame([("a", 1)], "s string, n int")
    with pytest.raises(SchemasNotEqualError):
        assert_df_equality(narrow, swapped, ignore_row_order=True)
    assert_df_equality(narrow, swapped, ignore_row_order=True, ignore_column_order=True)
