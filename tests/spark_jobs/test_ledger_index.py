"""The ledger index's own bookkeeping, without Spark (its use: test_silver.py)."""

from __future__ import annotations

import numpy as np

from spark_jobs.engine.ledger_index import Keys, LedgerIndex


def _keys(pairs: list[tuple[int, int, int]]) -> Keys:
    """(id hash, partition, offset) -> Keys, positions packed as the index keeps them."""
    return Keys(
        np.array([h for h, _, _ in pairs], np.int64),
        np.array([(p << 48) | o for _, p, o in pairs], np.int64),
    )


def test_added_rows_stay_sorted_and_are_found_by_hash():
    index = LedgerIndex("/nowhere")
    rng = np.random.default_rng(7)
    added = []
    for n in (10, 1, 0, 500, 77):
        rows = [
            (int(h), int(p), int(o))
            for h, p, o in zip(
                rng.integers(-50, 50, n),
                rng.integers(0, 4, n),
                rng.integers(0, 1 << 40, n),
                strict=True,
            )
        ]
        index.add(_keys(rows))
        added += rows
    assert len(index) == len(added)
    for h in (-50, 0, 17, 49):
        assert index.positions_of(np.array([h], np.int64)) == sorted(
            {(p, o) for hh, p, o in added if hh == h}
        )
    assert index.positions_of(np.array([1000], np.int64)) == []


def test_earlier_leaves_out_the_batchs_own_positions():
    index = LedgerIndex("/nowhere")
    index.add(_keys([(5, 0, 10), (5, 2, 3), (9, 1, 1)]))
    batch = _keys([(5, 2, 3), (8, 3, 0)])  # its (2, 3) is in the index already (a retry)
    assert index.earlier(batch) == [(0, 10)]
