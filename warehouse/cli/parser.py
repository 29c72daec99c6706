"""`regauge`'s arguments: every command, its options and its help, and nothing else.

This module imports only the base layer, so `regauge --help` and a usage error
answer at once, without Spark or Trino. Each command names its handler as
"module:function" in this package; `warehouse.cli.main` imports that module
only when the command runs.

Every command that names a view version takes `VIEW VERSION` as two
positional arguments, and every replay names its source `bronze` (all of
history, the default) or `kafka` (docs/contract.md §5).

Over 400 lines on purpose: every command's arguments and help text in one
file keeps their wording consistent, and keeps `--help` free of heavy imports.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from warehouse import sources
from warehouse.base import settings as settings_mod
from warehouse.base.sqlnames import (
    UnsafeNameError,
    check_customer_id,
    check_identifier,
    check_request_id,
    check_user,
)

# The choices below are spelled here so `--help` imports no Spark or Trino; fast
# tests hold each equal to the module that owns it.
SOURCES = ("bronze", "kafka")  # spark_jobs.engine.runner.SOURCES
AUDIT_CHECKS = ("kafka_bronze", "bronze_silver", "silver_gold", "routing")  # ops.audit.CHECKS
CHAOS_CASES = (  # tools.chaos.CASES
    "ingest_kills",
    "broker_stop",
    "bad_input",
    "view_kills",
    "commit_crash",
    "retention",
    "lost_checkpoint",
    "concurrent_writer",
    "postgres_down",
    "disk_full",
)
QUERY_FORMATS = ("table", "csv", "json")  # sql.trino_client.FORMATS
GENERATOR_START = datetime(2026, 1, 1, tzinfo=UTC)  # spark_jobs.generator.DEFAULT_START
BENCH_OUT = settings_mod.REPO_ROOT / "docs" / "bench"  # tools.bench.DEFAULT_OUT


# -- argument types: a bad value is a usage error naming what is wrong ---------------------
def subset(known: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    """An argparse type for a comma-separated, non-empty subset of `known`."""

    def parse(text: str) -> tuple[str, ...]:
        chosen = tuple(c.strip() for c in text.split(",") if c.strip())
        unknown = [c for c in chosen if c not in known]
        if unknown or not chosen:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; choose from {','.join(known)}")
        return chosen

    return parse


def timestamp(text: str) -> datetime | None:
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
        try:
            return check(text)
        except UnsafeNameError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


identifier = _name(lambda t: check_identifier(t, "view"))
user = _name(check_user)


def whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def percent(text: str) -> int:
    value = whole(text)
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"{value} is not a percent from 0 to 100")
    return value


def _request_id(text: str) -> str:
    try:
        return check_request_id(text)
    except UnsafeNameError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _customer_id(text: str) -> str:
    if text == "-":
        return text  # read from stdin by the command, and checked there
    try:
        return check_customer_id(text)
    except UnsafeNameError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of hours") from None
    if not value >= 0:  # NaN too
        raise argparse.ArgumentTypeError(f"{text} must be 0 or more")
    return value


def _zero_or_more(text: str) -> int:
    value = whole(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be 0 or more")
    return value


def _non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= 86_400:  # NaN too
        raise argparse.ArgumentTypeError(f"{text} must be from 0 to 86400 seconds (a day)")
    return value


def _by(text: str) -> str:
    # Recorded in the registry's history: a name, not free text.
    if not re.fullmatch(r"[A-Za-z0-9_.@:+-]{1,120}", text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: letters, digits and _.@:+- only, at most 120 (e.g. engineer.ada)"
        )
    return text


def positive_int(text: str) -> int:
    value = whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def _view_version(p: argparse.ArgumentParser, *, optional: bool = False) -> None:
    """VIEW VERSION, the same two positional arguments on every command."""
    nargs = "?" if optional else None
    p.add_argument("view", nargs=nargs, type=identifier, help="view name, e.g. revenue_hourly")
    p.add_argument("version", nargs=nargs, type=positive_int, help="view version, e.g. 2")


def _source(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--source",
        choices=SOURCES,
        default="bronze",
        help=f"what {what} reads: bronze (all of history, through silver; default) or "
        "kafka (every record Kafka still holds, validated and deduplicated on the fly)",
    )


# -- the commands ------------------------------------------------------------------------------
def build_parser(version: str = "unknown") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="regauge",
        description=(
            "Keep a lakehouse's derived tables correct while the code that derives them "
            "changes. Settings come from REGAUGE_PROFILE (local|cluster) and REGAUGE_* "
            "variables; see `regauge settings`."
        ),
    )
    parser.add_argument("--version", action="version", version=f"regauge {version}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, handler: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(handler=handler)
        return p

    _stack(add)
    _sources(add)
    _docs(add)
    _pipeline(add)
    _versions(add)
    _checks(add)
    _tools(add)
    return parser


Add = Callable[[str, str, str], argparse.ArgumentParser]


def _stack(add: Add) -> None:
    add("setup", "stack:setup", "fetch and unpack the JVM artifacts into the cache (idempotent)")
    for name, text in (
        ("up", "start services (all, or the ones named) and wait until healthy"),
        ("down", "stop services this project started (all, or the ones named)"),
        ("status", "show each service's state, port, pid and log file"),
    ):
        p = add(name, f"stack:{name}", text)
        p.add_argument(
            "services",
            nargs="*",
            metavar="SERVICE",
            help="postgres, kafka, trino, airflow (default: all)",
        )
        if name == "status":
            p.add_argument("--check", action="store_true", help="exit 1 unless all are up")
    p = add(
        "top",
        "stack:top",
        "a live terminal dashboard of the view host's metrics: ingest lag per partition, "
        "micro-batches per query, each view version's freshness and restatements, silver's "
        "outcomes, quarantine by reason, the last audit (Ctrl-C ends it)",
    )
    p.add_argument(
        "--every", type=float, default=2.0, metavar="S", help="seconds between scrapes (2)"
    )
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    add(
        "settings",
        "stack:settings",
        "print the active settings and the variables that change them",
    )
    p = add(
        "cluster",
        "cluster:main",
        "the one-box cluster: Spark standalone (master, 2 workers), S3Proxy, 3 Kafka "
        "brokers, Trino over HTTPS (coordinator, worker), PostgreSQL and Airflow, as "
        "separate processes on this machine, to run regauge's cluster profile on",
    )
    p.add_argument(
        "action",
        choices=("fetch", "up", "down", "status", "env", "run"),
        help="fetch: the cluster-only artifacts; up/down/status: its processes; env: the "
        'REGAUGE_* settings that point at it (eval "$(regauge cluster env)"); run: a '
        "command with those settings, e.g. `regauge cluster run -- regauge query ...`",
    )
    p.add_argument("argv", nargs=argparse.REMAINDER, help="for run: the command")


def _sources(add: Add) -> None:
    p = add(
        "sources",
        "sources:sources",
        "the declared sources (one file each in warehouse/sources/, docs/contract.md §10): list "
        "them; show one's contract (its topic, envelope fields and, per event type and "
        "schema version, every payload field and what it must be); check every declaration "
        "against the contract accepted before it (exit 1 naming the event type, schema "
        "version and field of each change that would alter how an accepted record "
        "validates or reads, or if a contract version is not accepted yet); accept a "
        "source's new contract versions once they pass; deploy one of its contract versions "
        "on this lake (ingest stops between micro-batches meanwhile; a new lake runs 1)",
    )
    p.add_argument(
        "action",
        choices=("list", "show", "check", "accept", "deploy"),
        help="list: every source; show, accept, deploy: one; check: all",
    )
    p.add_argument(
        "source",
        nargs="?",
        metavar="SOURCE",
        help="for show, accept and deploy: the source, e.g. shop",
    )
    p.add_argument(
        "version",
        nargs="?",
        type=int,
        metavar="VERSION",
        help="for deploy: the contract version to run, e.g. 2",
    )
    p.add_argument(
        "--markdown", action="store_true", help="for show: a Markdown table (docs/contract.md's)"
    )


def _docs(add: Add) -> None:
    p = add(
        "docs",
        "docs:docs_check",
        "check that what the docs name exists: every relative link, every repository "
        "path in backticks, every `regauge COMMAND`, and that every make target and DAG "
        "is named in a doc (exit 1 naming each miss; `make lint` runs it)",
    )
    p.add_argument("action", choices=("check",), help="check: the docs against the code")


def _pipeline(add: Add) -> None:
    p = add(
        "produce",
        "ingest:produce",
        "generate deterministic traffic of a source for a seed, seed the reference data in "
        "PostgreSQL, and produce it to the source's topic (shop.events by default)",
    )
    p.add_argument(
        "--source",
        choices=sorted(sources.discover()),
        default="shop",
        help="whose traffic: shop (carts, orders, payments) or web (sessions and product "
        "views of the same customers) (default shop)",
    )
    p.add_argument(
        "--count", type=positive_int, default=10_000, help="records to send (default 10000)"
    )
    p.add_argument("--seed", type=int, default=1, help="same seed, same records (default 1)")
    p.add_argument(
        "--chaos",
        action="store_true",
        help="mix in re-sends, conflicting duplicates, out-of-order and very late events, "
        "and records of every quarantine reason",
    )
    p.add_argument(
        "--rate", type=positive_int, default=None, help="events per second (default: max)"
    )
    p.add_argument(
        "--start",
        type=timestamp,
        default=GENERATOR_START,
        help="event time of the first event: RFC 3339, or 'now' for the last --days "
        "(default 2026-01-01T00:00:00Z)",
    )
    p.add_argument("--days", type=float, default=7.0, help="days the traffic spans (default 7)")
    p.add_argument(
        "--follows",
        type=positive_int,
        default=None,
        metavar="N",
        help="web only: browse the very customers and carts of the shop's run of N records "
        "with the same --seed, --chaos, --start and --days (its visits then convert)",
    )

    p = add(
        "ingest",
        "ingest:ingest_",
        "run Kafka -> bronze -> silver: start (in the view host, the Spark application "
        "that runs every live view stream; started if need be), stop, status, or run "
        "(in the foreground, a Spark application of its own)",
    )
    p.add_argument("action", choices=("run", "start", "stop", "status"))
    p.add_argument(
        "--trigger",
        default=None,
        help="micro-batch interval, e.g. '1 second' (default: REGAUGE_TRIGGER_INTERVAL)",
    )
    p = add(
        "ingest-once",
        "ingest:ingest_once",
        "copy everything new from Kafka to bronze and settle it into silver, then stop: "
        "for every declared source, one after another, or for --source",
    )
    p.add_argument(
        "--source",
        default=None,
        metavar="SOURCE",
        help="only this source, e.g. shop (default: every declared source)",
    )
    p.add_argument(
        "--accept-data-loss",
        action="store_true",
        help="skip a gap in the log (records Kafka deleted before bronze copied them) "
        "instead of stopping; only after deciding the loss is acceptable",
    )

    p = add(
        "views",
        "views:views",
        "list view versions, or run one into lakehouse.gold.<view>_v<N>: batch (recompute "
        "once), replay (rebuild from all of history, then continue live), stream (continue)",
    )
    p.add_argument("action", choices=("list", "run"))
    _view_version(p, optional=True)
    p.add_argument("--mode", choices=("stream", "replay", "batch"), default="stream")
    _source(p, "a replay or batch")
    p.add_argument("--trigger", default=None, help="micro-batch interval (default 1 second)")
    p.add_argument(
        "--until-caught-up",
        action="store_true",
        help="stop once the stream has processed everything in silver",
    )

    p = add(
        "streams",
        "views:streams_",
        "live view streams, each a query in one Spark application, the view host, "
        "which runs ingest too: list, start/stop VIEW VERSION, ensure (start the host "
        "if ingest is wanted and it is not running, then every live version's stream "
        "that is not running; what regauge_watchdog runs every minute), host (run the "
        "host in the foreground; start/stop launch it as a daemon)",
    )
    p.add_argument("action", choices=("list", "start", "stop", "ensure", "host"))
    _view_version(p, optional=True)

    p = add(
        "subscribe",
        "views:subscribe",
        "follow a view as one user sees it, pushed from Kafka instead of polling Trino: the "
        "version the user is routed to, switching (with a full copy of the new version) "
        "when a rollout moves them. Runs until Ctrl-C",
    )
    p.add_argument("view", metavar="VIEW", help="a view name, e.g. revenue_hourly")
    p.add_argument("--user", required=True, help="the Trino user whose route to follow")
    p.add_argument(
        "--from-start",
        action="store_true",
        help="start with the whole table (the compacted topic from its first record) "
        "instead of changes from now on",
    )
    p.add_argument(
        "--format",
        choices=("table", "json"),
        default="table",
        help="table: a live table of the copy; json: one JSON object per change "
        "(op reset|upsert|delete|waiting), for a program to apply",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        metavar="PORT",
        help="serve Prometheus metrics on this port (changes by op, the version "
        "followed, the delay from publishing to applying); off by default",
    )


def _versions(add: Add) -> None:
    p = add(
        "versions",
        "versions:versions",
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
    _view_version(p, optional=True)
    _source(p, "the replay")
    p.add_argument("--yes", action="store_true", help="confirm `forget`")

    p = add(
        "rollout",
        "versions:rollout",
        "route PERCENT of users to VERSION (the rest see the other live version); "
        "100 makes it the current version; every step can be undone until retirement",
    )
    _view_version(p)
    p.add_argument("percent", type=percent, help="0-100")
    p.add_argument(
        "--pin", metavar="USER", type=user, help="also pin USER to VERSION, whatever the percent"
    )
    p.add_argument("--unpin", metavar="USER", type=user, help="remove USER's pin")

    p = add(
        "autorollout",
        "versions:autorollout",
        "roll VERSION out by itself: step by step (--steps), holding each step (--hold), "
        "judging four gates (agreement, freshness, integrity, serving) and rolling everyone "
        "back to the current version if one fails; `autorollout stop VIEW` halts it where "
        "it is. Every decision is in `regauge versions show VIEW VERSION`",
    )
    p.add_argument("first", metavar="VIEW", help="the view, e.g. revenue_hourly (or: stop)")
    p.add_argument(
        "second", metavar="VERSION", help="its ready candidate, e.g. 2 (after stop: the view)"
    )
    p.add_argument(
        "--steps",
        default="1,5,25,50,100",
        help="rising percents of users, the last 100 (default 1,5,25,50,100)",
    )
    p.add_argument(
        "--hold",
        type=_non_negative_seconds,
        default=300.0,
        metavar="SECONDS",
        help="how long each step holds before its gates are judged (default 300)",
    )
    p.add_argument(
        "--unexplained-keys",
        type=_zero_or_more,
        default=0,
        metavar="N",
        help="agreement: final windows that may differ from the current version on shared "
        "columns with no restatement to explain them (default 0)",
    )
    p.add_argument(
        "--lag-versions",
        type=_zero_or_more,
        default=10,
        metavar="N",
        help="freshness: silver versions the candidate's stream may be behind (default 10)",
    )
    p.add_argument(
        "--failed-queries",
        type=_zero_or_more,
        default=0,
        metavar="N",
        help="serving: analysts' queries on the serving view that may fail during a step "
        "(default 0)",
    )
    p.add_argument(
        "--by",
        type=_by,
        default=None,
        metavar="WHO",
        help="who starts or stops it, as recorded (default: your login name)",
    )
    p.add_argument(
        "--request-id",
        type=_request_id,
        default=None,
        help="the caller's id for this request (e.g. an Airflow run id): run again with "
        "the same id, it reports the rollout's end instead of starting another",
    )

    p = add(
        "page",
        "versions:page",
        "the rollout page as HTML (what Airflow shows under Browse > regauge rollouts), "
        "or --json: per view, its live versions and their share of analysts, who sees "
        "which version and why, the rollouts and their gates' figures, each version's "
        "freshness, the latest audit, and the candidate's difference per hour",
    )
    p.add_argument("views", nargs="*", metavar="VIEW", help="the views (default: every one)")
    p.add_argument("--json", action="store_true", help="the page's figures as JSON")

    p = add(
        "retire",
        "versions:retire",
        "retire a version no user is routed to: stop its stream, drop it from Trino, "
        "archive its table",
    )
    _view_version(p)

    p = add(
        "trigger",
        "versions:trigger",
        "trigger an Airflow DAG through its REST API and follow it, e.g. "
        "`regauge trigger regauge_reprocess view=revenue_hourly version=2`",
    )
    p.add_argument("dag_id")
    p.add_argument("conf", nargs="*", metavar="KEY=VALUE", help="the run's params")
    p.add_argument("--no-wait", action="store_true", help="return once the run exists")


def _checks(add: Add) -> None:
    p = add(
        "audit",
        "checks:audit",
        "check every layer against the one it derives from (Kafka -> bronze -> silver -> "
        "gold, and routing); exit 1 on any mismatch; results in lakehouse.gold.audit_runs",
    )
    p.add_argument(
        "--sample",
        type=float,
        default=None,
        metavar="FRACTION",
        help="check a random FRACTION (0-1) of each view's windows, and of the event ids "
        "whose silver, quarantine and ledger rows are re-derived from bronze, instead of all",
    )
    p.add_argument(
        "--checks",
        type=subset(AUDIT_CHECKS),
        default=None,
        help="comma-separated subset of " + ",".join(AUDIT_CHECKS) + " (default: all)",
    )

    p = add(
        "forget",
        "checks:forget",
        "erase one customer from every place regauge keeps data (docs/contract.md §8): bronze, "
        "silver, the ledger, the quarantine, every view version (archived ones too), the "
        "restatements, the dbt marts, the reference data and Delta's history; ingest and "
        "replays skip their Kafka records until retention deletes them. Stops ingest and "
        "the streams meanwhile (minutes); logged without the id in ops.control.erasures",
    )
    p.add_argument(
        "what",
        choices=("customer", "resume", "airflow-runs"),
        help="a customer (give its ID); resume: finish the erasure ID that failed after the "
        "lake began to change (no customer id needed), starting again what it stopped; or "
        "airflow-runs: delete the succeeded regauge_forget runs from Airflow, whose params "
        "hold the id (regauge_audit does it every hour)",
    )
    p.add_argument(
        "id",
        type=_customer_id,
        nargs="?",
        metavar="ID",
        help="the customer_id, e.g. cust-00042 (any 1-64 characters); or - to read it from "
        "stdin, which keeps it out of the process list that every local account can read "
        "(regauge_forget does). For resume, the erasure_id of ops.control.erasures",
    )
    p.add_argument(
        "--request-id",
        type=_request_id,
        help="your id for this request (regauge_forget gives its run id): run again under "
        "the same one, the erasure resumes after the last step it completed",
    )
    p.add_argument(
        "--reason",
        default="erasure request",
        help="why, for the erasure log: plain words without the id, e.g. 'GDPR request 1234'",
    )

    p = add(
        "readmit",
        "checks:readmit",
        "validate again, under the contract version the lake runs (`regauge sources deploy`), "
        "every record of SOURCE quarantined with REASON, and settle each as if it had "
        "passed when it arrived (docs/contract.md §10): first in log order wins, exact "
        "duplicates counted, conflicts and records that still fail stay quarantined with "
        "today's reason. Stops ingest meanwhile; logged in ops.control.readmissions; a "
        "run that did not finish is resumed by the next, admitting nothing twice",
    )
    p.add_argument("source", metavar="SOURCE", help="the source, e.g. shop")
    p.add_argument(
        "--reason",
        default="unsupported_schema_version",
        help="the quarantine reason whose records to examine (default: unsupported_schema_version)",
    )

    p = add(
        "maintain",
        "checks:maintain",
        "compact (a view version's table: lay out by its window start), checkpoint "
        "and VACUUM every Delta table regauge writes (the "
        "regauge_maintenance DAG runs it daily). Files a newer version replaced are kept "
        "REGAUGE_MAINTENANCE_RETENTION_HOURS (168) or longer, while a stream's checkpoint, "
        "a replay waiting for its stream or the audit still needs an older version; "
        "safe beside ingest and the streams",
    )
    p.add_argument(
        "--table",
        dest="tables",
        action="append",
        default=[],
        metavar="SCHEMA.NAME",
        help="only this table, e.g. silver.shop_events (repeatable; default: all)",
    )
    p.add_argument(
        "--retention-hours",
        type=_non_negative,
        default=None,
        metavar="H",
        help="keep replaced files at least H hours instead of the configured retention "
        "(readers that need older versions still make it longer)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="only show each table's files, retention and the reader holding it",
    )

    p = add(
        "clean-airflow",
        "checks:clean_airflow",
        "delete Airflow's records of runs (runs, task instances, jobs, XComs, its audit "
        "log; each DAG's latest run stays) and task log files older than "
        "REGAUGE_AIRFLOW_KEEP_DAYS (14): the watchdog alone makes 1,440 runs a day "
        "(the regauge_maintenance DAG runs it daily)",
    )
    p.add_argument(
        "--keep-days",
        type=_non_negative,
        default=None,
        metavar="DAYS",
        help="keep this many days instead of REGAUGE_AIRFLOW_KEEP_DAYS",
    )
    p.add_argument("--dry-run", action="store_true", help="only count what would be deleted")

    p = add(
        "dbt",
        "checks:dbt",
        "run dbt on silver in this process (dbt-spark, session method), e.g. "
        "`regauge dbt build --select fct_orders+`; the profile comes from the settings, "
        "and after build/run every mart is published to Trino as lakehouse.marts.<model>",
    )
    p.add_argument("dbt_args", nargs=argparse.REMAINDER, help="dbt's own arguments")

    p = add("query", "checks:query", "run SQL through Trino and print the result as a table")
    p.add_argument("sql", help="the SQL statement")
    p.add_argument(
        "--user",
        type=user,
        default="regauge",
        help="Trino user name, e.g. analyst.alice: what it may read follows "
        "infra/trino/rules.json (default regauge, the pipeline: full access)",
    )
    p.add_argument(
        "--format",
        choices=QUERY_FORMATS,
        default="table",
        help="table (default), csv (with a header) or json (one object per row)",
    )


def _tools(add: Add) -> None:
    p = add(
        "chaos",
        "tools:chaos",
        "inject real faults into the running pipeline (kill -9 ingest, a broker, views; "
        "crashes between commit and checkpoint; poison pills, re-sends, clock skew; "
        "Kafka deleting unread data), prove nothing was lost or doubled, then audit; "
        "what `make chaos` runs",
    )
    p.add_argument(
        "--events",
        type=positive_int,
        default=200_000,
        help="size of the kill -9 run; the other cases use a tenth (default 200000)",
    )
    p.add_argument("--kills", type=positive_int, default=5, help="kill -9s of ingest (default 5)")
    p.add_argument(
        "--cases",
        type=subset(CHAOS_CASES),
        default=None,
        help="comma-separated subset of " + ",".join(CHAOS_CASES) + " (default: all)",
    )
    p.add_argument("--seed", type=int, default=None, help="seed the fault timing, to repeat it")

    p = add(
        "soak",
        "tools:soak",
        "steady traffic for hours with regauge_maintenance triggered every 10 minutes; "
        "samples file counts, the serving query, freshness and micro-batches, and says "
        "whether they stayed flat; writes docs/bench/soak-<time>.json and .png; what "
        "`make soak` runs",
    )
    p.add_argument(
        "--minutes", type=positive_int, default=120, help="how long to run (default 120)"
    )
    p.add_argument(
        "--rate", type=positive_int, default=50, help="events per second produced (default 50)"
    )
    p.add_argument(
        "--every", type=positive_int, default=5, help="minutes between samples (default 5)"
    )
    p.add_argument(
        "--maintenance-every",
        type=positive_int,
        default=10,
        help="minutes between regauge_maintenance runs (default 10)",
    )
    p.add_argument("--out", type=Path, default=BENCH_OUT, help="where the JSON and PNG go")

    # The defaults live in tools.bench.sizes, which imports nothing heavy.
    from warehouse.tools.bench.sizes import PHASES, Sizes

    sizes = Sizes()
    p = add(
        "bench",
        "tools:bench",
        "measure the pipeline on this machine, each figure beside a baseline from the same "
        "run (producer vs a bare confluent-kafka loop, ingest vs a bare consumer, the replay "
        "of every view vs DuckDB, a one-event view micro-batch over a 10x larger history vs a "
        "smaller one, Trino over 1,000 one-row commits vs after maintenance, freshness vs "
        "the trigger interval, a serving query vs SELECT 1, peak memory); writes JSON and a "
        "PNG and appends to docs/BENCHMARKS.md. "
        "Sends real traffic to the local stack; what `make bench` runs",
    )
    p.add_argument(
        "--events",
        type=positive_int,
        default=sizes.events,
        help=f"records produced, ingested and replayed (default {sizes.events}; the replay "
        "also covers whatever silver held before)",
    )
    p.add_argument(
        "--load-rate",
        type=positive_int,
        default=int(sizes.load_rate),
        help=f"events/s of steady load while freshness is probed (default {sizes.load_rate:g})",
    )
    p.add_argument(
        "--freshness-seconds",
        type=positive_int,
        default=int(sizes.freshness_s),
        help=f"how long freshness is probed, one probe every {sizes.probe_every_s:g} s "
        f"(default {sizes.freshness_s:g})",
    )
    p.add_argument(
        "--history-events",
        type=positive_int,
        default=sizes.history_events,
        help="events of the small history a one-event view micro-batch is timed over; the "
        f"large one has {sizes.history_factor}x as many (default {sizes.history_events}; "
        "500000 gives 0.5 M and 5 M, about 15 minutes more)",
    )
    p.add_argument(
        "--small-file-commits",
        type=positive_int,
        default=sizes.small_file_commits,
        help="one-row commits before Trino's p50 is compared with its p50 after "
        f"maintenance (default {sizes.small_file_commits})",
    )
    p.add_argument(
        "--queries",
        type=positive_int,
        default=sizes.queries,
        help=f"runs of each timed query (default {sizes.queries})",
    )
    p.add_argument(
        "--phases",
        type=subset(PHASES),
        default=PHASES,
        help="comma-separated subset of " + ",".join(PHASES) + " (default: all; "
        "throughput is the producer and ingest; freshness alone takes 6 to 8 minutes)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=BENCH_OUT,
        help="where the run's JSON and PNG go (default docs/bench)",
    )
    p.add_argument(
        "--no-doc", action="store_true", help="do not append the run to docs/BENCHMARKS.md"
    )

    p = add(
        "demo",
        "tools:demo",
        "the pipeline end to end: a chaos mix -> Kafka -> bronze -> silver + quarantine; "
        "revenue_hourly v1 serving, v2 reprocessed through Airflow while events flow, "
        "rolled out to 10/50/100 %% of analysts, v1 retired; then the numbers from Trino",
    )
    p.add_argument(
        "--events", type=positive_int, default=20_000, help="records to produce (default 20000)"
    )
