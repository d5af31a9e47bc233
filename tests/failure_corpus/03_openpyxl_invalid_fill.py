# expect: ValueError: Value must be one of
# message: raised inside openpyxl/
"""Highlight overdue invoices; the fill type "solid_fill" is not a valid openpyxl pattern."""

from datetime import date

from openpyxl import Workbook
from openpyxl.styles import PatternFill

INVOICES = [
    ("INV-001", date(2024, 1, 15), 1200.0, True),
    ("INV-002", date(2024, 2, 1), 450.5, False),
    ("INV-003", date(2024, 2, 20), 980.0, True),
]


def overdue_fill() -> PatternFill:
    return PatternFill(fill_type="solid_fill", start_color="FFFFC7CE", end_color="FFFFC7CE")


def main() -> None:
    wb = Workbook()
    ws = wb.active
    ws.append(["Invoice", "Due", "Amount", "Overdue"])
    for number, due, amount, overdue in INVOICES:
        ws.append([number, due, amount, "yes" if overdue else "no"])
        if overdue:
            for cell in ws[ws.max_row]:
                cell.fill = overdue_fill()
    wb.save("invoices.xlsx")


if __name__ == "__main__":
    main()
