# expect: ValueError: rejected payload for row 17
# stderr-at-least: 150000
"""An exception whose message embeds a whole 150 KB payload."""

import json


def validate(row_number: int, payload: dict[str, object]) -> None:
    if "amount" not in payload:
        raise ValueError(f"rejected payload for row {row_number}: {json.dumps(payload)}")


def main() -> None:
    payload: dict[str, object] = {f"field_{i:05d}": "x" * 20 for i in range(5000)}
    validate(17, payload)


if __name__ == "__main__":
    main()
