"""How `regauge query` prints a result: table, CSV and JSON lines, exact values kept."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime
from decimal import Decimal

import pytest

from warehouse.sql.trino_client import FORMATS, Result, format_csv, format_json, format_table

RESULT = Result(
    ["segment", "country", "net_revenue", "at"],
    [
        ("vip", "FR", Decimal("969550.03"), datetime(2026, 1, 2, 1, tzinfo=UTC)),
        ("business, large", None, Decimal("0.10"), None),
    ],
)


def test_csv_has_a_header_quotes_commas_and_leaves_null_empty():
    rows = list(csv.reader(io.StringIO(format_csv(RESULT))))
    assert rows == [
        ["segment", "country", "net_revenue", "at"],
        ["vip", "FR", "969550.03", "2026-01-02 01:00:00+00:00"],
        ["business, large", "", "0.10", ""],
    ]


def test_json_is_one_object_per_row_with_exact_decimals():
    lines = [json.loads(line) for line in format_json(RESULT).splitlines()]
    assert lines == [
        {
            "segment": "vip",
            "country": "FR",
            "net_revenue": "969550.03",
            "at": "2026-01-02 01:00:00+00:00",
        },
        {"segment": "business, large", "country": None, "net_revenue": "0.10", "at": None},
    ]


def test_the_table_says_null_and_counts_rows():
    text = format_table(RESULT)
    assert "NULL" in text and "969550.03" in text and text.endswith("(2 rows)")


def test_the_cli_offers_exactly_the_formats_there_are():
    from warehouse.cli.parser import build_parser

    args = build_parser().parse_args(["query", "SELECT 1", "--format", "csv"])
    assert args.format == "csv"
    for name in FORMATS:
        assert build_parser().parse_args(["query", "SELECT 1", "--format", name]).format == name
    with pytest.raises(SystemExit):
        build_parser().parse_args(["query", "SELECT 1", "--format", "xml"])
