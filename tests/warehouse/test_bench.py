"""The bench's pure parts: targets and percentiles."""

from __future__ import annotations

import pytest

from warehouse import bench


def test_each_target_is_met_missed_or_not_measured():
    rows = {
        r[0]: r for r in bench.verdicts({"producer_events_per_s": 120_000, "freshness_p95_s": 12})
    }
    assert rows["producer_events_per_s"][4] is True
    assert rows["freshness_p95_s"][4] is False  # a ceiling: 12 s is over 10 s
    assert rows["stack_peak_gib"][1] is None and rows["stack_peak_gib"][4] is None
    assert [r[0] for r in bench.verdicts({})] == [t[0] for t in bench.TARGETS]


def test_percentiles_interpolate_and_refuse_nothing():
    samples = [float(x) for x in range(1, 101)]
    assert bench.percentile(samples, 50) == pytest.approx(50.5)
    assert bench.percentile(samples, 95) == pytest.approx(95.05)
    assert bench.percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError):
        bench.percentile([], 50)
