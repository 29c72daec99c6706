"""The view host's metrics endpoint, served for real on a free port and scraped over HTTP."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from spark_jobs.engine.audit import Finding, Run
from spark_jobs.engine.ingest import record_progress
from spark_jobs.engine.silver import BatchResult
from tests.ports import free_port
from warehouse.base.settings import Settings
from warehouse.ops import audit, exporter, lag


@pytest.fixture()
def private(settings: Settings, tmp_path: Path) -> Settings:
    """Settings with a state folder of their own (no ingest wanted, no audit) and a free port."""
    return dataclasses.replace(settings, state_dir=tmp_path, metrics_port=free_port())


@pytest.fixture()
def served(private: Settings) -> Iterator[str]:
    stop = threading.Event()
    yield exporter.serve(private, stop)
    stop.set()


def test_a_taken_port_is_named_with_the_setting_that_moves_it(private: Settings) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", private.metrics_port))
        taken.listen()
        with pytest.raises(OSError) as refused:
            exporter.serve(private, threading.Event())
    text = str(refused.value)
    assert f"127.0.0.1:{private.metrics_port} is taken" in text
    assert "REGAUGE_METRICS_PORT" in text


def test_silver_batches_and_progress_are_scraped_by_name(served: str) -> None:
    before = exporter.scrape(served)
    BatchResult(
        7, rows_in=11, accepted=6, duplicates=1, conflicts=1, rejected={"oversize": 3}
    ).record()
    record_progress(
        {
            "name": "ingest",
            "numInputRows": 10,
            "durationMs": {"triggerExecution": 1500},
            "sources": [
                {
                    "endOffset": json.dumps({"shop.events": {"0": 40, "1": 12}}),
                    "latestOffset": json.dumps({"shop.events": {"0": 45, "1": 12}}),
                }
            ],
        }
    )
    after = exporter.scrape(served)

    def grew(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert grew("regauge_quarantined_total", reason="oversize") == 3
    assert grew("regauge_silver_rows_total", outcome="accepted") == 6
    assert grew("regauge_silver_rows_total", outcome="duplicate") == 1
    assert grew("regauge_quarantined_total", reason="conflicting_duplicate") == 1
    assert grew("regauge_silver_rows_total", outcome="quarantined") == 4
    assert grew("regauge_microbatch_seconds_count", query="ingest") == 1
    assert grew("regauge_microbatch_seconds_sum", query="ingest") == pytest.approx(1.5)
    assert grew("regauge_microbatch_input_rows_total", query="ingest") == 10
    # Only the partitions this progress named (others may be set by earlier tests
    # in the same process: the metrics are the process's).
    behind = exporter.by_labels(after, "regauge_ingest_behind_records", "source", "partition")
    assert (behind["shop", "0"], behind["shop", "1"]) == (5.0, 0.0)


def test_each_sources_ingest_lag_is_its_own(served: str) -> None:
    """Another source's ingest query (`ingest.web`) sets the web's lag, not the shop's;
    a view's query, whose source is silver, sets none."""
    for name, topic, behind in (("ingest.web", "web.events", 7), ("cart_sessions_v1", "x", 9)):
        record_progress(
            {
                "name": name,
                "durationMs": {"triggerExecution": 10},
                "sources": [
                    {
                        "endOffset": json.dumps({topic: {"3": 1}}),
                        "latestOffset": json.dumps({topic: {"3": 1 + behind}}),
                    }
                ],
            }
        )
    found = exporter.by_labels(
        exporter.scrape(served), "regauge_ingest_behind_records", "source", "partition"
    )
    assert found["web", "3"] == 7.0
    assert ("shop", "3") not in found and not [k for k in found if k[0] not in {"shop", "web"}]
    only_web = exporter.by_label(
        exporter.scrape(served), "regauge_ingest_behind_records", "partition", source="web"
    )
    assert only_web["3"] == 7.0


def test_the_status_files_copied_offsets_are_read_per_source() -> None:
    status = {
        "ingest": {"copied": {"0": 12, "1": 3}},
        "ingest.web": {"copied": {"0": 5}},
        "ingest.new": {"state": "running"},  # no batch yet: nothing copied
        "revenue_hourly_v2": {"copied": {"0": 99}},  # not an ingest query
    }
    assert lag.copied_by_source(status) == {"shop": {0: 12, 1: 3}, "web": {0: 5}}


def test_the_audit_figures_follow_the_last_audit(private: Settings, served: str) -> None:
    import math

    assert math.isnan(exporter.scrape(served)[("regauge_audit_passed", ())])
    failed = Run(findings=[Finding("routing", "revenue_hourly", False, "wrong", {})])
    audit.remember(private, failed, ["routing"])
    samples = exporter.scrape(served)
    assert samples[("regauge_audit_passed", ())] == 0.0
    assert 0 <= samples[("regauge_audit_age_seconds", ())] < 60
    assert audit.last_result(private) is not None
    audit.remember(private, Run(findings=[Finding("routing", "x", True, "ok", {})]), ["routing"])
    assert exporter.scrape(served)[("regauge_audit_passed", ())] == 1.0


def test_endpoints_say_why_the_host_has_none(private: Settings) -> None:
    found = {e.name: e for e in exporter.endpoints(private)}
    assert found["view host"].url is None and found["view host"].note == "not running"
    assert found["trino"].url == f"{private.trino_url}/metrics"
