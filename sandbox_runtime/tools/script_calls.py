"""The tool calls of one ``run_python`` run: what the script's ``sandbox_tools`` module sends, checked and answered.

Each line the run writes is one JSON request, ``{"id": n, "op": "list"}`` or ``{"id": n, "op": "call", "tool":
name, "arguments": {...}, "span": m}`` (``span``: the run's own span the call is made in, if any), or a span or an
event the run opens (``op`` ``span`` or ``event``: answered by :mod:`~sandbox_runtime.telemetry.sandbox_spans`);
each gets one JSON reply, in order. Before a call reaches the pipeline it must pass,
in this order (each refusal is a reply the script raises as a typed error; nothing is called):

* the line is JSON and names a tool (``invalid_arguments``);
* the tool is not ``run_python`` and matches a pattern of ``script_tools.allowed`` (``not_allowed``);
* the run has made fewer than ``script_tools.calls_max_count`` calls and spent less than
  ``script_tools.calls_max_s`` seconds in them (``limit``);
* its arguments take at most ``script_tools.call_args_max_bytes`` bytes as JSON (``limit``; a longer line is not
  even read).

Then the pipeline runs it (:class:`~sandbox_runtime.tools.base.ScriptTools`) and the reply carries what the model
would have had: the text (cut at ``script_tools.reply_max_chars``), the spilled file's descriptor (its path), the
error file, the call id, and why it failed (``denied``, ``invalid_arguments``, ``failed``). Without the pipeline
(a run started outside it) every call is ``unavailable``.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import logging
import time
from typing import Any

from sandbox_runtime.policy import ScriptToolsPolicy
from sandbox_runtime.telemetry.sandbox_spans import RunSpans
from sandbox_runtime.tools.base import ScriptTools, ToolSpec

__all__ = ["RunScriptCalls"]

logger = logging.getLogger(__name__)

_ENVELOPE_BYTES = 4096  # the request around the arguments: id, op, the tool's name
_RUN_PYTHON = "run_python"


class RunScriptCalls:
    """Answers the tool calls of one run (a :class:`~sandbox_runtime.sandbox.backend.ScriptCalls`)."""

    def __init__(
        self, scripts: ScriptTools | None, policy: ScriptToolsPolicy, source: str, spans: RunSpans | None = None
    ) -> None:
        self._scripts = scripts
        self._policy = policy
        self._source = source
        self._spans = spans
        self.made = 0  # calls that reached the pipeline
        self.failed = 0  # of those, the ones that failed (denied included)
        self.refused = 0  # calls refused before the pipeline (allow-list, limits, malformed)
        self.spent_s = 0.0

    @property
    def line_max_bytes(self) -> int:
        return self._policy.call_args_max_bytes + _ENVELOPE_BYTES

    def summary(self) -> str | None:
        """One line on the run's calls for the model; None when it made none."""
        if not self.made and not self.refused:
            return None
        parts = [f"{self.made - self.failed} ok"]
        if self.failed:
            parts.append(f"{self.failed} failed")
        if self.refused:
            parts.append(f"{self.refused} refused")
        return f"Tool calls from the script: {self.made + self.refused} ({', '.join(parts)})."

    def answer(self, line: bytes | None) -> dict[str, Any]:
        request, refusal = self._parse(line)
        if refusal is not None:
            return refusal
        number, op = request.get("id"), request.get("op")
        if op == "list":
            return {"id": number, "ok": True, "tools": [_listed(spec) for spec in self._allowed().values()]}
        if op in ("span", "event"):
            return (
                {"id": number, "ok": False, "error": "off"}
                if self._spans is None
                else self._spans.answer(number, request)
            )
        if op != "call":
            return self._refuse(number, "invalid_arguments", f"unknown op {op!r}")
        # made inside a span the run opened: the call's span is its child
        inside = contextlib.nullcontext() if self._spans is None else self._spans.inside(request.get("span"))
        with inside:
            return self._call(number, request.get("tool"), request.get("arguments"))

    def _parse(self, line: bytes | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The request a line holds, or the reply refusing a line that holds none."""
        if line is None:
            return {}, self._refuse(
                None,
                "limit",
                f"a call's request may take at most {self.line_max_bytes:,} bytes (its arguments "
                f"script_tools.call_args_max_bytes = {self._policy.call_args_max_bytes:,}); write large values "
                "to a file and pass its path",
            )
        try:
            request = json.loads(line)
        except (ValueError, RecursionError) as exc:
            return {}, self._refuse(None, "invalid_arguments", f"the request is not JSON: {exc}")
        if not isinstance(request, dict):
            return {}, self._refuse(None, "invalid_arguments", "the request is not a JSON object")
        return request, None

    def _call(self, number: object, tool: object, arguments: object) -> dict[str, Any]:
        if not isinstance(tool, str) or not tool:
            return self._refuse(number, "invalid_arguments", "a call names its tool (a string)")
        if not isinstance(arguments, dict):
            return self._refuse(number, "invalid_arguments", f"the arguments of {tool} are not a JSON object")
        if self._scripts is None:
            return {
                "id": number,
                "ok": False,
                "error": "unavailable",
                "message": "tool calls cannot be made from this run: it was not started through the runtime's "
                "dispatch pipeline (call run_python as a tool: conversation.call('run_python', ...))",
            }
        refusal = self._check(tool, arguments)
        if refusal is not None:
            kind, message = refusal
            return self._refuse(number, kind, message)
        self.made += 1
        began = time.monotonic()
        try:
            result = self._scripts.call(tool, arguments, self.made, self._source)
        except Exception as exc:  # an infrastructure failure: the script reads it; the run goes on
            logger.warning("a script's call of %s failed in the runtime: %s", tool, exc)
            self.failed += 1
            return {
                "id": number,
                "ok": False,
                "error": "failed",
                "message": f"the runtime could not run {tool}: {type(exc).__name__}: {exc}",
            }
        finally:
            self.spent_s += time.monotonic() - began
        outcome = result.outcome
        text = self._cut(outcome.text)
        reply: dict[str, Any] = {
            "id": number,
            "ok": result.failure is None,
            "call_id": outcome.call_id,
            "text": text,
            "descriptor": None if outcome.descriptor is None else outcome.descriptor.model_dump(mode="json"),
            "error_path": outcome.error_path,
        }
        if result.failure is not None:
            self.failed += 1
            reply.update(error=result.failure, message=text)
        return reply

    def _check(self, tool: str, arguments: dict[str, Any]) -> tuple[str, str] | None:
        """Why the call may not be made, as (kind, message); None when it may."""
        policy = self._policy
        if tool == _RUN_PYTHON:
            return "not_allowed", "run_python cannot be called from a run (run the code in this script instead)"
        allowed = self._allowed()
        if tool not in allowed:
            names = ", ".join(allowed) or "none"
            return "not_allowed", (
                f"scripts may not call {tool!r} (script_tools.allowed in the policy); the tools they may call: {names}"
            )
        if self.made >= policy.calls_max_count:
            return "limit", (
                f"this run has made {self.made:,} tool calls, as many as script_tools.calls_max_count allows; "
                "make fewer calls per run (batch the work), or run the rest in another run"
            )
        if self.spent_s >= policy.calls_max_s:
            return "limit", (
                f"this run has spent {self.spent_s:.1f} s in tool calls, script_tools.calls_max_s = "
                f"{policy.calls_max_s:g} s; run the rest in another run"
            )
        size = len(json.dumps(arguments, ensure_ascii=False).encode("utf-8", "surrogatepass"))
        if size > policy.call_args_max_bytes:
            return "limit", (
                f"the arguments of {tool} take {size:,} bytes as JSON, more than script_tools.call_args_max_bytes "
                f"= {policy.call_args_max_bytes:,}"
            )
        return None

    def _allowed(self) -> dict[str, ToolSpec]:
        if self._scripts is None:
            return {}
        patterns = self._policy.allowed
        return {
            name: spec
            for name, spec in self._scripts.specs().items()
            if name != _RUN_PYTHON and any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
        }

    def _refuse(self, number: object, kind: str, message: str) -> dict[str, Any]:
        self.refused += 1
        return {"id": number, "ok": False, "error": kind, "message": message}

    def _cut(self, text: str) -> str:
        cap = self._policy.reply_max_chars
        if len(text) <= cap:
            return text
        return text[:cap] + f"\n[cut at {cap:,} of {len(text):,} characters (script_tools.reply_max_chars)]"


def _listed(spec: ToolSpec) -> dict[str, Any]:
    return {"name": spec.name, "description": spec.description, "input_schema": spec.input_schema()}
