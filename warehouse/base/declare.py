"""The words a source's declaration is written in (CONTRACT.md §10).

A source is one Kafka topic and the contract its records keep: which envelope
fields hold the event id, the event time and the subject erasure goes by (§8),
its event types, and for each type and schema version the payload's fields,
their kinds and the rules across them. A declaration is data, not code: the
engine (`spark_jobs.contract`) compiles it into the Spark expressions that
validate and type records. Declarations live in `warehouse.sources`, one
module per source.

Everything here is a frozen dataclass of tuples, in declaration order. Order
is meaning: where a record breaks several rules, the first declared names it
(§1's precedence). Frozen values compare by value, so two versions of a
contract can be compared field by field. No Spark here: a declaration loads,
and `regauge sources` prints it, anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

# The largest count: a 32-bit signed integer, as silver types counts.
INT_MAX = 2_147_483_647


# -- kinds of value ---------------------------------------------------------------------
@dataclass(frozen=True)
class Text:
    """A JSON string."""

    @property
    def text(self) -> str:
        return "a string"


@dataclass(frozen=True)
class Count:
    """A JSON integer (3, 3.0 and 3e0 alike; not "3", not 3.5) from 1 to INT_MAX."""

    @property
    def text(self) -> str:
        return f"an integer from 1 to {INT_MAX}"


@dataclass(frozen=True)
class Money:
    """A JSON number >= 0 with at most 2 decimals, exact (never a float): DECIMAL(18,2)."""

    @property
    def text(self) -> str:
        return "a number >= 0 with at most 2 decimals"


@dataclass(frozen=True)
class OneOf:
    """A JSON string that is one of `values`."""

    values: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.values or len(set(self.values)) != len(self.values):
            raise ValueError(f"OneOf needs distinct values, got {self.values!r}")

    @property
    def text(self) -> str:
        return f"one of {', '.join(self.values)}"


@dataclass(frozen=True)
class Items:
    """A non-empty JSON array of objects, each with `fields` (all required)."""

    fields: tuple[Field, ...]

    def __post_init__(self) -> None:
        _distinct("Items", self.fields)
        for f in self.fields:
            if isinstance(f.kind, Items):
                raise ValueError(f"item field {f.name}: items inside items are not supported")

    @property
    def text(self) -> str:
        return "a non-empty array of items"


Kind = Text | Count | Money | OneOf | Items


@dataclass(frozen=True)
class Field:
    """A required payload field: present, not null, and a valid `kind`."""

    name: str
    kind: Kind

    def __post_init__(self) -> None:
        _check_name("field", self.name)


# -- rules across fields ------------------------------------------------------------------
@dataclass(frozen=True)
class SumOf:
    """`target` equals the sum over the `items` array of the product of `factors`
    (a `total_mismatch` otherwise): total = Σ quantity x unit_price."""

    target: str
    items: str
    factors: tuple[str, ...]

    @property
    def text(self) -> str:
        return "equal to Σ " + " x ".join(f"{self.items}[].{f}" for f in self.factors)

    def check(self, fields: tuple[Field, ...]) -> None:
        by_name = {f.name: f.kind for f in fields}
        if not isinstance(by_name.get(self.target), Money):
            raise ValueError(f"SumOf: {self.target} must be a Money field of the shape")
        items = by_name.get(self.items)
        if not isinstance(items, Items):
            raise ValueError(f"SumOf: {self.items} must be an Items field of the shape")
        kinds = {f.name: f.kind for f in items.fields}
        for name in self.factors:
            if not isinstance(kinds.get(name), Count | Money):
                raise ValueError(f"SumOf: {self.items}[].{name} must be a Count or Money field")


Rule = SumOf


# -- shapes, event types, sources ---------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """One schema version of an event type's payload."""

    version: int
    fields: tuple[Field, ...]
    rules: tuple[Rule, ...] = ()

    def __post_init__(self) -> None:
        if self.version < 1:
            raise ValueError(f"schema versions start at 1, got {self.version}")
        _distinct(f"schema version {self.version}", self.fields)
        for rule in self.rules:
            rule.check(self.fields)


@dataclass(frozen=True)
class EventType:
    name: str
    shapes: tuple[Shape, ...]

    def __post_init__(self) -> None:
        _check_name("event type", self.name)
        versions = [s.version for s in self.shapes]
        if versions != list(range(1, len(versions) + 1)):
            raise ValueError(
                f"{self.name}: schema versions must be 1, 2, ... in order, got {versions}"
            )

    @property
    def newest(self) -> Shape:
        return self.shapes[-1]


@dataclass(frozen=True)
class Source:
    """A topic and its contract. `key` is the envelope field producers key records by
    (so one subject's records stay in order in one partition)."""

    name: str
    topic: str
    key: str
    id_field: str
    time_field: str
    subject_field: str
    event_types: tuple[EventType, ...]

    def __post_init__(self) -> None:
        _check_name("source", self.name)
        envelope = self.envelope
        if len(set(envelope)) != len(envelope):
            raise ValueError(f"{self.name}: the envelope's fields must differ, got {envelope}")
        if self.key not in envelope:
            raise ValueError(f"{self.name}: the key {self.key!r} must be an envelope field")
        names = [t.name for t in self.event_types]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"{self.name}: event types must be distinct, got {names}")

    @property
    def envelope(self) -> tuple[str, ...]:
        """The envelope's fields, in the order §1 checks them."""
        return (
            self.id_field,
            "event_type",
            self.time_field,
            self.subject_field,
            "schema_version",
            "payload",
        )

    @property
    def type_names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.event_types)


def _check_name(what: str, name: str) -> None:
    if not name.isidentifier() or name != name.lower():
        raise ValueError(f"{what} name {name!r}: use lower_case letters, digits and _")


def _distinct(where: str, fields: tuple[Field, ...]) -> None:
    names = [f.name for f in fields]
    if not names or len(set(names)) != len(names):
        raise ValueError(f"{where}: fields must be distinct and at least one, got {names}")


# -- a declaration as a table (`regauge sources show`, docs/contract.md) -----------------
COLUMNS = ("event type", "schema version", "field", "must be")


def rows(source: Source) -> list[tuple[str, str, str, str]]:
    """Every payload field of every event type and schema version, with what it must
    be, in the order they are checked. Every field is required (present, not null)."""
    found = []
    for etype in source.event_types:
        for shape in etype.shapes:
            rules = {r.target: r.text for r in shape.rules}
            for f in shape.fields:
                rule = f.kind.text + (f"; {rules[f.name]}" if f.name in rules else "")
                found.append((etype.name, str(shape.version), f.name, rule))
                if isinstance(f.kind, Items):
                    found += [
                        (etype.name, str(shape.version), f"{f.name}[].{i.name}", i.kind.text)
                        for i in f.kind.fields
                    ]
    return found


def summary(source: Source) -> str:
    """One line: the topic, its key and the envelope's own fields."""
    return (
        f"source {source.name}: topic {source.topic}, keyed by {source.key}; event id "
        f"{source.id_field}, event time {source.time_field}, subject {source.subject_field} "
        f"(what an erasure goes by); {len(source.event_types)} event types"
    )


def markdown(source: Source) -> str:
    """`rows` as a Markdown table, under `summary`."""
    lines = [
        summary(source) + ".",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += [
        "| " + " | ".join(f"`{c}`" if i in (0, 2) else c for i, c in enumerate(row)) + " |"
        for row in rows(source)
    ]
    return "\n".join(lines) + "\n"
