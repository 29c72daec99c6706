"""The bench's PNG: each figure as a bar beside its baseline's, with the target as a line."""

from __future__ import annotations

from pathlib import Path

from warehouse.tools.bench.report import TARGETS, Report

# (title, unit, regauge figure, baseline figure, baseline label, target figure)
PANELS = [
    (
        "producer",
        "events/s",
        "producer_events_per_s",
        "producer_baseline_events_per_s",
        "bare loop",
        "producer_events_per_s",
    ),
    (
        "ingest Kafka→silver",
        "events/s",
        "ingest_events_per_s",
        "ingest_baseline_events_per_s",
        "bare consumer",
        "ingest_events_per_s",
    ),
    (
        "replay, slowest view",
        "events/s",
        "replay_events_per_s",
        "replay_duckdb_events_per_s",
        "DuckDB v1 only",
        "replay_events_per_s",
    ),
    ("freshness p95", "s", "freshness_p95_s", "trigger_interval_s", "trigger", "freshness_p95_s"),
    (
        "serving query p50",
        "ms",
        "serving_query_p50_ms",
        "select1_p50_ms",
        "SELECT 1",
        "serving_query_p50_ms",
    ),
    ("stack peak memory", "GiB", "stack_peak_gib", "", "", "stack_peak_gib"),
]


def draw(report: Report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # no display here or in CI
    import matplotlib.pyplot as plt

    bounds = {name: (op, bound) for name, op, bound in TARGETS}
    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5))
    for ax, (title, unit, ours, base, base_label, target) in zip(axes.flat, PANELS, strict=True):
        labels, values, colours = [], [], []
        if ours in report.figures:
            labels.append("regauge")
            values.append(report.figures[ours])
            colours.append("#2b6cb0")
        if base and base in report.baselines:
            labels.append(base_label)
            values.append(report.baselines[base])
            colours.append("#a0aec0")
        ax.bar(labels, values, color=colours)
        for i, v in enumerate(values):
            ax.annotate(
                f"{v:,.0f}" if v >= 100 else f"{v:,.2f}",
                (i, v),
                ha="center",
                va="bottom",
                fontsize=9,
            )
        if target in bounds:
            op, bound = bounds[target]
            ax.axhline(bound, color="#c53030", linestyle="--", linewidth=1)
            ax.annotate(
                f"target {op} {bound:,g}",
                (1.0, bound),
                xycoords=("axes fraction", "data"),
                ha="right",
                va="bottom",
                fontsize=8,
                color="#c53030",
            )
        ax.set_title(title)
        ax.set_ylabel(unit)
        if not values:
            ax.text(0.5, 0.5, "not measured", ha="center", va="center", transform=ax.transAxes)
    cores = report.machine.get("cores", "?")
    fig.suptitle(
        f"regauge bench, {report.started_at}, {cores} cores: each figure beside its "
        "baseline from the same run"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
