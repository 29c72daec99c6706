"""The worked example of adding a source (docs/architecture.md, "Adding a source") runs
as written: its declaration and its test are taken from the guide's text and executed
here (tests/guides.py), as the view guide's are."""

from __future__ import annotations

import types
from collections.abc import Iterator

import pytest

from tests.guides import guide_tests, module_from
from warehouse import sources
from warehouse.base import declare, registry


@pytest.fixture
def payments() -> Iterator[types.ModuleType]:
    """The guide's declaration as an importable module, for this test only (no file is
    written, so `sources.discover()`, which lists files, never sees it)."""
    with module_from("# warehouse/sources/payments.py", "warehouse.sources.payments") as module:
        yield module


def test_the_guide_s_source_and_its_test_pass(payments, spark):
    source = payments.SOURCE
    # A declaration the engine takes as it is: its topic and tables follow its name,
    # and a first contract is compatible with nothing accepted before it.
    assert source.topic == registry.source_tables("payments").topic
    assert declare.incompatibilities(None, source) == []
    assert "payments" not in sources.discover()
    tests = guide_tests("# tests/warehouse/sources/test_payments.py")
    assert len(tests) == 2
    for test in tests.values():
        test(spark)
