# expect: TypeError: can only concatenate str (not "int") to str
"""A buggy ``except`` block: the handler itself fails while handling a ValueError."""

ROWS = [("2024-03-01", "12.50"), ("2024-03-02", "n/a"), ("2024-03-03", "7.25")]


def parse_rows(rows: list[tuple[str, str]]) -> list[float]:
    amounts = []
    for index, (day, text) in enumerate(rows):
        try:
            amounts.append(float(text))
        except ValueError:
            print("skipping row " + index + " (" + day + ")")
    return amounts


if __name__ == "__main__":
    print(sum(parse_rows(ROWS)))
