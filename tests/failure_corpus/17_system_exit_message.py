# expect: input file sales_2024.csv has no data rows
# user-frame: no
"""Validate an input file and stop with ``sys.exit("message")``: Python prints only the message."""

import csv
import sys
import tempfile
from pathlib import Path


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sales_2024.csv"
        path.write_text("date,region,amount\n", encoding="utf-8")
        with path.open(newline="", encoding="utf-8") as handle:
            rows = list(csv.DictReader(handle))
        if not rows:
            sys.exit(f"error: input file {path.name} has no data rows")
        print(len(rows))


if __name__ == "__main__":
    main()
