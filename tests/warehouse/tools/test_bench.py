"""The bench's pure parts: targets, percentiles, the sustained rate, probes and the report."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from warehouse.tools.bench import chart as bench_chart
from warehouse.tools.bench import cpu, latency, replay, runner, throughput
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
            "serving_query_trino_cpu_ms": 350.0,
            "stack_peak_gib": 8.4,
        },
        baselines={
            "producer_baseline_events_per_s": 218_000.0,
            "select1_p50_ms": 30.0,
            "select1_trino_cpu_ms": 60.0,
        },
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
    # The replay target is per view: the slowest view's rate is the figure.
    assert "| replay, slowest view | 310,000 | - | events/s | >= 1,000,000 | **missed** |" in text
    assert "| replay, all views in turn | - | - | events/s |  |  |" in text
    assert "| replay time / DuckDB time | 9.00 | | ratio | <= 2 | **missed** |" in text
    assert "| freshness p95 | 6.10 | - | s | <= 5 | **missed** |" in text
    assert "| Trino CPU per serving query | 350 | 60.00 | ms | <= 300 | **missed** |" in text
    docs = tmp_path / "docs"
    section = bench_report.section(
        report, docs / "bench" / "a.json", docs / "bench" / "a.png", docs
    )
    assert "2 cores (x), 23.5 GiB; pyspark 4.2.0" in section
    assert "(bench/a.json)" in section and "![bench](bench/a.png)" in section
    assert (
        "Missed: ingest_events_per_s, replay_events_per_s, replay_vs_duckdb_time, "
        "freshness_p95_s, serving_query_trino_cpu_ms, stack_peak_gib." in section
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


def test_freshness_asks_trino_less_often_as_the_lags_grow_within_bounds():
    # Nothing seen yet, or lags near the target: once a second.
    assert latency.poll_interval(None) == 1.0
    assert latency.poll_interval(4.0) == 1.0
    # A tenth of the shortest lag, up to 5 s.
    assert latency.poll_interval(30.0) == 3.0
    assert latency.poll_interval(120.0) == 5.0


def test_freshness_per_minute_is_the_p50_of_the_probes_sent_in_each_minute():
    sent = {1: 100.0, 2: 130.0, 3: 161.0, 4: 200.0, 5: 221.0}
    lags = [50.0, 40.0, 30.0, 20.0, 10.0]
    # Minutes from the first probe: 0 -> probes 1-2, 1 -> 3-4, 2 -> 5.
    assert latency.per_minute(sent, lags) == [45.0, 25.0, 10.0]
    assert latency.per_minute({}, []) == []


def test_a_host_thread_is_named_by_what_it_does():
    assert cpu.thread_kind("C2 CompilerThre") == "JIT"
    assert cpu.thread_kind("Executor task l") == "Spark tasks"
    assert cpu.thread_kind("Executor task i") == "Spark tasks"
    assert cpu.thread_kind("stream executio") == "query drivers"
    assert cpu.thread_kind("G1 Conc#0") == "GC"
    assert cpu.thread_kind("python") == "Python"
    assert cpu.thread_kind("dispatcher-even") == "other"


def test_cpu_between_two_snapshots_counts_each_part_and_a_new_process_from_zero():
    before = cpu.Snapshot(
        10.0,
        {1: 5.0, 2: 1.0},
        {"view host": {1}, "trino": {2}},
        {(1, 11): ("C2 CompilerThre", 3.0), (1, 12): ("Executor task l", 1.0)},
    )
    after = cpu.Snapshot(
        20.0,
        {1: 17.0, 2: 2.5, 3: 4.0},
        {"view host": {1}, "trino": {2, 3}},
        {
            (1, 11): ("C2 CompilerThre", 7.0),
            (1, 12): ("Executor task l", 6.0),
            (1, 13): ("Executor task l", 2.0),
        },
    )
    use = cpu.between(before, after, cores=2)
    assert use.parts == {"view host": 12.0, "trino": 5.5}
    assert use.host_threads == {"JIT": 4.0, "Spark tasks": 7.0}
    assert use.busy == pytest.approx(17.5 / 20)
    assert use.describe() == (
        "18 of 20 CPU-s in 10 s (88% of 2 cores): view host 12 (Spark tasks 7, JIT 4), trino 6"
    )


def test_task_time_by_query_counts_the_jobs_since_the_start_from_every_event_log(tmp_path):
    def log(app: str, *files: list[dict]) -> None:
        """An application's rolled event files, events_1_..., events_2_..., each ending
        in the half-written line of a running application."""
        folder = tmp_path / f"eventlog_v2_{app}"
        folder.mkdir()
        for n, events in zip((2, 10), files, strict=False):
            text = "".join(json.dumps(e) + "\n" for e in events)
            half = '{"Event": "SparkListenerTaskEnd", "Sta'
            (folder / f"events_{n}_{app}").write_text(text + half)

    def job(job_id: int, at: int, stages: list[int], query: str | None) -> dict:
        props = {"sql.streaming.queryId": query} if query else {}
        return {
            "Event": "SparkListenerJobStart",
            "Job ID": job_id,
            "Submission Time": at,
            "Stage IDs": stages,
            "Properties": props,
        }

    def task(stage: int, ms: int) -> dict:
        info = {"Launch Time": 1000, "Finish Time": 1000 + ms}
        return {"Event": "SparkListenerTaskEnd", "Stage ID": stage, "Task Info": info}

    started = "org.apache.spark.sql.streaming.StreamingQueryListener$QueryStartedEvent"
    progress = "org.apache.spark.sql.streaming.StreamingQueryListener$QueryProgressEvent"
    log(
        "a",
        [
            {"Event": started, "id": "q1", "name": "ingest"},
            job(0, 500, [0], "q1"),  # before the phase: not counted
            task(0, 9000),
            job(1, 2000, [1, 2], "q1"),
            task(1, 1500),
            task(2, 500),
            job(2, 2500, [3], None),  # a Spark Connect client's work
            task(3, 250),
        ],
    )
    log(
        "b",
        # events_2: a job of the phase, and one from before it whose stage id app a
        # also used (each application numbers its own).
        [job(0, 3000, [0], "q2"), job(1, 500, [1], "q2")],
        # events_10, read after events_2: the tasks, then the query's name.
        [
            task(0, 4000),
            task(1, 7000),
            {"Event": progress, "progress": {"id": "q2", "name": "cart"}},
        ],
    )
    seconds = cpu.task_seconds_by_query(tmp_path, since_ms=1000)
    assert seconds == {"ingest": 2.0, "other": 0.25, "cart": 4.0}
    assert cpu.describe_tasks(seconds) == "cart 4 s (64%), ingest 2 s (32%)"
    # Logs not written since the phase began are not read at all.
    assert cpu.task_seconds_by_query(tmp_path, since_ms=(time.time() + 60) * 1000) == {}


def test_only_the_newest_event_logs_are_kept(tmp_path):
    for i in range(4):
        folder = tmp_path / f"eventlog_v2_local-{i}"
        folder.mkdir()
        (folder / f"events_1_local-{i}").write_text("{}\n")
        os.utime(folder, (1000 + i, 1000 + i))
    (tmp_path / "notes.txt").write_text("not an event log")
    deleted = cpu.keep_newest(tmp_path, 2)
    assert sorted(p.name for p in deleted) == ["eventlog_v2_local-0", "eventlog_v2_local-1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "eventlog_v2_local-2",
        "eventlog_v2_local-3",
        "notes.txt",
    ]


def test_the_freshness_load_is_chaos_traffic_happening_as_it_is_sent():
    now = datetime(2026, 11, 28, 6, 0, tzinfo=UTC)
    load = latency.live_load(7, 3000, 200.0, now)
    assert len(load) == 3000
    kinds = {r.kind for r in load}
    assert {"event", "resend", "very_late", "not_json"} <= kinds
    times = {
        r.event_id: (
            r.content["event_type"],
            datetime.fromisoformat(r.content["event_time"].replace("Z", "+00:00")),
        )
        for r in load
        if r.kind == "event" and r.content
    }
    # After all of history, and within the 15 s it takes to send plus a session's
    # length (a cancellation comes minutes to days after its order).
    assert min(t for _, t in times.values()) >= now
    shopping = [t for kind, t in times.values() if kind != "order_cancelled"]
    assert max(shopping) <= now + timedelta(seconds=15, hours=1)


def test_the_replay_figure_is_the_slowest_views_rate():
    got = replay.Replayed(
        events=1_000_000,
        seconds={"cart_sessions_v1": 4.0, "revenue_hourly_v1": 1.0, "revenue_hourly_v2": 1.25},
        duckdb_s=0.25,
    )
    assert got.slowest == "cart_sessions_v1"
    assert got.events_per_s() == 250_000
    assert got.all_views_events_per_s() == 1_000_000 / 6.25
    assert got.vs_duckdb() == 4.0
    report = _report()
    got.record(report, "replay_large")
    assert report.figures["replay_large_events_per_s"] == 250_000
    assert report.figures["replay_large_s_cart_sessions_v1"] == 4.0
    assert report.baselines["replay_large_duckdb_events_per_s"] == 4_000_000


def test_the_last_recorded_figure_is_the_newest_run_of_the_same_size(tmp_path):
    def run(stamp: str, events: int, ingest: float | None) -> None:
        figures = {} if ingest is None else {"ingest_events_per_s": ingest}
        (tmp_path / f"bench-{stamp}.json").write_text(
            json.dumps({"figures": figures, "sizes": {"events": events}})
        )

    assert bench_report.last_recorded("ingest_events_per_s", 1000, tmp_path) is None
    run("20261101T000000", 1000, 9_000.0)
    run("20261102T000000", 1000, 10_000.0)
    run("20261103T000000", 50, 99_000.0)  # another size: not comparable
    run("20261104T000000", 1000, None)  # a run of other phases: skipped
    assert bench_report.last_recorded("ingest_events_per_s", 1000, tmp_path) == 10_000.0
    figures = {"ingest_vs_last_recorded": 0.89}
    (verdict,) = [v for v in bench_report.verdicts(figures) if v[0] == "ingest_vs_last_recorded"]
    assert verdict[-1] is False  # more than 10 % slower is a missed target
