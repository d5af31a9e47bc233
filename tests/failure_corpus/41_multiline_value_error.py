# expect: ValueError: could not parse row 7
"""A ValueError whose message continues on further lines."""

from datetime import datetime


def parse_date(row_number: int, text: str) -> datetime:
    try:
        return datetime.strptime(text, "%d/%m/%Y")
    except ValueError:
        raise ValueError(
            f"could not parse row {row_number}\n"
            f"  column 'date': {text!r} is not a valid date\n"
            "  hint: the file uses day/month/year"
        ) from None


if __name__ == "__main__":
    print([parse_date(n, t) for n, t in [(6, "28/02/2024"), (7, "31/02/2024")]])
