"""`regauge produce|ingest|ingest-once`: events into Kafka, and Kafka into the lake."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime, timedelta

from spark_jobs import producer
from spark_jobs.engine import ingest
from spark_jobs.engine.session import build_session
from warehouse.base import settings as settings_mod
from warehouse.ops import ingest_ctl, pipeline, processes, writers


def produce(args: argparse.Namespace) -> int:
    s = settings_mod.get()
    run = pipeline.produce(
        s,
        seed=args.seed,
        count=args.count,
        chaos=args.chaos,
        rate=args.rate,
        start=args.start or datetime.now(UTC) - timedelta(days=args.days),
        days=args.days,
        progress=sys.stdout.isatty(),
        source=args.source,
        follows=args.follows,
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


def ingest_(args: argparse.Namespace) -> int:
    s = settings_mod.get()
    if args.action == "run":
        return processes.run_ingest(s, args.trigger)
    if args.action == "start":
        ingest_ctl.start(s, args.trigger)
        return 0
    if args.action == "stop":
        print("ingest stopped" if ingest_ctl.stop(s) else "ingest was not running")
        return 0
    running, text = ingest_ctl.describe(s)
    print(text)
    return 0 if running else 1


def ingest_once(args: argparse.Namespace) -> int:
    s = settings_mod.get()
    if args.source and args.source not in ingest.source_names():
        known = ", ".join(ingest.source_names())
        print(f"regauge: unknown source {args.source!r}; known: {known}", file=sys.stderr)
        return 2
    with writers.ingest(s, "`regauge ingest-once`"):
        spark = build_session("regauge-ingest-once", s, one_shot=True)
        try:
            pipeline.ingest_once(
                spark, s, accept_data_loss=args.accept_data_loss, source=args.source
            )
            for source in [args.source] if args.source else ingest.source_names():
                for table, rows in ingest.counts(spark, s, source).items():
                    print(f"{table:<34} {rows:>12,} rows")
        except ingest.DataLossError as exc:
            print(f"regauge: {exc}", file=sys.stderr)
            return 3
        finally:
            spark.stop()
    return 0
