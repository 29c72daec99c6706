"""`regauge chaos|bench|demo`: faults, measurements and the whole story, on the real stack."""

from __future__ import annotations

import argparse

from spark_jobs.session import build_session
from warehouse.base import settings as settings_mod
from warehouse.tools import bench as bench_mod
from warehouse.tools import chaos as chaos_mod
from warehouse.tools import demo as demo_mod


def chaos(args: argparse.Namespace) -> int:
    s = settings_mod.get()
    cases = tuple(args.cases or chaos_mod.CASES)
    # Before Spark starts: a refusal costs no JVM.
    chaos_mod.check_view_unregistered(s, cases)
    spark = build_session("regauge-chaos", s, ui=False)
    try:
        outcomes = chaos_mod.run(
            s, spark, events=args.events, kills=args.kills, cases=cases, seed=args.seed
        )
    finally:
        spark.stop()
    print("\n" + chaos_mod.table(outcomes))
    failed = [o.case for o in outcomes if not o.ok]
    print(
        f"\nchaos: {'FAILED: ' + ', '.join(failed) if failed else 'every case exact; audit passed'}"
    )
    return 1 if failed else 0


def bench(args: argparse.Namespace) -> int:
    sizes = bench_mod.Sizes(
        events=args.events,
        load_rate=args.load_rate,
        freshness_s=args.freshness_seconds,
        queries=args.queries,
        history_events=args.history_events,
        small_file_commits=args.small_file_commits,
        phases=args.phases,
    )
    report = bench_mod.run(
        settings_mod.get(), sizes, args.out, None if args.no_doc else bench_mod.DOC
    )
    print("\n" + bench_mod.table(report))
    missed = [name for name, _, _, _, ok in bench_mod.verdicts(report.figures) if ok is False]
    # A missed target is news, not a failure: the run itself succeeded.
    print(f"\nbench: {'missed ' + ', '.join(missed) if missed else 'every target met'}")
    return 0


def demo(args: argparse.Namespace) -> int:
    return demo_mod.run(settings_mod.get(), events=args.events)
