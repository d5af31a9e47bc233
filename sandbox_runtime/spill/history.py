"""Rebuilding a conversation's history for the next model request with the stored decisions.

A host keeps its own message list; before each model request it passes that list here, and every tool result
the runtime decided is set to the exact text the model was given then — the stand-in when it was replaced, the
inline text otherwise — byte for byte, after a restart too, whatever the policy says now. The input is never
changed; a rebuilt copy is returned. Messages of other shapes and results of unknown call ids are kept as they
are. Three message shapes are understood:

* OpenAI Chat Completions: ``{"role": "tool", "tool_call_id": ..., "content": ...}``
* OpenAI Responses: ``{"type": "function_call_output", "call_id": ..., "output": ...}``
* Anthropic Messages: ``{"role": "user", "content": [{"type": "tool_result", "tool_use_id": ..., "content": ...}]}``
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["HistoryRebuild", "rebuild_history"]


class HistoryRebuild(list[Any]):
    """The rebuilt messages (a plain list), with the call ids that were replayed and those not known here."""

    replayed: list[str]
    unknown: list[str]


def rebuild_history(messages: Sequence[Any], decided: Mapping[str, str]) -> HistoryRebuild:
    """A copy of ``messages`` with each known tool result's content set to its stored text."""
    out = HistoryRebuild()
    out.replayed, out.unknown = [], []

    def replay(call_id: object) -> str | None:
        if not isinstance(call_id, str):
            return None
        text = decided.get(call_id)
        (out.unknown if text is None else out.replayed).append(call_id)
        return text

    for message in messages:
        if not isinstance(message, dict):
            out.append(copy.deepcopy(message))
            continue
        rebuilt = dict(message)
        if message.get("role") == "tool" and "tool_call_id" in message:
            text = replay(message["tool_call_id"])
            if text is not None:
                rebuilt["content"] = text
        elif message.get("type") == "function_call_output" and "call_id" in message:
            text = replay(message["call_id"])
            if text is not None:
                rebuilt["output"] = text
        elif isinstance(message.get("content"), list):
            rebuilt["content"] = [_block(block, replay) for block in message["content"]]
        out.append(copy.deepcopy(rebuilt))
    return out


def _block(block: object, replay: Any) -> object:
    if isinstance(block, dict) and block.get("type") == "tool_result" and "tool_use_id" in block:
        text = replay(block["tool_use_id"])
        if text is not None:
            return {**block, "content": text}
    return block
