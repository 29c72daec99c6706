import pytest

from warehouse.base.sqlnames import (
    UnsafeNameError,
    check_identifier,
    quote_identifier,
    quote_location,
)


@pytest.mark.parametrize("name", ["revenue_hourly", "bronze", "shop_events_v2", "a"])
def test_plain_identifiers_pass_and_are_quoted(name):
    assert check_identifier(name) == name
    assert quote_identifier(name) == f'"{name}"'


@pytest.mark.parametrize(
    "name",
    [
        "x; drop table y",
        'x"; drop table y; --',
        "x'y",
        "r\u0435venue_hourly",  # a Cyrillic letter that looks like a Latin e
        "Revenue",
        "1abc",
        "",
        "a" * 64,
        "with space",
    ],
)
def test_anything_else_is_refused(name):
    with pytest.raises(UnsafeNameError, match="not a plain identifier"):
        quote_identifier(name, "view")


def test_locations_are_quoted_and_checked():
    assert quote_location("local:///bronze/shop_events") == "'local:///bronze/shop_events'"
    with pytest.raises(UnsafeNameError):
        quote_location("local:///x') ; DROP SCHEMA y; --")
