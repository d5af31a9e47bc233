# expect: IllegalCharacterError
# message: raised inside openpyxl/
"""Copy ticket descriptions pasted from a terminal; one holds a bell control character."""

from openpyxl import Workbook

TICKETS = [
    (101, "Printer on floor 2 is out of toner"),
    (102, "VPN drops every 10 minutes"),
    (103, "Build log says: \x07 FAILED at step 4"),
]


def main() -> None:
    wb = Workbook()
    ws = wb.active
    ws.title = "Tickets"
    ws.append(["Id", "Description"])
    for row_number, (ticket_id, text) in enumerate(TICKETS, start=2):
        ws.cell(row=row_number, column=1, value=ticket_id)
        ws.cell(row=row_number, column=2, value=text)
    wb.save("tickets.xlsx")


if __name__ == "__main__":
    main()
