# expect: UnicodeDecodeError: 'utf-8' codec can't decode byte 0xe9
"""Read a Latin-1 encoded customer list as UTF-8."""

import csv
import tempfile
from pathlib import Path


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "customers.csv"
        path.write_bytes("name,city\nRen\xe9e,Montr\xe9al\nJos\xe9,S\xe3o Paulo\n".encode("latin-1"))
        with path.open(encoding="utf-8", newline="") as handle:
            customers = list(csv.DictReader(handle))
        print(len(customers))


if __name__ == "__main__":
    main()
