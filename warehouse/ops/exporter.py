"""The view host's Prometheus endpoint, and where every metrics endpoint is.

The queries record their own figures as they run (`warehouse.base.metrics`).
This module serves them from the view host, and adds what only a look from
outside the queries gives: how long the oldest record not yet in bronze has
waited (a Kafka read, every `LAG_EVERY_S`), which hosted query runs, and the last
audit's age and verdict (from the file `regauge audit` leaves).

`endpoints` names every endpoint there is for `regauge status` and `regauge
top`: the host's own, its Spark driver's (Spark's PrometheusServlet, with the
streaming queries' metrics), and Trino's OpenMetrics on the coordinator.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass

from prometheus_client import start_http_server

from warehouse import sources
from warehouse.base import metrics
from warehouse.base.settings import Settings
from warehouse.ops import audit, ingest_ctl, lag, streams

log = logging.getLogger(__name__)

LAG_EVERY_S = 15.0
# Spark's PrometheusServlet on the driver's UI port (spark_jobs.engine.session turns it on).
SPARK_DRIVER_PATH = "/metrics/prometheus/"
SPARK_EXECUTORS_PATH = "/metrics/executors/prometheus"


def serve(settings: Settings, stop: threading.Event) -> str:
    """Serve the metrics until the process ends; the endpoint's URL.

    A port already taken is an OSError naming it: the caller decides whether to
    run without metrics.
    """
    url = listen(settings, settings.metrics_port, "set REGAUGE_METRICS_PORT to a free port")
    metrics.AUDIT_AGE.set_function(lambda: _audit_field(settings, "age_s"))
    metrics.AUDIT_PASSED.set_function(lambda: _audit_field(settings, "passed"))
    threading.Thread(
        target=_refresh_lag, args=(settings, stop), name="regauge-metrics-lag", daemon=True
    ).start()
    return url


def listen(settings: Settings, port: int, advice: str) -> str:
    """Serve this process's metrics on `port` (a thread); the endpoint's URL."""
    host = settings.bind_host or "0.0.0.0"
    try:
        start_http_server(port, addr=host)
    except OSError as exc:
        taken = f"the metrics port {host}:{port} is taken ({exc.strerror})"
        raise OSError(f"{taken}; {advice}") from exc
    return f"http://{host}:{port}/metrics"


def _audit_field(settings: Settings, field: str) -> float:
    last = audit.last_result(settings)
    if last is None:
        return math.nan
    if field == "age_s":
        return max(0.0, time.time() - float(last["finished_at"]))
    return 1.0 if last["passed"] else 0.0


def _refresh_lag(settings: Settings, stop: threading.Event) -> None:
    """Records behind and the oldest one's wait, per source and partition, while ingest
    is wanted. Kafka being away only leaves the last figures in place (and says so once)."""
    said = False
    while not stop.wait(LAG_EVERY_S):
        if not ingest_ctl.wanted(settings)[0]:
            # Stopped on purpose: no lag to report, rather than the last one seen.
            metrics.INGEST_BEHIND.clear()
            metrics.INGEST_OLDEST_WAITING.clear()
            continue
        copied = lag.copied_by_source(ingest_ctl.read_status(settings))
        failed = []
        # Every declared source is ingested; one not copied from yet is behind by all
        # Kafka holds. One whose topic cannot be read keeps its last figures.
        for name, source in sources.discover().items():
            try:
                lags = lag.ingest_lag(settings, copied.get(name, {}), source.topic)
            except Exception as exc:
                failed.append(f"{source.topic}: {exc}")
                continue
            for one in lags:
                at = (name, str(one.partition))
                metrics.INGEST_BEHIND.labels(*at).set(one.behind)
                metrics.INGEST_OLDEST_WAITING.labels(*at).set(one.age_s or 0.0)
        if failed and not said:
            log.warning("metrics: cannot read Kafka's offsets (%s); lag figures stale", failed)
        said = bool(failed)


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str | None
    # How to read it, or why there is none.
    note: str = ""


def host_endpoint(settings: Settings) -> Endpoint:
    """The view host's own endpoint (its url None, and why, when it has none)."""
    return endpoints(settings)[0]


def endpoints(settings: Settings) -> list[Endpoint]:
    """Every metrics endpoint regauge knows of, the view host's first, from its
    status file (which reads as empty unless the host supervisord runs wrote it)."""
    status = streams.host(settings).read_status()
    running = status.get("state") == "running"
    found = []
    if not running:
        found.append(Endpoint("view host", None, "not running"))
    elif status.get("metrics"):
        found.append(Endpoint("view host", status["metrics"]))
    else:
        found.append(Endpoint("view host", None, status.get("metrics_error") or "none yet"))
    ui = status.get("spark_ui") if running else None
    if ui:
        found.append(Endpoint("view host's Spark driver", ui + SPARK_DRIVER_PATH))
        found.append(Endpoint("view host's Spark executors", ui + SPARK_EXECUTORS_PATH))
    found.append(
        Endpoint(
            "trino",
            f"{settings.trino_url}/metrics",
            f"as {settings.trino_login}: X-Trino-User, the one user rules.json lets read it",
        )
    )
    return found


# (metric name, labels) -> value, as one scrape of an endpoint found them.
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str, timeout: float = 5.0) -> Samples:
    """One scrape of a Prometheus text endpoint (a connection error raises OSError)."""
    import requests
    from prometheus_client.parser import text_string_to_metric_families

    try:
        resp = requests.get(url, timeout=timeout)
        resp.raise_for_status()
    except requests.RequestException as exc:
        raise OSError(f"cannot scrape {url}: {exc}") from exc
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(resp.text)
        for sample in family.samples
    }


def by_view(samples: Samples, name: str) -> dict[str, float]:
    """One per-view-version metric's values keyed by `<view>_v<version>`."""
    return {
        f"{dict(labels)['view']}_v{dict(labels)['version']}": value
        for (sample, labels), value in samples.items()
        if sample == name
    }


def by_labels(samples: Samples, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """One metric's values keyed by the values of several of its labels."""
    found = {}
    for (sample, pairs), value in samples.items():
        given = dict(pairs)
        if sample == name and all(label in given for label in labels):
            found[tuple(given[label] for label in labels)] = value
    return found


def by_label(samples: Samples, name: str, label: str, **only: str) -> dict[str, float]:
    """One metric's values keyed by one of its labels, of the samples whose other
    labels have the values `only` gives (`source="shop"`, say)."""
    return {
        dict(labels)[label]: value
        for (sample, labels), value in samples.items()
        if sample == name
        and label in dict(labels)
        and all(dict(labels).get(k) == v for k, v in only.items())
    }
