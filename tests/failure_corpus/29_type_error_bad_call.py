# expect: TypeError: format_currency() got an unexpected keyword argument 'decimals'
"""Call a formatting helper with a keyword argument it does not take."""


def format_currency(value: float, currency: str) -> str:
    return f"{value:,.2f} {currency}"


def summary_line(label: str, value: float) -> str:
    return f"{label}: {format_currency(value, 'EUR', decimals=2)}"


if __name__ == "__main__":
    print(summary_line("Total revenue", 125_000.5))
