"""`regauge`: the command line for engineers (and for Airflow's tasks).

Every subcommand prints what it did; failures print one line saying what went
wrong and what to do, and exit non-zero.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from warehouse import settings as settings_mod

log = logging.getLogger("regauge")

Handler = Callable[[argparse.Namespace], int]


def _configure_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    # py4j and Spark's Python side are noisy at INFO and say nothing an operator needs.
    for noisy in ("py4j", "urllib3", "trino"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


# -- stack ------------------------------------------------------------------------
def cmd_setup(args: argparse.Namespace) -> int:
    from warehouse.stack import artifacts

    where = artifacts.fetch_all(settings_mod.get())
    for what, path in where.items():
        print(f"{what:<11} {path}")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from warehouse.stack import services

    services.up(settings_mod.get(), args.services)
    return cmd_status(args)


def cmd_down(args: argparse.Namespace) -> int:
    from warehouse import ingest_ctl, streams
    from warehouse.stack import services

    s = settings_mod.get()
    if not args.services:
        # Airflow first, so its watchdog cannot restart a stream stopped next; then
        # the pipeline's own daemons, which would fail once Kafka is gone.
        services.down(s, ["airflow"])
        for st in streams.known(s):
            if st.pid:
                print(streams.stop(s, st.view, st.version))
        if ingest_ctl.stop(s):
            print("ingest stopped")
    services.down(s, args.services)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from warehouse.stack import services

    s = settings_mod.get()
    table = Table(title=f"regauge stack ({s.profile} profile, state in {s.state_dir})")
    for col in ("service", "state", "port", "pid", "memory", "log", "where"):
        table.add_column(col)
    all_up = True
    total_rss = 0
    for svc in services.services(s, getattr(args, "services", ())):
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
                f"{proc.rss_bytes / 2**20:,.0f} MiB" if proc.pid else "-",
                str(proc.log),
                st.note if i == 0 else "",
            )
    Console(width=220).print(table)
    print(f"resident memory of the services above: {total_rss / 2**30:.2f} GiB")
    return 0 if all_up or not getattr(args, "check", False) else 1


def cmd_settings(args: argparse.Namespace) -> int:
    import dataclasses

    s = settings_mod.get()
    for f in dataclasses.fields(s):
        print(f"{f.name:<26} {getattr(s, f.name)}")
    print("\nOverride any value with its variable:")
    for var, (attr, _) in settings_mod.OVERRIDES.items():
        print(f"  {var:<32} -> {attr}")
    return 0


# -- pipeline ----------------------------------------------------------------------
def cmd_produce(args: argparse.Namespace) -> int:
    from spark_jobs import producer

    s = settings_mod.get()
    run = producer.produce_generated(
        s,
        seed=args.seed,
        count=args.count,
        chaos=args.chaos,
        rate=args.rate,
        start=args.start or datetime.now(UTC) - timedelta(days=args.days),
        days=args.days,
        progress=sys.stdout.isatty(),
    )
    report = run.report()
    print(run.summary.describe())
    for error in run.summary.errors[:5]:
        print(f"  {error}")
    injected = ", ".join(f"{k}={v:,}" for k, v in report["injected"].items())
    print(f"records by kind: {injected}")
    expected = report["expected"]
    reasons = ", ".join(f"{k}={v:,}" for k, v in expected["quarantine_by_reason"].items())
    print(
        f"the contract expects: silver {expected['silver']:,}, "
        f"exact duplicates {expected['exact_duplicates']:,}, quarantine: {reasons or 'none'}"
    )
    print(f"report: {producer.save_report(s, run)}")
    return 0 if run.summary.ok else 1


def cmd_ingest(args: argparse.Namespace) -> int:
    from warehouse import ingest_ctl

    s = settings_mod.get()
    if args.action == "run":
        return _ingest_run(s, args.trigger)
    if args.action == "start":
        ingest_ctl.start(s, args.trigger)
        return 0
    if args.action == "stop":
        print("ingest stopped" if ingest_ctl.stop(s) else "ingest was not running")
        return 0
    running, text = ingest_ctl.describe(s)
    print(text)
    return 0 if running else 1


def _ingest_run(s: settings_mod.Settings, trigger: str | None) -> int:
    import signal
    import threading

    from spark_jobs import ingest
    from spark_jobs.session import build_session

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    spark = build_session("regauge-ingest", s)
    try:
        ingest.run(spark, s, stop, trigger=trigger)
    except ingest.DataLossError as exc:
        print(f"regauge: {exc}", file=sys.stderr)
        return 3
    finally:
        spark.stop()
    log.info("ingest stopped")
    return 0


def cmd_bronze(args: argparse.Namespace) -> int:
    from spark_jobs import bronze
    from spark_jobs.session import build_session

    s = settings_mod.get()
    spark = build_session("regauge-bronze", s)
    rows = bronze.run_once(spark, s)
    print(f"bronze: {rows} rows in {bronze.BRONZE.trino_name}")
    return 0


def cmd_ingest_once(args: argparse.Namespace) -> int:
    from spark_jobs import ingest
    from spark_jobs.session import build_session

    s = settings_mod.get()
    spark = build_session("regauge-ingest-once", s)
    try:
        for table, rows in ingest.run_once(
            spark, s, accept_data_loss=args.accept_data_loss
        ).items():
            print(f"{table:<34} {rows:>12,} rows")
    except ingest.DataLossError as exc:
        print(f"regauge: {exc}", file=sys.stderr)
        return 3
    finally:
        spark.stop()
    return 0


def cmd_views(args: argparse.Namespace) -> int:
    from spark_jobs import views

    if args.action == "list":
        for (name, version), view in sorted(views.discover().items()):
            print(f"{name} v{version}: {view.description} (key {', '.join(view.key)})")
        return 0
    if not args.view or args.version is None:
        print("regauge: views run needs VIEW and --version N", file=sys.stderr)
        return 2
    try:
        view = views.get(args.view, args.version)
    except KeyError as exc:
        print(f"regauge: {exc.args[0]}", file=sys.stderr)
        return 2
    return _views_run(view, args.mode, args.trigger, args.until_caught_up, args.source)


def _views_run(
    view: Any, mode: str, trigger: str | None, until_caught_up: bool, source: str
) -> int:
    import os
    import signal
    import threading

    from spark_jobs.session import build_session
    from spark_jobs.views import runner
    from warehouse import streams

    s = settings_mod.get()
    table = runner.gold_table(view)
    spark = build_session(f"regauge-view-{view.table_name}", s)
    try:
        if mode == "batch":
            version = runner.batch(spark, s, view, source=source)
            print(f"{table.trino_name}: recomputed from {source} (silver version {version})")
            return 0
        if mode == "replay":
            after = runner.replay(spark, s, view, source=source)
            print(
                f"{table.trino_name}: replayed {source} (silver up to version {after}); "
                "continuing live"
            )
        elif not runner.has_checkpoint(s, view) and runner.replayed_through(s, view) < 0:
            print(
                f"regauge: {table.trino_name} has no stream yet; start it with --mode replay",
                file=sys.stderr,
            )
            return 2
        query = runner.stream(spark, s, view, trigger=trigger, available_now=until_caught_up)
        # `regauge streams` reads this to know the stream is up.
        status = streams.daemon(s, view.name, view.version)
        status.write_status(state="running", pid=os.getpid(), since=datetime.now(UTC))
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        while query.isActive and not stop.is_set():
            stop.wait(1.0)
        if query.isActive:
            query.stop()
        if query.exception() is not None:
            status.write_status(state="failed", error=str(query.exception()))
            print(
                f"regauge: {table.trino_name} stream failed: {query.exception()}", file=sys.stderr
            )
            return 1
        status.write_status(state="stopped", at=datetime.now(UTC))
        print(f"{table.trino_name}: stream stopped")
        return 0
    finally:
        spark.stop()


# -- versions: reprocess, rollout, retire -----------------------------------------------
def cmd_versions(args: argparse.Namespace) -> int:
    from warehouse import lifecycle, versions

    s = settings_mod.get()
    action = args.action
    if action == "list":
        rows = versions.versions(s, args.view)
        if not rows:
            print("no versions registered" + (f" for {args.view}" if args.view else ""))
            return 0
        for v in rows:
            print(
                f"{v.view_name:<18} v{v.version:<3} {v.status:<9} {v.rollout_percent:>3} %  "
                f"built from {v.source_position or '-':<14} "
                f"ready {_when(v.ready_at)}  retired {_when(v.retired_at)}"
            )
        return 0
    if args.view is None:
        print(f"regauge: versions {action} needs VIEW", file=sys.stderr)
        return 2
    if action == "forget":
        if not args.yes:
            print(
                f"regauge: this forgets every version of {args.view} and stops their streams; "
                "add --yes to go ahead",
                file=sys.stderr,
            )
            return 2
        for line in lifecycle.forget(s, args.view):
            print(line)
        return 0
    if args.version is None:
        print(f"regauge: versions {action} needs VIEW VERSION", file=sys.stderr)
        return 2
    view, version = args.view, args.version
    if action == "show":
        return _versions_show(s, view, version)
    if action == "validate":
        report = lifecycle.validate(s, view, version)
        print(json.dumps(report, indent=2, default=str))
        print(
            f"{view} v{version}: {'PASSED' if report.get('passed') else 'FAILED'}: "
            f"{report.get('summary', '')}"
        )
        return 0 if report.get("passed") else 1
    step = {
        "register": lambda: lifecycle.register(s, view, version, args.source),
        "build": lambda: lifecycle.build(s, view, version, args.source),
        "go-live": lambda: lifecycle.go_live(s, view, version),
        "publish": lambda: lifecycle.publish(s, view, version),
        "ready": lambda: lifecycle.ready(s, view, version),
    }[action]
    print(step())
    return 0


def _when(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%d %H:%M") if at else "-"


def _versions_show(s: settings_mod.Settings, view: str, version: int) -> int:
    from warehouse import streams, versions

    v = versions.get(s, view, version)
    stream = streams.daemon(s, view, version)
    pid = stream.pid()
    print(f"{v.label}: {v.status}, {v.rollout_percent} % of users")
    print(
        f"  created {_when(v.created_at)}, ready {_when(v.ready_at)}, retired {_when(v.retired_at)}"
    )
    print(f"  built from {v.source_position or '-'}")
    print(f"  stream: {'running, pid ' + str(pid) if pid else 'not running'} (log {stream.log})")
    pinned = sorted(u for u, pv in versions.pins(s, view).items() if pv == version)
    print(f"  pinned users: {', '.join(pinned) or 'none'}")
    if v.validation:
        print(
            f"  validation: {'passed' if v.validation.get('passed') else 'FAILED'}: "
            f"{v.validation.get('summary', '')}"
        )
    print("  history:")
    for e in versions.events(s, view):
        if e["version"] == version:
            print(f"    {_when(e['at'])}  {e['action']:<10} {e['detail']}")
    return 0


def cmd_rollout(args: argparse.Namespace) -> int:
    from warehouse import lifecycle

    for line in lifecycle.rollout(
        settings_mod.get(), args.view, args.version, args.percent, args.pin, args.unpin
    ):
        print(line)
    return 0


def cmd_retire(args: argparse.Namespace) -> int:
    from warehouse import lifecycle

    for line in lifecycle.retire(settings_mod.get(), args.view, args.version):
        print(line)
    return 0


def cmd_streams(args: argparse.Namespace) -> int:
    from warehouse import streams

    s = settings_mod.get()
    if args.action == "list":
        found = streams.known(s)
        for st in found:
            print(f"{st.view} v{st.version}: {st.state}" + (f" (pid {st.pid})" if st.pid else ""))
        if not found:
            print("no view stream is running")
        return 0
    if args.action == "ensure":
        for line in streams.ensure(s) or ["every live version's stream is running"]:
            print(line)
        return 0
    if args.view is None or args.version is None:
        print(f"regauge: streams {args.action} needs VIEW --version N", file=sys.stderr)
        return 2
    act = streams.start if args.action == "start" else streams.stop
    print(act(s, args.view, args.version))
    return 0


def cmd_trigger(args: argparse.Namespace) -> int:
    from warehouse import airflow_client

    conf: dict[str, Any] = {}
    for pair in args.conf:
        key, sep, value = pair.partition("=")
        if not sep:
            print(f"regauge: {pair!r} is not key=value", file=sys.stderr)
            return 2
        # Numbers as numbers, so Airflow's param schema sees an integer version.
        conf[key] = int(value) if value.lstrip("-").isdigit() else value
    client = airflow_client.Client(settings_mod.get())
    client.wait_for_dag(args.dag_id)
    run_id = client.trigger(args.dag_id, conf)
    print(f"{args.dag_id}: run {run_id} created")
    if args.no_wait:
        return 0
    state = client.wait(args.dag_id, run_id)
    print(f"{args.dag_id}: run {run_id} {state}")
    if state != "success":
        print(client.failure_logs(args.dag_id, run_id), file=sys.stderr)
        return 1
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    from warehouse import audit, trino_client

    s = settings_mod.get()
    checks = args.checks or audit.CHECKS
    from spark_jobs.session import build_session

    spark = build_session("regauge-audit", s, ui=False)
    try:
        run = audit.run(s, spark, checks, args.sample)
    finally:
        spark.stop()
    print(trino_client.format_table(audit.describe(run)))
    print(audit.verdict(run))
    return 0 if run.passed else 1


# Spelled here so `--help` imports neither Spark nor Trino; tests/warehouse/test_chaos.py
# holds them equal to chaos.CASES and audit.CHECKS.
CHAOS_CASES = (
    "ingest_kills",
    "broker_stop",
    "bad_input",
    "view_kills",
    "commit_crash",
    "retention",
)
AUDIT_CHECKS = ("kafka_bronze", "bronze_silver", "silver_gold", "routing")


def _subset(known: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """An argparse type for a comma-separated, non-empty subset of `known`."""

    def parse(text: str) -> tuple[str, ...]:
        chosen = tuple(c.strip() for c in text.split(",") if c.strip())
        unknown = [c for c in chosen if c not in known]
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {','.join(known)}")
        return chosen

    return parse


def cmd_chaos(args: argparse.Namespace) -> int:
    from spark_jobs.session import build_session
    from warehouse import chaos

    s = settings_mod.get()
    spark = build_session("regauge-chaos", s, ui=False)
    try:
        outcomes = chaos.run(
            s,
            spark,
            events=args.events,
            kills=args.kills,
            cases=args.cases or chaos.CASES,
            seed=args.seed,
        )
    finally:
        spark.stop()
    print("\n" + chaos.table(outcomes))
    failed = [o.case for o in outcomes if not o.ok]
    print(
        f"\nchaos: {'FAILED: ' + ', '.join(failed) if failed else 'every case exact; audit passed'}"
    )
    return 1 if failed else 0


def cmd_bench(args: argparse.Namespace) -> int:
    from warehouse import bench

    sizes = bench.Sizes(
        events=args.events,
        load_rate=args.load_rate,
        freshness_s=args.freshness_seconds,
        queries=args.queries,
    )
    report = bench.run(settings_mod.get(), sizes, args.out, None if args.no_doc else bench.DOC)
    print("\n" + bench.table(report))
    missed = [name for name, _, _, _, ok in bench.verdicts(report.figures) if ok is False]
    # A missed target is news, not a failure: the run itself succeeded.
    print(f"\nbench: {'missed ' + ', '.join(missed) if missed else 'every target met'}")
    return 0


def cmd_dbt(args: argparse.Namespace) -> int:
    from warehouse import dbt_runner

    return dbt_runner.run(settings_mod.get(), args.dbt_args or ["--help"])


def cmd_query(args: argparse.Namespace) -> int:
    from warehouse import trino_client

    result = trino_client.query(settings_mod.get(), args.sql, user=args.user)
    print(trino_client.FORMATS[args.format](result))
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from warehouse import demo

    return demo.run(settings_mod.get(), events=args.events)


# -- parser ------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="regauge",
        description=(
            "Keep a lakehouse's derived tables correct while the code that derives them "
            "changes. Settings come from REGAUGE_PROFILE (local|cluster) and REGAUGE_* "
            "variables; see `regauge settings`."
        ),
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: Handler, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(handler=handler)
        return p

    add("setup", cmd_setup, "fetch and unpack the JVM artifacts into the cache (idempotent)")
    for name, handler, text in (
        ("up", cmd_up, "start services (all, or the ones named) and wait until healthy"),
        ("down", cmd_down, "stop services this project started (all, or the ones named)"),
        ("status", cmd_status, "show each service's state, port, pid and log file"),
    ):
        p = add(name, handler, text)
        p.add_argument(
            "services",
            nargs="*",
            metavar="SERVICE",
            help="postgres, kafka, trino, airflow (default: all)",
        )
        if name == "status":
            p.add_argument("--check", action="store_true", help="exit 1 unless all are up")
    add("settings", cmd_settings, "print the active settings and the variables that change them")

    p = add(
        "produce",
        cmd_produce,
        "generate deterministic shop traffic for a seed, seed the reference data in "
        "PostgreSQL, and produce it to the shop.events topic",
    )
    p.add_argument(
        "--count", type=_positive_int, default=10_000, help="records to send (default 10000)"
    )
    p.add_argument("--seed", type=int, default=1, help="same seed, same records (default 1)")
    p.add_argument(
        "--chaos",
        action="store_true",
        help="mix in re-sends, conflicting duplicates, out-of-order and very late events, "
        "and records of every quarantine reason",
    )
    p.add_argument(
        "--rate", type=_positive_int, default=None, help="events per second (default: max)"
    )
    p.add_argument(
        "--start",
        type=_timestamp,
        default=generator_start(),
        help="event time of the first event: RFC 3339, or 'now' for the last --days "
        "(default 2026-01-01T00:00:00Z)",
    )
    p.add_argument("--days", type=float, default=7.0, help="days the traffic spans (default 7)")

    p = add(
        "ingest",
        cmd_ingest,
        "run Kafka -> bronze -> silver: run (foreground), start (background), stop, status",
    )
    p.add_argument("action", choices=("run", "start", "stop", "status"))
    p.add_argument(
        "--trigger",
        default=None,
        help="micro-batch interval, e.g. '1 second' (default: REGAUGE_TRIGGER_INTERVAL)",
    )
    p = add(
        "ingest-once",
        cmd_ingest_once,
        "copy everything new from Kafka to bronze and settle it into silver, then stop",
    )
    p.add_argument(
        "--accept-data-loss",
        action="store_true",
        help="skip a gap in the log (records Kafka deleted before bronze copied them) "
        "instead of stopping; only after deciding the loss is acceptable",
    )
    add("bronze", cmd_bronze, "copy everything new in Kafka into the bronze table, then stop")

    p = add(
        "views",
        cmd_views,
        "list view versions, or run one into lakehouse.gold.<view>_v<N>: batch (recompute "
        "once), replay (rebuild from all of silver, then continue live), stream (continue)",
    )
    p.add_argument("action", choices=("list", "run"))
    p.add_argument("view", nargs="?", help="view name, e.g. revenue_hourly")
    p.add_argument("--version", type=_positive_int, default=None, help="view version, e.g. 2")
    p.add_argument("--mode", choices=("stream", "replay", "batch"), default="stream")
    p.add_argument(
        "--source",
        choices=("silver", "kafka"),
        default="silver",
        help="what a replay or batch reads: silver (all history, default) or every record "
        "Kafka still holds, validated and deduplicated on the fly",
    )
    p.add_argument("--trigger", default=None, help="micro-batch interval (default 1 second)")
    p.add_argument(
        "--until-caught-up",
        action="store_true",
        help="stop once the stream has processed everything in silver",
    )

    p = add(
        "versions",
        cmd_versions,
        "the version registry: list, show VIEW VERSION; the steps of a reprocess "
        "(register, build, go-live, validate, publish, ready), as regauge_reprocess runs "
        "them; forget VIEW --yes starts a view's history over",
    )
    p.add_argument(
        "action",
        choices=(
            "list",
            "show",
            "register",
            "build",
            "go-live",
            "validate",
            "publish",
            "ready",
            "forget",
        ),
    )
    p.add_argument("view", nargs="?", type=_identifier, help="view name, e.g. revenue_hourly")
    p.add_argument("version", nargs="?", type=_positive_int, help="view version, e.g. 2")
    p.add_argument(
        "--source",
        choices=("bronze", "kafka"),
        default="bronze",
        help="what the replay reads: bronze (all history, via silver; default) or kafka",
    )
    p.add_argument("--yes", action="store_true", help="confirm `forget`")

    p = add(
        "rollout",
        cmd_rollout,
        "route PERCENT of users to VERSION (the rest see the other live version); "
        "100 makes it the current version; every step can be undone until retirement",
    )
    p.add_argument("view", type=_identifier)
    p.add_argument("version", type=_positive_int)
    p.add_argument("percent", type=_percent, help="0-100")
    p.add_argument(
        "--pin", metavar="USER", type=_user, help="also pin USER to VERSION, whatever the percent"
    )
    p.add_argument("--unpin", metavar="USER", type=_user, help="remove USER's pin")

    p = add(
        "retire",
        cmd_retire,
        "retire a version no user is routed to: stop its stream, drop it from Trino, "
        "archive its table",
    )
    p.add_argument("view", type=_identifier)
    p.add_argument("version", type=_positive_int)

    p = add(
        "streams",
        cmd_streams,
        "live view streams: list, start/stop VIEW --version N, ensure (start every live "
        "version's stream that is not running; what regauge_watchdog runs)",
    )
    p.add_argument("action", choices=("list", "start", "stop", "ensure"))
    p.add_argument("view", nargs="?", type=_identifier)
    p.add_argument("--version", type=_positive_int, default=None)

    p = add(
        "trigger",
        cmd_trigger,
        "trigger an Airflow DAG through its REST API and follow it, e.g. "
        "`regauge trigger regauge_reprocess view=revenue_hourly version=2`",
    )
    p.add_argument("dag_id")
    p.add_argument("conf", nargs="*", metavar="KEY=VALUE", help="the run's params")
    p.add_argument("--no-wait", action="store_true", help="return once the run exists")

    p = add(
        "audit",
        cmd_audit,
        "check every layer against the one it derives from (Kafka -> bronze -> silver -> "
        "gold, and routing); exit 1 on any mismatch; results in lakehouse.gold.audit_runs",
    )
    p.add_argument(
        "--sample",
        type=float,
        default=None,
        metavar="FRACTION",
        help="check a random FRACTION (0-1) of each view's windows instead of all of them",
    )
    p.add_argument(
        "--checks",
        type=_subset(AUDIT_CHECKS),
        default=None,
        help="comma-separated subset of " + ",".join(AUDIT_CHECKS) + " (default: all)",
    )

    p = add(
        "chaos",
        cmd_chaos,
        "inject real faults into the running pipeline (kill -9 ingest, a broker, views; "
        "crashes between commit and checkpoint; poison pills, re-sends, clock skew; "
        "Kafka deleting unread data), prove nothing was lost or doubled, then audit; "
        "what `make chaos` runs",
    )
    p.add_argument(
        "--events",
        type=_positive_int,
        default=200_000,
        help="size of the kill -9 run; the other cases use a tenth (default 200000)",
    )
    p.add_argument("--kills", type=_positive_int, default=5, help="kill -9s of ingest (default 5)")
    p.add_argument(
        "--cases",
        type=_subset(CHAOS_CASES),
        default=None,
        help="comma-separated subset of " + ",".join(CHAOS_CASES) + " (default: all)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed the fault timing, to repeat it")

    p = add(
        "bench",
        cmd_bench,
        "measure the pipeline on this machine, each figure beside a baseline from the same "
        "run (producer vs a bare confluent-kafka loop, ingest vs a bare consumer, the replay "
        "of every view vs DuckDB, freshness vs the trigger interval, a serving query vs "
        "SELECT 1, peak memory); writes JSON and a PNG and appends to docs/BENCHMARKS.md. "
        "Sends real traffic to the local stack; what `make bench` runs",
    )
    from warehouse.bench import DEFAULT_OUT, Sizes  # light: no Spark, no Trino

    sizes = Sizes()
    p.add_argument(
        "--events",
        type=_positive_int,
        default=sizes.events,
        help=f"records produced, ingested and replayed (default {sizes.events}; the replay "
        "also covers whatever silver held before)",
    )
    p.add_argument(
        "--load-rate",
        type=_positive_int,
        default=int(sizes.load_rate),
        help=f"events/s of steady load while freshness is probed (default {sizes.load_rate:g})",
    )
    p.add_argument(
        "--freshness-seconds",
        type=_positive_int,
        default=int(sizes.freshness_s),
        help=f"how long freshness is probed, one probe every {sizes.probe_every_s:g} s "
        f"(default {sizes.freshness_s:g})",
    )
    p.add_argument(
        "--queries",
        type=_positive_int,
        default=sizes.queries,
        help=f"runs of each timed query (default {sizes.queries})",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="where the run's JSON and PNG go (default docs/bench)",
    )
    p.add_argument(
        "--no-doc", action="store_true", help="do not append the run to docs/BENCHMARKS.md"
    )

    p = add(
        "dbt",
        cmd_dbt,
        "run dbt on silver in this process (dbt-spark, session method), e.g. "
        "`regauge dbt build --select fct_orders+`; the profile comes from the settings, "
        "and after build/run every mart is published to Trino as lakehouse.marts.<model>",
    )
    p.add_argument("dbt_args", nargs=argparse.REMAINDER, help="dbt's own arguments")

    p = add("query", cmd_query, "run SQL through Trino and print the result as a table")
    p.add_argument("sql", help="the SQL statement")
    p.add_argument(
        "--user",
        type=_user,
        default="regauge",
        help="Trino user name, e.g. analyst.alice: what it may read follows "
        "infra/trino/rules.json (default regauge, the pipeline: full access)",
    )
    p.add_argument(
        "--format",
        choices=("table", "csv", "json"),  # trino_client.FORMATS
        default="table",
        help="table (default), csv (with a header) or json (one object per row)",
    )

    p = add(
        "demo",
        cmd_demo,
        "the pipeline end to end: a chaos mix -> Kafka -> bronze -> silver + quarantine; "
        "revenue_hourly v1 serving, v2 reprocessed through Airflow while events flow, "
        "rolled out to 10/50/100 %% of analysts, v1 retired; then the numbers from Trino",
    )
    p.add_argument(
        "--events", type=_positive_int, default=20_000, help="records to produce (default 20000)"
    )
    return parser


def generator_start() -> datetime:
    from spark_jobs.generator import DEFAULT_START

    return DEFAULT_START


def _timestamp(text: str) -> datetime | None:
    """RFC 3339 with an offset, or 'now' (None: the traffic ends now)."""
    if text == "now":
        return None
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a timestamp like 2026-01-01T00:00:00Z"
        ) from None
    if parsed.tzinfo is None:
        raise argparse.ArgumentTypeError(f"{text!r} needs an offset or Z")
    return parsed


def _name(check: Callable[[str], str]) -> Callable[[str], str]:
    """An argparse type from a sqlnames check: a refused name is a usage error."""

    def parse(text: str) -> str:
        from warehouse.sqlnames import UnsafeNameError

        try:
            return check(text)
        except UnsafeNameError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _identifier(text: str) -> str:
    from warehouse.sqlnames import check_identifier

    return _name(lambda t: check_identifier(t, "view"))(text)


def _user(text: str) -> str:
    from warehouse.sqlnames import check_user

    return _name(check_user)(text)


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _percent(text: str) -> int:
    value = _whole(text)
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{value} is not a percent from 0 to 100")
    return value


def _positive_int(text: str) -> int:
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(args.verbose)
    import psycopg
    from trino.exceptions import TrinoConnectionError, TrinoQueryError

    from warehouse.airflow_client import AirflowError
    from warehouse.sqlnames import UnsafeNameError
    from warehouse.stack.artifacts import SetupError
    from warehouse.stack.process import ServiceError
    from warehouse.versions import VersionError

    try:
        return int(args.handler(args))
    except (
        SetupError,
        ServiceError,
        settings_mod.SettingsError,
        UnsafeNameError,
        VersionError,
        AirflowError,
    ) as exc:
        print(f"regauge: {exc}", file=sys.stderr)
        return 2
    except TrinoQueryError as exc:
        print(f"regauge: Trino refused the query: {exc.message}", file=sys.stderr)
        return 2
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(
            f"regauge: PostgreSQL is not reachable ({first}); start it with `regauge up`",
            file=sys.stderr,
        )
        return 2
    except TrinoConnectionError:
        s = settings_mod.get()
        print(
            f"regauge: Trino is not reachable at {s.trino_url}; start it with `regauge up`",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("regauge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
