# expect: ValueError: Row numbers must be between 1 and 1048576
# message: raised inside openpyxl/
"""Write a price list with computed coordinates; an off-by-one makes the first row number 0."""

from openpyxl import Workbook
from openpyxl.utils import get_column_letter

HEADERS = ["SKU", "Description", "Unit price", "Stock"]
ITEMS = [
    ("A-100", "Steel bracket", 4.25, 120),
    ("A-101", "Hinge, brass", 2.1, 640),
    ("B-200", "Cabinet handle", 6.8, 75),
]


def write_table(ws, top_row: int) -> None:
    for col, header in enumerate(HEADERS, start=1):
        ws[f"{get_column_letter(col)}{top_row}"] = header
    for offset, item in enumerate(ITEMS, start=1):
        for col, value in enumerate(item, start=1):
            ws[f"{get_column_letter(col)}{top_row + offset}"] = value


def main() -> None:
    wb = Workbook()
    ws = wb.active
    ws.title = "Price list"
    header_rows = 0  # the author meant "row 1", counting from zero
    write_table(ws, top_row=header_rows)
    wb.save("price_list.xlsx")


if __name__ == "__main__":
    main()
