"""The whole run: the phases one after another under a memory sampler, with ingest,
the view streams and the noisy DAGs quiet and left as they were found; then the
JSON, the chart and the BENCHMARKS.md section."""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from warehouse.base.settings import Settings
from warehouse.tools.bench import chart as bench_chart
from warehouse.tools.bench import cpu, history, latency, replay, small_files, throughput
from warehouse.tools.bench.context import Bench
from warehouse.tools.bench.memory import PeakMemory
from warehouse.tools.bench.report import DOC, Report, machine, section
from warehouse.tools.bench.sizes import Sizes

# DAGs paused while the bench runs: the watchdog restarts streams, and the audit and
# the daily maintenance read or rewrite every table with a Spark driver of their
# own. Maintenance, retried after a stop at its 03:17 UTC slot, once ran through a
# freshness phase here: Airflow's tree took 132 of its 484 CPU-s.
QUIET_DAGS = ("regauge_watchdog", "regauge_audit", "regauge_maintenance")
# The phases whose memory is the stack's (`stack_peak_gib`): ingest and three live
# streams in the view host, a reprocess through Airflow if a version is not built
# yet, and Trino answering. The phases before run ingest, the replay and the
# history in the bench's own JVM, with DuckDB beside it: reported apart.
SERVING = "serving"
MEASURING = {"throughput", "replay", "history", "small_files"}
EVENT_LOG_VAR = "REGAUGE_SPARK_EVENT_LOG_DIR"
# Spark applications whose event logs a run leaves (each run starts two or more).
KEPT_EVENT_LOGS = 8


def run(settings: Settings, sizes: Sizes, out_dir: Path, doc: Path | None = DOC) -> Report:
    """Every phase, then the JSON, the chart and (unless doc is None) BENCHMARKS.md."""
    from spark_jobs.engine.session import build_session
    from warehouse.ops import airflow_client, ingest_ctl, pipeline, streams
    from warehouse.sql import trino_client

    report = Report(sizes=asdict(sizes), started_at=datetime.now(UTC).isoformat(timespec="seconds"))
    began = time.monotonic()
    ingest_was_running = ingest_ctl.pid(settings) is not None
    running_streams = [(s.view, s.version) for s in streams.known(settings) if s.pid]
    airflow = airflow_client.Client(settings)
    # Any of them would take cores from the phase being measured (QUIET_DAGS).
    was_paused = airflow.quiet(QUIET_DAGS)
    bench = Bench(settings, sizes, report)
    took: dict[str, float] = {}

    @contextlib.contextmanager
    def timed(phase: str) -> Iterator[None]:
        """Time a phase: the run's default sizes must fit in 15 minutes."""
        started = time.monotonic()
        try:
            yield
        finally:
            took[phase] = time.monotonic() - started
            print(f"bench: {phase} took {took[phase]:.0f} s")

    try:
        _let_tasks_finish(airflow, report)
        with PeakMemory(settings) as memory:
            ingest_ctl.stop(settings)
            for view, version in running_streams:
                streams.stop(settings, view, version)
            # An idle host still holds a JVM's memory.
            streams.stop_host(settings)
            # The event log is what to profile a slow phase with (Spark's history UI
            # reads it): the bench's own phases, and the view host it starts later.
            events_dir = str(settings.state_dir / "bench" / "spark-events")
            os.environ[EVENT_LOG_VAR] = events_dir
            bench.events_dir = Path(events_dir)
            # The runs before this one's: a profile compares with the last few.
            cpu.keep_newest(bench.events_dir, KEPT_EVENT_LOGS)
            spark = build_session(
                "regauge-bench", replace(settings, spark_event_log_dir=events_dir)
            )
            spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "1000")
            report.machine = machine(spark)
            report.machine["trino"] = trino_client.scalar(
                settings, "SELECT node_version FROM system.runtime.nodes LIMIT 1"
            )
            phases = set(sizes.phases)
            print(
                "bench: settling what ingest had not copied yet, so the phases measure only "
                "the bench's records"
            )
            with timed("settling"):
                pipeline.ingest_once(spark, settings)
            if "throughput" in phases:
                with timed("throughput"):
                    print(f"bench: producer ({sizes.events:,} records)")
                    before, after, valid = throughput.producer(bench)
                    print("bench: ingest (a bare consumer first, then Kafka -> bronze -> silver)")
                    throughput.bare_consumer(bench, before, after)
                    throughput.ingest(bench, spark, before, after, valid)
                    throughput.web_ingest(bench, spark)
            if "replay" in phases:
                with timed("replay"):
                    print("bench: replay of every view from silver, and DuckDB")
                    replay.replay(bench, spark)
            if "history" in phases:
                with timed("history"):
                    print(
                        f"bench: one-event view micro-batches over {sizes.history_events:,} "
                        f"and {sizes.history_events * sizes.history_factor:,} events of history"
                    )
                    history.history(bench, spark)
            if "small_files" in phases:
                with timed("small_files"):
                    print(
                        f"bench: Trino over {sizes.small_file_commits:,} one-row commits, then "
                        "after maintenance"
                    )
                    small_files.small_files(bench, spark)
            _stop_jvm(spark)
            # From here the stack runs as in production: the host with ingest and the
            # live streams, Airflow's reprocess of any version not built yet, Trino.
            memory.phase = SERVING
            if "freshness" in phases or "queries" in phases:
                with timed("serving (the host, its streams, reprocesses)"):
                    latency.ensure_serving(bench)
            if "freshness" in phases:
                with timed("freshness"):
                    print("bench: freshness through Trino under steady load")
                    latency.freshness(bench)
            if "queries" in phases:
                with timed("queries"):
                    print(f"bench: serving query latency ({sizes.queries} runs)")
                    latency.queries(bench)
        for phase, (peak, at_peak) in sorted(memory.peaks.items()):
            parts = ", ".join(f"{name} {n / 2**30:.1f}" for name, n in sorted(at_peak.items()) if n)
            if phase == SERVING:
                report.figures["stack_peak_gib"] = peak / 2**30
            elif MEASURING & phases:
                report.figures["measuring_phases_peak_gib"] = peak / 2**30
            else:  # only the settling ingest ran before the stack's phases
                continue
            report.notes[f"memory, {phase}"] = f"at the peak, {peak / 2**30:.1f} GiB: {parts}"
            print(f"bench: peak resident memory, {phase}: {peak / 2**30:.1f} GiB ({parts})")
    finally:
        try:
            # The host the bench started logs every job; the one it leaves behind does
            # not, and runs only what ran before.
            os.environ.pop(EVENT_LOG_VAR, None)
            for view, version in streams.wanted(settings):
                if (view, version) not in running_streams:
                    streams.want(settings, view, version, False)
            streams.stop_host(settings)
            if ingest_was_running:
                ingest_ctl.start(settings, None)
            else:
                ingest_ctl.stop(settings)
            for view, version in running_streams:
                streams.start(settings, view, version)
            if not running_streams and not ingest_was_running:
                streams.stop_host(settings)
        finally:
            # Last, and whatever failed above: the watchdog, unpaused, starts what is
            # wanted and not running.
            airflow.restore(was_paused)
    report.seconds = time.monotonic() - began
    if took:
        report.notes["time per phase, s"] = ", ".join(f"{k} {v:.0f}" for k, v in took.items())
    save(report, out_dir, doc)
    return report


# Task states that use the machine even while their DAG is paused: Airflow starts
# no new task of a paused DAG, but one running, or already handed to the executor,
# runs to its end.
BUSY = ("running", "queued", "restarting")


def _let_tasks_finish(airflow: Any, report: Report, timeout: float = 900.0) -> None:
    """Wait for tasks of the quiet DAGs that were under way when they were paused: a
    scheduled audit (one is due at once when the stack comes up after an hour or
    more) runs a Spark job for minutes, and took a third of the cores from a
    freshness phase that did not wait for it."""
    from warehouse.ops.stack import process

    deadline = time.monotonic() + timeout
    for dag in QUIET_DAGS:
        for run_id in airflow.active_runs(dag):

            def busy(dag: str = dag, run_id: str = run_id) -> list[str]:
                return [t for t, st in airflow.tasks(dag, run_id).items() if st in BUSY]

            under_way = busy()
            if not under_way:
                continue
            print(f"bench: waiting for {dag} run {run_id} ({', '.join(under_way)}) to finish")
            left = max(0.0, deadline - time.monotonic())
            if not process.wait_until(lambda: not busy(), left, interval=3.0):
                report.notes[f"{dag} run"] = f"{run_id} still had {', '.join(busy())} running"
                print(f"bench: {dag} still busy after {timeout:.0f} s; measuring anyway (noted)")


def save(report: Report, out_dir: Path, doc: Path | None) -> tuple[Path, Path]:
    """The run's JSON and chart in out_dir; its table appended to doc."""
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = report.started_at.replace(":", "").replace("-", "")[:15]
    data = out_dir / f"bench-{stamp}.json"
    data.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    chart = out_dir / f"bench-{stamp}.png"
    bench_chart.draw(report, chart)
    if doc is not None:
        with doc.open("a") as out:
            out.write("\n" + section(report, data, chart, doc.parent) + "\n")
    print(f"bench: wrote {data} and {chart}" + (f"; appended to {doc}" if doc else ""))
    return data, chart


def _stop_jvm(spark: Any) -> None:
    """Stop Spark and its JVM: `spark.stop()` alone leaves the JVM's heap resident,
    which the later phases would count as the stack's memory."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    spark.stop()
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    gateway.shutdown()
    if proc is not None:
        proc.terminate()
        proc.wait(60)
    SparkContext._gateway = None
    SparkContext._jvm = None
