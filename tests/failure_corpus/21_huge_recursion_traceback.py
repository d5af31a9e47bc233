# expect: RecursionError: maximum recursion depth exceeded
# stderr-at-least: 100000
"""Mutual recursion with long lines: Python cannot fold the frames, so the traceback exceeds 100 KB."""


def consolidate_department_totals_for_the_quarterly_board_report(department_identifier, depth):
    return aggregate_child_departments_into_the_parent_ledger_and_report(department_identifier, depth + 1)


def aggregate_child_departments_into_the_parent_ledger_and_report(department_identifier, depth):
    return consolidate_department_totals_for_the_quarterly_board_report(department_identifier, depth + 1)


if __name__ == "__main__":
    consolidate_department_totals_for_the_quarterly_board_report("finance", 0)
