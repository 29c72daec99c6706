"""The worked example of adding a view version (docs/architecture.md) runs as
written: its module and its test are taken from the guide's text and executed
here (tests/guides.py)."""

from __future__ import annotations

import types
from collections.abc import Iterator

import pytest

from tests.guides import guide_tests, module_from

MODULE = "spark_jobs.views.revenue_hourly_v3"


@pytest.fixture
def v3() -> Iterator[types.ModuleType]:
    """The guide's v3 as an importable module, for this test only (no file is written,
    so the view registry, which lists files, never sees it)."""
    with module_from("# spark_jobs/views/revenue_hourly_v3.py", MODULE) as module:
        yield module


def test_the_readme_v3_and_its_test_pass(v3, spark, silver_df):
    tests = guide_tests("# tests/spark_jobs/views/test_revenue_hourly_v3.py")
    assert len(tests) == 2
    for test in tests.values():
        test(spark, silver_df)
    assert v3.VIEW.table_name == "revenue_hourly_v3"
    assert v3.VIEW.event_types == ("order_placed", "order_cancelled")
