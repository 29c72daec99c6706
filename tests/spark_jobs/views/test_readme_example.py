"""The worked example of adding a view version (docs/architecture.md) runs as
written: its module and its test are taken from the guide's text and executed
here (as chispa's `tests/test_readme_examples.py` runs its README)."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"
MODULE = "spark_jobs.views.revenue_hourly_v3"


def _block(first_line: str) -> str:
    """The ```python block of the guide whose first line is `first_line`."""
    for body in re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S):
        if body.startswith(first_line + "\n"):
            return str(body)
    raise AssertionError(f"docs/architecture.md has no python block starting {first_line!r}")


@pytest.fixture
def v3() -> Iterator[types.ModuleType]:
    """The guide's v3 as an importable module, for this test only (no file is written,
    so the view registry, which lists files, never sees it)."""
    module = types.ModuleType(MODULE)
    sys.modules[MODULE] = module
    try:
        exec(
            compile(_block("# spark_jobs/views/revenue_hourly_v3.py"), MODULE, "exec"), vars(module)
        )
        yield module
    finally:
        del sys.modules[MODULE]


def test_the_readme_v3_and_its_test_pass(v3, spark, silver_df):
    namespace: dict[str, object] = {"__name__": "readme_v3_test"}
    exec(
        compile(_block("# tests/spark_jobs/views/test_revenue_hourly_v3.py"), "readme", "exec"),
        namespace,
    )
    tests = {k: v for k, v in namespace.items() if k.startswith("test_") and callable(v)}
    assert len(tests) == 2
    for test in tests.values():
        test(spark, silver_df)
    assert v3.VIEW.table_name == "revenue_hourly_v3"
    assert v3.VIEW.event_types == ("order_placed", "order_cancelled")
