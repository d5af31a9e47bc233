# expect: KeyError: 'Worksheet Revenue does not exist.'
# message: raised inside openpyxl/
"""Warnings and progress prints on stderr come before the traceback; one progress line looks like an error."""

import sys
import warnings

from openpyxl import Workbook


def build(wb: Workbook) -> None:
    ws = wb.active
    ws.title = "Sales"
    ws.append(["Region", "Sales"])
    ws.append(["North", 1200])
    print("Error: 0 rows skipped (this is just a progress line)", file=sys.stderr)
    print('  File "progress.log", line 3, in writer', file=sys.stderr)
    warnings.warn("column widths are estimated", UserWarning, stacklevel=1)
    revenue_sheet = wb["Revenue"]
    revenue_sheet.append(["Total", 1200])


if __name__ == "__main__":
    workbook = Workbook()
    build(workbook)
    workbook.save("sales.xlsx")
