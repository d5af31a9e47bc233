"""A small, realistic SQLite database for the demo and the tests: orders of a fictional hardware wholesaler.

Deterministic (seeded), so the same rows come out on every machine.
"""

from __future__ import annotations

import datetime as dt
import random
import sqlite3
from pathlib import Path

__all__ = ["SAMPLE_ORDER_COLUMNS", "make_sample_database"]

SAMPLE_ORDER_COLUMNS = (
    "order_id",
    "ordered_on",
    "customer",
    "region",
    "product",
    "quantity",
    "unit_price",
    "total",
    "status",
)
_CUSTOMERS = (
    "Alvarez Tooling",
    "Brightline Builders",
    "Castell & Söhne",
    "Dunmore Joinery",
    "Eastgate Facilities",
    "Fjord Marine Supply",
    "Granite Peak Homes",
    "Harbor Electric",
    "Ishikawa Kōgyō",
    "Juniper Renovations",
    "Kestrel Roofing",
    "Lindqvist Bygg",
)
_REGIONS = ("North", "South", "East", "West", "Central")
_PRODUCTS = {
    "Cordless drill 18V": 129.0,
    "Impact driver": 149.5,
    "Circular saw 190mm": 189.99,
    "Laser level": 239.0,
    "Work light LED": 39.95,
    "Safety glasses (10)": 24.5,
    "Wood screws 5x60 (500)": 18.75,
    "Sanding discs P120 (50)": 14.2,
    "Extension cord 25m": 42.0,
    "Tool bag": 56.9,
}
_STATUSES = ("shipped", "shipped", "shipped", "delivered", "delivered", "open", "cancelled")


def make_sample_database(path: str | Path, *, rows: int = 360, seed: int = 20261130) -> Path:
    """Create (or replace) an ``orders`` table with ``rows`` rows at ``path``; return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    rng = random.Random(seed)  # noqa: S311  (sample data, not secrets)
    start = dt.date(2026, 1, 5)
    products = list(_PRODUCTS.items())
    records = []
    for n in range(rows):
        product, price = rng.choice(products)
        quantity = rng.choice((1, 2, 3, 5, 10, 12, 20, 25, 50))
        records.append(
            (
                10_001 + n,
                (start + dt.timedelta(days=rng.randrange(320))).isoformat(),
                rng.choice(_CUSTOMERS),
                rng.choice(_REGIONS),
                product,
                quantity,
                price,
                round(price * quantity, 2),
                rng.choice(_STATUSES),
            )
        )
    with sqlite3.connect(target) as connection:
        connection.execute(
            "CREATE TABLE orders (order_id INTEGER PRIMARY KEY, ordered_on TEXT NOT NULL, customer TEXT NOT NULL, "
            "region TEXT NOT NULL, product TEXT NOT NULL, quantity INTEGER NOT NULL, unit_price REAL NOT NULL, "
            "total REAL NOT NULL, status TEXT NOT NULL)"
        )
        placeholders = ", ".join("?" * len(SAMPLE_ORDER_COLUMNS))
        connection.executemany(f"INSERT INTO orders VALUES ({placeholders})", records)  # noqa: S608  (constant)
    connection.close()
    return target
