# expect: AssertionError: totals differ: rows sum to 1,250.00 but the header says 1,300.00
"""A consistency check written as an ``assert`` with a message."""

HEADER_TOTAL = 1300.0
ROWS = [500.0, 450.0, 300.0]


def check_totals(rows: list[float], header_total: float) -> None:
    row_sum = sum(rows)
    assert abs(row_sum - header_total) < 0.01, (
        f"totals differ: rows sum to {row_sum:,.2f} but the header says {header_total:,.2f}"
    )


if __name__ == "__main__":
    check_totals(ROWS, HEADER_TOTAL)
    print("ok")
