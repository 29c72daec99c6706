"""The latency phases: freshness (a probe order's time until Trino shows its window)
under steady load, and serving queries beside `SELECT 1`, both through Trino."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from warehouse.base.settings import Settings
from warehouse.tools.bench import cpu
from warehouse.tools.bench.context import Bench
from warehouse.tools.bench.report import percentile

PROBE_VIEW = "revenue_hourly"
# Each run's probe orders fall in hours of 2001, a year no generated traffic uses, so
# a window appearing there can only be a probe arriving.
PROBE_YEAR = datetime(2001, 1, 1, tzinfo=UTC)
PROBE_CUSTOMER = "bench-probe"
# How often freshness asks Trino. Each ask is a real query through the serving
# view: 0.5 to 1 CPU-s of Trino on 2 cores under the phase's load, so asking a
# second after each answer took a quarter of the cores (94 of 363 CPU-s,
# 2026-11-29) from the pipeline being measured. So the asks space out as the
# lags grow: a tenth of the shortest lag seen so far, never under a second nor
# over 5 s (`poll_interval`). A probe is then seen at most that much after it
# became visible, a small error beside its lag; near the 5 s target the asks
# are a second apart. The warm-up probe, not measured, is asked for every 5 s,
# and its lag counts as seen.
POLL_MIN_S = 1.0
POLL_MAX_S = 5.0
POLL_SHARE = 0.1
# The first probe waits for the streams to catch up with the ingest phase.
WARMUP_S = 900.0


def probe_event(run: str, k: int, hour: datetime) -> dict[str, Any]:
    """A valid order_placed whose event time opens hour `hour` in the probe year."""
    return {
        "event_id": f"bench-{run}-{k}",
        "event_type": "order_placed",
        "event_time": hour.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
        "customer_id": PROBE_CUSTOMER,
        "schema_version": 1,
        "payload": {
            "order_id": f"bench-{run}-{k}",
            "currency": "GBP",
            "items": [{"product_id": "bench-probe", "quantity": 1, "unit_price": 1.0}],
            "total": 1.0,
        },
    }


def probe_base(now: datetime) -> datetime:
    """The first probe hour of a run: one of 87 stretches of 100 hours in 2001, a
    different one each minute, so runs rarely meet (`_free_probe_base` checks anyway)."""
    slot = int(now.timestamp() // 60) % 87
    return PROBE_YEAR + timedelta(hours=slot * 100)


def live_load(seed: int, count: int, rate: float, now: datetime) -> list[Any]:
    """`count` records of chaos traffic (`make chaos`'s re-sends, conflicts, late and
    malformed records), their event times from `now` on, spread over the time they
    take to send at `rate`: live traffic happens about when it arrives, after all
    of history. (The generator's default week would put every event among
    history's, so no batch could show that its work follows the change.)"""
    from spark_jobs import generator

    return generator.records(seed, count, chaos=True, start=now, days=count / rate / 86400)


def query_latency(settings: Settings, sql: str, runs: int, warmup: int = 3) -> list[float]:
    """Wall-clock milliseconds of `runs` executions of sql through the trino client."""
    from warehouse.sql import trino_client

    out = []
    for i in range(warmup + runs):
        started = time.perf_counter()
        trino_client.query(settings, sql)
        if i >= warmup:
            out.append((time.perf_counter() - started) * 1000)
    return out


# What streams beside the probes (issue 16): two live versions of the probed view and
# cart_sessions, each a query of the view host.
LIVE = ((PROBE_VIEW, 1), (PROBE_VIEW, 2), ("cart_sessions", 1))
# The reprocess whose wall time is `reprocess_s`: the one the issue measured.
TIMED_REPROCESS = (PROBE_VIEW, 2)


def poll_interval(shortest_lag: float | None) -> float:
    """Seconds until freshness asks Trino again, given the shortest lag seen so far
    (None: no probe seen yet)."""
    if shortest_lag is None:
        return POLL_MIN_S
    return min(POLL_MAX_S, max(POLL_MIN_S, POLL_SHARE * shortest_lag))


def probe_lags(sent: dict[int, float], seen: dict[int, float], gave_up: float) -> list[float]:
    """Each probe's time from sending to visible. A probe never seen counts with the
    time it was waited for, a lower bound: a percentile over it is a floor of the
    true one, and the bench still writes it (with `freshness_never_seen`) rather
    than stopping for want of a figure."""
    return [seen.get(k, gave_up) - sent[k] for k in sorted(sent)]


def per_minute(sent: dict[int, float], lags: list[float]) -> list[float]:
    """The p50 lag of the probes sent in each minute of the phase, in order: a host
    started for the phase compiles Spark's and Delta's code (the JIT) for its first
    minutes, so the later minutes are what a host that has run a while gives."""
    if not sent:
        return []
    first = min(sent.values())
    minutes: dict[int, list[float]] = {}
    for k, lag in zip(sorted(sent), lags, strict=True):
        minutes.setdefault(int((sent[k] - first) // 60), []).append(lag)
    return [percentile(minutes[m], 50) for m in sorted(minutes)]


def ensure_serving(bench: Bench) -> None:
    """Ingest and the LIVE versions' streams running, as in production. A version not
    built yet is built through regauge_reprocess, and the run's tasks are timed."""
    from warehouse.ops import airflow_client, ingest_ctl, streams
    from warehouse.sql import versions

    ingest_ctl.start(bench.settings, None)
    client = airflow_client.Client(bench.settings)
    for view, version in LIVE:
        known = {v.version: v for v in versions.versions(bench.settings, view)}
        row = known.get(version)
        if row is not None:
            if not row.live:
                bench.say(f"  {row.label} is {row.status}: freshness is probed without it")
            continue
        bench.say(f"  building {view} v{version} through regauge_reprocess")
        began = time.monotonic()
        run_id = client.run("regauge_reprocess", {"view": view, "version": version})
        took = time.monotonic() - began
        tasks = client.task_seconds("regauge_reprocess", run_id)
        per_task = ", ".join(f"{task} {s:.0f}" for task, s in tasks.items())
        bench.report.notes[f"reprocess {view} v{version}"] = (
            f"{took:.0f} s through Airflow, from trigger to success; per task, s: {per_task}"
        )
        bench.say(f"  {view} v{version} built in {took:.0f} s ({per_task})")
        if (view, version) == TIMED_REPROCESS:
            bench.report.figures["reprocess_s"] = took
    for line in streams.ensure(bench.settings):
        bench.say(f"  {line}")


def freshness(bench: Bench) -> None:
    """Probe orders sent every few seconds under steady load; each one's time until
    Trino shows its window through lakehouse.serving.revenue_hourly."""
    from spark_jobs import producer
    from warehouse.ops.stack import process
    from warehouse.sql import serving, trino_client

    base = _free_probe_base(bench)
    sql = (
        f"SELECT DISTINCT window_start FROM {serving.trino_name(PROBE_VIEW)} "
        "WHERE window_start >= ? AND window_start < ?"
    )
    span = [base, base + timedelta(hours=100)]

    def visible() -> set[int]:
        rows = trino_client.query(bench.settings, sql, span).rows
        return {int((_utc(r[0]) - base).total_seconds() // 3600) for r in rows}

    # The streams may still be catching up with the ingest phase; the first
    # probe, unmeasured, waits for that.
    warm_sent = _probe(bench, base, 0)
    warm_lag: float | None = None
    if process.wait_until(lambda: 0 in visible(), WARMUP_S, interval=POLL_MAX_S):
        # Where the asks' spacing starts, until a measured probe is seen. It is
        # unloaded, but may include a catch-up: if it is longer than the lags under
        # load, the first probes are seen up to POLL_MAX_S late, never early.
        warm_lag = time.monotonic() - warm_sent
    else:
        # A missed target, not a crash: the probes below are measured all the same,
        # and the ones never seen count as such.
        late = f"the warm-up probe was not visible within {WARMUP_S / 60:.0f} min"
        bench.say(f"freshness: {late}")
        bench.report.notes["freshness_warmup"] = late
    # ...and so may the other live versions (a catch-up batch of a version
    # restarted behind would take the cores the probes are measured on): each
    # holds the warm-up probe's row before the load starts.
    live = _streaming(bench)
    if _live_versions_without(bench, live, base):
        # Every 5 s: each look is a Trino query per version, on the same two cores
        # as the catch-up it waits for.
        process.wait_until(
            lambda: not _live_versions_without(bench, live, base), WARMUP_S, interval=5.0
        )
        late = ", ".join(_live_versions_without(bench, live, base))
        if late:
            bench.say(f"freshness: {late} had not caught up within {WARMUP_S / 60:.0f} min")
            bench.report.notes["freshness_warmup_versions"] = f"{late} had not caught up"
    silver_before = _silver_version(bench.settings)
    load = live_load(
        int(bench.run_id) % 10**9 + 500,
        int(bench.sizes.load_rate * (bench.sizes.freshness_s + 15)),
        bench.sizes.load_rate,
        datetime.now(UTC),
    )
    cpu_before, began_ms = _cpu_snapshot(bench), time.time() * 1000
    loader = threading.Thread(
        target=lambda: producer.produce_run(bench.settings, 0, load, rate=bench.sizes.load_rate),
        name="bench-load",
        daemon=True,
    )
    loader.start()
    sent: dict[int, float] = {}
    seen: dict[int, float] = {}
    k = 1
    end = time.monotonic() + bench.sizes.freshness_s
    next_probe = next_poll = time.monotonic()
    asks = 0
    while time.monotonic() < end or (set(sent) - set(seen) and time.monotonic() < end + 120):
        now = time.monotonic()
        if now >= next_probe and now < end and k < 100:
            sent[k] = _probe(bench, base, k)
            k += 1
            next_probe = now + bench.sizes.probe_every_s
        if now >= next_poll:
            found = visible()
            asks += 1
            at = time.monotonic()
            for j in found:
                if j in sent and j not in seen:
                    seen[j] = at
            lags_seen = [seen[j] - sent[j] for j in seen]
            if warm_lag is not None:
                lags_seen.append(warm_lag)
            shortest = min(lags_seen, default=None)
            next_poll = now + poll_interval(shortest)
        # Awake often enough to send each probe on time; only the asks cost Trino.
        time.sleep(0.1)
    gave_up = time.monotonic()
    _cpu(bench, cpu_before, _cpu_snapshot(bench), began_ms)
    loader.join(bench.sizes.freshness_s + 120)
    lags = probe_lags(sent, seen, gave_up)
    f = bench.report.figures
    f["freshness_p50_s"] = percentile(lags, 50)
    f["freshness_p95_s"] = percentile(lags, 95)
    f["freshness_probes"] = len(sent)
    f["freshness_never_seen"] = len(set(sent) - set(seen))
    by_minute = per_minute(sent, lags)
    if len(by_minute) > 1:
        bench.report.notes["freshness by minute"] = "p50 of the probes sent in each minute: " + (
            ", ".join(f"{p:.1f}" for p in by_minute) + " s"
        )
        bench.say(f"  {bench.report.notes['freshness by minute']}")
    _stages(bench, sent, silver_before)
    bench.report.baselines["trigger_interval_s"] = _seconds(bench.settings.trigger_interval)
    bench.report.notes["freshness"] = (
        f"{len(sent)} probes, one every {bench.sizes.probe_every_s:g} s, under "
        f"{bench.sizes.load_rate:,.0f} events/s of chaos traffic happening as it is sent; "
        f"Trino asked {asks} times, every {POLL_MIN_S:g} to {POLL_MAX_S:g} s "
        f"(a tenth of the shortest lag seen)"
    )
    bench.say(
        f"freshness: p50 {f['freshness_p50_s']:.1f} s, p95 {f['freshness_p95_s']:.1f} s "
        f"({len(seen)} of {len(sent)} probes seen); trigger interval "
        f"{bench.settings.trigger_interval}"
    )


def _cpu_snapshot(bench: Bench, note: str = "cpu, freshness") -> cpu.Snapshot | None:
    try:
        return cpu.snapshot(bench.settings)
    except Exception as exc:  # a diagnosis, not a figure: never lose the run for it
        bench.report.notes[note] = f"not measured: {exc}"
        return None


def _cpu(
    bench: Bench, before: cpu.Snapshot | None, after: cpu.Snapshot | None, began_ms: float
) -> None:
    """Where the cores went while the probes ran: what limits freshness."""
    if before is not None and after is not None:
        use = cpu.between(before, after)
        bench.report.figures["freshness_cpu_busy"] = use.busy
        bench.report.notes["cpu, freshness"] = use.describe()
        bench.say(f"  cpu while probing: {use.describe()}")
    if bench.events_dir is None:
        return
    try:
        tasks = cpu.task_seconds_by_query(bench.events_dir, began_ms)
    except Exception as exc:
        bench.report.notes["spark task time, freshness"] = f"not measured: {exc}"
        return
    bench.report.notes["spark task time, freshness"] = cpu.describe_tasks(tasks)
    bench.say(f"  Spark task time by query while probing: {cpu.describe_tasks(tasks)}")


def _streaming(bench: Bench) -> list[tuple[str, int]]:
    """The LIVE versions that are live (streaming) on this lake."""
    from warehouse.sql import versions

    out = []
    for name, version in LIVE:
        known = {v.version: v for v in versions.versions(bench.settings, name)}
        if version in known and known[version].live:
            out.append((name, version))
    return out


def _live_versions_without(bench: Bench, live: list[tuple[str, int]], base: datetime) -> list[str]:
    """The versions of `live` whose gold has no row for the warm-up probe yet: no
    row whose window starts at its hour (an hour's window, or the probe
    customer's session, both start at the probe's event time)."""
    from spark_jobs import views
    from warehouse.base import registry
    from warehouse.sql import trino_client

    out = []
    for name, version in live:
        table = registry.gold_view_table(name, version).trino_name
        start = views.get(name, version).window[0]
        sql = f"SELECT count(*) FROM {table} WHERE {start} = ?"
        if not trino_client.scalar(bench.settings, sql, [base]):
            out.append(f"{name} v{version}")
    return out


def _silver_version(settings: Settings) -> int:
    from warehouse.base import registry
    from warehouse.sql import trino_client

    t = registry.SILVER_EVENTS
    history = f'{registry.TRINO_LAKE_CATALOG}.{t.schema}."{t.name}$history"'
    return int(trino_client.scalar(settings, f"SELECT max(version) FROM {history}"))


def _stages(bench: Bench, sent: dict[int, float], silver_since: int) -> None:
    """Where the probes' time went: each probe's time until bronze and until silver
    committed it (read back from the lake through Trino), beside the time until
    Trino showed it. What is left after silver is the view's stream and Trino."""
    from warehouse.base import registry
    from warehouse.sql import trino_client

    if not sent:
        return
    # Monotonic send times -> wall clock, as the lake's commit times are.
    offset = time.time() - time.monotonic()
    prefix = f"bench-{bench.run_id}-"
    bronze = trino_client.query(
        bench.settings,
        "SELECT json_extract_scalar(from_utf8(value), '$.event_id'), "
        f'min("$file_modified_time") FROM {registry.BRONZE_EVENTS.trino_name} '
        "WHERE key = ? GROUP BY 1",
        [PROBE_CUSTOMER],
    ).rows
    t = registry.SILVER_EVENTS
    silver = trino_client.query(
        bench.settings,
        "SELECT event_id, min(_commit_timestamp) FROM TABLE("
        f"{registry.TRINO_LAKE_CATALOG}.system.table_changes(schema_name => '{t.schema}', "
        f"table_name => '{t.name}', since_version => {int(silver_since)})) "
        "WHERE event_id LIKE ? GROUP BY 1",
        [prefix + "%"],
    ).rows
    f = bench.report.figures
    said = []
    for stage, rows in (("bronze", bronze), ("silver", silver)):
        at = {str(r[0]): _utc(r[1]).timestamp() for r in rows if r[0]}
        lags = [at[prefix + str(k)] - (sent[k] + offset) for k in sent if prefix + str(k) in at]
        if lags:
            f[f"freshness_{stage}_p50_s"] = percentile(lags, 50)
            said.append(f"{stage} p50 {f[f'freshness_{stage}_p50_s']:.1f} s")
    if said:
        bench.report.notes["freshness stages"] = (
            "from produce until committed in "
            + ", ".join(said)
            + f"; visible through Trino p50 {f['freshness_p50_s']:.1f} s"
        )
        bench.say(f"  freshness stages: {bench.report.notes['freshness stages']}")


def _probe(bench: Bench, base: datetime, k: int) -> float:
    from confluent_kafka import Producer

    from spark_jobs import producer
    from warehouse.base import registry

    send = Producer({**producer.producer_config(bench.settings), "linger.ms": 0})
    event = probe_event(bench.run_id, k, base + timedelta(hours=k))
    at = time.monotonic()
    send.produce(registry.TOPIC, key=PROBE_CUSTOMER, value=json.dumps(event))
    if send.flush(30):
        raise RuntimeError("a freshness probe was not acknowledged within 30 s")
    return at


def _free_probe_base(bench: Bench) -> datetime:
    """A stretch of 100 probe hours no earlier run used."""
    from warehouse.base import registry
    from warehouse.sql import trino_client

    used = {
        _utc(r[0])
        for r in trino_client.query(
            bench.settings,
            "SELECT DISTINCT date_trunc('hour', event_time) FROM "
            f"{registry.SILVER_EVENTS.trino_name} WHERE customer_id = ?",
            [PROBE_CUSTOMER],
        ).rows
    }
    base = probe_base(datetime.now(UTC))
    for _ in range(87):
        hours = {base + timedelta(hours=h) for h in range(100)}
        if not hours & used:
            return base
        base = PROBE_YEAR + timedelta(hours=(base - PROBE_YEAR).total_seconds() // 3600 + 100)
        if base.year > PROBE_YEAR.year:
            base = PROBE_YEAR
    raise RuntimeError(f"every stretch of {PROBE_YEAR.year} has probes; run `make clean`")


def queries(bench: Bench) -> None:
    """Serving queries beside `SELECT 1`, through the same client: their latency,
    and Trino's CPU per query (issue 67's row), from Trino's processes' CPU time
    across the measured runs, so planning and scheduling count, not only tasks."""
    from warehouse.sql import serving

    runs = bench.sizes.queries
    one, one_cpu = _trino_cpu(bench, "SELECT 1", runs)
    view, view_cpu = _trino_cpu(
        bench,
        f"SELECT * FROM {serving.trino_name(PROBE_VIEW)} WHERE currency = 'EUR' "
        "ORDER BY window_start DESC LIMIT 24",
        runs,
    )
    f, b = bench.report.figures, bench.report.baselines
    f["serving_query_p50_ms"] = percentile(view, 50)
    f["serving_query_p95_ms"] = percentile(view, 95)
    b["select1_p50_ms"] = percentile(one, 50)
    b["select1_p95_ms"] = percentile(one, 95)
    if view_cpu is not None and one_cpu is not None:
        f["serving_query_trino_cpu_ms"] = view_cpu
        b["select1_trino_cpu_ms"] = one_cpu
    bench.say(
        f"serving query: p50 {f['serving_query_p50_ms']:.0f} ms, p95 "
        f"{f['serving_query_p95_ms']:.0f} ms; SELECT 1 p50 {b['select1_p50_ms']:.0f} ms"
        + (
            f"; Trino CPU per query {view_cpu:.0f} ms (SELECT 1: {one_cpu:.0f} ms)"
            if view_cpu is not None and one_cpu is not None
            else ""
        )
    )


def _trino_cpu(bench: Bench, sql: str, runs: int) -> tuple[list[float], float | None]:
    """`query_latency` of sql, and Trino's CPU milliseconds per measured run (None
    if Trino's processes could not be read: a diagnosis, never the run's end).
    The warm-up runs go first, outside the measured window."""
    query_latency(bench.settings, sql, 0, warmup=3)
    before = _cpu_snapshot(bench, "Trino cpu, queries")
    times = query_latency(bench.settings, sql, runs, warmup=0)
    after = _cpu_snapshot(bench, "Trino cpu, queries")
    if before is None or after is None or not runs:
        return times, None
    used = cpu.between(before, after).parts.get("trino")
    return times, None if used is None else used * 1000 / runs


def _utc(moment: datetime) -> datetime:
    """Trino's timestamps come back with or without a zone; the bench compares in UTC."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _seconds(interval: str) -> float:
    """'1 second', '500 milliseconds', '2 minutes' -> seconds."""
    number, unit = interval.split()
    scale = {"milli": 0.001, "second": 1.0, "minute": 60.0}
    return float(number) * next(v for k, v in scale.items() if unit.startswith(k))
