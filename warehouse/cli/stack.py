"""`regauge setup|up|down|status|settings`: the local stack."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from warehouse.base import settings as settings_mod
from warehouse.ops import ingest_ctl, streams
from warehouse.ops.stack import artifacts, services
from warehouse.ops.stack.base import Service


def setup(args: argparse.Namespace) -> int:
    where = artifacts.fetch_all(settings_mod.get())
    for what, path in where.items():
        print(f"{what:<11} {path}")
    return 0


def up(args: argparse.Namespace) -> int:
    services.up(settings_mod.get(), args.services)
    return status(args)


def down(args: argparse.Namespace) -> int:
    s = settings_mod.get()
    if not args.services:
        # Airflow first, so its watchdog cannot restart a stream stopped next; then
        # the pipeline's own daemons, which would fail once Kafka is gone.
        services.down(s, ["airflow"])
        # What is wanted stays: the next `streams ensure` brings it back.
        if streams.stop_host(s):
            print("view host stopped (ingest and every view stream in it)")
    services.down(s, args.services)
    return 0


def status(args: argparse.Namespace) -> int:
    s = settings_mod.get()
    all_up = print_status(
        f"regauge stack ({s.profile} profile, state in {s.state_dir})",
        services.services(s, getattr(args, "services", ())),
    )
    (kafka,) = services.services(s, ["kafka"])
    print(ingest_ctl.describe(s, kafka_up=kafka.status().healthy)[1])
    return 0 if all_up or not getattr(args, "check", False) else 1


def print_status(title: str, members: Sequence[Service]) -> bool:
    """A table of each service's processes; whether every service is healthy."""
    table = Table(title=title)
    for col in ("service", "state", "port", "pid", "memory", "log", "where"):
        table.add_column(col)
    all_up = True
    total_rss = 0
    for svc in members:
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
    return all_up


def settings(args: argparse.Namespace) -> int:
    s = settings_mod.get()
    for f in dataclasses.fields(s):
        value = getattr(s, f.name)
        # Never echo a secret: say only whether it is set.
        if value and any(word in f.name for word in ("password", "secret")):
            value = "(set)"
        print(f"{f.name:<26} {value}")
    print("\nOverride any value with its variable:")
    for var, (attr, _) in settings_mod.OVERRIDES.items():
        print(f"  {var:<32} -> {attr}")
    return 0
