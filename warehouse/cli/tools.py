"""`regauge chaos|bench|demo`: faults, measurements and the whole story, on the real stack."""

from __future__ import annotations

import argparse

from spark_jobs.engine.session import build_session
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


def soak(args: argparse.Namespace) -> int:
    from warehouse.tools import soak as soak_mod

    result = soak_mod.run(
        settings_mod.get(),
        minutes=args.minutes,
        rate=args.rate,
        every_min=args.every,
        maintenance_every_min=args.maintenance_every,
        out_dir=args.out,
    )
    print(f"\nsoak: {len(result.samples)} samples, {len(result.maintenance_runs)} maintenance runs")
    for name, verdict in result.verdicts.items():
        print(f"  {name:<40} {verdict}")
    grew = [n for n, v in result.verdicts.items() if v.startswith("GREW")]
    print(f"soak: {'grew: ' + ', '.join(grew) if grew else 'everything stayed flat'}")
    return 1 if grew else 0


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
