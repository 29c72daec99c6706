"""`regauge`: the command line for engineers (and for Airflow's tasks).

Every subcommand prints what it did; failures print one line saying what went
wrong and what to do, and exit non-zero.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

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
    from warehouse.stack import services

    services.down(settings_mod.get(), args.services)
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

    summary = producer.produce_sample(settings_mod.get(), count=args.count, run_id=args.run_id)
    print(summary.describe())
    return 0 if summary.failed == 0 else 1


def cmd_bronze(args: argparse.Namespace) -> int:
    from spark_jobs import bronze
    from spark_jobs.session import build_session

    s = settings_mod.get()
    spark = build_session("regauge-bronze", s)
    rows = bronze.run_once(spark, s)
    print(f"bronze: {rows} rows in {bronze.BRONZE.trino_name}")
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from warehouse import trino_client

    result = trino_client.query(settings_mod.get(), args.sql, user=args.user)
    print(trino_client.format_table(result))
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

    p = add("produce", cmd_produce, "produce sample events to the shop.events topic")
    p.add_argument(
        "--count", type=_positive_int, default=1000, help="events to send (default 1000)"
    )
    p.add_argument("--run-id", default=None, help="tag for the events (default: random)")

    add("bronze", cmd_bronze, "copy everything new in Kafka into the bronze table, then stop")

    p = add("query", cmd_query, "run SQL through Trino and print the result as a table")
    p.add_argument("sql", help="the SQL statement")
    p.add_argument("--user", default="regauge", help="Trino user name (default regauge)")

    p = add("demo", cmd_demo, "the walking skeleton: events -> Kafka -> bronze -> Trino")
    p.add_argument("--events", type=_positive_int, default=2000, help="events to produce")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _configure_logging(args.verbose)
    from trino.exceptions import TrinoUserError

    from warehouse.sqlnames import UnsafeNameError
    from warehouse.stack.artifacts import SetupError
    from warehouse.stack.process import ServiceError

    try:
        return int(args.handler(args))
    except (SetupError, ServiceError, settings_mod.SettingsError, UnsafeNameError) as exc:
        print(f"regauge: {exc}", file=sys.stderr)
        return 2
    except TrinoUserError as exc:
        print(f"regauge: Trino refused the query: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("regauge: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
