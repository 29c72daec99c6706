"""The soak's verdict: the last third of each series against the first."""

from __future__ import annotations

from warehouse.tools.soak import Sample, verdicts


def _sample(minute: float, files: int, serving_s: float, fresh_s: float) -> Sample:
    return Sample(
        minute,
        {"silver.shop_events": files},
        serving_s,
        {"revenue_hourly_v1": fresh_s},
        {"ingest": 2.0},
    )


def test_flat_series_are_flat_and_growth_is_named():
    samples = [_sample(m * 5, 40 + m % 3, 0.2, 10.0 + 20 * m) for m in range(9)]
    found = verdicts(samples)
    assert found["data files"].startswith("flat")
    assert found["serving p50"].startswith("flat")
    assert found["batch ingest"] == "flat: last third 1.00x the first"
    # 10, 30, 50 against 130, 150, 170: a freshness that keeps growing.
    assert found["freshness revenue_hourly_v1"] == "GREW: last third 5.00x the first"


def test_a_run_too_short_is_not_judged():
    assert verdicts([_sample(0, 1, 0.1, 1.0)]) == {
        "run": "too short to judge (fewer than 3 samples)"
    }
