"""The bench's pure parts: targets, percentiles, the sustained rate, probes and the report."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from warehouse.tools.bench import chart as bench_chart
from warehouse.tools.bench import latency, runner, throughput
from warehouse.tools.bench import report as bench_report


def test_each_target_is_met_missed_or_not_measured():
    rows = {
        r[0]: r
        for r in bench_report.verdicts({"producer_events_per_s": 120_000, "freshness_p95_s": 12})
    }
    assert rows["producer_events_per_s"][4] is True
    assert rows["freshness_p95_s"][4] is False  # a ceiling: 12 s is over 10 s
    assert rows["stack_peak_gib"][1] is None and rows["stack_peak_gib"][4] is None
    assert [r[0] for r in bench_report.verdicts({})] == [t[0] for t in bench_report.TARGETS]


def test_percentiles_interpolate_and_refuse_nothing():
    samples = [float(x) for x in range(1, 101)]
    assert bench_report.percentile(samples, 50) == pytest.approx(50.5)
    assert bench_report.percentile(samples, 95) == pytest.approx(95.05)
    assert bench_report.percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError):
        bench_report.percentile([], 50)


def test_sustained_rate_spans_the_first_busy_batch_start_to_the_last_busy_batch_end():
    batches = [
        bench_report.Batch("ingest", 100.0, 4.0, 250_000),
        bench_report.Batch("ingest", 104.5, 15.5, 150_000),  # ends at 120
        bench_report.Batch("ingest", 121.0, 0.1, 0),  # idle batches neither start nor end the span
        bench_report.Batch("ingest", 90.0, 0.2, 0),
    ]
    rate, p95 = bench_report.sustained(batches, 400_000)
    assert rate == pytest.approx(400_000 / 20.0)
    assert p95 == pytest.approx(4.0 + 0.95 * 11.5)
    with pytest.raises(ValueError, match="no batch with rows"):
        bench_report.sustained([bench_report.Batch("ingest", 1.0, 1.0, 0)], 5)


def test_probe_is_a_valid_order_in_its_own_hour_of_the_probe_year():
    hour = datetime(2001, 3, 4, 5, tzinfo=UTC)
    event = latency.probe_event("r1", 7, hour)
    assert event["event_time"] == "2001-03-04T05:00:00.000Z"
    assert event["event_type"] == "order_placed" and event["schema_version"] == 1
    items = event["payload"]["items"]
    assert event["payload"]["total"] == sum(i["quantity"] * i["unit_price"] for i in items)
    assert event["payload"]["currency"] in ("EUR", "USD", "GBP")
    assert len(json.dumps(event)) < 64 * 1024
    # Every minute of a run's start lands in a stretch of 100 hours inside 2001.
    for minute in range(0, 200):
        base = latency.probe_base(datetime(2026, 11, 22, 0, minute % 60, tzinfo=UTC))
        assert base.year == 2001
        assert (base.replace(hour=0, day=1, month=1) - latency.PROBE_YEAR).days == 0
        assert (latency.PROBE_YEAR.replace(year=2002) - base).total_seconds() >= 100 * 3600


def test_intervals_and_chunks():
    assert latency._seconds("1 second") == 1.0
    assert latency._seconds("500 milliseconds") == 0.5
    assert latency._seconds("2 minutes") == 120.0
    assert throughput._chunks(250_000, 100_000) == [100_000, 100_000, 50_000]
    assert throughput._chunks(5, 100) == [5]


def _report() -> bench_report.Report:
    return bench_report.Report(
        figures={
            "producer_events_per_s": 120_000.0,
            "producer_vs_baseline": 0.55,
            "ingest_events_per_s": 21_000.0,
            "replay_events_per_s": 310_000.0,
            "replay_vs_duckdb_time": 9.0,
            "freshness_p50_s": 4.2,
            "freshness_p95_s": 6.1,
            "serving_query_p50_ms": 120.0,
            "stack_peak_gib": 8.4,
        },
        baselines={"producer_baseline_events_per_s": 218_000.0, "select1_p50_ms": 30.0},
        notes={"ingest": "1,000,000 records"},
        machine={"cores": 2, "memory_gib": 23.5, "cpu": "x", "pyspark": "4.2.0"},
        sizes={"events": 1_000_000},
        started_at="2026-11-22T23:00:00+00:00",
        seconds=600.0,
    )


def test_table_and_doc_section_say_what_was_missed(tmp_path):
    report = _report()
    text = bench_report.table(report)
    assert "| producer | 120,000 | 218,000 | events/s | >= 100,000 | yes |" in text
    assert "| ingest | 21,000 | - | events/s | >= 50,000 | **missed** |" in text
    assert "| replay time / DuckDB time | 9.00 | | ratio | <= 2 | **missed** |" in text
    assert "| freshness p95 | 6.10 | - | s | <= 5 | **missed** |" in text
    docs = tmp_path / "docs"
    section = bench_report.section(
        report, docs / "bench" / "a.json", docs / "bench" / "a.png", docs
    )
    assert "2 cores (x), 23.5 GiB; pyspark 4.2.0" in section
    assert "(bench/a.json)" in section and "![bench](bench/a.png)" in section
    assert (
        "Missed: ingest_events_per_s, replay_events_per_s, replay_vs_duckdb_time, "
        "freshness_p95_s, stack_peak_gib." in section
    )


def test_a_probe_never_seen_or_taken_is_a_missed_target():
    report = _report()
    report.figures |= {"freshness_never_seen": 2.0, "view_batch_probes_unseen": 0.0}
    text = bench_report.table(report)
    assert "| freshness probes never seen | 2 | | probes | <= 0 | **missed** |" in text
    assert "| one-event view batches not taken in time | 0 | | probes | <= 0 | yes |" in text
    assert "freshness_never_seen" in bench_report.section(report, *_paths())
    # Not measured (an older report): no row rather than a verdict on nothing.
    assert "never seen" not in bench_report.table(_report())


def test_a_run_of_some_phases_says_which():
    report = _report()
    assert "Phases run" not in bench_report.section(report, *_paths())
    report.sizes["phases"] = ["freshness"]
    assert "Phases run: freshness. " in bench_report.section(report, *_paths())


def _paths() -> tuple[Path, Path, Path]:
    docs = Path("/nonexistent/docs")
    return docs / "bench" / "a.json", docs / "bench" / "a.png", docs


def test_save_writes_json_chart_and_appends_to_the_doc(tmp_path):
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n")
    data, chart = runner.save(_report(), tmp_path / "bench", doc)
    saved = json.loads(data.read_text())
    assert saved["figures"]["ingest_events_per_s"] == 21_000.0
    assert {v["figure"]: v["met"] for v in saved["verdicts"]}["ingest_events_per_s"] is False
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and chart.stat().st_size > 10_000
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n") and "## Run of 2026-11-22T23:00:00+00:00" in text
    assert len(bench_chart.PANELS) == 6


def test_a_probe_never_seen_counts_as_waited_for_and_none_seen_is_no_crash():
    sent = {1: 10.0, 2: 12.0, 3: 14.0}
    assert latency.probe_lags(sent, {1: 13.5, 3: 20.0}, gave_up=140.0) == [3.5, 128.0, 6.0]
    assert latency.probe_lags(sent, {}, gave_up=140.0) == [130.0, 128.0, 126.0]
