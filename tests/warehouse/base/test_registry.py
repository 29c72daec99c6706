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
