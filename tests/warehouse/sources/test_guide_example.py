"""The worked example of adding a source (docs/architecture.md, "Adding a source") runs
as written: its declaration and its test are taken from the guide's text and executed
here, as `tests/spark_jobs/views/test_readme_example.py` runs the view guide's."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

from warehouse import sources
from warehouse.base import declare, registry

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "architecture.md"
MODULE = "warehouse.sources.payments"


def _block(first_line: str) -> str:
    """The ```python block of the guide whose first line is `first_line`."""
    for body in re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S):
        if body.startswith(first_line + "\n"):
            return str(body)
    raise AssertionError(f"docs/architecture.md has no python block starting {first_line!r}")


@pytest.fixture
def payments() -> Iterator[types.ModuleType]:
    """The guide's declaration as an importable module, for this test only (no file is
    written, so `sources.discover()`, which lists files, never sees it)."""
    module = types.ModuleType(MODULE)
    sys.modules[MODULE] = module
    try:
        exec(compile(_block("# warehouse/sources/payments.py"), MODULE, "exec"), vars(module))
        yield module
    finally:
        del sys.modules[MODULE]


def test_the_guide_s_source_and_its_test_pass(payments, spark):
    source = payments.SOURCE
    # A declaration the engine takes as it is: its topic and tables follow its name,
    # and a first contract is compatible with nothing accepted before it.
    assert source.topic == registry.source_tables("payments").topic
    assert declare.incompatibilities(None, source) == []
    assert "payments" not in sources.discover()

    namespace: dict[str, object] = {"__name__": "guide_payments_test"}
    exec(
        compile(_block("# tests/warehouse/sources/test_payments.py"), "guide", "exec"),
        namespace,
    )
    tests = {k: v for k, v in namespace.items() if k.startswith("test_") and callable(v)}
    assert len(tests) == 2
    for test in tests.values():
        test(spark)
