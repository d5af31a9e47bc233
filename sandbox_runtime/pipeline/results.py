"""What a call of the pipeline becomes between its run and its decision (:class:`Pending`: its body, the stand-in
the turn budget may show instead, its files), the decision stored for it (:func:`to_stored`), and the outcome the
caller gets, always built from the stored decision (:func:`outcome`): a new one adds what is never replayed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox_runtime.models import ResultDescriptor, StoredResult, ToolOutcome

__all__ = ["Pending", "outcome", "to_stored"]


class Pending(BaseModel):
    """One new result between execution and the stored decision."""

    model_config = ConfigDict(extra="forbid")

    call_id: str
    tool: str
    is_error: bool
    body: str
    stand_in: str | None = None
    tail: str = ""
    descriptor: ResultDescriptor | None = None
    error_path: str | None = None
    replaced: bool = False
    warnings: list[str] = Field(default_factory=list)
    details: dict[str, Any] | None = None
    blocks: list[dict[str, Any]] = Field(default_factory=list)
    annotations: dict[str, Any] | None = None
    structured: Any = None

    def text(self) -> str:
        shown = self.stand_in if self.replaced and self.stand_in is not None else self.body
        return "\n".join(part for part in (shown, self.tail) if part)


def to_stored(conversation_id: str, turn_id: str, now: float, p: Pending) -> StoredResult:
    return StoredResult(
        conversation_id=conversation_id,
        call_id=p.call_id,
        tool=p.tool,
        turn_id=turn_id,
        decided_at=now,
        is_error=p.is_error,
        replaced=_shows_stand_in(p),
        text=p.text(),
        descriptor=p.descriptor,
        error_path=p.error_path,
    )


def _shows_stand_in(p: Pending) -> bool:
    return p.replaced or bool(p.descriptor and p.descriptor.truncated_inline)


def outcome(stored: StoredResult, fresh: Pending | None = None) -> ToolOutcome:
    """The outcome of a stored decision; ``fresh``: the new result it was made from, whose warnings, details and
    MCP extras (never replayed) come along. Without it the decision is a replay."""
    extras: dict[str, Any] = {}
    if fresh is not None:
        extras = {
            "warnings": fresh.warnings,
            "details": fresh.details,
            "blocks": fresh.blocks,
            "annotations": fresh.annotations,
            "structured": fresh.structured,
        }
    return ToolOutcome(
        call_id=stored.call_id,
        tool=stored.tool,
        is_error=stored.is_error,
        text=stored.text,
        descriptor=stored.descriptor,
        error_path=stored.error_path,
        replaced=stored.replaced,
        replayed=fresh is None,
        **extras,
    )
