"""`make soak`: hours of steady traffic with table maintenance every 10 minutes.

The question is whether regauge runs unattended without decay (issue 21). Two
things must hold over the run:
- each table's file count stays bounded;
- the latencies stay flat: the serving query's p50, each view version's
  produce-to-gold freshness, and each query's micro-batch duration.

The setup runs as in production. Ingest and every live view stream run in the
view host, under supervisord. `regauge_maintenance` is triggered through
Airflow's API every `maintenance_every_min`. The soak does not change the
DAG's schedule: that is read when Airflow parses the file. Every
`every_min`, a sample is taken:
- each table's data files in its newest version;
- five serving queries through Trino, as an analyst;
- the view host's metrics endpoint: freshness, and the micro-batches since the
  last sample.

At the end the soak prints the series and a verdict, and writes a JSON file
and a chart. The verdict compares the last third of the run with the first
third. The soak sends real traffic into the local lake, like the bench.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from warehouse.base.settings import Settings

# The views the soak keeps live: whichever versions are live, or v1 built through
# regauge_reprocess if none is.
LIVE = ("revenue_hourly", "cart_sessions")
# Only columns every version of the view has: the analyst may be routed to any.
SERVING_SQL = "SELECT count(*), max(window_end) FROM lakehouse.serving.revenue_hourly"
ANALYST = "analyst.soak"
# A figure in the last third may be this much above the first third's and still count as flat.
GROWTH_ALLOWED = 1.5


@dataclass
class Sample:
    minute: float
    files: dict[str, int]
    serving_p50_s: float
    # Per view version, seconds (the host's regauge_view_freshness_seconds).
    freshness_s: dict[str, float]
    # Per query, the mean micro-batch seconds since the previous sample.
    batch_mean_s: dict[str, float]


@dataclass
class Soak:
    started_at: str
    minutes: float
    rate: float
    samples: list[Sample] = field(default_factory=list)
    maintenance_runs: list[str] = field(default_factory=list)
    verdicts: dict[str, str] = field(default_factory=dict)
    # Samples or maintenance triggers that failed, with why.
    errors: list[str] = field(default_factory=list)


def run(
    settings: Settings,
    *,
    minutes: float,
    rate: float,
    every_min: float,
    maintenance_every_min: float,
    out_dir: Path,
) -> Soak:
    from trino.exceptions import TrinoUserError

    from spark_jobs.engine.session import build_session
    from warehouse.ops import airflow_client

    soak = Soak(datetime.now(UTC).isoformat(timespec="seconds"), minutes, rate)
    airflow = airflow_client.Client(settings)
    _ensure_live(settings, airflow)
    spark = build_session("regauge-soak", settings, ui=False)
    stop = threading.Event()
    producer = threading.Thread(
        target=_produce, args=(settings, rate, stop), name="soak-producer", daemon=True
    )
    producer.start()
    began = time.monotonic()
    # The first sample after one interval: at the start the streams have seen no traffic yet.
    next_sample, next_maintenance = began + every_min * 60, began
    last_batches: dict[str, tuple[float, float]] = {}
    try:
        while (now := time.monotonic()) < began + minutes * 60:
            if not producer.is_alive():
                raise RuntimeError("the soak's producer stopped; see the log above")
            # One failed look (Trino busy, the host restarting) costs a sample, not the run.
            try:
                if now >= next_maintenance:
                    next_maintenance += maintenance_every_min * 60
                    if airflow.active_runs("regauge_maintenance"):
                        print("soak: maintenance still running; this one skipped")
                    else:
                        soak.maintenance_runs.append(airflow.trigger("regauge_maintenance", {}))
                if now >= next_sample:
                    next_sample += every_min * 60
                    sample = _sample(settings, spark, (now - began) / 60, last_batches)
                    soak.samples.append(sample)
                    print(_line(sample), flush=True)
            except TrinoUserError:
                raise  # the query itself is wrong: no later sample would do better
            except Exception as exc:
                soak.errors.append(f"{(now - began) / 60:.1f} min: {type(exc).__name__}: {exc}")
                print(f"soak: {soak.errors[-1]}", flush=True)
            time.sleep(max(0.0, min(next_sample, next_maintenance) - time.monotonic()))
    finally:
        stop.set()
        producer.join(120)
        spark.stop()
        # Whatever ended the run, what was measured is kept.
        soak.verdicts = verdicts(soak.samples)
        _write(soak, out_dir)
    return soak


def _ensure_live(settings: Settings, airflow: Any) -> None:
    from warehouse.ops import ingest_ctl, streams
    from warehouse.sql import versions

    ingest_ctl.start(settings, None)
    for view in LIVE:
        known = versions.versions(settings, view)
        if known and not any(v.live for v in known):
            raise RuntimeError(
                f"{view} has no live version (all are retired or failed): build one "
                "through regauge_reprocess before the soak"
            )
        if not known:
            print(f"soak: building {view} v1 through regauge_reprocess")
            airflow.run("regauge_reprocess", {"view": view, "version": 1})
    for line in streams.ensure(settings):
        print(f"soak: {line}")


def _produce(settings: Settings, rate: float, stop: threading.Event) -> None:
    """A minute of traffic at `rate` events/s at a time, until stopped."""
    from spark_jobs.testing.landing import fresh_seed
    from warehouse.ops import pipeline

    while not stop.is_set():
        pipeline.produce(settings, seed=fresh_seed(), count=int(rate * 60), rate=rate)


def _sample(
    settings: Settings,
    spark: Any,
    minute: float,
    last_batches: dict[str, tuple[float, float]],
) -> Sample:
    from spark_jobs.engine import maintenance
    from warehouse.ops import exporter
    from warehouse.sql import trino_client

    files = {
        maintenance.table_name(path): maintenance.files_in(spark, path)
        for path in maintenance.lake_tables(spark, settings)
    }
    timings = []
    for _ in range(5):
        t = time.monotonic()
        trino_client.query(settings, SERVING_SQL, user=ANALYST)
        timings.append(time.monotonic() - t)
    host = exporter.host_endpoint(settings)
    scraped = exporter.scrape(host.url) if host.url else {}
    freshness = exporter.by_view(scraped, "regauge_view_freshness_seconds")
    counts = exporter.by_label(scraped, "regauge_microbatch_seconds_count", "query")
    sums = exporter.by_label(scraped, "regauge_microbatch_seconds_sum", "query")
    means = {}
    for query, count in counts.items():
        before_count, before_sum = last_batches.get(query, (0.0, 0.0))
        if count < before_count:  # the host started again: its counters too
            before_count, before_sum = 0.0, 0.0
        if count > before_count:
            means[query] = (sums[query] - before_sum) / (count - before_count)
        last_batches[query] = (count, sums[query])
    return Sample(round(minute, 1), files, statistics.median(timings), freshness, means)


def _line(s: Sample) -> str:
    files = sum(s.files.values())
    fresh = ", ".join(f"{k} {v:.0f} s" for k, v in sorted(s.freshness_s.items())) or "-"
    batches = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(s.batch_mean_s.items())) or "-"
    return (
        f"soak {s.minute:6.1f} min: {files:,} data files in {len(s.files)} tables; serving "
        f"p50 {s.serving_p50_s * 1000:.0f} ms; freshness {fresh}; batches {batches}"
    )


def verdicts(samples: list[Sample]) -> dict[str, str]:
    """Per series, the last third against the first: 'flat', 'bounded' or what grew."""
    if len(samples) < 3:
        return {"run": "too short to judge (fewer than 3 samples)"}
    third = max(1, len(samples) // 3)
    first, last = samples[:third], samples[-third:]

    def files(part: list[Sample]) -> list[float]:
        return [sum(s.files.values()) for s in part]

    series: dict[str, tuple[list[float], list[float]]] = {
        "data files": (files(first), files(last)),
        "serving p50": ([s.serving_p50_s for s in first], [s.serving_p50_s for s in last]),
    }
    for key in sorted({k for s in samples for k in s.freshness_s}):
        series[f"freshness {key}"] = (
            [s.freshness_s[key] for s in first if key in s.freshness_s],
            [s.freshness_s[key] for s in last if key in s.freshness_s],
        )
    for key in sorted({k for s in samples for k in s.batch_mean_s}):
        series[f"batch {key}"] = (
            [s.batch_mean_s[key] for s in first if key in s.batch_mean_s],
            [s.batch_mean_s[key] for s in last if key in s.batch_mean_s],
        )
    found = {}
    for name, (early, late) in series.items():
        if not early or not late:
            found[name] = "not enough samples"
            continue
        ratio = statistics.median(late) / max(statistics.median(early), 1e-9)
        word = "flat" if ratio <= GROWTH_ALLOWED else "GREW"
        found[name] = f"{word}: last third {ratio:.2f}x the first"
    return found


def _write(soak: Soak, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = out_dir / f"soak-{soak.started_at.replace(':', '')}"
    stem.with_suffix(".json").write_text(json.dumps(asdict(soak), indent=2))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("soak: matplotlib is missing (the bench extra); no chart")
        return
    minutes = [s.minute for s in soak.samples]
    fig, axes = plt.subplots(3, 1, figsize=(9, 10), sharex=True)
    axes[0].plot(minutes, [sum(s.files.values()) for s in soak.samples])
    axes[0].set_ylabel("data files, all tables")
    axes[1].plot(minutes, [s.serving_p50_s * 1000 for s in soak.samples], label="serving p50")
    axes[1].set_ylabel("ms")
    axes[1].legend()
    for key in sorted({k for s in soak.samples for k in s.freshness_s}):
        axes[2].plot(minutes, [s.freshness_s.get(key) for s in soak.samples], label=key)
    axes[2].set_ylabel("freshness, s")
    axes[2].set_xlabel("minutes")
    axes[2].legend()
    fig.suptitle(f"regauge soak, {soak.rate:g} events/s, from {soak.started_at}")
    fig.savefig(stem.with_suffix(".png"))
    print(f"soak: {stem}.json and .png written")
