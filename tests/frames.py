"""chispa's DataFrame comparison, without its Spark sort when row order is ignored.

`chispa.assert_df_equality(..., ignore_row_order=True)` sorts each side in Spark
before collecting it: a global sort per side, a sampling job and a shuffle job,
about 4 Spark jobs per call on frames of a few rows. Here each side is collected
once and the rows are compared as multisets in Python, after chispa's own schema
check. Only when they differ does chispa run as before, so a failure reads as it
always did (chispa's row diff) and a pass means what chispa's pass means: equal
schemas, equal rows.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable
from typing import Any

import chispa
from chispa.schema_comparer import assert_schema_equality
from pyspark.sql import DataFrame


def _frozen(value: Any) -> Hashable:
    """A value made hashable: rows and arrays as tuples, maps as frozen sets."""
    if isinstance(value, tuple | list):  # a Row is a tuple
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return frozenset((k, _frozen(v)) for k, v in value.items())
    return value


def assert_df_equality(df1: DataFrame, df2: DataFrame, **options: Any) -> None:
    """`chispa.assert_df_equality` with the same options; without a Spark sort when
    `ignore_row_order`, unless the frames differ."""
    if not options.get("ignore_row_order") or set(options) - {
        "ignore_row_order",
        "ignore_nullable",
        "ignore_column_order",
    }:
        chispa.assert_df_equality(df1, df2, **options)
        return
    left, right = df1, df2
    if options.get("ignore_column_order"):
        left, right = left.select(sorted(left.columns)), right.select(sorted(right.columns))
    # chispa's own check, which raises as its `assert_df_equality` would.
    assert_schema_equality(left.schema, right.schema, options.get("ignore_nullable", False))
    if Counter(map(_frozen, left.collect())) != Counter(map(_frozen, right.collect())):
        chispa.assert_df_equality(df1, df2, **options)
        # chispa compares with tolerance where this does not (NaN, say): its pass stands.
