# expect: IndexError: list index out of range
# message: raised inside docx/
"""Fill a Word table sized for the header only; writing the first data row goes past the last row."""

from docx import Document

ROWS = [("Alice", "Engineering", 3), ("Bob", "Sales", 5), ("Chen", "Support", 2)]


def main() -> None:
    doc = Document()
    doc.add_heading("Team overview", level=1)
    table = doc.add_table(rows=1, cols=3)
    for index, header in enumerate(("Name", "Team", "Years")):
        table.cell(0, index).text = header
    for row_index, row in enumerate(ROWS, start=1):
        for col_index, value in enumerate(row):
            table.cell(row_index, col_index).text = str(value)
    doc.save("team.docx")


if __name__ == "__main__":
    main()
