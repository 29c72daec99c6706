"""`regauge sources check`'s rule (a schema registry's BACKWARD, for data already in
silver): a change that alters how an accepted record validates or reads is refused,
naming the event type, the schema version and the field."""

from __future__ import annotations

import dataclasses

import pytest

from warehouse import sources
from warehouse.base import declare
from warehouse.base.declare import Field, Items, Money, Shape, Text
from warehouse.sources import shop

SHOP_V2 = shop.SOURCE  # contract version 2 adds order_placed v2 (§10)
SHOP_V1 = shop.SOURCE.at(1)
ORDER_V2 = SHOP_V2.event_types[2].shape(2)
ACCEPTED_V1 = declare.canonical(SHOP_V1)


def _with_order(*shapes: Shape) -> declare.Source:
    return dataclasses.replace(
        SHOP_V1,
        event_types=tuple(
            dataclasses.replace(t, shapes=shapes) if t.name == "order_placed" else t
            for t in SHOP_V1.event_types
        ),
    )


V1 = SHOP_V2.event_types[2].shape(1)


def test_the_shop_as_declared_is_the_shop_as_accepted():
    assert sources.accepted("shop") == declare.canonical(shop.SOURCE)
    assert sources.unaccepted_versions(shop.SOURCE) == []
    wrong, right = sources.check()
    assert wrong == []
    assert "shop: contract version 2, compatible and accepted" in right


def test_a_new_schema_version_with_a_default_for_older_records_is_compatible():
    assert declare.incompatibilities(ACCEPTED_V1, SHOP_V2) == []
    # ... and nothing at all, on a new lake.
    assert declare.incompatibilities(None, SHOP_V2) == []
    assert SHOP_V2.contract_version == 2
    assert SHOP_V2.at(1) == SHOP_V1
    assert SHOP_V1.contract_version == 1


@pytest.mark.parametrize(
    ("declared", "says"),
    [
        (
            _with_order(
                dataclasses.replace(V1, fields=(*V1.fields[:3], Field("total", Text())), rules=())
            ),
            "order_placed v1, field total: was Money, now Text",
        ),
        (
            _with_order(dataclasses.replace(V1, fields=V1.fields[:3], rules=())),
            "order_placed v1, field total: removed",
        ),
        # A limit tightened, or a field made optional, in a version already accepted.
        (
            _with_order(
                dataclasses.replace(
                    V1, fields=(Field("order_id", Text(max_length=8)), *V1.fields[1:])
                )
            ),
            "order_placed v1, field order_id: was Text, now Text(max_length=8)",
        ),
        (
            _with_order(
                dataclasses.replace(
                    V1, fields=(Field("order_id", Text(), required=False), *V1.fields[1:])
                )
            ),
            "order_placed v1, field order_id: was Text, now Text(required=False)",
        ),
        (
            _with_order(dataclasses.replace(V1, fields=(*V1.fields, Field("note", Text())))),
            "order_placed v1, field note: added to a version already accepted",
        ),
        (
            _with_order(
                V1,
                dataclasses.replace(ORDER_V2, fields=(*V1.fields, Field("d", Money())), rules=()),
            ),
            "order_placed v2, field d: new, and without a default",
        ),
        (
            _with_order(V1, dataclasses.replace(ORDER_V2, fields=V1.fields[:3], rules=())),
            "order_placed v2, field total: dropped; older records hold it in silver",
        ),
        (
            _with_order(
                V1,
                dataclasses.replace(
                    ORDER_V2, fields=(*V1.fields, Field("discount", Money(), default="1.00"))
                ),
                dataclasses.replace(ORDER_V2, version=3, since=3),
            ),
            "order_placed v3, field discount: its default was '1.00' in v2, '0.00' here",
        ),
        (
            _with_order(dataclasses.replace(ORDER_V2, version=1, since=1), ORDER_V2),
            "order_placed v1, field discount: added to a version already accepted",
        ),
        (
            _with_order(V1, dataclasses.replace(ORDER_V2, since=1)),
            "order_placed v2: new, so it must come with a new contract version (since=2, not 1)",
        ),
        (
            _with_order(
                dataclasses.replace(
                    V1,
                    fields=tuple(
                        Field("items", Items((Field("product_id", Text()),)))
                        if f.name == "items"
                        else f
                        for f in V1.fields
                    ),
                    rules=(),
                )
            ),
            "order_placed v1, field items[].unit_price: removed",
        ),
        (
            dataclasses.replace(SHOP_V1, event_types=SHOP_V1.event_types[:4]),
            "payment_captured: the event type was removed",
        ),
        (dataclasses.replace(SHOP_V1, key="event_id"), "shop: key changed from"),
    ],
)
def test_a_change_that_would_read_an_accepted_record_differently_is_refused(declared, says):
    problems = declare.incompatibilities(ACCEPTED_V1, declared)
    assert any(says in p for p in problems), problems


def test_a_contract_version_not_accepted_yet_is_named_and_accepting_records_it(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(sources, "accepted_path", lambda name: tmp_path / f"{name}.json")
    assert sources.unaccepted_versions(SHOP_V2) == [1, 2]
    assert sources.accept(SHOP_V1) == []
    assert sources.unaccepted_versions(SHOP_V2) == [2]
    assert sources.accept(SHOP_V2) == []
    assert sources.unaccepted_versions(SHOP_V2) == []
    recorded = (tmp_path / "shop.json").read_text()
    # Once accepted, v1 cannot change in place: refused, and nothing is written.
    broken = _with_order(dataclasses.replace(V1, fields=V1.fields[:3], rules=()), ORDER_V2)
    assert "order_placed v1, field total: removed" in sources.accept(broken)
    assert (tmp_path / "shop.json").read_text() == recorded


def test_a_new_schema_version_may_judge_its_own_records_by_other_limits():
    """Limits judge records of their own version only, and silver's column is the
    same: a new version may change them (older records keep theirs)."""
    stricter = dataclasses.replace(
        ORDER_V2, fields=(Field("order_id", Text(pattern="o-[0-9]+")), *ORDER_V2.fields[1:])
    )
    assert declare.incompatibilities(ACCEPTED_V1, _with_order(V1, stricter)) == []


def test_an_incompatible_declaration_stops_the_check_ingest_the_view_host_and_deploy(
    settings, monkeypatch, capsys, caplog
):
    """Where a declaration edited against its accepted contract is refused: `regauge
    sources check` (and so `make lint`), ingest's and the view host's start, and
    `regauge sources deploy`, each naming the event type, version and field, before
    any of them touches a service."""
    from warehouse.cli import sources as cli
    from warehouse.ops import processes

    edited = _with_order(dataclasses.replace(V1, fields=V1.fields[:3], rules=()), ORDER_V2)
    monkeypatch.setattr(sources, "discover", lambda: {"shop": edited})
    says = "shop: incompatible: order_placed v1, field total: removed"

    assert cli.check() == 1
    assert f"regauge: {says}" in capsys.readouterr().err
    assert cli.deploy("shop", 2) == 1
    err = capsys.readouterr().err
    assert says in err and "refusing to deploy a contract that fails its check" in err
    with caplog.at_level("ERROR"):
        assert processes.run_ingest(settings, None) == 2
        assert processes.run_view_host(settings) == 2
    assert f"ingest will not start: {says}" in caplog.text
    assert f"the view host will not start: {says}" in caplog.text
