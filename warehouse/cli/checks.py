"""`regauge audit|maintain|dbt|query|forget`: verify the layers, keep the tables
small, build the dbt project, ask Trino, erase a customer."""

from __future__ import annotations

import argparse
import re
import sys

from spark_jobs.engine.session import build_session
from warehouse.base import settings as settings_mod
from warehouse.ops import audit as audit_mod
from warehouse.ops import dbt_runner
from warehouse.sql import trino_client


def audit(args: argparse.Namespace) -> int:
    s = settings_mod.get()
    spark = build_session("regauge-audit", s, ui=False, one_shot=True)
    try:
        run = audit_mod.run(s, spark, args.checks or audit_mod.CHECKS, args.sample)
    finally:
        spark.stop()
    print(trino_client.format_table(audit_mod.describe(run)))
    print(audit_mod.verdict(run))
    return 0 if run.passed else 1


def clean_airflow(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime, timedelta

    from warehouse.ops.stack.airflow import Airflow

    s = settings_mod.get()
    days = s.airflow_keep_days if args.keep_days is None else args.keep_days
    before = datetime.now(UTC) - timedelta(days=days)
    cleaned = Airflow(s).clean(before, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    print(cleaned.output.strip())
    print(
        f"Airflow's records before {before:%Y-%m-%d %H:%M} UTC ({days:g} days kept): "
        f"{verb} {cleaned.log_files} task log files ({cleaned.log_bytes / 2**20:.1f} MiB)"
    )
    return 0


def dbt(args: argparse.Namespace) -> int:
    from warehouse.ops import writers

    s = settings_mod.get()
    with writers.beside_erasure_refused(s, "`regauge dbt`"):
        return dbt_runner.run(s, args.dbt_args or ["--help"])


def query(args: argparse.Namespace) -> int:
    if not args.sql.strip():
        # Trino answers an empty statement with an HTTP 400, not a query error.
        print("regauge: query: the SQL is empty; give one statement", file=sys.stderr)
        return 2
    result = trino_client.query(settings_mod.get(), args.sql, user=args.user)
    print(trino_client.FORMATS[args.format](result))
    return 0


def forget(args: argparse.Namespace) -> int:
    from warehouse.base.sqlnames import check_customer_id, check_reason
    from warehouse.ops import erasure

    if args.what == "airflow-runs":
        if args.id is not None or args.request_id is not None:
            print("regauge: forget airflow-runs takes no ID and no --request-id", file=sys.stderr)
            return 2
        deleted = erasure.scrub_airflow_runs(settings_mod.get())
        print(f"{deleted} succeeded {erasure.FORGET_DAG} runs deleted from Airflow")
        return 0
    if args.what == "resume":
        return _resume(args)
    if args.id is None:
        print("regauge: forget customer needs the customer's ID, e.g. cust-00042", file=sys.stderr)
        return 2
    customer = args.id
    if customer == "-":
        # All of stdin but the newline that ends it (a here-string or `echo` adds
        # one): an id may itself hold a newline, or end in a space.
        given = sys.stdin.read()
        customer = check_customer_id(given[:-1] if given.endswith("\n") else given)
    check_reason(args.reason, customer)  # before anything stops
    report = erasure.forget_customer(settings_mod.get(), customer, args.reason, args.request_id)
    for line in report.lines():
        print(line)
    return 0


def _resume(args: argparse.Namespace) -> int:
    from warehouse.ops import erasure

    if args.id is None or not re.fullmatch(r"[0-9a-f]{32}", args.id):
        print(
            "regauge: forget resume needs an erasure_id (32 hex digits) from "
            "ops.control.erasures, e.g. of the erasure whose status is failed",
            file=sys.stderr,
        )
        return 2
    if args.request_id is not None:
        print("regauge: forget resume takes no --request-id", file=sys.stderr)
        return 2
    try:
        report = erasure.resume(settings_mod.get(), args.id)
    except ValueError as exc:
        print(f"regauge: {exc}", file=sys.stderr)
        return 2
    for line in report.lines():
        print(line)
    return 0


def readmit(args: argparse.Namespace) -> int:
    from warehouse.ops import readmit as readmit_mod

    try:
        run = readmit_mod.readmit(settings_mod.get(), args.source, args.reason)
    except ValueError as exc:
        print(f"regauge: {exc}", file=sys.stderr)
        return 2
    resumed = ", resuming the run that did not finish" if run.resumed else ""
    print(
        f"re-admission {run.readmission_id} under contract version "
        f"{run.contract_version}{resumed}: {run.summary}"
    )
    return 0


def maintain(args: argparse.Namespace) -> int:
    from warehouse.ops import maintenance, writers

    s = settings_mod.get()
    try:
        with writers.beside_erasure_refused(s, "`regauge maintain`"):
            rows = maintenance.maintain(s, args.tables, args.retention_hours, args.dry_run)
    except ValueError as exc:
        print(f"regauge: {exc}", file=sys.stderr)
        return 2
    header = maintenance.DRY_RUN_HEADER if args.dry_run else maintenance.HEADER
    print(trino_client.format_table(trino_client.Result(header, [tuple(r) for r in rows])))
    return 0
