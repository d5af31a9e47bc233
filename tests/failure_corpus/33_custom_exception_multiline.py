# expect: ReportValidationError: 3 problems found in sales_report.xlsx
"""A custom exception whose message spans several lines (only the first starts with the type name)."""


class ReportValidationError(Exception):
    """The generated report failed its checks."""

    def __init__(self, filename: str, problems: list[str]) -> None:
        lines = [f"{len(problems)} problems found in {filename}:"]
        lines += [f"  - {problem}" for problem in problems]
        super().__init__("\n".join(lines))


def check_report() -> None:
    problems = [
        "sheet 'Summary' is empty",
        "column D has text in a numeric column",
        'File "totals" row 12 is a duplicate',
    ]
    raise ReportValidationError("sales_report.xlsx", problems)


if __name__ == "__main__":
    check_report()
