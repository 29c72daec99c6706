"""`regauge sources`: the declared sources and their contracts. Loads no Spark."""

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
    if not args.source:
        known = ", ".join(sorted(sources_mod.discover()))
        print(f"regauge: sources show needs a SOURCE; known: {known}", file=sys.stderr)
        return 2
    try:
        source = sources_mod.get(args.source)
    except KeyError as exc:
        print(f"regauge: {exc.args[0]}", file=sys.stderr)
        return 2
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
