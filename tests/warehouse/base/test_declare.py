"""The declaration words: what each kind says it wants, and declarations refused."""

from __future__ import annotations

import re

import pytest

from warehouse.base.declare import (
    Count,
    EventType,
    Field,
    Items,
    Money,
    OneOf,
    Shape,
    Source,
    SumOf,
    Text,
)

ITEMS = Items((Field("sku", Text()), Field("n", Count()), Field("price", Money())))


def test_each_kind_says_what_it_wants_in_the_words_quarantine_details_use():
    assert Text().text == "a string"
    assert Count().text == "an integer from 1 to 2147483647"
    assert Money().text == "a number >= 0 with at most 2 decimals"
    assert OneOf(("EUR", "USD")).text == "one of EUR, USD"
    assert ITEMS.text == "a non-empty array of items"


def _source(**changes) -> Source:
    fields = {
        "name": "web",
        "topic": "web.events",
        "key": "visitor_id",
        "id_field": "event_id",
        "time_field": "event_time",
        "subject_field": "visitor_id",
        "event_types": (EventType("page_viewed", (Shape(1, (Field("url", Text()),)),)),),
    }
    return Source(**{**fields, **changes})


def test_a_source_lists_its_envelope_in_the_order_it_is_checked():
    assert _source().envelope == (
        "event_id",
        "event_type",
        "event_time",
        "visitor_id",
        "schema_version",
        "payload",
    )
    assert _source().type_names == ("page_viewed",)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: OneOf(()), "OneOf needs distinct values"),
        (lambda: OneOf(("a", "a")), "OneOf needs distinct values"),
        (lambda: Field("Bad-Name", Text()), "field name 'Bad-Name'"),
        (lambda: Shape(0, (Field("a", Text()),)), "schema versions start at 1"),
        (lambda: Shape(1, (Field("a", Text()), Field("a", Count()))), "fields must be distinct"),
        (lambda: Shape(1, ()), "at least one"),
        (lambda: Items((Field("inner", ITEMS),)), "items inside items"),
        (
            lambda: EventType("e", (Shape(2, (Field("a", Text()),)),)),
            "schema versions must be 1, 2, ... in order, got [2]",
        ),
        (
            lambda: Shape(
                1,
                (Field("total", Text()), Field("lines", ITEMS)),
                (SumOf("total", "lines", ("n",)),),
            ),
            "SumOf: total must be a Money field",
        ),
        (
            lambda: Shape(1, (Field("total", Money()),), (SumOf("total", "lines", ("n",)),)),
            "SumOf: lines must be an Items field",
        ),
        (
            lambda: Shape(
                1,
                (Field("total", Money()), Field("lines", ITEMS)),
                (SumOf("total", "lines", ("sku",)),),
            ),
            "SumOf: lines[].sku must be a Count or Money field",
        ),
        (lambda: Field("n", Count(), default="1e2"), "default '1e2' is not an integer"),
        (lambda: Field("m", Money(), default="1e17"), "default '1e17' is not a number"),
        (lambda: Field("m", Money(), default="1" * 17), "is not a number >= 0"),
        (lambda: Field("m", Money(), default="2.505"), "is not a number >= 0"),
        (lambda: Field("c", OneOf(("EUR",)), default="USD"), "default 'USD' is not one of EUR"),
        (
            lambda: _source(
                event_types=(
                    EventType("a", (Shape(1, (Field("n", Count()),)),)),
                    EventType("b", (Shape(1, (Field("n", Money()),)),)),
                )
            ),
            r"payload.n is Count\(\) somewhere and Money\(\) in b v1",
        ),
        (
            lambda: _source(
                event_types=(
                    EventType("a", (Shape(1, (Field("lines", ITEMS), Field("more", ITEMS))),)),
                )
            ),
            r"at most one array of items, got \['lines', 'more'\]",
        ),
        (lambda: _source(key="nowhere"), "the key 'nowhere' must be an envelope field"),
        (lambda: _source(subject_field="event_id"), "the envelope's fields must differ"),
        (lambda: _source(event_types=()), "event types must be distinct"),
        (lambda: _source(name="Web"), "source name 'Web'"),
    ],
)
def test_a_malformed_declaration_is_refused_with_what_is_wrong(build, message):
    with pytest.raises(ValueError, match=message if "\\" in message else re.escape(message)):
        build()


def test_a_default_is_kept_as_written():
    assert Field("m", Money(), default="0.00").default == "0.00"
    assert Field("n", Count(), default="7").default == "7"


def test_declarations_compare_by_value():
    assert _source() == _source()
    assert _source(topic="other") != _source()
