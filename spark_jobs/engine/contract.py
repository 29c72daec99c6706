"""The event contract (docs/contract.md §1) as Spark column expressions, compiled from
a source's declaration (`warehouse.sources`, docs/contract.md §10).

What is the source's own (its event types, their payload fields and kinds, the
id, time and subject fields, the rules across fields) comes from its
declaration; what holds for every source (the reasons and their precedence,
the envelope's rules, how numbers are judged) is written here. `plan` reads a
declaration into what the expressions need, in pure Python; `_build_expressions`
turns that into columns.

A raw Kafka value is parsed once into Spark's VARIANT, which keeps each JSON
value's own type: an integer stays an integer, `"1"` stays a string, and a
number keeps its exact decimal digits (12.345 is DECIMAL(5,3)), so "at most
two decimals" and "money is never a float" are checked without rounding.

A number is judged by its value, whatever its spelling (docs/contract.md §1):
`3.0` is the integer 3 and `12.500` has one decimal (parse_json already
normalises both). Only exponent form (`1e2`) arrives as a DOUBLE, which can
hold neither "at most two decimals" nor 18 digits of money, so for records
with such a number the numeric fields are read once more from the text as
exact decimals (`Json.exact`).

`validate` is pure: bronze-shaped rows in, the same rows plus `reason`,
`detail` and the typed event columns out. The first failing rule in the
contract's order gives the reason; `reason` is null for an accepted event.
Duplicates (`conflicting_duplicate`) need history and are decided by silver.

Over 400 lines on purpose: the rules follow docs/contract.md §1's precedence from
top to bottom, and splitting them would hide which rule wins.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from pyspark import SparkContext
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DecimalType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from warehouse import sources
from warehouse.base import registry
from warehouse.base.declare import (
    INT_MAX,
    Count,
    Field,
    Items,
    Kind,
    Money,
    OneOf,
    Source,
    SumOf,
    Text,
)
from warehouse.sources import shop

MAX_VALUE_BYTES = 64 * 1024
EARLIEST_EVENT_TIME = "2000-01-01 00:00:00"
MAX_CLOCK_SKEW_HOURS = 24

# In precedence order: where several apply, the first wins.
REASONS = (
    "oversize",
    "malformed_json",
    "missing_field",
    "invalid_field",
    "unknown_event_type",
    "unsupported_schema_version",
    "event_time_out_of_range",
    "total_mismatch",
    "conflicting_duplicate",
)

MONEY = DecimalType(18, 2)
# `reason` is also a payload field of order_cancelled, so while rows are being
# validated the rejection reason is called `reject_reason`.

# Checked as text: RFC 3339 with a T, at least milliseconds, and an offset or Z.
# `\z`, not `$`: in a Java regex `$` also matches before a final line break, so
# "e1\n" would pass as an id.
_RFC3339 = r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}\.\d{3,9}([Zz]|[+-]\d{2}:\d{2})\z"
_EVENT_ID = r"^[A-Za-z0-9_-]{1,64}\z"
# _RFC3339's parts, read in Python (`accepted_partition`).
_RFC3339_PARTS = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt](\d{2}):(\d{2}):(\d{2})\.\d{3,9}(?:[Zz]|([+-])(\d{2}):(\d{2}))"
)
# schema_of_variant's names for JSON numbers, by what their value can be.
_NUMBER_KINDS = r"^(TINYINT|SMALLINT|INT|BIGINT|DECIMAL\(\d+,\d+\)|FLOAT|DOUBLE)\z"
_WHOLE_KINDS = r"^(TINYINT|SMALLINT|INT|BIGINT|DECIMAL\(\d+,0\))\z"
_CENTS_KINDS = r"^(TINYINT|SMALLINT|INT|BIGINT|DECIMAL\(\d+,[0-2]\))\z"
_BINARY_KINDS = r"^(FLOAT|DOUBLE)\z"

# An exponent-form number re-read from the text: exact to 22 decimals below
# 10^16, which covers every valid count and amount of money.
EXACT = DecimalType(38, 22)
# Only numbers of this magnitude are re-read: rescaling a decimal like 1e-999999999
# is unbounded work, and anything outside cannot be a valid count or amount anyway.
# (0.0 is left out too, because a tiny number that underflowed reads as 0.0.)
EXACT_RANGE = (1e-3, 1e17)


# -- a declaration, read for compiling ------------------------------------------------
def _sql_type(kind: Kind) -> DataType:
    """The silver type of a value of `kind`."""
    if isinstance(kind, Count):
        return IntegerType()
    if isinstance(kind, Money):
        return MONEY
    if isinstance(kind, Items):
        fields = [StructField(f.name, _sql_type(f.kind)) for f in kind.fields]
        return ArrayType(StructType(fields), containsNull=False)
    return StringType()


def _is_number(kind: Kind) -> bool:
    return isinstance(kind, Count | Money)


@dataclass(frozen=True)
class Checked:
    """One schema version of one event type, as its records are checked.

    `version` None: the type's only version, so its records' version is not asked
    (a version the type lacks is `unsupported_schema_version` further down). With
    several, a later version's checks apply to records of that version, and the
    first's to every other record of the type (`others`: the versions that are not
    it): one of a version the contract does not know yet, or whose version is not
    an integer at all, is checked by the fields every version keeps, and so ends
    as `unsupported_schema_version` or `invalid_field` as under contract 1.
    """

    event_type: str
    version: int | None
    others: tuple[int, ...]
    fields: tuple[Field, ...]
    rules: tuple[SumOf, ...]


@dataclass(frozen=True)
class Upcast:
    """Records of `event_type` at `versions` lack `field`: they read its default."""

    event_type: str
    versions: tuple[int, ...]
    field: Field


@dataclass(frozen=True)
class Plan:
    """What the expressions need of one contract version of a source's declaration.

    - `shapes`: every schema version of every event type, in declaration order
      (the order of their checks, so of which one a detail names).
    - `columns`: every payload field once, in the order contract versions, event
      types and fields declared it: the typed event's columns after the envelope
      (null where a type lacks one). Each type is held in its newest shape.
    - `items`: the payload's array of objects, if any type has one.
    - `versions`: the schema versions of each event type.
    - `upcasts`: the fields older versions lack, read as their defaults.
    """

    source: Source
    contract_version: int
    shapes: tuple[Checked, ...]
    columns: tuple[Field, ...]
    items: Field | None
    versions: tuple[tuple[str, tuple[int, ...]], ...]  # (event type, its versions)
    upcasts: tuple[Upcast, ...]

    @property
    def event_schema(self) -> StructType:
        """The typed event: envelope, then every payload field flattened."""
        src = self.source
        return StructType(
            [
                StructField(src.id_field, StringType()),
                StructField("event_type", StringType()),
                StructField(src.time_field, TimestampType()),
                StructField(src.subject_field, StringType()),
                StructField("schema_version", IntegerType()),
                *[StructField(f.name, _sql_type(f.kind)) for f in self.columns],
            ]
        )

    @property
    def tables(self) -> registry.SourceTables:
        """The source's topic and tables (docs/contract.md §10)."""
        return registry.source_tables(self.source.name)

    @property
    def payload_names(self) -> list[str]:
        return sorted(f.name for f in self.columns)

    @property
    def item_fields(self) -> tuple[Field, ...]:
        return self.items.kind.fields if self.items and isinstance(self.items.kind, Items) else ()

    @property
    def number_paths(self) -> list[str]:
        """The payload's scalar number fields, as paths."""
        return [f"$.payload.{f.name}" for f in self.columns if _is_number(f.kind)]

    @property
    def exact_schema(self) -> StructType:
        """The fields that are numbers somewhere in the contract, as from_json reads
        them: scalars first, then the items' numbers."""
        payload = [StructField(f.name, EXACT) for f in self.columns if _is_number(f.kind)]
        if self.items is not None:
            numbers = [StructField(f.name, EXACT) for f in self.item_fields if _is_number(f.kind)]
            payload.append(StructField(self.items.name, ArrayType(StructType(numbers))))
        return StructType(
            [StructField("schema_version", EXACT), StructField("payload", StructType(payload))]
        )

    @property
    def rules(self) -> list[SumOf]:
        return [rule for shape in self.shapes for rule in shape.rules]


def plan(source: Source, contract_version: int | None = None) -> Plan:
    """Read contract `contract_version` of `source` (its newest by default) for
    compiling, or refuse, naming it, what silver could not hold.

    The contract version decides which records are accepted; silver's columns are
    the whole declaration's, whichever version runs, so moving between contract
    versions never changes silver's schema (a record reads a field its version
    lacks as the field's default)."""
    version = source.contract_version if contract_version is None else contract_version
    src = source.at(version)
    columns: dict[str, Field] = {}
    for n in range(1, source.contract_version + 1):
        for etype in source.event_types:
            for shape in etype.shapes:
                if shape.since != n:
                    continue
                for f in shape.fields:
                    # One kind per name, and one array of items: Source holds both.
                    columns.setdefault(f.name, f)
    clash = set(columns) & set(src.envelope)
    if clash:
        raise ValueError(f"{src.name}: payload fields {sorted(clash)} clash with the envelope")
    arrays = [f for f in columns.values() if isinstance(f.kind, Items)]
    shapes = []
    for etype in src.event_types:
        every = tuple(s.version for s in etype.shapes)
        for shape in etype.shapes:
            only = len(every) == 1
            first = shape.version == 1
            others = tuple(v for v in every if v != 1) if first and not only else ()
            for rule in shape.rules:
                if not arrays or rule.items != arrays[0].name:
                    raise ValueError(f"{etype.name}: SumOf must sum the payload's array of items")
            checked = Checked(
                etype.name, None if only else shape.version, others, shape.fields, shape.rules
            )
            shapes.append(checked)
    upcasts = []
    for etype in source.event_types:
        newest_names = {f.name for f in etype.newest.fields}
        for shape in etype.shapes[:-1]:
            gone = {f.name for f in shape.fields} - newest_names
            if gone:
                raise ValueError(
                    f"{etype.name} v{shape.version}: fields {sorted(gone)} are not in the "
                    "newest version; silver holds each type in its newest shape"
                )
        for f in etype.newest.fields:
            lacking = tuple(
                s.version for s in etype.shapes if f.name not in {g.name for g in s.fields}
            )
            if lacking and f.default is None:
                raise ValueError(
                    f"{etype.name} v{etype.newest.version}: field {f.name} has no default "
                    f"for records of v{', v'.join(map(str, lacking))}"
                )
            if lacking:
                upcasts.append(Upcast(etype.name, lacking, f))
    versions = tuple((t.name, tuple(s.version for s in t.shapes)) for t in src.event_types)
    items = arrays[0] if arrays else None
    return Plan(
        src, version, tuple(shapes), tuple(columns.values()), items, versions, tuple(upcasts)
    )


@functools.cache
def source_plan(name: str, contract_version: int | None = None) -> Plan:
    """Declared source `name`'s contract at `contract_version` (its newest by
    default), compiled once per process."""
    return plan(sources.get(name), contract_version)


def shop_plan(contract_version: int) -> Plan:
    """The shop's contract at `contract_version`."""
    return source_plan(shop.SOURCE.name, contract_version)


def newest(running: Plan) -> Plan:
    """The newest contract of `running`'s source. It accepts every record an older one
    did and reads it the same (`regauge sources check` holds declarations to that),
    so records already settled are read again by it, whichever version admitted them."""
    return source_plan(running.source.name)


# A deployment starts at the shop's first contract version (docs/contract.md §1: any
# schema_version but 1 is unsupported) and moves on with `regauge sources deploy`,
# which silver records (`silver.deployed_plan`). The pure functions below judge by
# PLAN unless told otherwise; what runs against a lake asks silver.
FIRST_VERSION = 1
PLAN = shop_plan(FIRST_VERSION)
# The shop's newest contract (`newest`).
NEWEST = source_plan(shop.SOURCE.name)
EVENT_TYPES = PLAN.source.type_names
EVENT_SCHEMA = PLAN.event_schema


class Json:
    """Questions about one JSON value (a VARIANT column) and the values under it.

    `known` holds answers computed once per record in an earlier projection
    (see `validate`): the checks ask about the same fields dozens of times, and
    Spark evaluates a repeated expression inside a long CASE chain once per use.
    `numbers` is the same value's `Plan.exact_schema` fields read from the JSON text
    (null unless the record has a number in exponent form). `fields` holds, by
    path, the VARIANT of that path already taken out of its object (`_fields`).
    """

    def __init__(
        self,
        variant: Column,
        known: dict[tuple[str, str], Column] | None = None,
        numbers: Column | None = None,
        fields: dict[str, Column] | None = None,
    ) -> None:
        self.v = variant
        self.known = known or {}
        self.numbers = numbers
        self.fields = fields or {}

    def at(self, path: str) -> Column:
        field = self.fields.get(path)
        return F.try_variant_get(self.v, path, "variant") if field is None else field

    def kind(self, path: str) -> Column:
        """OBJECT<…>, ARRAY<…>, STRING, BIGINT, DECIMAL(p,s), VOID for null; null if absent."""
        known = self.known.get((path, KIND))
        return F.schema_of_variant(self.at(path)) if known is None else known

    def absent(self, path: str) -> Column:
        return F.coalesce(self.kind(path) == "VOID", F.lit(True))

    def get(self, path: str, sql_type: str) -> Column:
        known = self.known.get((path, sql_type))
        if known is not None:
            return known
        field = self.fields.get(path)
        if field is not None:
            return F.try_variant_get(field, "$", sql_type)
        return F.try_variant_get(self.v, path, sql_type)

    def is_string(self, path: str) -> Column:
        return self.kind(path) == "STRING"

    def is_object(self, path: str) -> Column:
        return F.coalesce(self.kind(path).startswith("OBJECT"), F.lit(False))

    def is_number(self, path: str) -> Column:
        return F.coalesce(self.kind(path).rlike(_NUMBER_KINDS), F.lit(False))

    def exact(self, path: str) -> Column:
        """An exponent-form number at `path` as an exact decimal, read from the text.

        Null when the value is not a DOUBLE of EXACT_RANGE's magnitude."""
        if self.numbers is None:
            return F.lit(None).cast(EXACT)
        column = self.numbers
        for name in path.removeprefix("$.").split("."):
            column = column.getField(name)
        return column

    def whole(self, path: str) -> Column:
        """The value as a BIGINT if it is a number without a fraction (3, 3.0, 3e0), else null."""
        kind, exact = self.kind(path), self.exact(path)
        return F.when(kind.rlike(_WHOLE_KINDS), self.get(path, "bigint")).when(
            kind.rlike(_BINARY_KINDS) & (exact == F.floor(exact)), exact.try_cast("bigint")
        )

    def cents(self, path: str) -> Column:
        """The value as DECIMAL(18,2) if it is a JSON number with at most 2 decimals that
        fits, else null."""
        kind, exact = self.kind(path), self.exact(path)
        binary = kind.rlike(_BINARY_KINDS)
        return (
            F.when(kind.rlike(_CENTS_KINDS), self.get(path, "decimal(18,2)"))
            .when(binary & (exact == F.round(exact, 2)), exact.try_cast(MONEY))
            # 0e0 is 0 (and so, unavoidably, is a number too small for a double).
            .when(binary & (self.get(path, "double") == 0), F.lit(0).cast(MONEY))
        )

    def has_fraction(self, path: str) -> Column:
        """A number that is certainly not an integer (2.5, 25e-1)."""
        kind = self.kind(path)
        magnitude = F.abs(self.get(path, "double"))
        return kind.rlike(r"^DECIMAL\(\d+,[1-9]\d*\)\z") | (
            kind.rlike(_BINARY_KINDS)
            & (magnitude < EXACT_RANGE[1])
            & ~F.coalesce(self.exact(path) == F.floor(self.exact(path)), F.lit(False))
            & (magnitude != 0)
        )

    def is_count(self, path: str, minimum: int = 1, maximum: int = INT_MAX) -> Column:
        """An integer (not a string, not 1.5) from `minimum` to `maximum`."""
        return F.coalesce(self.whole(path).between(minimum, maximum), F.lit(False))

    def is_text(self, path: str, kind: Text) -> Column:
        """A string of the declared length that matches the declared pattern whole."""
        ok = self.is_string(path)
        if kind.pattern is None and not kind.min_length and kind.max_length is None:
            return ok
        value = self.get(path, "string")
        if kind.min_length or kind.max_length is not None:
            high = INT_MAX if kind.max_length is None else kind.max_length
            ok = ok & F.char_length(value).between(kind.min_length, high)
        if kind.pattern is not None:
            # \A and \z: the whole value (Java's `$` also matches before a final newline).
            ok = ok & value.rlike(f"\\A(?:{kind.pattern})\\z")
        return F.coalesce(ok, F.lit(False))

    def is_money(self, path: str) -> Column:
        """A number >= 0 with at most two decimals that fits DECIMAL(18,2)."""
        return F.coalesce(self.cents(path) >= 0, F.lit(False))

    def is_one_of(self, path: str, values: tuple[str, ...]) -> Column:
        return self.is_string(path) & self.get(path, "string").isin(*values)


KIND = "kind"  # Json.known's key for a path's schema_of_variant


def _fields(variant: Column, names: list[str]) -> Column:
    """The object's `names` as a struct of VARIANTs, taken out in one pass over it;
    null unless `variant` is an object. An absent name is a null field, a JSON null
    a VARIANT null (kind VOID), as `try_variant_get(variant, "$.name")` gives them.

    Asking an object for one path at a time walks it again and builds a new
    VARIANT each time: in a profile of validation (JFR, 250,000 records) path
    lookups and those copies were over half of its CPU (docs/BENCHMARKS.md)."""
    struct = ",".join(f"`{name}`:variant" for name in names)
    return F.try_variant_get(variant, "$", f"struct<{struct}>")


def _object_kind(fields: Column, variant: Column) -> Column:
    """A kind for `variant` whose `_fields` are `fields`: an object's is "OBJECT"
    (spelling out its whole schema would cost a walk of it); any other value's is
    schema_of_variant's."""
    return F.when(fields.isNotNull(), F.lit("OBJECT")).otherwise(F.schema_of_variant(variant))


ITEMS = "items"  # Json.known's key for the items, each `_with_fields`
Check = tuple[str, Column, Column]  # (reason, failing condition, detail)


def _first(checks: list[Check]) -> Column:
    """The (reason, detail) of the first check whose condition is true, else null."""
    return F.coalesce(
        *[
            F.when(F.coalesce(cond, F.lit(False)), F.struct(F.lit(r).alias("r"), d.alias("d")))
            for r, cond, d in checks
        ]
    )


def _exact_value(item: Json, path: str, kind: Kind) -> Column:
    """A number field's value as an exact decimal: a count's as DECIMAL(20,0)."""
    if isinstance(kind, Count):
        return item.whole(path).cast(DecimalType(20, 0))
    return item.cents(path)


def default(f: Field) -> Column:
    """A field's declared default, in its silver type."""
    return F.lit(f.default).cast(_sql_type(f.kind))


class _Compiler:
    """One plan's expressions. What the source declares comes from `plan`; the
    paths below are where its envelope and payload fields are in a record."""

    def __init__(self, plan: Plan) -> None:
        src = plan.source
        self.plan = plan
        self.envelope = list(src.envelope)
        self.id, self.time, self.subject = (
            f"$.{n}" for n in (src.id_field, src.time_field, src.subject_field)
        )
        self.payload_names = plan.payload_names
        self.item_names = [f.name for f in plan.item_fields]
        # The payload's array of items, if the contract has one.
        self.items_path = f"$.payload.{plan.items.name}" if plan.items is not None else None
        # The paths validate computes once per record (Json.known).
        self.kind_paths = [
            "$",
            *[f"$.{n}" for n in self.envelope],
            *[f"$.payload.{name}" for name in self.payload_names],
        ]
        money = [r.target for r in plan.rules] + [r.less for r in plan.rules if r.less]
        self.typed_paths = [
            (self.id, "string"),
            ("$.event_type", "string"),
            (self.time, "string"),
            (self.subject, "string"),
            ("$.schema_version", "bigint"),
            # What the SumOf rules compare, and the items they sum.
            *dict.fromkeys((f"$.payload.{name}", "decimal(18,2)") for name in money),
            *([(self.items_path, ITEMS)] if self.items_path else []),
        ]

    # -- the items ---------------------------------------------------------------------
    def with_fields(self) -> Callable[[Column], Column]:
        names = self.item_names

        def with_fields(item: Column) -> Column:
            """One item as (v: its VARIANT, f: its item names' `_fields`)."""
            return F.struct(item.alias("v"), _fields(item, names).alias("f"))

        return with_fields

    def items(self, event: Json) -> Column:
        """The items, each `with_fields` (computed once per record in `validate`); an
        empty array if the contract has none."""
        if self.items_path is None:
            return F.array()
        known = event.known.get((self.items_path, ITEMS))
        if known is not None:
            return known
        return F.transform(event.get(self.items_path, "array<variant>"), self.with_fields())

    def item(self, x: Column, numbers: Column | None = None) -> Json:
        """The Json of one element of `items`."""
        return Json(
            x["v"],
            known={("$", KIND): _object_kind(x["f"], x["v"])},
            numbers=numbers,
            fields={f"$.{name}": x["f"][name] for name in self.item_names},
        )

    def per_item(self, event: Json, f: Callable[[Json], Column]) -> Column:
        """f applied to each item, as an array; each item's Json carries its exact numbers."""
        numbers = event.exact(self.items_path) if self.items_path else F.lit(None)
        return F.transform(self.items(event), lambda x, i: f(self.item(x, F.get(numbers, i))))

    def any_item(self, event: Json, test: Callable[[Json], Column]) -> Column:
        verdicts = self.per_item(event, lambda item: F.coalesce(test(item), F.lit(False)))
        return F.coalesce(F.array_contains(verdicts, True), F.lit(False))

    def item_lacks(self, name: str) -> Callable[[Json], Column]:
        """A test for one item: it is an object without `name` (or with it null)."""
        return lambda item: item.is_object("$") & item.absent(f"$.{name}")

    def item_breaks(self, name: str, kind: Kind) -> Callable[[Json], Column]:
        """A test for one item: its field `name` is not a valid `kind`."""
        return lambda item: ~self.valid(item, f"$.{name}", kind)

    def valid(self, event: Json, path: str, kind: Kind) -> Column:
        if isinstance(kind, Text):
            return event.is_text(path, kind)
        if isinstance(kind, Count):
            return event.is_count(path, kind.minimum, kind.maximum)
        if isinstance(kind, Money):
            return event.is_money(path)
        if isinstance(kind, OneOf):
            return event.is_one_of(path, kind.values)
        if isinstance(kind, Items):
            # The shape only: each item's fields have checks of their own, so the
            # detail names the one that failed.
            arr = self.items(event)
            objects = F.forall(arr, lambda x: self.item(x).is_object("$"))
            return F.coalesce(
                event.kind(path).startswith("ARRAY") & (F.size(arr) > 0) & objects, F.lit(False)
            )
        raise ValueError(f"unknown field kind {kind!r}")

    def item_sum(self, event: Json, rule: SumOf) -> Column:
        """The sum over the items of the product of `rule.factors`, exact in DECIMAL(38,2)."""
        kinds = {f.name: f.kind for f in self.plan.item_fields}

        def product(item: Json) -> Column:
            factors = [_exact_value(item, f"$.{name}", kinds[name]) for name in rule.factors]
            result = factors[0]
            for factor in factors[1:]:
                result = result * factor
            return result

        return F.aggregate(
            self.per_item(event, product),
            F.lit(0).cast(DecimalType(38, 2)),
            lambda acc, product: (acc + product).cast(DecimalType(38, 2)),
        )

    # -- the checks, in the contract's order ---------------------------------------------
    def of_shape(self, event: Json, etype: Column, shape: Checked) -> Column:
        """A record is of this event type and, where the type has several, this version."""
        this = etype == shape.event_type
        if shape.version is None:
            return this
        version = event.whole("$.schema_version")
        if shape.others:
            return this & ~F.coalesce(version.isin(*shape.others), F.lit(False))
        return this & F.coalesce(version == shape.version, F.lit(False))

    def checks(
        self, df_value: Column, kafka_ts: Column, event: Json, text_ok: Column
    ) -> list[Check]:
        lit = F.lit
        plan, src = self.plan, self.plan.source
        etype = event.get("$.event_type", "string")
        known_type = event.is_string("$.event_type") & etype.isin(*src.type_names)
        checks: list[Check] = [
            (
                "oversize",
                F.length(df_value) > MAX_VALUE_BYTES,
                F.format_string(
                    f"value is %d bytes; the limit is {MAX_VALUE_BYTES}", F.length(df_value)
                ),
            ),
            ("malformed_json", df_value.isNull(), lit("record has no value")),
            ("malformed_json", ~text_ok, lit("value is not valid UTF-8")),
            ("malformed_json", event.v.isNull(), lit("value is not valid JSON")),
            ("malformed_json", ~event.is_object("$"), lit("value is JSON but not an object")),
        ]
        checks += [
            ("missing_field", event.absent(f"$.{name}"), lit(f"{name} is missing or null"))
            for name in self.envelope
        ]
        payload_is_object = event.is_object("$.payload")
        for shape in plan.shapes:
            is_this = payload_is_object & self.of_shape(event, etype, shape)
            checks += [
                (
                    "missing_field",
                    is_this & event.absent(f"$.payload.{f.name}"),
                    lit(f"payload.{f.name} is missing or null"),
                )
                for f in shape.fields
                if f.required
            ]
            # An item's missing fields come after all of its type's own.
            checks += [
                (
                    "missing_field",
                    is_this & self.any_item(event, self.item_lacks(item.name)),
                    lit(f"payload.{f.name}[].{item.name} is missing or null"),
                )
                for f in shape.fields
                if isinstance(f.kind, Items)
                for item in f.kind.fields
            ]
        event_time = F.try_to_timestamp(event.get(self.time, "string"))
        checks += [
            (
                "invalid_field",
                ~(event.is_string(self.id) & event.get(self.id, "string").rlike(_EVENT_ID)),
                lit(f"{src.id_field} must be 1-64 characters of A-Z a-z 0-9 _ -"),
            ),
            (
                "invalid_field",
                ~event.is_string("$.event_type"),
                lit("event_type must be a string"),
            ),
            (
                "invalid_field",
                ~(
                    event.is_string(self.time)
                    & event.get(self.time, "string").rlike(_RFC3339)
                    & event_time.isNotNull()
                ),
                lit(f"{src.time_field} must be RFC 3339 with milliseconds and an offset or Z"),
            ),
            (
                "invalid_field",
                ~(
                    event.is_string(self.subject)
                    & F.length(event.get(self.subject, "string")).between(1, 64)
                ),
                lit(f"{src.subject_field} must be a string of 1-64 characters"),
            ),
            (
                "invalid_field",
                ~event.is_number("$.schema_version") | event.has_fraction("$.schema_version"),
                lit("schema_version must be an integer"),
            ),
            ("invalid_field", ~payload_is_object, lit("payload must be an object")),
        ]
        for shape in plan.shapes:
            is_this = self.of_shape(event, etype, shape)
            less = {r.less: r for r in shape.rules if r.less}
            for f in shape.fields:
                path = f"$.payload.{f.name}"
                # An optional field is judged only when given.
                given = is_this if f.required else is_this & ~event.absent(path)
                checks.append(
                    (
                        "invalid_field",
                        given & ~self.valid(event, path, f.kind),
                        lit(f"payload.{f.name} must be {f.kind.text}"),
                    )
                )
                # An item's invalid fields come right after its array's own check.
                if isinstance(f.kind, Items):
                    checks += [
                        (
                            "invalid_field",
                            is_this & self.any_item(event, self.item_breaks(i.name, i.kind)),
                            lit(f"payload.{f.name}[].{i.name} must be {i.kind.text}"),
                        )
                        for i in f.kind.fields
                    ]
                # What a sum is less by cannot exceed the sum.
                rule = less.get(f.name)
                if rule is not None:
                    checks.append(
                        (
                            "invalid_field",
                            is_this
                            & (event.cents(f"$.payload.{f.name}") > self.item_sum(event, rule)),
                            lit(f"payload.{f.name} must be at most {rule.sum_text}"),
                        )
                    )
        checks += [
            (
                "unknown_event_type",
                ~known_type,
                F.format_string("event_type %s is not one of the known types", etype),
            ),
            self.version_check(event, etype),
            (
                "event_time_out_of_range",
                (event_time < F.to_timestamp(lit(EARLIEST_EVENT_TIME)))
                | (event_time > kafka_ts + F.expr(f"INTERVAL {MAX_CLOCK_SKEW_HOURS} HOURS")),
                lit(
                    f"event_time is before 2000-01-01 or more than {MAX_CLOCK_SKEW_HOURS} h "
                    "after the Kafka record timestamp"
                ),
            ),
        ]
        for shape in plan.shapes:
            for rule in shape.rules:
                checks.append(self.sum_check(event, self.of_shape(event, etype, shape), rule))
        return checks

    def version_check(self, event: Json, etype: Column) -> Check:
        """`unsupported_schema_version`: a version its event type does not declare."""
        version = event.whole("$.schema_version")
        given = event.get("$.schema_version", "string")
        every = {versions for _, versions in self.plan.versions}
        if every == {(1,)}:
            # Every type has version 1 only: one test for all (docs/contract.md §1's words).
            return (
                "unsupported_schema_version",
                ~F.coalesce(version == 1, F.lit(False)),
                F.format_string("schema_version %s is not supported (only 1)", given),
            )
        known = F.lit(False)
        only = F.lit(None).cast("string")
        for name, versions in reversed(self.plan.versions):
            known = F.when(etype == name, version.isin(*versions)).otherwise(known)
            only = F.when(etype == name, F.lit(", ".join(map(str, versions)))).otherwise(only)
        return (
            "unsupported_schema_version",
            ~F.coalesce(known, F.lit(False)),
            F.format_string(
                "schema_version %s is not supported for %s (only %s)", given, etype, only
            ),
        )

    def sum_check(self, event: Json, is_this: Column, rule: SumOf) -> Check:
        """`total_mismatch`: the target is not the sum (less what the rule says)."""
        item_sum = self.item_sum(event, rule)
        target = event.cents(f"$.payload.{rule.target}")
        factors = " x ".join(rule.factors)
        if rule.less is None:
            want, words = item_sum, f"the sum of {factors}"
        else:
            want = (item_sum - event.cents(f"$.payload.{rule.less}")).cast(DecimalType(38, 2))
            words = f"the sum of {factors} less {rule.less}"
        return (
            "total_mismatch",
            is_this & (want != target),
            F.format_string(
                f"{rule.target} %s is not {words} (%s)",
                target.cast("string"),
                want.cast("string"),
            ),
        )

    # -- typed values ----------------------------------------------------------------------
    def typed(self, event: Json, path: str, kind: Kind) -> Column:
        """The value at `path` in its silver type (`_sql_type`)."""
        if isinstance(kind, Count):
            return event.whole(path).try_cast("int")
        if isinstance(kind, Money):
            return event.cents(path)
        if isinstance(kind, Items):
            return self.per_item(
                event,
                lambda item: F.struct(
                    *[self.typed(item, f"$.{f.name}", f.kind).alias(f.name) for f in kind.fields]
                ),
            )
        return event.get(path, "string")

    def column(self, event: Json, f: Field) -> Column:
        """A payload column: the record's value, or for a record of an older version
        that lacks the field, its declared default (upcasting)."""
        value = self.typed(event, f"$.payload.{f.name}", f.kind)
        upcasts = [u for u in self.plan.upcasts if u.field.name == f.name]
        if not upcasts:
            return value
        etype = event.get("$.event_type", "string")
        version = event.whole("$.schema_version")
        result = None
        for u in upcasts:
            older = (etype == u.event_type) & F.coalesce(version.isin(*u.versions), F.lit(False))
            result = (F if result is None else result).when(older, default(u.field))
        assert result is not None
        return result.otherwise(value)

    def typed_event(self, event: Json) -> list[Column]:
        """The event's fields in their contract types (only meaningful when accepted)."""
        src = self.plan.source
        return [
            event.get(self.id, "string").alias(src.id_field),
            event.get("$.event_type", "string").alias("event_type"),
            F.try_to_timestamp(event.get(self.time, "string")).alias(src.time_field),
            event.get(self.subject, "string").alias(src.subject_field),
            event.whole("$.schema_version").try_cast("int").alias("schema_version"),
            *[self.column(event, f).alias(f.name) for f in self.plan.columns],
        ]

    def numbers(self, text: Column, event: Json) -> Column:
        """`Plan.exact_schema`'s fields read from the text, for a record whose numbers
        include a DOUBLE (exponent form), as long as every such field is a plain number
        or a DOUBLE in EXACT_RANGE (the re-read must stay cheap, see EXACT_RANGE); else
        null.

        Whether there is a DOUBLE at all is asked of the kinds computed once per record
        (an array's kind names every kind in it), so an ordinary record pays a few
        string tests and nothing more."""

        def safe(json: Json, path: str) -> Column:
            kind = F.coalesce(json.kind(path), F.lit("VOID"))
            magnitude = F.abs(json.get(path, "double"))
            double = kind.rlike(_BINARY_KINDS)
            in_range = (magnitude >= EXACT_RANGE[0]) & (magnitude < EXACT_RANGE[1])
            # Not a string: from_json would parse "1e-999999999" into a decimal too.
            plain = (kind == "VOID") | (kind.rlike(_NUMBER_KINDS) & ~double)
            return F.coalesce(plain | (double & in_range), F.lit(False))

        paths = ["$.schema_version", *self.plan.number_paths]
        has_double = F.lit(False)
        for path in [*paths, *([self.items_path] if self.items_path else [])]:
            has_double = has_double | F.coalesce(
                event.kind(path).rlike("FLOAT|DOUBLE"), F.lit(False)
            )
        item_numbers = [f"$.{f.name}" for f in self.plan.item_fields if _is_number(f.kind)]

        def item_safe(x: Column) -> Column:
            verdicts = [safe(self.item(x), path) for path in item_numbers]
            result = verdicts[0] if verdicts else F.lit(True)
            for verdict in verdicts[1:]:
                result = result & verdict
            return result

        all_safe = F.coalesce(F.forall(self.items(event), item_safe), F.lit(True))
        for path in paths:
            all_safe = all_safe & safe(event, path)
        return F.when(has_double, F.when(all_safe, F.from_json(text, self.plan.exact_schema)))

    # -- all of it -------------------------------------------------------------------------
    def build(self) -> _Expressions:
        text = F.col("value").cast(BinaryType()).cast(StringType())
        text_ok = F.is_valid_utf8(text)
        small = F.length(F.col("value")) <= MAX_VALUE_BYTES
        # The envelope's and the payload's fields are taken out of their objects
        # once per record (`_fields`); every later question about one of them starts
        # from its own VARIANT instead of walking from the root.
        fields = {f"$.{n}": F.col("_e")[n] for n in self.envelope} | {
            f"$.payload.{n}": F.col("_p")[n] for n in self.payload_names
        }
        variant = Json(F.col("_v"), fields=fields)
        # What the checks ask about most, once per record, as columns of their own
        # projection (Spark does not fold a projection into the next one when that
        # would repeat an expensive expression). On 2 cores this took validating 100k
        # records from 6.1 s to 2.8 s (`make bench`, docs/BENCHMARKS.md).
        first_asks = {
            ("$", KIND): _object_kind(F.col("_e"), F.col("_v")),
            ("$.payload", KIND): _object_kind(F.col("_p"), variant.at("$.payload")),
        }
        if self.items_path is not None:
            first_asks[(self.items_path, ITEMS)] = self.items(variant)

        def first_ask(path: str, kind: str) -> Column:
            asked = first_asks.get((path, kind))
            if asked is not None:
                return asked
            return variant.kind(path) if kind == KIND else variant.get(path, kind)

        known = {
            (path, kind): f"_known{i}"
            for i, (path, kind) in enumerate(
                [(p, KIND) for p in self.kind_paths] + self.typed_paths
            )
        }
        event = Json(F.col("_v"), {key: F.col(name) for key, name in known.items()}, fields=fields)
        numbers = self.numbers(text, event)
        event = Json(event.v, event.known, numbers=F.col("_numbers"), fields=fields)
        verdict = self.checks(F.col("value"), F.col("kafka_timestamp"), event, text_ok)
        return _Expressions(
            parse=F.when(small & text_ok, F.try_parse_json(text)),
            envelope=_fields(F.col("_v"), self.envelope),
            payload=_fields(variant.at("$.payload"), self.payload_names),
            known=[first_ask(p, k).alias(name) for (p, k), name in known.items()],
            numbers=numbers,
            verdict=_first(verdict),
            outputs=[
                F.col("_verdict.r").alias("reject_reason"),
                F.col("_verdict.d").alias("reject_detail"),
                # Canonical JSON: a VARIANT object's keys are sorted and its numbers
                # normalised, so equal events hash equal however they were spelled.
                F.sha2(F.to_json(F.col("_v")), 256).alias("content_hash"),
                *self.typed_event(event),
            ],
            scratch=["_v", "_e", "_p", "_verdict", "_numbers", *known.values()],
        )


@dataclass(frozen=True)
class _Expressions:
    """`validate`'s column expressions, in the order its projections use them."""

    parse: Column
    envelope: Column
    payload: Column
    known: list[Column]
    numbers: Column
    verdict: Column
    outputs: list[Column]
    scratch: list[str]


# Built once per JVM and plan, and reused by every batch: the expressions name
# columns only, so they fit any bronze-shaped DataFrame, and building them is
# thousands of calls into the JVM. That cost 2 s of every silver micro-batch on 2
# cores, however few its records (a 6-record batch took 7 s).
_BUILT: dict[tuple[int, Plan], _Expressions] = {}


def _expressions(plan: Plan) -> _Expressions:
    # Keyed by the Py4J gateway: a Column holds references into that JVM. Under
    # Spark Connect there is no gateway, and a Column is plain Python.
    key = (id(SparkContext._gateway), plan)
    built = _BUILT.get(key)
    if built is None:
        built = _BUILT[key] = _build_expressions(plan)
    return built


def _build_expressions(plan: Plan = PLAN) -> _Expressions:
    return _Compiler(plan).build()


def validate(records: DataFrame, plan: Plan = PLAN) -> DataFrame:
    """Bronze rows (one per Kafka record) -> the same rows with `reject_reason`,
    `reject_detail`, `content_hash` and the typed event columns (one per record),
    by `plan` (the shop's first contract version by default)."""
    e = _expressions(plan)
    return (
        records.withColumn("_v", e.parse)
        .withColumn("_e", e.envelope)
        .withColumn("_p", e.payload)
        .select("*", *e.known)
        .withColumn("_numbers", e.numbers)
        .withColumn("_verdict", e.verdict)
        .select("*", *e.outputs)
        .drop(*e.scratch)
    )


def accepted_partition(value: bytes | None, plan: Plan) -> tuple[str, date] | None:
    """The `event_type` and the UTC date of the time field of a record `validate`
    accepted, read from its raw value in Python: what silver partitions its row by,
    without planning the whole validation for a few old records (`silver._where_held`).

    Only for accepted records, whose envelope validate has checked (an object without
    duplicate keys, a string event type, an RFC 3339 time that Spark reads); None
    where the value is not one (erased, or not as validated), for the caller to ask
    Spark instead. The fraction is dropped: it cannot move the date (Spark keeps
    microseconds, truncated)."""
    try:
        event = json.loads(value) if value is not None else None
    except (ValueError, RecursionError):  # Spark's parser takes deeper nesting
        return None
    if not isinstance(event, dict):
        return None
    etype, time = event.get("event_type"), event.get(plan.source.time_field)
    found = _RFC3339_PARTS.fullmatch(time) if isinstance(time, str) else None
    if not isinstance(etype, str) or found is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in found.groups()[:6])
    sign, hours, minutes = found.group(7, 8, 9)
    try:
        local = datetime(year, month, day, hour, minute, second)
    except ValueError:
        return None
    offset = timedelta(hours=int(hours), minutes=int(minutes)) if sign else timedelta()
    try:
        return etype, (local - offset if sign == "+" else local + offset).date()
    except OverflowError:
        return None
