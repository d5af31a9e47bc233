# expect: SyntaxError: unterminated string literal
# user-file: chart_helpers.py
"""The script writes a helper module with a syntax error next to itself and imports it."""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.dont_write_bytecode = True

HELPER_SOURCE = 'def axis_title(unit):\n    return "Revenue (" + unit + ")\n'


def main() -> None:
    (HERE / "chart_helpers.py").write_text(HELPER_SOURCE, encoding="utf-8")
    sys.path.insert(0, str(HERE))
    import chart_helpers  # noqa: PLC0415  (the module exists only now)

    print(chart_helpers.axis_title("EUR"))


if __name__ == "__main__":
    main()
