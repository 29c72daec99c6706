"""`regauge setup|up|down|status|settings`: the local stack."""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from warehouse.base import registry
from warehouse.base import settings as settings_mod
from warehouse.ops import audit, exporter, ingest_ctl, streams
from warehouse.ops.stack import artifacts, services
from warehouse.ops.stack.base import Service


def setup(args: argparse.Namespace) -> int:
    where = artifacts.fetch_all(settings_mod.get())
    for what, path in where.items():
        print(f"{what:<11} {path}")
    return 0


def up(args: argparse.Namespace) -> int:
    services.up(settings_mod.get(), args.services)
    return status(args)


def down(args: argparse.Namespace) -> int:
    s = settings_mod.get()
    if not args.services:
        # Airflow first, so its watchdog cannot restart a stream stopped next; then
        # the pipeline's own daemons, which would fail once Kafka is gone.
        services.down(s, ["airflow"])
        # What is wanted stays: the next `streams ensure` brings it back.
        if streams.shutdown(s):
            print("view host stopped (ingest and every view stream in it)")
    services.down(s, args.services)
    return 0


def status(args: argparse.Namespace) -> int:
    s = settings_mod.get()
    all_up = print_status(
        f"regauge stack ({s.profile} profile, state in {s.state_dir})",
        services.services(s, getattr(args, "services", ())),
    )
    (kafka,) = services.services(s, ["kafka"])
    print(ingest_ctl.describe(s, kafka_up=kafka.status().healthy)[1])
    supervisor = streams.host(s).supervisor
    # The services' programs are in the table above; the pipeline's are here.
    table_names = {p.name for svc in services.services(s) for p in svc.procs()}
    programs = [p for p in supervisor.programs() if p["name"] not in table_names]
    print(
        f"supervisord ({supervisor.log}): "
        + (
            "; ".join(f"{p['name']} {p['statename']} ({p['description']})" for p in programs)
            if programs
            else (
                "runs no pipeline process (`ingest start` or `streams start` starts the host)"
                if supervisor.running()
                else "not running (`regauge up` starts it)"
            )
        )
    )
    host_status = streams.host(s).read_status()
    if host_status.get("state") == "running":
        connect = host_status.get("spark_connect")
        print(
            "view host's Spark Connect (Airflow's replay and validate tasks run there): "
            + (connect or f"none: {host_status.get('spark_connect_error')}")
        )
    print("metrics (Prometheus text; `regauge top` shows the view host's):")
    for endpoint in exporter.endpoints(s):
        note = f" ({endpoint.note})" if endpoint.note else ""
        print(f"  {endpoint.name + ':':<30} {endpoint.url or '-'}{note}")
    print(f"last audit: {_last_audit(s)}")
    return 0 if all_up or not getattr(args, "check", False) else 1


def _last_audit(s: settings_mod.Settings) -> str:
    last = audit.last_result(s)
    if last is None:
        return "none on record (`regauge audit`, or the hourly regauge_audit DAG)"
    verdict = "PASSED" if last["passed"] else f"FAILED ({last['failed']} checks)"
    minutes = (time.time() - float(last["finished_at"])) / 60
    return f"{verdict} {minutes:,.0f} min ago, run {last['run_id']}"


def top(args: argparse.Namespace) -> int:
    """The view host's metrics as a terminal dashboard, scraped every `--every` s."""
    from rich.live import Live

    s = settings_mod.get()
    host = exporter.host_endpoint(s)
    if host.url is None:
        print(f"regauge: the view host has no metrics endpoint: {host.note}", flush=True)
        print("start it with `regauge ingest start` or `regauge streams start VIEW VERSION`")
        return 2
    if args.once:
        Console(width=160).print(_dashboard(host.url))
        return 0
    with Live(_dashboard(host.url), refresh_per_second=1, screen=False) as live:
        try:
            while True:
                time.sleep(args.every)
                live.update(_dashboard(host.url))
        except KeyboardInterrupt:
            return 0


def _dashboard(url: str) -> Table:
    """One frame: ingest, each query, each view version, silver and the audit."""
    grid = Table.grid(padding=(0, 2))
    try:
        samples = exporter.scrape(url)
    except OSError as exc:
        grid.add_row(f"[red]{exc}[/red]")
        return grid
    grid.add_row(f"regauge top: {url} at {time.strftime('%H:%M:%S')}")

    def num(value: float | None, fmt: str = ",.0f") -> str:
        return "-" if value is None or math.isnan(value) else format(value, fmt)

    ingest = Table(title="ingest, per source and Kafka partition")
    for col in ("source", "partition", "records behind", "oldest waiting s"):
        ingest.add_column(col, justify="right")
    keys = ("source", "partition")
    behind = exporter.by_labels(samples, "regauge_ingest_behind_records", *keys)
    waiting = exporter.by_labels(samples, "regauge_ingest_oldest_waiting_seconds", *keys)
    # The shop's first, then the other sources by name, each by partition.
    for key in sorted(behind, key=lambda k: (k[0] != registry.SHOP_SOURCE, k[0], int(k[1]))):
        ingest.add_row(*key, num(behind[key]), num(waiting.get(key), ",.1f"))
    grid.add_row(ingest)

    queries = Table(title="micro-batches, per query")
    for col in ("query", "running", "batches", "mean s", "rows read"):
        queries.add_column(col, justify="right")
    running = exporter.by_label(samples, "regauge_query_running", "query")
    count = exporter.by_label(samples, "regauge_microbatch_seconds_count", "query")
    total = exporter.by_label(samples, "regauge_microbatch_seconds_sum", "query")
    rows = exporter.by_label(samples, "regauge_microbatch_input_rows_total", "query")
    for q in sorted(set(running) | set(count)):
        mean = total[q] / count[q] if count.get(q) else None
        state = {1.0: "yes", 0.0: "[red]no[/red]"}.get(running.get(q, math.nan), "-")
        queries.add_row(q, state, num(count.get(q)), num(mean, ",.1f"), num(rows.get(q)))
    grid.add_row(queries)

    views = Table(title="views, per version")
    for col in ("view", "freshness s", "last gold commit s ago", "restatements"):
        views.add_column(col, justify="right")
    freshness = exporter.by_view(samples, "regauge_view_freshness_seconds")
    committed = exporter.by_view(samples, "regauge_view_last_gold_commit_timestamp_seconds")
    restated = exporter.by_view(samples, "regauge_restatements_total")
    now = time.time()
    for v in sorted(set(freshness) | set(committed) | set(restated)):
        at = committed.get(v)
        views.add_row(
            v,
            num(freshness.get(v), ",.1f"),
            num(None if at is None else now - at),
            num(restated.get(v)),
        )
    grid.add_row(views)

    silver = exporter.by_label(samples, "regauge_silver_rows_total", "outcome")
    reasons = exporter.by_label(samples, "regauge_quarantined_total", "reason")
    grid.add_row(
        "silver rows: "
        + (", ".join(f"{k} {num(v)}" for k, v in sorted(silver.items())) or "none yet")
        + "; quarantined by reason: "
        + (", ".join(f"{k} {num(v)}" for k, v in sorted(reasons.items())) or "none")
    )
    age = samples.get(("regauge_audit_age_seconds", ()), math.nan)
    passed = samples.get(("regauge_audit_passed", ()), math.nan)
    verdict = "none on record" if math.isnan(passed) else ("passed" if passed else "FAILED")
    grid.add_row(f"last audit: {verdict}, {num(age / 60)} min ago")
    return grid


def print_status(title: str, members: Sequence[Service]) -> bool:
    """A table of each service's processes; whether every service is healthy."""
    table = Table(title=title)
    for col in ("service", "state", "port", "pid", "supervisord", "memory", "log", "where"):
        table.add_column(col)
    all_up = True
    total_rss = 0
    for svc in members:
        st = svc.status()
        state = "up" if st.healthy else ("starting/unhealthy" if st.running else "down")
        all_up &= st.healthy
        for i, proc in enumerate(st.procs):
            total_rss += proc.rss_bytes
            table.add_row(
                st.service if i == 0 else "",
                state if i == 0 else "",
                ",".join(map(str, st.ports)) if i == 0 else "",
                str(proc.pid or "-"),
                proc.state,
                f"{proc.rss_bytes / 2**20:,.0f} MiB" if proc.pid else "-",
                str(proc.log),
                st.note if i == 0 else "",
            )
    Console(width=220).print(table)
    print(f"resident memory of the services above: {total_rss / 2**30:.2f} GiB")
    return all_up


def settings(args: argparse.Namespace) -> int:
    s = settings_mod.get()
    for f in dataclasses.fields(s):
        value = getattr(s, f.name)
        # Never echo a secret: say only whether it is set.
        if value and any(word in f.name for word in ("password", "secret")):
            value = "(set)"
        print(f"{f.name:<26} {value}")
    print("\nOverride any value with its variable:")
    for var, (attr, _) in settings_mod.OVERRIDES.items():
        print(f"  {var:<32} -> {attr}")
    return 0
