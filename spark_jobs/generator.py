"""Deterministic shop traffic, and the chaos real producers add to it.

Pure Python, no IO: for a seed, the same records in the same order, every
time. A shopper adds and removes cart items, sometimes orders what is in the
cart, pays minutes later, and now and then cancels minutes to days later.

With chaos the stream also holds what real producers send: re-sends of the
same event (a retry; sometimes with its keys in another order), the same
event_id with other content, events out of order and very late, and records
of every quarantine reason. Each record carries what the contract says must
become of it, so a test can compare the lake with the generator's own record
(see `expected_outcome`, which needs the Kafka positions the records got).
"""

from __future__ import annotations

import copy
import json
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from spark_jobs.engine import contract

VALID = "valid"
DUPLICATE = "duplicate"
CONFLICT = "conflicting_duplicate"

COUNTRIES = {"DE": "EUR", "FR": "EUR", "NL": "EUR", "US": "USD", "GB": "GBP"}
SEGMENTS = ("consumer", "consumer", "consumer", "business", "vip")
CATEGORIES = ("books", "games", "garden", "kitchen", "music", "outdoor", "toys")
CANCEL_REASONS = ("changed_mind", "found_cheaper", "late_delivery", "duplicate_order")
N_PRODUCTS = 200
# The schema version of every event this generator writes: its payloads are each
# type's version 1 (docs/contract.md §1).
SCHEMA_VERSION = 1
DEFAULT_START = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Customer:
    customer_id: str
    country: str
    segment: str
    signup_date: date

    @property
    def currency(self) -> str:
        return COUNTRIES[self.country]


@dataclass(frozen=True)
class Product:
    product_id: str
    category: str
    list_price: Decimal


@dataclass
class Record:
    """One Kafka record to send, and what the contract says must become of it."""

    key: bytes
    value: bytes
    # VALID (silver, or a duplicate of it: decided by Kafka position) or a reason.
    expect: str
    event_id: str | None = None
    # The parsed event, for telling exact from conflicting duplicates.
    content: dict[str, Any] | None = None
    kind: str = "event"
    # The producer's clock when it sent the record (ms); None: the machine's clock.
    timestamp_ms: int | None = None


# -- reference data ------------------------------------------------------------------
def customer(i: int) -> Customer:
    """Customer i is the same in every run, whatever the seed: reference data is shared."""
    rng = random.Random(f"customer-{i}")
    return Customer(
        customer_id=f"cust-{i:05d}",
        country=rng.choice(sorted(COUNTRIES)),
        segment=rng.choice(SEGMENTS),
        signup_date=date(2024, 1, 1) + timedelta(days=rng.randrange(700)),
    )


def product(i: int) -> Product:
    rng = random.Random(f"product-{i}")
    return Product(
        product_id=f"prod-{i:04d}",
        category=rng.choice(CATEGORIES),
        list_price=Decimal(rng.randrange(199, 25000)) / 100,
    )


def customers_for(count: int) -> list[Customer]:
    """The customers a run of `count` records shops with."""
    return [customer(i) for i in range(max(20, count // 40))]


def products() -> list[Product]:
    return [product(i) for i in range(N_PRODUCTS)]


# -- clean traffic -------------------------------------------------------------------
def _ts(t: datetime, rng: random.Random) -> str:
    """RFC 3339 with milliseconds; one event in twenty carries a +02:00 offset."""
    if rng.random() < 0.05:
        local = t.astimezone(_PLUS_TWO)
        return local.strftime("%Y-%m-%dT%H:%M:%S.") + f"{local.microsecond // 1000:03d}+02:00"
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


_PLUS_TWO = timezone(timedelta(hours=2))


class _Ids:
    def __init__(self, run: str) -> None:
        self.run = run
        self.n = 0

    def next(self, tag: str = "") -> str:
        self.n += 1
        return f"{self.run}-{tag}{self.n:07d}"


def _event(
    ids: _Ids, etype: str, t: datetime, cust: Customer, payload: dict[str, Any], rng: random.Random
) -> tuple[datetime, dict[str, Any]]:
    return t, {
        "event_id": ids.next(),
        "event_type": etype,
        "event_time": _ts(t, rng),
        "customer_id": cust.customer_id,
        "schema_version": SCHEMA_VERSION,
        "payload": payload,
    }


def _session(
    ids: _Ids, rng: random.Random, cust: Customer, catalogue: Sequence[Product], t: datetime
) -> list[tuple[datetime, dict[str, Any]]]:
    out = []
    cart: Counter[str] = Counter()
    prices = {p.product_id: p.list_price for p in catalogue}
    for _ in range(rng.randint(1, 5)):
        t += timedelta(seconds=rng.uniform(10, 480), milliseconds=rng.randrange(1000))
        prod = rng.choice(catalogue).product_id
        qty = rng.randint(1, 3)
        cart[prod] += qty
        out.append(
            _event(ids, "cart_item_added", t, cust, {"product_id": prod, "quantity": qty}, rng)
        )
    if rng.random() < 0.15:
        prod = rng.choice(sorted(cart))
        qty = rng.randint(1, cart[prod])
        cart[prod] -= qty
        t += timedelta(seconds=rng.uniform(5, 300))
        out.append(
            _event(ids, "cart_item_removed", t, cust, {"product_id": prod, "quantity": qty}, rng)
        )
    cart = +cart  # drop products removed entirely
    if not cart or rng.random() >= 0.45:
        return out
    order_id = ids.next("o")
    lines = sorted(cart.items())
    items = [{"product_id": p, "quantity": q, "unit_price": prices[p]} for p, q in lines]
    total = sum((q * prices[p] for p, q in lines), Decimal("0.00"))
    t += timedelta(seconds=rng.uniform(30, 300))
    placed = {"order_id": order_id, "currency": cust.currency, "items": items, "total": total}
    out.append(_event(ids, "order_placed", t, cust, placed, rng))
    if rng.random() < 0.9:
        paid = t + timedelta(seconds=rng.uniform(5, 600))
        payment = {"order_id": order_id, "amount": total, "currency": cust.currency}
        out.append(_event(ids, "payment_captured", paid, cust, payment, rng))
    if rng.random() < 0.08:
        # Minutes to days later: cancellations restate old windows of revenue v2.
        later = t + timedelta(minutes=10 + rng.expovariate(1 / 600))
        cancel = {"order_id": order_id, "reason": rng.choice(CANCEL_REASONS)}
        out.append(_event(ids, "order_cancelled", later, cust, cancel, rng))
    return out


def orders_v2(
    seed: int, count: int, hour: datetime, currency: str = "EUR"
) -> list[tuple[bytes, bytes]]:
    """`count` valid `order_placed` events of schema_version 2 (docs/contract.md §10: a
    `discount`, and total = Σ quantity x unit_price - discount), each by a customer
    paying in `currency`, placed within the hour from `hour`, as (key, value).
    Their ids are `v2-<seed>-N`: what a producer sends once it has moved to v2."""
    rng = random.Random(seed)
    people = [c for c in customers_for(max(count, 50) * 4) if c.currency == currency]
    catalogue = products()
    out = []
    for n in range(count):
        cust = rng.choice(people)
        lines = [(rng.choice(catalogue), rng.randint(1, 3)) for _ in range(rng.randint(1, 3))]
        items = [
            {"product_id": p.product_id, "quantity": q, "unit_price": p.list_price}
            for p, q in lines
        ]
        gross = sum((q * p.list_price for p, q in lines), Decimal("0.00"))
        discount = (gross * Decimal(rng.choice((5, 10, 20))) / 100).quantize(Decimal("0.01"))
        t = hour + timedelta(seconds=rng.uniform(0, 3599))
        event = {
            "event_id": f"v2-{seed}-{n:05d}",
            "event_type": "order_placed",
            "event_time": _ts(t, rng),
            "customer_id": cust.customer_id,
            "schema_version": 2,
            "payload": {
                "order_id": f"v2-{seed}-o{n:05d}",
                "currency": currency,
                "items": items,
                "total": gross - discount,
                "discount": discount,
            },
        }
        out.append((cust.customer_id.encode(), encode(event)))
    return out


def traffic(
    seed: int, count: int, start: datetime = DEFAULT_START, days: float = 7.0
) -> list[dict[str, Any]]:
    """At least `count` clean events, in event-time order, from `start` over `days`."""
    rng = random.Random(seed)
    ids = _Ids(f"s{seed}")
    people = customers_for(count)
    catalogue = products()
    timed: list[tuple[datetime, dict[str, Any]]] = []
    span = days * 86400
    while len(timed) < count:
        t = start + timedelta(seconds=rng.uniform(0, span))
        timed += _session(ids, rng, rng.choice(people), catalogue, t)
    timed.sort(key=lambda te: te[0])
    return [event for _, event in timed[:count]]


# -- encoding ------------------------------------------------------------------------
def encode(event: Any, *, shuffle: random.Random | None = None) -> bytes:
    """Compact JSON with money as exact decimals (never floats); keys optionally shuffled."""
    return _json(event, shuffle).encode()


def _json(obj: Any, shuffle: random.Random | None) -> str:
    if isinstance(obj, dict):
        keys = list(obj)
        if shuffle is not None:
            shuffle.shuffle(keys)
        return "{" + ",".join(f"{json.dumps(k)}:{_json(obj[k], shuffle)}" for k in keys) + "}"
    if isinstance(obj, list):
        return "[" + ",".join(_json(x, shuffle) for x in obj) + "]"
    if isinstance(obj, Decimal):
        return format(obj, "f")
    return json.dumps(obj)


def _record(event: dict[str, Any], kind: str = "event", **kw: Any) -> Record:
    return Record(
        key=str(event.get("customer_id", "")).encode(),
        value=encode(event, **kw),
        expect=VALID,
        event_id=event["event_id"],
        content=event,
        kind=kind,
    )


def _bad(value: bytes | dict[str, Any], reason: str, kind: str, key: str = "cust-bad") -> Record:
    raw = value if isinstance(value, bytes) else encode(value)
    return Record(key=key.encode(), value=raw, expect=reason, kind=kind)


# -- chaos ---------------------------------------------------------------------------
def _broken(ids: _Ids) -> list[Record]:
    """One record of every way to fail the contract, each from a copy of a good event."""

    def mutate(**changes: Any) -> dict[str, Any]:
        event = json.loads(encode(_TEMPLATE), parse_float=Decimal)
        event["event_id"] = ids.next("bad-")
        for path, value in changes.items():
            target = event
            *parents, leaf = path.split("__")
            for p in parents:
                target = target[p]
            if value is _DROP:
                target.pop(leaf, None)
            else:
                target[leaf] = copy.deepcopy(value)
        return event

    def spaced(event: dict[str, Any]) -> dict[str, Any]:
        # A bad id that is still this run's own: a constant one would recur in every
        # run, and on a lake that outlives runs an erasure of the template's customer
        # keeps its hash, so every later run's copy would read as a forgotten id back.
        event["event_id"] = event["event_id"].replace("-", " ")
        return event

    item = {"product_id": "prod-0001", "quantity": 2, "unit_price": Decimal("1.25")}
    order: dict[str, Any] = {
        "order_id": "o-x",
        "currency": "EUR",
        "items": [item],
        "total": Decimal("2.50"),
    }
    as_order = {"event_type": "order_placed", "payload": order}
    padding = "x" * (contract.MAX_VALUE_BYTES + 100)
    return [
        _bad(mutate(note=padding), "oversize", "oversize"),
        _bad(b"\xff\xfe\x00 not utf-8 \xc3\x28", "malformed_json", "not_utf8"),
        _bad(b'{"event_id": "broken', "malformed_json", "not_json"),
        _bad(b'[{"event_id": "in-an-array"}]', "malformed_json", "json_not_object"),
        _bad(mutate(customer_id=_DROP), "missing_field", "missing_customer_id"),
        _bad(mutate(payload__product_id=None), "missing_field", "null_payload_field"),
        _bad(mutate(payload__quantity="2"), "invalid_field", "integer_as_string"),
        _bad(mutate(payload__quantity=0), "invalid_field", "quantity_below_one"),
        _bad(mutate(event_time="2026-01-01T10:00:00.000"), "invalid_field", "time_without_offset"),
        _bad(spaced(mutate()), "invalid_field", "bad_id_characters"),
        _bad(
            mutate(
                **as_order,
                payload__items=[{**item, "unit_price": Decimal("1.255")}],
                payload__total=Decimal("2.51"),
            ),
            "invalid_field",
            "three_decimals",
        ),
        _bad(mutate(**as_order, payload__currency="JPY"), "invalid_field", "bad_currency"),
        _bad(mutate(**as_order, payload__items=[]), "invalid_field", "empty_items"),
        _bad(mutate(event_type="page_viewed"), "unknown_event_type", "unknown_type"),
        _bad(mutate(schema_version=2), "unsupported_schema_version", "schema_v2"),
        _bad(mutate(event_time="1999-12-31T23:59:59.000Z"), "event_time_out_of_range", "too_old"),
        _bad(
            mutate(event_time="2999-01-01T00:00:00.000Z"),
            "event_time_out_of_range",
            "future",
        ),
        _bad(mutate(**as_order, payload__total=Decimal("2.49")), "total_mismatch", "bad_total"),
    ]


_DROP = object()


def _conflicting(event: dict[str, Any], rng: random.Random, people: Sequence[Customer]) -> Record:
    """Same event_id, other content; half of them under another customer (so often
    another partition, which may precede the original in log order)."""
    other = json.loads(encode(event), parse_float=Decimal)
    if rng.random() < 0.5:
        other["customer_id"] = rng.choice(people).customer_id
    else:
        other["event_time"] = _ts(
            datetime.fromisoformat(event["event_time"]) + timedelta(seconds=1), rng
        )
    return _record(other, "conflicting")


def clean_count(count: int, *, chaos: bool) -> int:
    """How many clean events `records(seed, count, chaos=chaos)` draws from
    `traffic(seed, ...)`: what a web run that follows it (`web_traffic`) needs."""
    if not chaos:
        return count
    n_bad = max(len(_broken(_Ids("count"))), count // 100)
    return count - n_bad - count * 3 // 100 - count // 100


def records(
    seed: int,
    count: int,
    *,
    chaos: bool = False,
    start: datetime = DEFAULT_START,
    days: float = 7.0,
) -> list[Record]:
    """Exactly `count` records to send, in sending order."""
    rng = random.Random(seed * 7919 + 1)
    if not chaos:
        return [_record(e) for e in traffic(seed, count, start, days)]
    broken_one_each = _broken(_Ids(f"s{seed}"))
    n_bad = max(len(broken_one_each), count // 100)
    n_resend = count * 3 // 100
    n_conflict = count // 100
    n_clean = clean_count(count, chaos=True)
    if n_clean < 1:
        raise ValueError(f"--chaos needs at least {count - n_clean + 1} records; got {count}")
    events = traffic(seed, n_clean, start, days)
    out = [_record(e) for e in events]
    people = customers_for(count)

    # Out of order: 2 % swap with a neighbour up to 50 places on; 0.5 % arrive at
    # the very end, days after their event time.
    for _ in range(n_clean // 50):
        i = rng.randrange(len(out))
        j = min(len(out) - 1, i + rng.randint(1, 50))
        out[i], out[j] = out[j], out[i]
    late = [out.pop(rng.randrange(len(out))) for _ in range(n_clean // 200)]
    for r in late:
        r.kind = "very_late"
    out += late

    extras: list[Record] = []
    for _ in range(n_resend):  # retries: the same event again, sometimes spelled differently
        event = rng.choice(events)
        shuffled = rng.random() < 0.2
        kind = "resend_reordered" if shuffled else "resend"
        extras.append(_record(event, kind, shuffle=rng if shuffled else None))
    extras += [_conflicting(rng.choice(events), rng, people) for _ in range(n_conflict)]
    bad = list(broken_one_each)
    while len(bad) < n_bad:
        bad += _broken(_Ids(f"s{seed}-{len(bad)}"))
    extras += bad[:n_bad]
    for r in extras:  # later than the original, at a random place
        out.insert(rng.randrange(len(out) // 2, len(out) + 1), r)
    return out


def skewed(seed: int, count: int, *, producer_clock: datetime, now: datetime) -> list[Record]:
    """Events of the three days before `now`, sent by a producer whose clock reads
    `producer_clock`: Kafka keeps the producer's timestamp (CreateTime), so an event
    more than 24 h after it is out of range, and every other one is valid, however late."""
    return _stamped(seed, count, now - timedelta(days=3), 3.0, producer_clock, "clock_skew")


def recent(seed: int, count: int, *, sent_at: datetime, span: timedelta) -> list[Record]:
    """Clean events of the `span` before `sent_at`, all sent then (their Kafka
    timestamp): a backlog of recent traffic arriving at once. A cancellation comes
    minutes to days after its order, so one more than 24 h after `sent_at` is out
    of range; every other event is valid."""
    return _stamped(seed, count, sent_at - span, span / timedelta(days=1), sent_at, "recent")


def _stamped(
    seed: int, count: int, start: datetime, days: float, clock: datetime, kind: str
) -> list[Record]:
    """Traffic from `start` over `days`, each record stamped with `clock` (CreateTime),
    and what the contract makes of an event more than 24 h after it."""
    stamp = int(clock.timestamp() * 1000)
    limit = clock + timedelta(hours=contract.MAX_CLOCK_SKEW_HOURS)
    out = []
    for event in traffic(seed, count, start, days):
        rec = _record(event, kind)
        rec.timestamp_ms = stamp
        # event_time carries milliseconds; compare what silver will parse.
        t = datetime.fromisoformat(event["event_time"])
        if t > limit:
            rec.expect = "event_time_out_of_range"
        out.append(rec)
    return out


# The good event every broken record starts from.
_TEMPLATE: dict[str, Any] = {
    "event_id": "template",
    "event_type": "cart_item_added",
    "event_time": "2026-01-01T10:00:00.000Z",
    "customer_id": "cust-00000",
    "schema_version": SCHEMA_VERSION,
    "payload": {"product_id": "prod-0001", "quantity": 1},
}


# -- the web source (warehouse/sources/web.py) ----------------------------------------
WEB_REFERRERS = ("direct", "search", "ads", "email", "social")
# A customer's web events more than this apart belong to two sessions.
WEB_SESSION_GAP = timedelta(minutes=30)


def web_traffic(
    seed: int,
    count: int,
    start: datetime = DEFAULT_START,
    days: float = 7.0,
    follows: int | None = None,
) -> list[dict[str, Any]]:
    """Exactly `count` clean web events, in event-time order: how the customers of the
    shop's `traffic(seed, ...)` browsed. Before each product a customer adds to a
    cart, they view it (and often others); a customer's views less than
    `WEB_SESSION_GAP` apart share a session, which a `session_started` opens. So the
    web's views and the shop's orders of one seed join, as a conversion view needs.

    `follows`: the number of clean shop events of the run to follow
    (`clean_count`), so the web browses that very run's traffic; whole customers'
    browsing is then kept until `count` is reached, so the visits kept are whole and
    their orders convert. Without it, the shop traffic followed is sized to `count`."""
    rng = random.Random(seed * 31 + 7)
    ids = _Ids(f"w{seed}")
    if follows is not None:
        timed = _browsing(traffic(seed, follows, start, days), rng, ids)
        if len(timed) < count:
            raise ValueError(
                f"the shop's {follows:,} clean events of seed {seed} give {len(timed):,} web "
                f"events; ask for at most that many, not {count:,}"
            )
        return [event for _, event in _whole_customers(timed, count, rng)]
    shop_count = count
    timed = []
    while len(timed) < count:
        timed = _browsing(traffic(seed, shop_count, start, days), rng, ids)
        shop_count *= 2
    timed.sort(key=lambda te: te[0])
    return [event for _, event in timed[:count]]


def _browsing(
    shop: list[dict[str, Any]], rng: random.Random, ids: _Ids
) -> list[tuple[datetime, dict[str, Any]]]:
    """The web events (with their times) of the customers of `shop`'s cart adds."""
    catalogue = products()
    timed: list[tuple[datetime, dict[str, Any]]] = []
    last: dict[str, tuple[datetime, str]] = {}  # customer -> (last view, session)
    for event in shop:
        if event["event_type"] != "cart_item_added":
            continue
        # In UTC: `_ts` writes a UTC time as it is, and one in twenty shop events
        # carries a +02:00 offset.
        t = datetime.fromisoformat(event["event_time"]).astimezone(UTC)
        who = event["customer_id"]
        seen = [rng.choice(catalogue).product_id for _ in range(rng.randint(0, 2))]
        views = [*seen, event["payload"]["product_id"]]
        first = t - timedelta(seconds=rng.uniform(5, 60) * len(views))
        before = last.get(who)
        if before is None or first - before[0] > WEB_SESSION_GAP:
            session = ids.next("sess-")
            opened = first - timedelta(seconds=rng.uniform(5, 120))
            payload = {"session_id": session, "referrer": rng.choice(WEB_REFERRERS)}
            timed.append((opened, _web_event(ids, "session_started", opened, who, payload, rng)))
        else:
            session = before[1]
        # Each view before the add, the added product's last.
        stamps = sorted(first + (t - first) * rng.random() for _ in views)
        for at, product in zip(stamps, views, strict=True):
            payload = {"session_id": session, "product_id": product}
            timed.append((at, _web_event(ids, "product_viewed", at, who, payload, rng)))
        last[who] = (t, session)
    return timed


def _whole_customers(
    timed: list[tuple[datetime, dict[str, Any]]], count: int, rng: random.Random
) -> list[tuple[datetime, dict[str, Any]]]:
    """Exactly `count` of `timed`, in time order: every event of customers drawn at
    random, and the earliest of the last one drawn."""
    by_customer: dict[str, list[tuple[datetime, dict[str, Any]]]] = {}
    for te in timed:
        by_customer.setdefault(te[1]["customer_id"], []).append(te)
    who = sorted(by_customer)
    rng.shuffle(who)
    kept: list[tuple[datetime, dict[str, Any]]] = []
    for customer in who:
        mine = sorted(by_customer[customer], key=lambda te: te[0])
        kept += mine[: count - len(kept)]
        if len(kept) == count:
            break
    return sorted(kept, key=lambda te: te[0])


def _web_event(
    ids: _Ids, etype: str, t: datetime, who: str, payload: dict[str, Any], rng: random.Random
) -> dict[str, Any]:
    return {
        "event_id": ids.next(),
        "event_type": etype,
        "event_time": _ts(t, rng),
        "customer_id": who,
        "schema_version": SCHEMA_VERSION,
        "payload": payload,
    }


def _web_broken(ids: _Ids) -> list[Record]:
    """One record of each way a web event fails its contract."""

    def bad(**changes: Any) -> dict[str, Any]:
        event = {
            "event_id": ids.next("bad-"),
            "event_type": "product_viewed",
            "event_time": "2026-01-01T10:00:00.000Z",
            "customer_id": "cust-bad",
            "schema_version": 1,
            "payload": {"session_id": "sess-bad", "product_id": "prod-0001"},
        }
        return {**event, **changes}

    started = {"event_type": "session_started"}
    return [
        _bad(b'{"event_id": "broken', "malformed_json", "web_not_json"),
        _bad(bad(payload={"product_id": "prod-0001"}), "missing_field", "web_no_session"),
        _bad(
            bad(**started, payload={"session_id": "s", "referrer": "billboard"}),
            "invalid_field",
            "web_bad_referrer",
        ),
        _bad(bad(event_type="page_scrolled"), "unknown_event_type", "web_unknown_type"),
        _bad(bad(schema_version=2), "unsupported_schema_version", "web_schema_v2"),
        _bad(bad(event_time="1999-12-31T23:59:59.000Z"), "event_time_out_of_range", "web_too_old"),
    ]


def web_records(
    seed: int,
    count: int,
    *,
    chaos: bool = False,
    start: datetime = DEFAULT_START,
    days: float = 7.0,
    follows: int | None = None,
) -> list[Record]:
    """Exactly `count` web records to send, in sending order. With `chaos`: resends
    (exact duplicates, some spelled otherwise), conflicts (same id, another product),
    one of each broken kind (`_web_broken`), and late arrivals. `follows`: as for
    `web_traffic`."""
    rng = random.Random(seed * 7919 + 3)
    if not chaos:
        return [_record(e) for e in web_traffic(seed, count, start, days, follows)]
    broken = _web_broken(_Ids(f"w{seed}"))
    n_resend, n_conflict = count * 3 // 100, count // 100
    n_clean = count - len(broken) - n_resend - n_conflict
    if n_clean < 1:
        raise ValueError(f"--chaos needs at least {count - n_clean + 1} records; got {count}")
    events = web_traffic(seed, n_clean, start, days, follows)
    out = [_record(e) for e in events]
    late = [out.pop(rng.randrange(len(out))) for _ in range(n_clean // 200)]
    for r in late:
        r.kind = "very_late"
    out += late
    extras: list[Record] = []
    for _ in range(n_resend):
        shuffled = rng.random() < 0.2
        kind = "resend_reordered" if shuffled else "resend"
        extras.append(_record(rng.choice(events), kind, shuffle=rng if shuffled else None))
    for _ in range(n_conflict):
        other = json.loads(encode(rng.choice(events)), parse_float=Decimal)
        if "product_id" in other["payload"]:
            other["payload"]["product_id"] = f"prod-{rng.randrange(10_000, 20_000)}"
        else:
            other["payload"]["referrer"] = (
                "direct" if other["payload"]["referrer"] != "direct" else "ads"
            )
        extras.append(_record(other, "conflicting"))
    extras += broken
    for r in extras:  # later than the original, at a random place
        out.insert(rng.randrange(len(out) // 2, len(out) + 1), r)
    return out


# Each source's generator: `regauge produce --source S` sends its records.
GENERATORS: dict[str, Callable[..., list[Record]]] = {"shop": records, "web": web_records}
