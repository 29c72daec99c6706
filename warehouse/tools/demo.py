"""`make demo`: the pipeline on the local stack, ending with Trino queries a person can read.

The story: shop traffic lands exactly once in bronze and silver, and the same
customers' browsing, a second source, in its own tables; revenue_hourly
v1 is built and serves everyone; v2 (net of cancellations) is reprocessed from
all history through Airflow while events keep flowing, validated, rolled out
to 10 % of analysts by hand, then to 50 % and 100 % by itself while four gates
hold, and v1 is retired. A deliberately wrong v3 is built and rolled out by
itself, and its agreement gate sends everyone back to v2. A subscriber follows
one analyst's view from Kafka throughout, and moves with them. Then the producer
moves to `order_placed` schema_version 2 before the lake's contract knows it: the
orders wait in quarantine until `regauge sources deploy shop 2` and
regauge_readmit bring them back, and the hour they land in is restated. Then one
customer is forgotten everywhere (regauge_forget) and shown absent from every
table. Analysts' questions close it, one of them joining the two sources. Every
number printed comes from Trino, or is checked against it.
"""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from decimal import Decimal

from warehouse.base import registry
from warehouse.base.registry import SILVER_EVENTS
from warehouse.base.settings import Settings
from warehouse.ops import airflow_client, ingest_ctl, lifecycle, pipeline
from warehouse.ops.stack import services
from warehouse.ops.subscribe import Change, Copy, Subscriber
from warehouse.sql import accounting, erasures, serving, trino_client, versions
from warehouse.tools.examples import analyst_examples

log = logging.getLogger(__name__)

VIEW = "revenue_hourly"
# The view over both sources (docs/contract.md §3): built once the web has landed.
VISITS = "visits"
# Three analysts whose cohorts (docs/contract.md §4) are 8, 25 and 85: they move to v2
# at 10 %, 50 % and 100 % respectively.
ANALYSTS = ("analyst.yuki", "analyst.grace", "analyst.alice")


def _step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def _wait_for_silver(
    settings: Settings,
    seed: int,
    want: int,
    timeout: float = 900,
    silver: registry.Table = SILVER_EVENTS,
    prefix: str = "s",
) -> int:
    """Poll Trino until `silver` holds `want` events of this seed's run (their ids
    start with `prefix` and the seed)."""
    deadline = time.monotonic() + timeout
    got = -1
    while time.monotonic() < deadline:
        got = int(
            trino_client.scalar(
                settings,
                f"SELECT count(*) FROM {silver.trino_name} WHERE starts_with(event_id, ?)",
                [f"{prefix}{seed}-"],
            )
        )
        if got >= want:
            return got
        time.sleep(5)
    return got


def _who_sees_what(settings: Settings, hour: datetime | None) -> None:
    """Each analyst's view of the same hour through lakehouse.serving.revenue_hourly."""
    print(f"  {'analyst':<15} {'cohort':>6}  sees  EUR in the hour from {hour or '-'}")
    # The serving view has v1's `revenue` column only while v1 is live.
    live = {v.version for v in versions.versions(settings, VIEW) if v.live}
    amount = "coalesce(revenue, net_revenue)" if 1 in live else "net_revenue"
    for user in ANALYSTS:
        found = trino_client.query(
            settings,
            f"SELECT view_version, {amount} FROM {serving.trino_name(VIEW)} "
            "WHERE currency = 'EUR' AND window_start = ?",
            [hour],
            user=user,
        ).rows
        version, amount = found[0] if found else (None, None)
        what = "revenue (gross)" if version == 1 else "net_revenue"
        print(f"  {user:<15} {versions.cohort(user):>6}  v{version}    {what} = {amount}")


class _Follower:
    """`regauge subscribe VIEW --user U --from-start`, in a thread: it says when it moves."""

    def __init__(self, settings: Settings, user: str) -> None:
        self.settings, self.user = settings, user
        self.copy = Copy()
        self.stop = threading.Event()
        self._lock = threading.Lock()
        subscriber = Subscriber(settings, VIEW, user, from_start=True)
        self.thread = threading.Thread(
            target=subscriber.follow, args=(self._apply, self.stop), daemon=True
        )
        self.thread.start()

    def _apply(self, change: Change) -> None:
        with self._lock:
            self.copy.apply(change)
        if change.op == "reset":
            print(
                f"  [subscriber for {self.user}] now following v{change.version}: its whole "
                "table from the topic, then each change as it is committed",
                flush=True,
            )

    def rows(self) -> set[tuple[int, str, Decimal]]:
        """v2's rows in the copy: window start in seconds, currency, net revenue."""
        with self._lock:
            rows = list(self.copy.rows.values())
        return {
            (
                int(datetime.fromisoformat(r["window_start"]).timestamp()),
                r["currency"],
                # JSON carries the decimal as a number; its shortest repr is its digits.
                Decimal(repr(r["net_revenue"])),
            )
            for r in rows
            if "net_revenue" in r
        }

    def check(self, timeout: float = 180) -> bool:
        """Whether the copy comes to equal the serving view for the user, within `timeout`."""
        sql = (
            "SELECT CAST(to_unixtime(window_start) AS bigint), currency, "
            f"net_revenue FROM {serving.trino_name(VIEW)}"
        )
        deadline = time.monotonic() + timeout
        while True:
            served = {tuple(r) for r in trino_client.query(self.settings, sql, user=self.user).rows}
            mine = self.rows()
            if mine == served or time.monotonic() > deadline:
                print(
                    f"  the copy of {self.user}'s view (v{self.copy.version}, {len(mine):,} rows "
                    f"as of gold commit {self.copy.gold_version}) "
                    + ("equals" if mine == served else "DIFFERS FROM")
                    + f" what Trino serves them ({len(served):,} rows)"
                )
                return mine == served
            time.sleep(3)


def run(settings: Settings, events: int) -> int:
    from spark_jobs.expectations import id_checksum

    _step("starting the local stack (PostgreSQL, Kafka, Trino, Airflow)")
    services.up(settings)
    airflow = airflow_client.Client(settings)

    for view in (VIEW, VISITS):
        _step(f"{view}: starting its story over (earlier demo versions forgotten)")
        for line in lifecycle.forget(settings, view):
            print(f"  {line}")

    # A new seed per demo: its event ids are new, so what it expects is exact.
    seed = int(time.time())
    _step(f"producing {events:,} records of shop traffic with chaos (seed {seed})")
    sent = pipeline.produce(settings, seed=seed, count=events, chaos=True)
    print(sent.summary.describe())
    expected = sent.expected()
    reasons = ", ".join(f"{r}={n}" for r, n in sorted(expected.by_reason().items()))
    print(
        f"the contract expects: {len(expected.silver):,} events in silver, "
        f"{len(expected.duplicates):,} exact duplicates, quarantine: {reasons}"
    )

    _step(
        "ingesting live: Kafka -> bronze -> silver + quarantine (Spark, Delta), in the background"
    )
    ingest_ctl.start(settings, None)
    landed = _wait_for_silver(settings, seed, len(expected.silver))
    print(f"  silver holds {landed:,} of this run's events")

    web = registry.source_tables("web")
    _step(
        f"a second source: the same customers browsing ({web.topic}, with chaos), "
        "ingested by its own query into its own tables"
    )
    # Browsing the very customers and carts of the shop's run, so its visits convert.
    browsed = pipeline.produce(
        settings, seed=seed, count=events // 2, chaos=True, source="web", follows=events
    )
    print(browsed.summary.describe())
    web_expected = browsed.expected()
    web_landed = _wait_for_silver(
        settings, seed, len(web_expected.silver), silver=web.silver, prefix="w"
    )
    web_exact = web_landed == len(web_expected.silver)
    print(
        f"  {web.silver.trino_name} holds {web_landed:,} of this run's events; "
        f"the generator expected {len(web_expected.silver):,}"
    )
    print(trino_client.format_table(_settled_accounting(settings, source="web")))
    print(trino_client.format_table(accounting.by_reason(settings, source="web")))

    _step(f"Airflow: regauge_reprocess {VIEW} v1 (its first version serves everyone once valid)")
    airflow.run("regauge_reprocess", {"view": VIEW, "version": 1})
    print(f"  {_describe(settings, 1)}")

    _step(
        f"regauge subscribe {VIEW} --user {ANALYSTS[1]} --from-start: pushed changes "
        "instead of polling, following the analyst's route"
    )
    follower = _Follower(settings, ANALYSTS[1])

    # More traffic while v2 is reprocessed: the live hand-off must lose none of it.
    stop = threading.Event()
    background = [0]
    # One line at the end instead of two per batch among the steps.
    quiet = [logging.getLogger(n) for n in ("spark_jobs.producer", "warehouse.sql.reference")]
    for logger in quiet:
        logger.setLevel(logging.WARNING)

    def keep_producing() -> None:
        while not stop.is_set():
            pipeline.produce(settings, seed=int(time.time() * 1000) % 10**9, count=200, chaos=True)
            background[0] += 200
            # Gentle: on 2 cores, ingest and two live streams already share the CPU.
            stop.wait(30)

    flowing = threading.Thread(target=keep_producing, daemon=True)
    flowing.start()
    try:
        _step(f"Airflow: regauge_reprocess {VIEW} v2 (net of cancellations), while events flow")
        airflow.run("regauge_reprocess", {"view": VIEW, "version": 2})
        print(f"  {_describe(settings, 2)}")
        hour = _busiest_hour(settings)
        _step(f"Airflow: regauge_rollout {VIEW} v2 to 10 % of analysts, by hand")
        airflow.run("regauge_rollout", {"view": VIEW, "version": 2, "percent": 10})
        _who_sees_what(settings, hour)
        _audit_for_the_gates()
        _step(
            f"Airflow: regauge_autorollout {VIEW} v2: 50 %, then 100 %, each step held "
            f"{HOLD_S} s, then judged by four gates (agreement, freshness, integrity, serving)"
        )
        airflow.run("regauge_autorollout", {**AUTOROLLOUT, "version": 2})
        rolled = _judged(settings, 2) == "completed"
        _who_sees_what(settings, hour)
    finally:
        stop.set()
        flowing.join(60)
        for logger in quiet:
            logger.setLevel(logging.NOTSET)
    print(f"\n  {background[0]:,} more records were produced while v2 was built and rolled out")

    _step("asking Trino: revenue_hourly v1 (gross) and v2 (net of cancellations), same hours")
    print(trino_client.format_table(trino_client.query(settings, SIDE_BY_SIDE_SQL)))

    _step(f"Airflow: regauge_retire {VIEW} v1 (nobody is routed to it any more)")
    airflow.run("regauge_retire", {"view": VIEW, "version": 1})
    for v in versions.versions(settings, VIEW):
        print(f"  {v.label}: {v.status}, {v.rollout_percent} % of users")

    _step(f"the subscriber for {ANALYSTS[1]}, moved to v2 at 50 %: its copy against Trino")
    followed = follower.check()
    follower.stop.set()

    caught = _faulty_v3_rolled_back(settings, airflow, hour)

    _step("asking Trino: every bronze record accounted for, per Kafka partition")
    print(trino_client.format_table(_settled_accounting(settings)))
    _step("asking Trino: the quarantine by reason")
    print(trino_client.format_table(accounting.by_reason(settings)))

    _step(f"asking Trino: did this demo's events land in {SILVER_EVENTS.trino_name} exactly?")
    found = trino_client.query(
        settings,
        "SELECT count(*) AS events, "
        "sum(from_base(substr(to_hex(sha256(to_utf8(event_id))), 1, 8), 16)) AS id_checksum, "
        "count_if(event_type = 'order_placed') AS orders, sum(total) AS order_total "
        f"FROM {SILVER_EVENTS.trino_name} WHERE starts_with(event_id, ?)",
        [f"s{seed}-"],
    )
    print(trino_client.format_table(found))
    events_found, checksum = found.rows[0][0], found.rows[0][1]
    ok = events_found == len(expected.silver) and checksum == id_checksum(expected.silver)
    print(
        f"\n{'exact' if ok else 'MISMATCH'}: silver holds {events_found:,} of this demo's "
        f"events; the generator expected {len(expected.silver):,}"
    )
    evolved = _schema_evolution(settings, airflow, seed, hour)
    _step("asking Trino: closed windows that late and re-admitted events restated")
    print(trino_client.format_table(trino_client.query(settings, RESTATEMENTS_SQL)))

    _step("Airflow: regauge_dbt (dbt build on silver beside the running streams; marts to Trino)")
    airflow.run("regauge_dbt", {})

    _step("Airflow: regauge_forget, for the customer with the most events in this demo")
    customer = _busiest_customer(settings, seed)
    airflow.run(
        "regauge_forget",
        {"customer_id": customer, "reason": "demo: a customer asked to be forgotten"},
    )
    _step(f"asking Trino: rows naming {customer}, per table, after the erasure")
    left = erasures.mentions(settings, customer)
    print(trino_client.format_table(trino_client.Result(["table", "rows"], sorted(left.items()))))
    print(trino_client.format_table(trino_client.query(settings, ERASURES_SQL)))
    forgotten = not any(left.values())
    print(f"\n{'forgotten' if forgotten else 'NOT FORGOTTEN'}: {customer} is in no table")

    _step(
        f"Airflow: regauge_reprocess {VISITS} v1, a view over both sources: each customer's "
        "visits across the web and the shop, and whether a product viewed was ordered"
    )
    airflow.run("regauge_reprocess", {"view": VISITS, "version": 1})
    print(f"  {_describe(settings, 1, VISITS)}")
    _step(
        f"asking Trino as {ANALYSTS[0]}: visits on the busiest days across both sources, "
        "and conversions"
    )
    visits = trino_client.query(settings, VISITS_SQL, user=ANALYSTS[0])
    print(trino_client.format_table(visits))
    # The gate passed (every gold commit equals the view over its snapshot of both
    # silvers); what is left to see is that the web's views meet the shop's orders,
    # on any day: chaos traffic's days years back hold a few visits and seldom one.
    (converted,) = trino_client.query(settings, VISITS_CONVERTED_SQL, user=ANALYSTS[0]).rows[0]
    joined = bool(converted)
    print(
        f"\n{'joined' if joined else 'NOT JOINED'}: visits that viewed a product, then "
        "ordered it, in one view over both sources"
    )

    examples = analyst_examples()
    for title in (
        "Net revenue by customer segment and country",
        "Revenue by product category",
        "Daily net revenue, from the dbt mart",
        "Sessions by referrer, and how many led to an order",
        "Hourly revenue as you see it",
    ):
        _step(f"asking Trino as {ANALYSTS[0]} (docs/analysts.md): {title}")
        answer = trino_client.query(settings, examples[title], user=ANALYSTS[0])
        print(trino_client.format_table(answer))
    print(
        f"\nthe rollout page: {settings.airflow_url}/regauge/ (Airflow's UI, Browse > regauge "
        f"rollouts; user admin, password in {services.Airflow(settings).passwords_file})"
    )
    print(
        "\nstill running: ingest, and the live streams of revenue_hourly v2 and visits v1 "
        "(`regauge streams list`), "
        "and the stack (`make status`); `make down` stops everything"
    )
    return (
        0
        if ok and web_exact and followed and rolled and caught and forgotten and evolved and joined
        else 1
    )


# The automatic rollouts' plan: short holds, so that the story keeps moving.
HOLD_S = 20
AUTOROLLOUT = {"view": VIEW, "steps": [50, 100], "hold_s": HOLD_S}
# Orders produced after the faulty v3 is built: the ones it counts twice.
FAULTY_ORDERS = 300


def _audit_for_the_gates() -> None:
    """The integrity gate reads the latest audit: run its quickest check (every
    analyst's route, in Trino against the registry) rather than wait for the hourly one."""
    import subprocess
    import sys

    _step("regauge audit --checks routing: the integrity gate reads the latest audit")
    argv = [sys.executable, "-m", "warehouse.cli", "audit", "--checks", "routing"]
    done = subprocess.run(argv, capture_output=True, text=True)
    print("\n".join(f"  {line}" for line in done.stdout.strip().splitlines()[-3:]))


def _judged(settings: Settings, version: int) -> str:
    """Print the newest rollout of `version` and its judged steps; return how it ended."""
    from warehouse.base import page
    from warehouse.sql import rollouts

    (r, *_) = rollouts.history(settings, VIEW, 1)
    for e in versions.events(settings, VIEW, 40):
        if e["version"] != version or e["at"] < r.started_at or e["action"] != "judged":
            continue
        judged = page.parse_judged(e["at"].isoformat(), e["detail"])
        if judged is not None:
            f = judged.figures
            print(
                f"  at {judged.percent:>3} %: {'all gates held' if judged.held else 'FAILED'}: "
                f"{f.get('keys_compared')} final windows compared, "
                f"{f.get('keys_unexplained')} differing unexplained; "
                f"{f.get('lag_versions')} silver versions behind; audit passed "
                f"{f.get('audit_passed')}; {f.get('failed_queries')} of {f.get('queries')} "
                "analysts' queries failed"
            )
    print(f"  {r.view_name} v{r.version}: rollout {r.state.replace('_', ' ')}: {r.why}")
    return r.state if r.version == version else "not found"


def _faulty_v3_rolled_back(
    settings: Settings, airflow: airflow_client.Client, hour: datetime | None
) -> bool:
    """A deliberately wrong v3 (spark_jobs/testing/faulty_view.py): equal to v2 on all
    history when built, so its own validation passes; orders past the topic's end
    offsets then count twice.
    Its automatic rollout must be rolled back by the agreement gate, by itself."""
    from spark_jobs.testing import faulty_view
    from warehouse.ops import autorollout, lag

    ends = {p: high for p, (_, high) in lag.kafka_watermarks(settings).items()}
    with faulty_view.added(ends):
        _step(
            f"a faulty {VIEW} v3 ({faulty_view.VIEW_FILE.name}, added for this part of the "
            f"demo): orders reaching Kafka from now on (past offsets {ends}) count twice. "
            "Airflow: regauge_reprocess v3"
        )
        airflow.run("regauge_reprocess", {"view": VIEW, "version": 3})
        print(f"  {_describe(settings, 3)}")
        seed = int(time.time()) + 1
        _step(f"producing {FAULTY_ORDERS} more records, which v3 gets wrong")
        run = pipeline.produce(settings, seed=seed, count=FAULTY_ORDERS, chaos=True)
        _wait_for_silver(settings, seed, len(run.expected().silver))
        # Both streams fold the new orders in (late ones restated by both): a
        # difference then left is a wrong number, not one stream being behind.
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and any(
            autorollout.lag(settings, VIEW, v).get("lag_versions") != 0 for v in (2, 3)
        ):
            time.sleep(3)
        _step(f"Airflow: regauge_autorollout {VIEW} v3 to 100 %, held {HOLD_S} s")
        run_id = airflow.trigger(
            "regauge_autorollout", {**AUTOROLLOUT, "version": 3, "steps": [100]}
        )
        state = airflow.wait("regauge_autorollout", run_id)
        print(f"  the Airflow run {state} (a rollback fails its run, so that it is seen)")
        rolled_back = _judged(settings, 3) == "rolled_back"
        _who_sees_what(settings, hour)
        _step(f"Airflow: regauge_retire {VIEW} v3")
        airflow.run("regauge_retire", {"view": VIEW, "version": 3})
    back = {v.version: (v.status, v.rollout_percent) for v in versions.versions(settings, VIEW)}
    print(f"  {', '.join(f'v{n}: {st} {pct} %' for n, (st, pct) in sorted(back.items()))}")
    return rolled_back and back.get(2) == ("serving", 100) and state == "failed"


# Orders the producer sends as schema_version 2: few, so the story stays readable.
V2_ORDERS = 20


def _schema_evolution(
    settings: Settings, airflow: airflow_client.Client, seed: int, hour: datetime | None
) -> bool:
    """v2 orders before the contract knows them, then deploy 2 and re-admit them: True if
    every one ends in silver with the accounting exact."""
    from spark_jobs import generator, producer
    from warehouse.ops import readmit

    at = (hour or generator.DEFAULT_START).replace(minute=0, second=0, microsecond=0)
    at = at if at.tzinfo else at.replace(tzinfo=UTC)
    _step(
        f"the producer moves to order_placed schema_version 2 (a discount, docs/contract.md "
        f"§10) before the lake's contract knows it: {V2_ORDERS} EUR orders in the hour from "
        f"{at:%Y-%m-%d %H:%M}"
    )
    summary, _ = producer.produce_records(settings, generator.orders_v2(seed, V2_ORDERS, at))
    print(summary.describe())
    prefix = f"v2-{seed}-"
    print(trino_client.format_table(_v2_places(settings, prefix, V2_ORDERS)))

    _step("regauge sources deploy shop 2: the lake runs the shop's contract version 2")
    for line in readmit.deploy(settings, "shop", 2).lines():
        print(f"  {line}")

    _step("Airflow: regauge_readmit shop (the quarantined records, validated again)")
    airflow.run("regauge_readmit", {"source": "shop", "reason": "unsupported_schema_version"})
    print(trino_client.format_table(trino_client.query(settings, READMISSIONS_SQL)))
    _step("asking Trino: where the v2 orders are now, and every record still accounted for")
    places = _v2_places(settings, prefix, V2_ORDERS)
    print(trino_client.format_table(places))
    accounted = _settled_accounting(settings)
    print(trino_client.format_table(accounted))
    unaccounted = accounted.columns.index("unaccounted")
    in_silver = sum(r[-1] for r in places.rows if r[0] == "silver")
    # The live version folds them in like late events, within a round or two.
    restated = _restatements(settings, "readmission")
    windows = "window" if restated == 1 else "windows"
    print(f"  {VIEW} v2 restated {restated} closed {windows} with the re-admitted orders")
    return in_silver == V2_ORDERS and all(r[unaccounted] == 0 for r in accounted.rows)


def _v2_places(
    settings: Settings, prefix: str, want: int, timeout: float = 300
) -> trino_client.Result:
    """Where the records with ids starting `prefix` are (silver, or the quarantine by
    reason), once all `want` of them are in one or the other."""
    sql = f"""
    SELECT 'silver' AS place, CAST(NULL AS varchar) AS reason, schema_version, count(*) AS n
    FROM {SILVER_EVENTS.trino_name} WHERE starts_with(event_id, ?)
    GROUP BY schema_version
    UNION ALL
    SELECT 'quarantine', reason, NULL, count(*)
    FROM {registry.SILVER_QUARANTINE.trino_name} WHERE starts_with(event_id, ?)
    GROUP BY reason
    ORDER BY place DESC, reason
    """
    deadline = time.monotonic() + timeout
    while True:
        found = trino_client.query(settings, sql, [prefix, prefix])
        if sum(r[-1] for r in found.rows) >= want or time.monotonic() > deadline:
            return found
        time.sleep(3)


def _restatements(settings: Settings, reason: str, timeout: float = 180) -> int:
    """Windows restated for `reason`, once there are some (0 after `timeout`)."""
    sql = (
        f"SELECT count(DISTINCT window_start) FROM {registry.GOLD_RESTATEMENTS.trino_name} "
        "WHERE reason = ?"
    )
    deadline = time.monotonic() + timeout
    while True:
        (n,) = trino_client.query(settings, sql, [reason]).rows[0]
        if n or time.monotonic() > deadline:
            return int(n)
        time.sleep(5)


READMISSIONS_SQL = f"""
SELECT readmission_id, reason, contract_version, status, examined, admitted,
       json_format(still_quarantined) AS still_quarantined
FROM {registry.TRINO_OPS_CATALOG}.control.readmissions
ORDER BY requested_at DESC
LIMIT 1
"""


def _settled_accounting(
    settings: Settings, timeout: float = 300, source: str = registry.SHOP_SOURCE
) -> trino_client.Result:
    """`source`'s accounting once ingest has settled what it was still working on."""
    deadline = time.monotonic() + timeout
    while True:
        result = accounting.per_partition(settings, source=source)
        unaccounted = result.columns.index("unaccounted")
        if all(row[unaccounted] == 0 for row in result.rows) or time.monotonic() > deadline:
            return result
        time.sleep(5)


ERASURES_SQL = f"""
SELECT erasure_id, reason, status, requested_at, completed_at, removed
FROM {registry.TRINO_OPS_CATALOG}.control.erasures
ORDER BY requested_at DESC
LIMIT 1
"""


def _busiest_customer(settings: Settings, seed: int) -> str:
    """The customer with the most of this demo's events in silver."""
    rows = trino_client.query(
        settings,
        f"SELECT customer_id FROM {SILVER_EVENTS.trino_name} WHERE starts_with(event_id, ?) "
        "GROUP BY customer_id ORDER BY count(*) DESC, customer_id LIMIT 1",
        [f"s{seed}-"],
    ).rows
    return str(rows[0][0])


def _describe(settings: Settings, version: int, view: str = VIEW) -> str:
    v = versions.get(settings, view, version)
    summary = (v.validation or {}).get("summary", "")
    return (
        f"{v.label}: {v.status} at {v.rollout_percent} %, built from {v.source_position}; "
        f"validation: {summary}"
    )


def _busiest_hour(settings: Settings) -> datetime | None:
    """The EUR hour where v2 differs most from v1: the one worth watching."""
    found = trino_client.query(
        settings,
        f"SELECT window_start FROM {V2} "
        "WHERE currency = 'EUR' ORDER BY cancelled_revenue DESC, gross_revenue DESC LIMIT 1",
    ).rows
    return found[0][0] if found else None


V1 = registry.gold_view_table(VIEW, 1).trino_name
V2 = registry.gold_view_table(VIEW, 2).trino_name
SIDE_BY_SIDE_SQL = f"""
SELECT v1.window_start, v1.currency, v1.orders, v1.revenue AS v1_revenue,
       v2.orders_cancelled AS v2_cancelled, v2.net_revenue AS v2_net_revenue
FROM {V1} AS v1
JOIN {V2} AS v2 ON v2.window_start = v1.window_start AND v2.currency = v1.currency
WHERE v1.currency = 'EUR'
ORDER BY v2.orders_cancelled DESC, v1.revenue DESC, v1.window_start
LIMIT 8
"""
VISITS_SQL = f"""
SELECT date(visit_start) AS day, count(*) AS visits,
       count_if(web_sessions > 0 AND orders > 0) AS browsed_and_ordered,
       count_if(converted) AS converted,
       round(100.0 * count_if(converted) / count(*), 1) AS converted_pct
FROM {serving.trino_name(VISITS)}
GROUP BY date(visit_start)
ORDER BY visits DESC, day
LIMIT 8
"""
VISITS_CONVERTED_SQL = f"SELECT count_if(converted) FROM {serving.trino_name(VISITS)}"
RESTATEMENTS_SQL = f"""
SELECT view, version, reason, count(*) AS restatements,
       count(DISTINCT window_start) AS windows, round(avg(lateness) / 3600.0, 1) AS avg_hours_late
FROM {registry.GOLD_RESTATEMENTS.trino_name}
GROUP BY view, version, reason
ORDER BY view, version, reason
"""
