"""`regauge sources`: the declared sources and their contracts. Loads no Spark, but
`deploy`, which writes the lake."""

from __future__ import annotations

import argparse
import sys

from warehouse import sources as sources_mod
from warehouse.base import declare


def sources(args: argparse.Namespace) -> int:
    if args.action == "list":
        for source in sorted(sources_mod.discover().values(), key=lambda s: s.name):
            print(declare.summary(source))
        return 0
    if args.action == "check":
        return check()
    if not args.source:
        known = ", ".join(sorted(sources_mod.discover()))
        print(f"regauge: sources {args.action} needs a SOURCE; known: {known}", file=sys.stderr)
        return 2
    try:
        source = sources_mod.get(args.source)
    except KeyError as exc:
        print(f"regauge: {exc.args[0]}", file=sys.stderr)
        return 2
    if args.action == "deploy":
        return deploy(source.name, args.version)
    if args.action == "accept":
        new = sources_mod.unaccepted_versions(source)
        problems = sources_mod.accept(source)
        for problem in problems:
            print(f"regauge: {source.name}: refused: {problem}", file=sys.stderr)
        if problems:
            return 1
        said = ", ".join(map(str, new)) if new else "none new"
        print(
            f"{source.name}: contract versions accepted ({said}); recorded in "
            f"{sources_mod.accepted_path(source.name).name}"
        )
        return 0
    if args.markdown:
        print(declare.markdown(source), end="")
        return 0
    # Plain aligned columns: readable in a terminal and whole when piped.
    table = [declare.COLUMNS, *declare.rows(source)]
    widths = [max(len(row[i]) for row in table) for i in range(len(declare.COLUMNS) - 1)]
    print(declare.summary(source))
    for n, row in enumerate(table):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
        if n == 0:
            print("  ".join("-" * w for w in widths) + "  " + "-" * len(row[-1]))
    return 0


def deploy(name: str, version: int | None) -> int:
    """Run contract `version` of a source on this lake (Spark: loaded only here)."""
    from warehouse.base import settings as settings_mod
    from warehouse.ops import readmit

    if version is None:
        print(f"regauge: sources deploy {name} needs a VERSION, e.g. 2", file=sys.stderr)
        return 2
    wrong, _ = sources_mod.check()
    if wrong:
        for line in wrong:
            print(f"regauge: {line}", file=sys.stderr)
        print("regauge: refusing to deploy a contract that fails its check", file=sys.stderr)
        return 1
    try:
        deployed = readmit.deploy(settings_mod.get(), name, version)
    except ValueError as exc:
        print(f"regauge: {exc}", file=sys.stderr)
        return 2
    for line in deployed.lines():
        print(line)
    return 0


def check() -> int:
    """Every declaration against its accepted contract; 1 on any problem or a
    contract version not accepted yet (`make lint` and the view host run it)."""
    wrong, right = sources_mod.check()
    for line in right:
        print(line)
    for line in wrong:
        print(f"regauge: {line}", file=sys.stderr)
    return 1 if wrong else 0
