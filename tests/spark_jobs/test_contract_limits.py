"""The declaration's words for a string's pattern and length, an integer's range and
an optional field (issue 66, item 1), compiled and run by real Spark: each record
is judged as the declaration says, and the detail names the field and the rule.

One validation of every case, shared by the tests (a module fixture)."""

from __future__ import annotations

import json

import pytest

from spark_jobs.engine import contract
from tests.spark_jobs.conftest import Case, judge
from warehouse.base.declare import Count, EventType, Field, OneOf, Shape, Source, Text

SKU = r"[A-Z]{3}-[0-9]{4}"
SOURCE = Source(
    name="stock",
    topic="stock.events",
    key="warehouse_id",
    id_field="event_id",
    time_field="event_time",
    subject_field="warehouse_id",
    event_types=(
        EventType(
            "stock_counted",
            (
                Shape(
                    1,
                    (
                        Field("sku", Text(pattern=SKU)),
                        Field("shelf", Text(min_length=2, max_length=4)),
                        Field("on_hand", Count(minimum=0, maximum=10_000)),
                        Field("delta", Count(minimum=-50, maximum=50), required=False),
                        Field("note", Text(max_length=8), required=False),
                        Field("unit", OneOf(("each", "box")), required=False),
                    ),
                ),
            ),
        ),
    ),
)
GOOD = {"sku": "ABC-0001", "shelf": "A1", "on_hand": 0}


def _record(**payload: object) -> bytes:
    body = {k: v for k, v in {**GOOD, **payload}.items() if v is not ...}
    return json.dumps(
        {
            "event_id": "e1",
            "event_type": "stock_counted",
            "event_time": "2026-01-01T11:00:00.000Z",
            "warehouse_id": "w1",
            "schema_version": 1,
            "payload": body,
        }
    ).encode()


# name -> (record, reason, detail)
CASES: dict[str, Case] = {
    "the least a record holds": (_record(), None, None),
    "every optional field given": (
        _record(delta=-50, note="recount!", unit="box", on_hand=10_000, shelf="B12C"),
        None,
        None,
    ),
    "optional fields null": (_record(delta=None, note=None, unit=None), None, None),
    "sku not matching": (
        _record(sku="abc-0001"),
        "invalid_field",
        f"payload.sku must be a string matching {SKU}",
    ),
    "sku matching only in part": (
        _record(sku="ABC-00012"),
        "invalid_field",
        f"payload.sku must be a string matching {SKU}",
    ),
    "sku matching but for a final newline": (
        _record(sku="ABC-0001\n"),
        "invalid_field",
        f"payload.sku must be a string matching {SKU}",
    ),
    "shelf too short": (
        _record(shelf="A"),
        "invalid_field",
        "payload.shelf must be a string of 2-4 characters",
    ),
    "shelf too long in characters, not bytes": (
        _record(shelf="ÄÖÜßé"),
        "invalid_field",
        "payload.shelf must be a string of 2-4 characters",
    ),
    "shelf of four characters, eight bytes": (_record(shelf="ÄÖÜß"), None, None),
    "on_hand below its range": (
        _record(on_hand=-1),
        "invalid_field",
        "payload.on_hand must be an integer from 0 to 10000",
    ),
    "on_hand above its range": (
        _record(on_hand=10_001),
        "invalid_field",
        "payload.on_hand must be an integer from 0 to 10000",
    ),
    "on_hand missing": (
        _record(on_hand=...),
        "missing_field",
        "payload.on_hand is missing or null",
    ),
    "an optional field out of its range": (
        _record(delta=51),
        "invalid_field",
        "payload.delta must be an integer from -50 to 50",
    ),
    "an optional field of the wrong kind": (
        _record(note=7),
        "invalid_field",
        "payload.note must be a string of at most 8 characters",
    ),
    "an optional field not one of its values": (
        _record(unit="pallet"),
        "invalid_field",
        "payload.unit must be one of each, box",
    ),
}


@pytest.fixture(scope="module")
def verdicts(spark):
    return judge(spark, CASES, contract.plan(SOURCE))


def test_each_record_is_judged_by_the_declared_limits(verdicts):
    got = {n: (r.reject_reason, r.reject_detail) for n, r in verdicts.items()}
    assert got == {n: (reason, detail) for n, (_, reason, detail) in CASES.items()}


def test_an_optional_field_not_given_reads_null_and_one_given_reads_typed(verdicts):
    least, every = verdicts["the least a record holds"], verdicts["every optional field given"]
    assert (least.delta, least.note, least.unit, least.on_hand) == (None, None, None, 0)
    assert (every.delta, every.note, every.unit, every.shelf) == (-50, "recount!", "box", "B12C")
