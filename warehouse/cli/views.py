"""`regauge views|streams`: view versions run in the foreground, and their daemons."""

from __future__ import annotations

import argparse
import sys

from spark_jobs import views as views_mod
from warehouse.base import settings as settings_mod
from warehouse.ops import ingest_ctl, processes, streams


def views(args: argparse.Namespace) -> int:
    if args.action == "list":
        for (name, version), view in sorted(views_mod.discover().items()):
            print(f"{name} v{version}: {view.description} (key {', '.join(view.key)})")
        return 0
    if not args.view or args.version is None:
        print("regauge: views run needs VIEW VERSION", file=sys.stderr)
        return 2
    try:
        view = views_mod.get(args.view, args.version)
    except KeyError as exc:
        print(f"regauge: {exc.args[0]}", file=sys.stderr)
        return 2
    return processes.run_view(
        settings_mod.get(),
        view,
        mode=args.mode,
        source=args.source,
        trigger=args.trigger,
        until_caught_up=args.until_caught_up,
    )


def streams_(args: argparse.Namespace) -> int:
    s = settings_mod.get()
    if args.action == "host":
        return processes.run_view_host(s)
    if args.action == "list":
        host = streams.host(s)
        pid = host.pid()
        print(f"view host: {'running, pid ' + str(pid) if pid else 'not running'} (log {host.log})")
        found = streams.known(s)
        for st in found:
            print(f"  {st.view} v{st.version}: {st.state}")
        if not found:
            print("  no view stream is wanted")
        return 0
    if args.action == "ensure":
        # Ingest first: every view's stream waits for what it writes.
        restarted = ingest_ctl.ensure(s)
        for line in ([restarted] if restarted else []) + (
            streams.ensure(s) or ["every live version's stream is running"]
        ):
            print(line)
        return 0
    if args.view is None or args.version is None:
        print(f"regauge: streams {args.action} needs VIEW VERSION", file=sys.stderr)
        return 2
    act = streams.start if args.action == "start" else streams.stop
    print(act(s, args.view, args.version))
    return 0
