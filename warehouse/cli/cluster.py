"""`regauge cluster fetch|up|down|status|env|run`: the one-box cluster."""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

from warehouse.base.settings import Settings
from warehouse.cli.parser import build_parser
from warehouse.cli.stack import print_status
from warehouse.ops.stack import artifacts, cluster


def main(args: argparse.Namespace) -> int:
    # Everything below, and every process it starts (Airflow's tasks, the view
    # host), reads the cluster's settings from the environment.
    if args.argv and args.action != "run":
        # `argv` takes the rest of the line for run (argparse.REMAINDER), a `--help`
        # after another action too: `regauge cluster up --help` started the cluster.
        if {"-h", "--help"} & set(args.argv):
            build_parser().parse_args(["cluster", "--help"])  # prints it, exits 0
        print(
            f"regauge: cluster {args.action} takes no further arguments "
            f"(got {shlex.join(args.argv)}); only run takes a command",
            file=sys.stderr,
        )
        return 2
    os.environ.update(cluster.env())
    s = cluster.settings()
    if args.action == "fetch":
        for what, path in artifacts.fetch_cluster(s).items():
            print(f"{what:<17} {path}")
        return 0
    if args.action == "up":
        cluster.up(s)
        return status(s)
    if args.action == "down":
        stopped = cluster.down(s)
        print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
        return 0
    if args.action == "status":
        return status(s)
    if args.action == "env":
        for var, value in cluster.env().items():
            print(f"export {var}={shlex.quote(value)}")
        return 0
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        print(
            "regauge: cluster run needs a command, e.g. `regauge cluster run -- regauge status`",
            file=sys.stderr,
        )
        return 2
    return subprocess.call(argv)


def status(settings: Settings) -> int:
    title = f"regauge one-box cluster (state in {settings.state_dir})"
    return 0 if print_status(title, cluster.members(settings)) else 1
