"""The per-turn budget: a batch of results the host runs together shows at most ``budget_chars`` inline.

When the inline total of a turn is over the budget, the largest *eligible* results are replaced by their
stand-ins (preview and path), largest first, until the total fits. Eligible means: the result was spilled (its
file exists, so replacing it loses nothing), its tool is not self-bounded, it is not already a stand-in, and the
result itself is at least ``floor_chars`` characters long. Ties go to the earlier result, so the same turn always makes
the same choice. The budget is best effort: when exempt results or failed spills keep a turn over it, the report
says so (``over_budget``) rather than hiding it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["BudgetCandidate", "BudgetDecision", "plan_turn_budget"]


@dataclass(frozen=True)
class BudgetCandidate:
    """One result of a turn: what it shows now, the length of its stand-in (None: cannot be replaced), and the
    size of the result itself, which the floor is measured against (None: the inline length)."""

    inline_chars: int
    stand_in_chars: int | None
    result_chars: int | None = None

    @property
    def size_chars(self) -> int:
        return self.inline_chars if self.result_chars is None else self.result_chars


@dataclass(frozen=True)
class BudgetDecision:
    """Which results (by position) to replace, and the inline totals before and after."""

    replace: tuple[int, ...]
    total_before_chars: int
    total_after_chars: int
    budget_chars: int
    over_budget: bool


def plan_turn_budget(candidates: Sequence[BudgetCandidate], *, budget_chars: int, floor_chars: int) -> BudgetDecision:
    """Choose the replacements, largest first, until the turn's inline total is at most ``budget_chars``."""
    total = before = sum(c.inline_chars for c in candidates)
    eligible = sorted(
        (
            i
            for i, c in enumerate(candidates)
            if c.stand_in_chars is not None and c.size_chars >= floor_chars and c.stand_in_chars < c.inline_chars
        ),
        key=lambda i: (-candidates[i].inline_chars, i),
    )
    chosen: list[int] = []
    for i in eligible:
        if total <= budget_chars:
            break
        stand_in = candidates[i].stand_in_chars
        assert stand_in is not None  # noqa: S101  (filtered above)
        total -= candidates[i].inline_chars - stand_in
        chosen.append(i)
    return BudgetDecision(
        replace=tuple(sorted(chosen)),
        total_before_chars=before,
        total_after_chars=total,
        budget_chars=budget_chars,
        over_budget=total > budget_chars,
    )
