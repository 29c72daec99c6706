"""`regauge versions|rollout|retire|trigger`: build a new version, move users, retire the old."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from datetime import datetime
from typing import Any

from warehouse.base import settings as settings_mod
from warehouse.base.settings import Settings
from warehouse.ops import airflow_client, lifecycle, streams, writers
from warehouse.sql import versions as registry


def versions(args: argparse.Namespace) -> int:
    s = settings_mod.get()
    action = args.action
    if action == "list":
        rows = registry.versions(s, args.view)
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
        return _show(s, view, version)
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
    if action in ("register", "build"):
        # A new version's replay reads silver as it is: not beside an erasure.
        with writers.beside_erasure_refused(s, f"`regauge versions {action}`"):
            print(step())
        return 0
    print(step())
    return 0


def _when(at: datetime | None) -> str:
    return at.strftime("%Y-%m-%d %H:%M") if at else "-"


def _show(s: Settings, view: str, version: int) -> int:
    v = registry.get(s, view, version)
    pid = streams.pid(s, view, version)
    print(f"{v.label}: {v.status}, {v.rollout_percent} % of users")
    print(
        f"  created {_when(v.created_at)}, ready {_when(v.ready_at)}, retired {_when(v.retired_at)}"
    )
    print(f"  built from {v.source_position or '-'}")
    print(
        f"  stream: {'running in the view host, pid ' + str(pid) if pid else 'not running'} "
        f"(log {streams.host(s).log})"
    )
    pinned = sorted(u for u, pv in registry.pins(s, view).items() if pv == version)
    print(f"  pinned users: {', '.join(pinned) or 'none'}")
    if v.validation:
        print(
            f"  validation: {'passed' if v.validation.get('passed') else 'FAILED'}: "
            f"{v.validation.get('summary', '')}"
        )
    print("  history:")
    for e in registry.events(s, view):
        if e["version"] == version:
            print(f"    {_when(e['at'])}  {e['action']:<10} {e['detail']}")
    return 0


def page(args: argparse.Namespace) -> int:
    """`regauge page [VIEW...] [--json]`: what the rollout page shows."""
    from warehouse.base import page as shown
    from warehouse.base.sqlnames import check_identifier
    from warehouse.ops import page as gathered

    views = [check_identifier(v, "view") for v in args.views] or None
    got = gathered.gather(settings_mod.get(), views)
    print(
        json.dumps(gathered.as_json(got), indent=2, default=str) if args.json else shown.render(got)
    )
    return 0


def rollout(args: argparse.Namespace) -> int:
    for line in lifecycle.rollout(
        settings_mod.get(), args.view, args.version, args.percent, args.pin, args.unpin
    ):
        print(line)
    return 0


def retire(args: argparse.Namespace) -> int:
    for line in lifecycle.retire(settings_mod.get(), args.view, args.version):
        print(line)
    return 0


def trigger(args: argparse.Namespace) -> int:
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


def autorollout(args: argparse.Namespace) -> int:
    """`regauge autorollout VIEW VERSION [...]` or `regauge autorollout stop VIEW`."""
    import getpass

    from warehouse.base import autorollout as rules
    from warehouse.base.sqlnames import check_identifier
    from warehouse.ops import autorollout as driver

    first, second = args.first, args.second
    by = args.by or getpass.getuser()
    s = settings_mod.get()
    try:
        if first == "stop":
            print(driver.stop(s, check_identifier(second, "view"), by))
            return 0
        if not second.isdigit() or int(second) < 1:
            print(f"regauge: autorollout: version {second!r} must be 1 or more", file=sys.stderr)
            return 2
        plan = rules.plan(
            check_identifier(first, "view"),
            int(second),
            args.steps,
            args.hold,
            rules.Thresholds(args.unexplained_keys, args.lag_versions, args.failed_queries),
        )
    except rules.PlanError as exc:
        print(f"regauge: autorollout: {exc}", file=sys.stderr)
        return 2
    print(f"{plan.view}: rolling out {plan.describe()}")

    def terminated(signum: int, frame: object) -> None:
        raise driver.Terminated(f"signal {signum}")

    # Airflow kills a task whose run is marked failed with SIGTERM: stop cleanly.
    signal.signal(signal.SIGTERM, terminated)
    r = driver.run(s, plan, by, args.request_id)
    print(f"{r.view_name} v{r.version}: rollout {r.state.replace('_', ' ')}: {r.why}")
    # A rollback is the gates doing their job, but a caller (Airflow) must see it.
    return 0 if r.state == "completed" else 1
