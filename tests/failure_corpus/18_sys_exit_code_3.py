# expect: exit code 3
# exception-line: empty
# user-frame: no
"""Exit with a bare status code: nothing at all is written to stderr."""

import sys

REQUIRED_COLUMNS = {"date", "region", "amount"}


def main() -> int:
    columns = {"date", "region"}
    print(f"checking {len(columns)} columns")
    if REQUIRED_COLUMNS - columns:
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
