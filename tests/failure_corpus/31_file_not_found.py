# expect: FileNotFoundError: [Errno 2] No such file or directory: 'input/customers_2024.csv'
"""Open an input file that was never uploaded."""

import csv


def load_customers(path: str) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


if __name__ == "__main__":
    print(len(load_customers("input/customers_2024.csv")))
