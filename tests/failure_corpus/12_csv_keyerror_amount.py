# expect: KeyError: 'amount'
"""Sum order amounts from a CSV the script writes itself; the column is really called "Amount"."""

import csv
import tempfile
from pathlib import Path

ORDERS = [
    {"order_id": "1001", "customer": "ACME", "Amount": "250.00"},
    {"order_id": "1002", "customer": "Globex", "Amount": "99.90"},
    {"order_id": "1003", "customer": "Initech", "Amount": "1200.00"},
]


def write_orders(path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["order_id", "customer", "Amount"])
        writer.writeheader()
        writer.writerows(ORDERS)


def build_rows(path: Path) -> list[tuple[str, float]]:
    rows = []
    total = 0.0
    with path.open(newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            total += float(row["amount"])
            rows.append((row["customer"], total))
    return rows


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "orders.csv"
        write_orders(path)
        for customer, running_total in build_rows(path):
            print(f"{customer:10} {running_total:10.2f}")


if __name__ == "__main__":
    main()
