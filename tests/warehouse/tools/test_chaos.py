"""`make chaos`'s table, without the stack."""

from __future__ import annotations

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
