# expect: KeyError: 'vat_rate'
# user-file: invoice_helpers/totals.py
"""The script writes a helper package next to itself, imports it, and the error is raised in the helper."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.dont_write_bytecode = True

TOTALS_SOURCE = '''"""Invoice arithmetic."""


def line_total(line: dict[str, float], rates: dict[str, float]) -> float:
    return line["quantity"] * line["unit_price"] * (1 + rates["vat_rate"])


def invoice_total(lines: list[dict[str, float]], rates: dict[str, float]) -> float:
    return round(sum(line_total(line, rates) for line in lines), 2)
'''


def write_helpers() -> None:
    package = HERE / "invoice_helpers"
    package.mkdir(exist_ok=True)
    (package / "__init__.py").write_text('"""Helpers written by the report script."""\n', encoding="utf-8")
    (package / "totals.py").write_text(TOTALS_SOURCE, encoding="utf-8")


def main() -> None:
    write_helpers()
    sys.path.insert(0, str(HERE))
    from invoice_helpers.totals import invoice_total  # noqa: PLC0415  (the module exists only now)

    lines = [{"quantity": 3, "unit_price": 9.99}, {"quantity": 1, "unit_price": 120.0}]
    print(invoice_total(lines, {"vat": 0.21}))


if __name__ == "__main__":
    main()
