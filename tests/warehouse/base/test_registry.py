import pytest

from warehouse.base import registry
from warehouse.base.settings import load


def test_tables_live_under_the_lake_root_by_schema_and_name():
    s = load({"REGAUGE_LAKE_ROOT": "/lake/"})
    bronze = registry.table("bronze.shop_events")
    assert bronze.path(s) == "/lake/bronze/shop_events"
    assert bronze.checkpoint(s) == "/lake/_checkpoints/bronze/shop_events/main"
    assert bronze.trino_name == "lakehouse.bronze.shop_events"


def test_view_versions_are_separate_gold_tables():
    v2 = registry.gold_view_table("revenue_hourly", 2)
    assert v2.trino_name == "lakehouse.gold.revenue_hourly_v2"


def test_an_unknown_table_is_an_error_listing_the_known_ones():
    with pytest.raises(KeyError, match=r"silver\.shop_events"):
        registry.table("silver.shop_event")


def test_a_source_s_topic_and_tables_follow_its_name():
    """docs/contract.md §10: source S reads S.events into bronze.S_events and the silver
    tables beside silver.S_events; the shop's names are the same rule's."""
    s = load({"REGAUGE_LAKE_ROOT": "/lake"})
    web = registry.source_tables("web")
    assert web.topic == "web.events"
    assert [t.trino_name for t in web.tables] == [
        "lakehouse.bronze.web_events",
        "lakehouse.silver.web_events",
        "lakehouse.silver.web_events_quarantine",
        "lakehouse.silver.web_events_ledger",
        "lakehouse.silver.web_events_forgotten",
    ]
    assert web.ingest_checkpoint(s) == "/lake/_checkpoints/silver/web_events/kafka"
    assert (web.ingest_query, registry.SHOP.ingest_query) == ("ingest.web", "ingest")
    shop = registry.SHOP
    assert (shop.topic, shop.bronze, shop.silver, shop.quarantine, shop.ledger) == (
        registry.TOPIC,
        registry.BRONZE_EVENTS,
        registry.SILVER_EVENTS,
        registry.SILVER_QUARANTINE,
        registry.SILVER_LEDGER,
    )
    assert registry.ingest_checkpoint(s) == shop.ingest_checkpoint(s)
    assert registry.table("silver.web_events_quarantine") == web.quarantine
    with pytest.raises(ValueError, match="use 1-31 of a-z 0-9 _"):
        registry.source_tables("Web Site")
