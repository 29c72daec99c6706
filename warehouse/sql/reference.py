"""Reference data in PostgreSQL (`regauge.reference`, Trino catalog `ops`).

The generator seeds it with the customers and products its events use, so a
federated join of silver with `ops.reference.*` finds every customer.
Upserts: seeding twice, or from runs with other seeds, converges.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import psycopg

from spark_jobs.generator import Customer, Product
from warehouse.base.settings import Settings

log = logging.getLogger(__name__)

DDL = (
    """
    CREATE TABLE IF NOT EXISTS reference.customers (
        customer_id text PRIMARY KEY,
        country     text NOT NULL,
        segment     text NOT NULL,
        signup_date date NOT NULL
    )
    """,
    """
    CREATE TABLE IF NOT EXISTS reference.products (
        product_id text PRIMARY KEY,
        category   text NOT NULL,
        list_price numeric(18, 2) NOT NULL CHECK (list_price >= 0)
    )
    """,
)


def connect(settings: Settings) -> psycopg.Connection:
    return psycopg.connect(settings.postgres_dsn(), autocommit=False)


def ensure_tables(conn: psycopg.Connection) -> None:
    for statement in DDL:
        conn.execute(statement)


def seed(settings: Settings, customers: Sequence[Customer], products: Sequence[Product]) -> None:
    """Upsert the given customers and products in one transaction."""
    with connect(settings) as conn:
        ensure_tables(conn)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO reference.customers (customer_id, country, segment, signup_date) "
                "VALUES (%s, %s, %s, %s) ON CONFLICT (customer_id) DO UPDATE SET "
                "country = EXCLUDED.country, segment = EXCLUDED.segment, "
                "signup_date = EXCLUDED.signup_date",
                [(c.customer_id, c.country, c.segment, c.signup_date) for c in customers],
            )
            cur.executemany(
                "INSERT INTO reference.products (product_id, category, list_price) "
                "VALUES (%s, %s, %s) ON CONFLICT (product_id) DO UPDATE SET "
                "category = EXCLUDED.category, list_price = EXCLUDED.list_price",
                [(p.product_id, p.category, p.list_price) for p in products],
            )
    log.info("reference data: %d customers and %d products upserted", len(customers), len(products))
