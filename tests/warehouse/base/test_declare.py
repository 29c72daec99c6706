"""The declaration words: what each kind says it wants, and declarations refused."""

from __future__ import annotations

import re

import pytest

from warehouse.base import declare
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
    assert Text(pattern="[A-Z]{3}").text == "a string matching [A-Z]{3}"
    assert Text(min_length=1, max_length=64).text == "a string of 1-64 characters"
    assert Text(max_length=8).text == "a string of at most 8 characters"
    assert Text(min_length=3).text == "a string of at least 3 characters"
    assert Count(minimum=-5, maximum=5).text == "an integer from -5 to 5"
    assert Field("n", Count(), required=False).text == (
        "optional; if given, an integer from 1 to 2147483647"
    )


def test_limits_leave_the_canonical_form_of_a_field_without_them_unchanged():
    """Contracts accepted before limits existed read the same (`sources check`)."""
    plain = declare.canonical(_source())
    assert plain["event_types"]["page_viewed"]["1"]["fields"] == [
        {"name": "url", "kind": "Text", "default": None}
    ]
    limited = _source(
        event_types=(
            EventType(
                "page_viewed",
                (Shape(1, (Field("url", Text(max_length=9), required=False),)),),
            ),
        )
    )
    assert declare.canonical(limited)["event_types"]["page_viewed"]["1"]["fields"] == [
        {"name": "url", "kind": "Text", "max_length": 9, "default": None, "required": False}
    ]


def test_one_column_may_have_other_limits_in_other_event_types():
    both = _source(
        event_types=(
            EventType("a", (Shape(1, (Field("n", Count(maximum=9)),)),)),
            EventType("b", (Shape(1, (Field("n", Count(minimum=0)),)),)),
        )
    )
    assert [t.name for t in both.event_types] == ["a", "b"]


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
        (lambda: Text(pattern="(unclosed"), "Text: pattern '(unclosed' is not a regex"),
        (lambda: Text(min_length=5, max_length=4), "Text: lengths must be"),
        (lambda: Text(max_length=0), "Text: lengths must be"),
        (lambda: Count(minimum=3, maximum=2), "Count: need"),
        (lambda: Count(maximum=2**31), "Count: need"),
        (
            lambda: Items((Field("sku", Text(), required=False),)),
            "item field sku: an item's fields are all required",
        ),
        (lambda: Field("n", Count(maximum=9), default="10"), "default '10' is not an integer"),
        (lambda: Field("t", Text(pattern="[a-z]+"), default="A"), "default 'A' is not a string"),
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
