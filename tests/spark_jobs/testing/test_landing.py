"""Scoring a run against the lake: what counts as lost, doubled, or merely different."""

from __future__ import annotations

from collections import Counter

from spark_jobs import generator
from spark_jobs.producer import GeneratedRun, ProduceSummary
from spark_jobs.testing.landing import Landing, score


def _run() -> GeneratedRun:
    recs = generator.records(9, 6)
    bad = generator.Record(b"k", b"nope", "malformed_json")
    again = generator.Record(
        recs[0].key, recs[0].value, generator.VALID, recs[0].event_id, recs[0].content
    )
    records = [*recs, bad, again]
    positions = [(0, i) for i in range(len(records))]
    return GeneratedRun(9, records, list(positions), ProduceSummary(produced=len(records)))


def _exact(run: GeneratedRun) -> Landing:
    exp = run.expected()
    bronze = Counter(p for p in run.positions if p is not None)
    return Landing(bronze, dict(exp.silver), dict(exp.quarantine), len(exp.silver), len(exp.silver))


def test_the_contracts_answer_scores_exact():
    run = _run()
    result = score(run, _exact(run))
    assert (result.produced, result.in_silver, result.lost, result.doubled) == (8, 6, 0, 0)
    assert result.exact


def test_a_lost_silver_event_and_a_lost_bronze_record_are_counted_once_each():
    run = _run()
    got = _exact(run)
    event_id = next(iter(got.silver))
    del got.silver[event_id]
    got.silver_total_rows = got.silver_distinct_ids = len(got.silver)
    del got.bronze[(0, 6)]  # the malformed record never reached bronze
    del got.quarantine[(0, 6)]
    result = score(run, got)
    assert (result.lost, result.doubled) == (2, 0)
    assert any(event_id in p for p in result.problems)
    assert any("not in bronze" in p for p in result.problems)


def test_doubled_rows_in_bronze_and_silver_are_counted():
    run = _run()
    got = _exact(run)
    got.bronze[(0, 3)] += 1
    got.silver_total_rows += 2
    result = score(run, got)
    assert (result.lost, result.doubled) == (0, 3)
    assert not result.exact


def test_a_record_in_the_wrong_place_is_a_problem_though_nothing_is_lost():
    run = _run()
    got = _exact(run)
    got.quarantine[(0, 6)] = "invalid_field"
    result = score(run, got)
    assert (result.lost, result.doubled) == (0, 0)
    assert result.problems == ["quarantine differs at 2 (position, reason) pairs"]
