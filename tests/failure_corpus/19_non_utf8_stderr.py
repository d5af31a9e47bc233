# expect: ValueError: could not parse price
"""A legacy tool's Latin-1 output lands on stderr before the script fails."""

import sys


def parse_price(text: str) -> float:
    cleaned = text.replace("EUR", "").strip()
    try:
        return float(cleaned)
    except ValueError:
        raise ValueError(f"could not parse price {text!r}") from None


def main() -> None:
    sys.stderr.flush()
    sys.stderr.buffer.write(b"legacy export: caf\xe9 cr\xe8me br\xfbl\xe9e \xff\xfe\n")
    sys.stderr.buffer.flush()
    prices = ["4.50 EUR", "3,20 EUR"]
    print(sum(parse_price(p) for p in prices))


if __name__ == "__main__":
    main()
