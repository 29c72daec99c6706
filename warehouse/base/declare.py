"""The words a source's declaration is written in (docs/contract.md §10).

A source is one Kafka topic and the contract its records keep: which envelope
fields hold the event id, the event time and the subject erasure goes by (§8),
its event types, and for each type and schema version the payload's fields,
their kinds and the rules across them. A declaration is data, not code: the
engine (`spark_jobs.engine.contract`) compiles it into the Spark expressions that
validate and type records. Declarations live in `warehouse.sources`, one
module per source.

Everything here is a frozen dataclass of tuples, in declaration order. Order
is meaning: where a record breaks several rules, the first declared names it
(§1's precedence). Frozen values compare by value, so two versions of a
contract can be compared field by field. No Spark here: a declaration loads,
and `regauge sources` prints it, anywhere.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

# The largest count: a 32-bit signed integer, as silver types counts.
INT_MAX = 2_147_483_647


# -- kinds of value ---------------------------------------------------------------------
# The smallest integer a Count may allow: silver types integers as INT.
INT_MIN = -2_147_483_648


def _limits(kind: Any) -> dict[str, Any]:
    """The limits a Text or Count declares beyond its defaults."""
    unset = type(kind)()
    return {
        name: getattr(kind, name)
        for name in kind.__dataclass_fields__
        if getattr(kind, name) != getattr(unset, name)
    }


def _limits_repr(kind: Any) -> str:
    """`Text()`, `Count(minimum=0)`: the limits declared, as a declaration writes them."""
    said = ", ".join(f"{k}={v!r}" for k, v in _limits(kind).items())
    return f"{type(kind).__name__}({said})"


@dataclass(frozen=True, repr=False)
class Text:
    """A JSON string; with `pattern`, one the whole of which matches it (a Java and
    Python regular expression both read alike: letters, classes, `{m,n}`, `|`), and
    from `min_length` to `max_length` characters."""

    pattern: str | None = None
    min_length: int = 0
    max_length: int | None = None

    def __post_init__(self) -> None:
        if self.pattern is not None:
            try:
                re.compile(self.pattern)
            except re.error as e:
                raise ValueError(f"Text: pattern {self.pattern!r} is not a regex: {e}") from None
        if self.min_length < 0 or (
            self.max_length is not None and self.max_length < max(self.min_length, 1)
        ):
            raise ValueError(
                f"Text: lengths must be 0 <= min_length <= max_length and max_length >= 1, "
                f"got {self.min_length} and {self.max_length}"
            )

    @property
    def text(self) -> str:
        said = "a string"
        low, high = self.min_length, self.max_length
        if high is not None:
            said += f" of {low}-{high} characters" if low else f" of at most {high} characters"
        elif low:
            said += f" of at least {low} characters"
        if self.pattern is not None:
            said += f" matching {self.pattern}"
        return said

    def __repr__(self) -> str:
        return _limits_repr(self)

    def accepts(self, value: str) -> bool:
        """Whether `value` is valid: what the engine's check computes, in Python."""
        high = len(value) if self.max_length is None else self.max_length
        return self.min_length <= len(value) <= high and (
            self.pattern is None or re.fullmatch(self.pattern, value) is not None
        )


@dataclass(frozen=True, repr=False)
class Count:
    """A JSON integer (3, 3.0 and 3e0 alike; not "3", not 3.5) from `minimum` to
    `maximum` (1 to INT_MAX unless declared)."""

    minimum: int = 1
    maximum: int = INT_MAX

    def __post_init__(self) -> None:
        if not INT_MIN <= self.minimum <= self.maximum <= INT_MAX:
            raise ValueError(
                f"Count: need {INT_MIN} <= minimum <= maximum <= {INT_MAX}, "
                f"got {self.minimum} and {self.maximum}"
            )

    def __repr__(self) -> str:
        return _limits_repr(self)

    @property
    def text(self) -> str:
        return f"an integer from {self.minimum} to {self.maximum}"


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
            if not f.required:
                raise ValueError(f"item field {f.name}: an item's fields are all required")

    @property
    def text(self) -> str:
        return "a non-empty array of items"


Kind = Text | Count | Money | OneOf | Items


def column_kind(kind: Kind) -> Kind:
    """The kind as silver's column holds it: without its limits (a pattern, lengths, a
    range), which only judge records. Two event types may limit one column otherwise."""
    if isinstance(kind, Text):
        return Text()
    if isinstance(kind, Count):
        return Count()
    if isinstance(kind, Items):
        return Items(tuple(replace(f, kind=column_kind(f.kind)) for f in kind.fields))
    return kind


@dataclass(frozen=True)
class Field:
    """A payload field: present, not null, and a valid `kind`. With
    `required=False` it may be absent or null (silver then holds null), and is
    checked only when given.

    `default`: what a record of an older schema version of its event type, which
    has no such field, reads in silver (its JSON text, e.g. "0.00"). A field new
    in a version needs one: silver holds each event type in its newest shape.
    """

    name: str
    kind: Kind
    default: str | None = None
    required: bool = True

    def __post_init__(self) -> None:
        _check_name("field", self.name)
        if self.default is not None and not _fits(self.kind, self.default):
            raise ValueError(f"field {self.name}: default {self.default!r} is not {self.kind.text}")

    @property
    def text(self) -> str:
        """What it must be, as `regauge sources show` says it."""
        return self.kind.text if self.required else f"optional; if given, {self.kind.text}"


def _fits(kind: Kind, text: str) -> bool:
    """Whether `text` is a valid default of `kind`, spelled as silver's cast reads it:
    a count as plain digits, money as plain digits with up to 2 decimals and below
    10^16 (DECIMAL(18,2)), never in exponent form."""
    if isinstance(kind, Text):
        return kind.accepts(text)
    if isinstance(kind, OneOf):
        return text in kind.values
    if isinstance(kind, Count):
        return (
            re.fullmatch(r"-?(0|[1-9][0-9]*)", text) is not None
            and kind.minimum <= int(text) <= kind.maximum
        )
    if isinstance(kind, Money):
        return re.fullmatch(r"[0-9]{1,16}(\.[0-9]{1,2})?", text) is not None
    return False


# -- rules across fields ------------------------------------------------------------------
@dataclass(frozen=True)
class SumOf:
    """`target` equals the sum over the `items` array of the product of `factors`,
    less the Money field `less` if given (a `total_mismatch` otherwise): total =
    Σ quantity x unit_price - discount. A `less` greater than the sum is an
    `invalid_field`."""

    target: str
    items: str
    factors: tuple[str, ...]
    less: str | None = None

    @property
    def sum_text(self) -> str:
        return "Σ " + " x ".join(f"{self.items}[].{f}" for f in self.factors)

    @property
    def text(self) -> str:
        return f"equal to {self.sum_text}" + (f" - {self.less}" if self.less else "")

    def check(self, fields: tuple[Field, ...]) -> None:
        by_name = {f.name: f.kind for f in fields}
        for name in (self.target, *([self.less] if self.less else [])):
            if not isinstance(by_name.get(name), Money):
                raise ValueError(f"SumOf: {name} must be a Money field of the shape")
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
    """One schema version of an event type's payload. `since`: the version of the
    source's contract that first knew it (a contract, like a schema registry's
    subject, keeps its history: contract 1 may know `order_placed` v1 only, and
    contract 2 add v2)."""

    version: int
    fields: tuple[Field, ...]
    rules: tuple[Rule, ...] = ()
    since: int = 1

    def __post_init__(self) -> None:
        if self.version < 1:
            raise ValueError(f"schema versions start at 1, got {self.version}")
        if self.since < 1:
            raise ValueError(f"contract versions start at 1, got since={self.since}")
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
        since = [s.since for s in self.shapes]
        if since != sorted(since):
            raise ValueError(
                f"{self.name}: a later schema version cannot be known before an earlier one "
                f"(since={since})"
            )

    @property
    def newest(self) -> Shape:
        return self.shapes[-1]

    def shape(self, version: int) -> Shape:
        return self.shapes[version - 1]


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
        kinds: dict[str, Kind] = {}
        for etype in self.event_types:
            for shape in etype.shapes:
                for f in shape.fields:
                    column = column_kind(f.kind)
                    if kinds.setdefault(f.name, column) != column:
                        raise ValueError(
                            f"{self.name}: payload.{f.name} is {kinds[f.name]} somewhere and "
                            f"{column} in {etype.name} v{shape.version}; silver has one "
                            "column per name"
                        )
        arrays = {name for name, kind in kinds.items() if isinstance(kind, Items)}
        if len(arrays) > 1:
            raise ValueError(f"{self.name}: at most one array of items, got {sorted(arrays)}")
        since = {s.since for t in self.event_types for s in t.shapes}
        if since != set(range(1, max(since) + 1)):
            raise ValueError(
                f"{self.name}: every contract version from 1 on must add a schema version; "
                f"declared since={sorted(since)}"
            )

    @property
    def contract_version(self) -> int:
        """The newest version of this source's contract."""
        return max(s.since for t in self.event_types for s in t.shapes)

    def at(self, contract_version: int) -> Source:
        """This source as its contract `contract_version` knew it."""
        if not 1 <= contract_version <= self.contract_version:
            raise ValueError(
                f"{self.name} has contract versions 1 to {self.contract_version}, "
                f"not {contract_version}"
            )
        types = tuple(
            replace(t, shapes=kept)
            for t in self.event_types
            if (kept := tuple(s for s in t.shapes if s.since <= contract_version))
        )
        return replace(self, event_types=types)

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
    be, in the order they are checked. A field is required (present, not null)
    unless it says optional."""
    found = []
    for etype in source.event_types:
        for shape in etype.shapes:
            rules = {r.target: r.text for r in shape.rules}
            limits = {r.less: f"at most {r.sum_text}" for r in shape.rules if r.less}
            # A version a later contract version added says which, as a registry would.
            version = str(shape.version) + (f" (contract {shape.since})" if shape.since > 1 else "")
            older = [s.version for s in etype.shapes if s.version < shape.version]
            for f in shape.fields:
                said = [f.text, *[t for t in (rules.get(f.name), limits.get(f.name)) if t]]
                new_here = older and all(
                    f.name not in {g.name for g in s.fields}
                    for s in etype.shapes
                    if s.version in older
                )
                if new_here and f.default is not None:
                    said.append(f"v{', v'.join(map(str, older))} records read {f.default}")
                found.append((etype.name, version, f.name, "; ".join(said)))
                if isinstance(f.kind, Items):
                    found += [
                        (etype.name, version, f"{f.name}[].{i.name}", i.kind.text)
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


# -- compatibility, in the manner of a schema registry's BACKWARD rule ----------------------
# What a field's form says beyond its kind, each written only when not the default
# (so contracts accepted before these words existed read the same): how a value is
# judged, which a new schema version may change for its own records.
_LIMITS = ("pattern", "min_length", "max_length", "minimum", "maximum", "required")


def _kind_form(kind: Kind) -> dict[str, Any]:
    form: dict[str, Any] = {"kind": type(kind).__name__}
    if isinstance(kind, OneOf):
        form["values"] = list(kind.values)
    if isinstance(kind, Items):
        form["fields"] = [_field_form(f) for f in kind.fields]
    if isinstance(kind, Text | Count):
        form.update(_limits(kind))
    return form


def _field_form(f: Field) -> dict[str, Any]:
    form = {"name": f.name, **_kind_form(f.kind), "default": f.default}
    if not f.required:
        form["required"] = False
    return form


def canonical(source: Source) -> dict[str, Any]:
    """The source's contract as JSON-able data, every contract version in it: what
    `regauge sources accept` records, and what later declarations are checked against."""
    return {
        "topic": source.topic,
        "envelope": list(source.envelope),
        "key": source.key,
        "event_types": {
            t.name: {
                str(s.version): {
                    "since": s.since,
                    "fields": [_field_form(f) for f in s.fields],
                    "rules": [{"rule": type(r).__name__, "text": r.text} for r in s.rules],
                }
                for s in t.shapes
            }
            for t in source.event_types
        },
    }


def _describe_field(form: dict[str, Any]) -> str:
    kind = form["kind"]
    if "values" in form:
        kind += "(" + ", ".join(form["values"]) + ")"
    limits = [f"{k}={form[k]!r}" for k in _LIMITS if k in form]
    if limits:
        kind += "(" + ", ".join(limits) + ")"
    return kind


def _field_changes(where: str, path: str, was: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """How one field of an accepted version changed, naming it down to an item's field."""
    if was["kind"] == now["kind"] == "Items":
        old_items = {f["name"]: f for f in was["fields"]}
        new_items = {f["name"]: f for f in now["fields"]}
        found = [
            f"{where}, field {path}[].{n}: removed" for n in old_items.keys() - new_items.keys()
        ]
        found += [
            f"{where}, field {path}[].{n}: added to a version already accepted"
            for n in new_items.keys() - old_items.keys()
        ]
        for n in old_items.keys() & new_items.keys():
            found += _field_changes(where, f"{path}[].{n}", old_items[n], new_items[n])
        if not found and was != now:
            found.append(f"{where}, field {path}: its items' fields were reordered")
        return found
    if was == now:
        return []
    if _describe_field(was) != _describe_field(now) or _kind_form_of(was) != _kind_form_of(now):
        return [f"{where}, field {path}: was {_describe_field(was)}, now {_describe_field(now)}"]
    return [f"{where}, field {path}: its default was {was['default']!r}, now {now['default']!r}"]


def _shape_changes(where: str, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """How one accepted schema version was changed in place: each is refused."""
    problems = []
    old_fields = {f["name"]: f for f in old["fields"]}
    new_fields = {f["name"]: f for f in new["fields"]}
    for name, was in old_fields.items():
        now = new_fields.get(name)
        if now is None:
            problems.append(f"{where}, field {name}: removed")
        else:
            problems += _field_changes(where, name, was, now)
    problems += [
        f"{where}, field {name}: added to a version already accepted (declare a new "
        "schema version instead)"
        for name in new_fields.keys() - old_fields.keys()
    ]
    if [f["name"] for f in old["fields"]] != [f["name"] for f in new["fields"]] and not problems:
        problems.append(
            f"{where}: its fields were reordered, which changes which one a detail names"
        )
    if old["rules"] != new["rules"]:
        problems.append(f"{where}, rules: were {old['rules']}, now {new['rules']}")
    if old["since"] != new["since"]:
        problems.append(
            f"{where}: its contract version changed from {old['since']} to {new['since']}"
        )
    return problems


def _new_version_problems(
    name: str, version: str, previous: dict[str, Any], new: dict[str, Any], since: int
) -> list[str]:
    """Whether a new schema version can hold the older records: silver holds the newest
    shape, so every older field stays, with its kind and its default, and a new one
    has a default. `since`: the newest contract version accepted, which a new
    schema version must come after."""
    where = f"{name} v{version}"
    before = {f["name"]: f for f in previous["fields"]}
    problems = []
    if new["since"] <= since:
        problems.append(
            f"{where}: new, so it must come with a new contract version (since={since + 1}, "
            f"not {new['since']}): contract {new['since']} was accepted without it"
        )
    for f in new["fields"]:
        was = before.get(f["name"])
        if was is None and f["default"] is None:
            problems.append(
                f"{where}, field {f['name']}: new, and without a default for the older "
                "versions' records to read"
            )
        elif was is not None and _kind_form_of(was) != _kind_form_of(f):
            problems.append(
                f"{where}, field {f['name']}: {_describe_field(was)} in v{int(version) - 1}, "
                f"{_describe_field(f)} here; silver has one column per name"
            )
        elif was is not None and was["default"] != f["default"]:
            problems.append(
                f"{where}, field {f['name']}: its default was {was['default']!r} in "
                f"v{int(version) - 1}, {f['default']!r} here; older records would read "
                "another value"
            )
    kept = {f["name"] for f in new["fields"]}
    problems += [
        f"{where}, field {gone}: dropped; older records hold it in silver"
        for gone in before.keys() - kept
    ]
    return problems


def _kind_form_of(form: dict[str, Any]) -> dict[str, Any]:
    """What silver's column of a field follows from: its kind, not its limits (a new
    schema version may judge its own records otherwise; older ones keep theirs)."""
    return {k: v for k, v in form.items() if k not in ("name", "default", *_LIMITS)}


def _newest_since(form: dict[str, Any]) -> int:
    return max(
        (
            shape["since"]
            for versions in form["event_types"].values()
            for shape in versions.values()
        ),
        default=0,
    )


def incompatibilities(accepted: dict[str, Any] | None, declared: Source) -> list[str]:
    """What in `declared` would change how a record already accepted under the
    `accepted` contract (its `canonical` form; None if none was) validates or
    reads, each naming the event type, the schema version and the field; and what
    a new schema version lacks to read older records. Empty: compatible."""
    new = canonical(declared)
    if accepted is None:
        accepted = {**new, "event_types": {}}
    problems = [
        f"{declared.name}: {what} changed from {accepted[what]!r} to {new[what]!r}"
        for what in ("topic", "envelope", "key")
        if accepted[what] != new[what]
    ]
    for name, versions in accepted["event_types"].items():
        now = new["event_types"].get(name)
        if now is None:
            problems.append(f"{name}: the event type was removed")
            continue
        for version, shape in versions.items():
            if version not in now:
                problems.append(f"{name} v{version}: the schema version was removed")
            else:
                problems += _shape_changes(f"{name} v{version}", shape, now[version])
    since = _newest_since(accepted)
    for name, versions in new["event_types"].items():
        for version, shape in versions.items():
            if version in accepted["event_types"].get(name, {}):
                continue
            if version == "1":
                if shape["since"] <= since:
                    problems.append(
                        f"{name}: a new event type, so it must come with a new contract "
                        f"version (since={since + 1}, not {shape['since']})"
                    )
                continue
            previous = versions[str(int(version) - 1)]
            problems += _new_version_problems(name, version, previous, shape, since)
    return problems
