# expect: InvalidFileException: openpyxl does not support .csv file format
# message: raised inside openpyxl/
"""Write a CSV export, then try to open it as a workbook with openpyxl."""

import csv
import tempfile
from pathlib import Path

from openpyxl import load_workbook


def export_csv(folder: Path) -> Path:
    path = folder / "sales_export.csv"
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["date", "region", "amount"])
        writer.writerow(["2024-03-01", "North", "1200.50"])
        writer.writerow(["2024-03-02", "South", "980.00"])
    return path


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        source = export_csv(Path(tmp))
        wb = load_workbook(source)
        print(wb.sheetnames)


if __name__ == "__main__":
    main()
