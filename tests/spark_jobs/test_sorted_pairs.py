"""The driver-side indexes' sorted pairs, without Spark."""

from __future__ import annotations

import numpy as np

from spark_jobs.engine.sorted_pairs import SortedPairs


def _built(keys: np.ndarray, values: np.ndarray) -> SortedPairs:
    pairs = SortedPairs()
    pairs.reset(keys, values)
    return pairs


def _pairs(pairs: list[tuple[int, int]]) -> SortedPairs:
    keys, values = zip(*pairs, strict=True)
    return _built(np.array(keys), np.array(values))


def test_values_of_gives_every_value_of_each_key_once():
    index = _pairs([(5, 50), (1, 10), (5, 51), (9, 90), (5, 50)])
    assert index.values_of(np.array([5])).tolist() == [50, 51]
    assert index.values_of(np.array([9, 1, 9])).tolist() == [10, 90]
    assert index.values_of(np.array([2, 7, 100])).tolist() == []
    assert index.values_of(np.array([], np.int64)).tolist() == []


def test_added_pairs_are_found_as_if_built_with_them():
    rng = np.random.default_rng(7)
    keys, values = rng.integers(-50, 50, 400), rng.integers(0, 10**12, 400)
    built = _built(keys, values)
    grown = _built(keys[:150], values[:150])
    grown.add(keys[150:300], values[150:300])
    grown.add(keys[300:], values[300:])
    grown.add(np.array([], np.int64), np.array([], np.int64))
    assert np.all(np.diff(grown.keys) >= 0)
    for wanted in ([0], [-50, 49], list(range(-60, 60, 7))):
        assert (
            grown.values_of(np.array(wanted)).tolist() == built.values_of(np.array(wanted)).tolist()
        )
        expected = sorted({int(v) for k, v in zip(keys, values, strict=True) if k in wanted})
        assert built.values_of(np.array(wanted)).tolist() == expected


def test_values_within_takes_keys_in_half_open_ranges():
    index = _pairs([(10, 1), (20, 2), (30, 3), (40, 4), (20, 5)])
    assert index.values_within([(10, 30)]).tolist() == [1, 2, 5]
    assert index.values_within([(11, 20), (40, 41)]).tolist() == [4]
    assert index.values_within([(0, 10), (41, 99)]).tolist() == []
    assert index.values_within([]).tolist() == []
