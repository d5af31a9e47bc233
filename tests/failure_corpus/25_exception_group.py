# expect: ExceptionGroup: 2 rows failed validation
# expect: ValueError: row 3: amount is negative
"""Validate every row, collect the failures and raise them together as an ExceptionGroup."""


def validate_row(number: int, row: dict[str, object]) -> None:
    amount = row.get("amount")
    if amount is None:
        raise KeyError(f"row {number}: no amount")
    if not isinstance(amount, (int, float)) or amount < 0:
        raise ValueError(f"row {number}: amount is negative ({amount})")


def validate_all(rows: list[dict[str, object]]) -> None:
    errors: list[Exception] = []
    for number, row in enumerate(rows, start=1):
        try:
            validate_row(number, row)
        except (KeyError, ValueError) as exc:
            errors.append(exc)
    if errors:
        raise ExceptionGroup(f"{len(errors)} rows failed validation", errors)


if __name__ == "__main__":
    validate_all([{"amount": 10}, {"amount": 5.5}, {"amount": -2}, {"region": "north"}])
