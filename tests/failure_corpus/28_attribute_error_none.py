# expect: AttributeError: 'NoneType' object has no attribute 'group'
"""Extract invoice numbers with a regular expression that does not match one of the lines."""

import re

LINES = ["Invoice INV-2024-001 paid", "Invoice INV-2024-002 open", "Credit note CN-17 issued"]
PATTERN = re.compile(r"Invoice (INV-\d{4}-\d{3})")


def invoice_numbers(lines: list[str]) -> list[str]:
    return [PATTERN.match(line).group(1) for line in lines]


if __name__ == "__main__":
    print(invoice_numbers(LINES))
