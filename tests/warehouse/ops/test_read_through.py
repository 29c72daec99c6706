"""What the view host says a stream has read all of (issue 69's freshness gate)."""

from warehouse.ops.processes import read_through

END = 2**63 - 101  # Delta's END_INDEX: every file of the version read


def source(path: str, version: int, index: int) -> dict[str, object]:
    offset = {"sourceVersion": 1, "reservoirVersion": version, "index": index}
    return {"description": f"DeltaSource[file:{path}]", "endOffset": offset}


def test_a_version_counts_once_all_of_it_is_read():
    progress = {
        "sources": [
            source("/lake/silver/shop_events", 12, -1),  # 12 not begun: through 11
            source("/lake/silver/web_events", 7, END),  # all of 7
            source("/lake/silver/other", 30, 4),  # part of 30: through 29
        ]
    }
    assert read_through(progress) == {
        "/lake/silver/shop_events": 11,
        "/lake/silver/web_events": 7,
        "/lake/silver/other": 29,
    }


def test_an_offset_as_json_text_and_other_sources_are_read_or_skipped():
    progress = {
        "sources": [
            {
                "description": "DeltaSource[/lake/silver/shop_events]",
                "endOffset": '{"reservoirVersion": 5, "index": -1}',
            },
            {"description": "KafkaV2[Subscribe[shop.events]]", "endOffset": {"shop.events": {}}},
            {"description": "DeltaSource[/lake/x]", "endOffset": "not json"},
        ]
    }
    assert read_through(progress) == {"/lake/silver/shop_events": 4}
    assert read_through({}) == {}
