"""`regauge views|streams`: view versions run in the foreground, and their daemons."""

from __future__ import annotations

import argparse
import sys
import threading

from spark_jobs import views as views_mod
from warehouse.base import settings as settings_mod
from warehouse.base.sqlnames import UnsafeNameError, check_user
from warehouse.ops import exporter, ingest_ctl, processes, streams
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
    s = settings_mod.get()
    subscriber = Subscriber(s, args.view, args.user, from_start=args.from_start)
    if args.metrics_port is not None:
        try:
            url = exporter.listen(s, args.metrics_port, "choose another --metrics-port")
        except OSError as exc:
            print(f"regauge: {exc}", file=sys.stderr)
            return 2
        print(f"metrics on {url}", file=sys.stderr, flush=True)
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
    """The copy as a table, redrawn twice a second (newest rows by key last)."""
    from rich.live import Live
    from rich.table import Table
    from rich.text import Text

    copy = Copy()
    lock = threading.Lock()
    shown = 20

    def render() -> Table:
        with lock:
            version, gold, n = copy.version, copy.gold_version, len(copy.rows)
            rows = [copy.rows[k] for k in sorted(copy.rows)[-shown:]]
        where = f"v{version}" if version is not None else "no live version yet"
        table = Table(
            title=f"{subscriber.view} as {subscriber.user} sees it: {where}",
            caption=f"{n:,} rows, as of gold commit {gold}; the last {shown} by key. Ctrl-C stops",
        )
        for column in rows[0] if rows else ["(no rows yet)"]:
            table.add_column(column)
        for row in rows:
            # Text, not markup: a value like "[/x]" is data.
            table.add_row(*[Text(str(v)) for v in row.values()])
        return table

    def apply(change: Change) -> None:
        with lock:
            copy.apply(change)

    # Live calls render on its own thread at each refresh, not once per change: a
    # whole table arriving would otherwise be sorted once per row.
    with Live(get_renderable=render, refresh_per_second=2):
        subscriber.follow(apply, stop)
