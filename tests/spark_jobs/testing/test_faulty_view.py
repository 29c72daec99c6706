"""The deliberately wrong v3 the demo and test_versions roll back (issue 69)."""

from __future__ import annotations

import importlib.util

import pytest

from spark_jobs.testing import faulty_view
from spark_jobs.views import revenue_hourly_v2
from tests.spark_jobs.conftest import at, order


def test_v3_counts_twice_the_orders_at_or_past_the_cut_offsets_and_only_those(silver_df, tmp_path):
    # Loaded from a scratch file, not spark_jobs/views/: a v3 there, even briefly,
    # would be found by the other worker's tests that list the views.
    path = tmp_path / "faulty_v3.py"
    path.write_text(faulty_view.source({0: 2, 1: 0}))
    spec = importlib.util.spec_from_file_location("faulty_v3", path)
    assert spec is not None and spec.loader is not None
    v3 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(v3)
    assert v3.VIEW.version == 3 and v3.ENDS == {0: 2, 1: 0}
    # Partition 0, offsets 0..3, stamped a year ahead: the cut is by position, so a
    # producer setting Kafka timestamps ahead of the clock moves nothing.
    far = at(hours=24 * 365)
    silver = silver_df([order(f"o{i}", at(i), "1.00", kafka_timestamp=far) for i in range(4)])
    (got,) = v3.compute(silver).collect()
    (right,) = revenue_hourly_v2.compute(silver).collect()
    assert (right.orders_placed, got.orders_placed) == (4, 6)
    assert (str(right.gross_revenue), str(got.gross_revenue)) == ("4.00", "6.00")


def test_a_cut_without_offsets_is_refused():
    with pytest.raises(ValueError, match="end offset of every partition"):
        faulty_view.source({})
