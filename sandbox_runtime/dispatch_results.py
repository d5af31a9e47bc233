"""What a call of the pipeline becomes between its run and its decision, and the outcomes the caller gets: a
new result (:class:`Pending`: its body, the stand-in the turn budget may show instead, its files), the decision
stored for it, and a replayed one."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox_runtime.calls import ToolOutcome
from sandbox_runtime.records import StoredResult
from sandbox_runtime.spill.spiller import ResultDescriptor

__all__ = ["Pending", "outcome", "replayed", "to_stored"]


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
        descriptor=None if p.descriptor is None else p.descriptor.model_dump_json(),
        error_path=p.error_path,
    )


def _shows_stand_in(p: Pending) -> bool:
    return p.replaced or bool(p.descriptor and p.descriptor.truncated_inline)


def outcome(p: Pending) -> ToolOutcome:
    return ToolOutcome(
        call_id=p.call_id,
        tool=p.tool,
        is_error=p.is_error,
        text=p.text(),
        descriptor=p.descriptor,
        error_path=p.error_path,
        replaced=_shows_stand_in(p),
        warnings=p.warnings,
        details=p.details,
        blocks=p.blocks,
        annotations=p.annotations,
        structured=p.structured,
    )


def replayed(s: StoredResult) -> ToolOutcome:
    return ToolOutcome(
        call_id=s.call_id,
        tool=s.tool,
        is_error=s.is_error,
        text=s.text,
        descriptor=None if s.descriptor is None else ResultDescriptor.model_validate(json.loads(s.descriptor)),
        error_path=s.error_path,
        replaced=s.replaced,
        replayed=True,
    )
