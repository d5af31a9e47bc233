# expect: ValueError: Invalid character / found in sheet title
# message: raised inside openpyxl/
"""Quarterly workbook: one sheet per period; the title "Q1/Q2 summary" is rejected inside openpyxl."""

from openpyxl import Workbook
from openpyxl.styles import Font

PERIODS = {
    "Q1": [("North", 1200.5), ("South", 980.0), ("West", 1430.25)],
    "Q2": [("North", 1310.0), ("South", 1005.75), ("West", 1502.0)],
    "Q1/Q2 summary": [("North", 2510.5), ("South", 1985.75), ("West", 2932.25)],
}


def add_period_sheet(wb: Workbook, title: str, rows: list[tuple[str, float]]) -> None:
    ws = wb.create_sheet(title=title)
    ws.append(["Region", "Revenue"])
    for cell in ws[1]:
        cell.font = Font(bold=True)
    for region, revenue in rows:
        ws.append([region, revenue])
    ws.append(["Total", f"=SUM(B2:B{len(rows) + 1})"])


def build_workbook() -> Workbook:
    wb = Workbook()
    wb.remove(wb.active)
    for title, rows in PERIODS.items():
        add_period_sheet(wb, title, rows)
    return wb


if __name__ == "__main__":
    build_workbook().save("quarterly_revenue.xlsx")
