"""`make chaos`'s table and its CLI, without the stack."""

from __future__ import annotations

import pytest

from warehouse.cli import parser as cli
from warehouse.tools import chaos


def test_the_summary_table_lines_up_and_says_what_failed():
    text = chaos.table(
        [
            chaos.Outcome("ingest_kills", 200_000, 197_000, 0, 0, 41.25, "5 x kill -9 of ingest"),
            chaos.Outcome("retention", 500, 500, 1, 0, 3.0, "", ["1 lost"]),
        ]
    )
    head, rule, first, second = text.splitlines()
    assert head.split()[:4] == ["case", "produced", "in", "silver"]
    assert first.split()[:7] == ["ingest_kills", "200,000", "197,000", "0", "0", "41.2", "ok"]
    assert second.split()[6] == "FAILED"
    # Right-aligned numbers end in the same column as their heading.
    assert first.index("200,000") + len("200,000") == head.index("produced") + len("produced")
    assert set(rule) == {"-", " "}


def test_the_cli_knows_every_case_and_refuses_others():
    assert cli.CHAOS_CASES == chaos.CASES
    args = cli.build_parser().parse_args(["chaos", "--cases", "retention,bad_input"])
    assert args.cases == ("retention", "bad_input")
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["chaos", "--cases", "meteor"])


def test_the_cli_knows_every_audit_check_and_refuses_others():
    from warehouse.ops import audit

    assert cli.AUDIT_CHECKS == audit.CHECKS
    args = cli.build_parser().parse_args(["audit", "--checks", "routing,kafka_bronze"])
    assert args.checks == ("routing", "kafka_bronze")
    for bad in ("meteor", "routing,meteor", ","):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(["audit", "--checks", bad])
