"""`regauge views|streams`: view versions run in the foreground, and their daemons."""

from __future__ import annotations

import argparse
import sys
import threading
import time

from spark_jobs import views as views_mod
from warehouse.base import settings as settings_mod
from warehouse.base.sqlnames import UnsafeNameError, check_user
from warehouse.ops import ingest_ctl, processes, streams
from warehouse.ops.subscribe import Change, Copy, Subscriber


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


def subscribe(args: argparse.Namespace) -> int:
    known = sorted({name for name, _ in views_mod.discover()})
    if args.view not in known:
        print(f"regauge: unknown view {args.view!r}; known: {', '.join(known)}", file=sys.stderr)
        return 2
    try:
        check_user(args.user)
    except UnsafeNameError as exc:
        print(f"regauge: {exc}", file=sys.stderr)
        return 2
    subscriber = Subscriber(settings_mod.get(), args.view, args.user, from_start=args.from_start)
    stop = threading.Event()
    try:
        if args.format == "json":
            subscriber.follow(_print_json, stop)
        else:
            _live_table(subscriber, stop)
    except KeyboardInterrupt:
        stop.set()
    return 0


def _print_json(change: Change) -> None:
    print(change.as_json(), flush=True)


def _live_table(subscriber: Subscriber, stop: threading.Event) -> None:
    """The copy as a table, redrawn at most twice a second (newest rows by key last)."""
    from rich.live import Live
    from rich.table import Table
    from rich.text import Text

    copy = Copy()
    shown = 20

    def render() -> Table:
        where = f"v{copy.version}" if copy.version is not None else "no live version yet"
        table = Table(
            title=f"{subscriber.view} as {subscriber.user} sees it: {where}",
            caption=f"{len(copy.rows):,} rows, as of gold commit {copy.gold_version}; "
            f"the last {shown} by key. Ctrl-C stops",
        )
        rows = [copy.rows[k] for k in sorted(copy.rows)[-shown:]]
        for column in rows[0] if rows else ["(no rows yet)"]:
            table.add_column(column)
        for row in rows:
            # Text, not markup: a value like "[/x]" is data.
            table.add_row(*[Text(str(v)) for v in row.values()])
        return table

    drawn = [0.0]
    with Live(render(), refresh_per_second=2) as live:

        def show(change: Change) -> None:
            copy.apply(change)
            now = time.monotonic()
            # Sorting the copy on every change would be quadratic over a whole table.
            if now - drawn[0] >= 0.5 or change.op in ("reset", "waiting"):
                drawn[0] = now
                live.update(render())

        subscriber.follow(show, stop)
