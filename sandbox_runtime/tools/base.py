"""What every tool is to the dispatch pipeline: a name, a description, an argument model, a spill mode, and a
handler that turns validated arguments into a :class:`ToolReturn`.

Handlers raise a :class:`~sandbox_runtime.errors.ToolFailure` for bad input (``InvalidToolArguments``,
``PathRejected``, ``PathNotFound``, ``BadTableFile``, ...); the pipeline turns it into a result the model reads, and
any other unexpected exception of a handler into an internal-error result (see
:mod:`sandbox_runtime.pipeline.call`).
Infrastructure failures (every other :class:`~sandbox_runtime.errors.SandboxRuntimeError`) propagate.

Arguments nested deeper than the policy's ``tools.json_nesting_max`` (arrays and objects; the arguments object is
level 1) are refused before any schema sees them: validators, serialisers and the execution record recurse.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from jsonschema import Draft202012Validator
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sandbox_runtime.control import CallControl
from sandbox_runtime.conversations.handle import SandboxHandle
from sandbox_runtime.errors import InvalidToolArguments
from sandbox_runtime.models import Attachment, ResultDescriptor, SpillMode, ToolOutcome
from sandbox_runtime.policy import Policy
from sandbox_runtime.state.records import ExpiredFile
from sandbox_runtime.store.path_rules import DEFAULT_MOUNT_PATH
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tables.jsonio import nesting_depth

__all__ = [
    "ScriptCallOutcome",
    "ScriptFailure",
    "ScriptTools",
    "SpillMode",
    "ToolContext",
    "ToolReturn",
    "ToolSpec",
    "check_nesting",
    "model_arguments",
    "validate_arguments",
]

M = TypeVar("M", bound=BaseModel)


class ToolReturn(BaseModel):
    """A tool's raw result. The model sees, in order: ``content`` (through the spill), the short form of
    ``error`` (whose full text the pipeline saves in ``errors/``), and ``note`` (a short status line).

    A failure sets ``is_error`` (and ``cancelled`` when the caller cancelled the call); a tool that saved its full
    error itself names it in ``error_path``. ``details`` are for the host (e.g. a run's status and exit code), not
    for the model.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    content: Any = ""
    is_error: bool = False
    cancelled: bool = False  # the caller cancelled the call (a run ended every process it started)
    error: str | None = None
    note: str | None = None
    error_path: str | None = None
    descriptor: ResultDescriptor | None = None  # the file a file-building tool made
    details: dict[str, Any] | None = None
    blocks: list[dict[str, Any]] = Field(default_factory=list)  # MCP content blocks kept as they are (links)
    annotations: dict[str, Any] | None = None  # MCP annotations of the text (audience, priority)
    structured: Any = None  # a host tool's own structured result (MCP structuredContent), shown when not spilled


@dataclass(frozen=True)
class ToolContext:
    """What a handler may use: the conversation's sandbox, its results folder and outputs, the policy, and
    retention's record of removed files."""

    sandbox: SandboxHandle
    conversation_id: str
    root: ResultsRoot
    outputs: Path  # attachments: outside the results folder, never seen by the sandbox
    policy: Policy
    expired: Callable[[str], ExpiredFile | None]
    record_attachment: Callable[[Attachment], None]
    call_id: str = ""  # the call being run (set per call by the pipeline)
    control: CallControl | None = None  # its cancellation and progress, when the caller gave them
    scripts: ScriptTools | None = None  # the pipeline, for the tool calls of a run_python script


ScriptFailure = Literal["denied", "invalid_arguments", "failed"]


@dataclass(frozen=True)
class ScriptCallOutcome:
    """What a script's tool call came to: the outcome the model would have had, and why it failed, if it did."""

    outcome: ToolOutcome
    failure: ScriptFailure | None


class ScriptTools(Protocol):
    """The dispatch pipeline as a ``run_python`` run's tool calls reach it."""

    def specs(self) -> Mapping[str, ToolSpec]:
        """Every tool of the runtime, by name (the caller picks those scripts may call)."""

    def call(self, tool: str, arguments: dict[str, Any], number: int, source: str) -> ScriptCallOutcome:
        """The run's call ``number`` (1, 2, ...), its arguments from ``source`` (the script), through the whole
        pipeline: validation, approval, the handler, spill, the stored decision and the execution record."""


@dataclass(frozen=True)
class ToolSpec:
    """A tool the pipeline can run: built in (a pydantic argument model) or the host's (a JSON schema)."""

    name: str
    description: str
    arguments: type[BaseModel] | None
    handler: Callable[[ToolContext, Any], ToolReturn]
    spill_mode: SpillMode = "normal"
    threshold_chars: int | None = None  # the tool's own spill threshold (None: the policy's)
    schema: dict[str, Any] | None = None  # the JSON schema of a host tool's arguments
    title: str | None = None  # a human-readable name (MCP's Tool.title)
    annotations: dict[str, Any] | None = None  # MCP tool annotations (readOnlyHint, destructiveHint, ...)
    output_schema: dict[str, Any] | None = None  # the JSON schema of the tool's structured result
    long_running: bool = False  # may run long: an MCP client may call it as a task
    # where the results folder appears in the sandbox (the policy's): an argument model's descriptions give their
    # examples under the default one, and the schema the model is shown names this one instead
    results_path: str = DEFAULT_MOUNT_PATH

    def input_schema(self) -> dict[str, Any]:
        """The JSON schema of the arguments (what MCP's ``tools/list`` shows); made once per argument model and
        results folder and shared, so read it, never change it."""
        if self.arguments is not None:
            return _model_schema(self.arguments, self.results_path)
        return self.schema or {"type": "object"}


@functools.cache
def _model_schema(model: type[BaseModel], results_path: str) -> dict[str, Any]:
    schema = model.model_json_schema()
    return schema if results_path == DEFAULT_MOUNT_PATH else _with_results_path(schema, results_path)


def _with_results_path(node: Any, results_path: str) -> Any:
    """A schema whose descriptions name ``results_path`` where they name the default results folder."""
    if isinstance(node, dict):
        return {
            key: value.replace(DEFAULT_MOUNT_PATH, results_path)
            if key == "description" and isinstance(value, str)
            else _with_results_path(value, results_path)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_with_results_path(item, results_path) for item in node]
    return node


def validate_arguments(spec: ToolSpec, raw: object, *, label: str | None = None, nesting_max: int | None = None) -> Any:
    """Arguments checked against the tool's schema: a model instance for built-in tools, the dict itself for
    host tools. Errors name each failing field; ``label`` names the call (e.g. ``delegate_call → crm__create``).
    With ``nesting_max`` (the policy's ``tools.json_nesting_max``) deeper arguments are refused first."""
    name = label or spec.name
    if nesting_max is not None:
        check_nesting(raw, nesting_max, name)
    if spec.arguments is None:
        problems = sorted(
            Draft202012Validator(spec.input_schema()).iter_errors(raw), key=lambda e: list(map(str, e.path))
        )
        if problems:
            detail = "; ".join(f"{'.'.join(map(str, e.path)) or 'arguments'}: {e.message}" for e in problems[:10])
            raise InvalidToolArguments(f"{name}: {detail}")
        return raw
    return model_arguments(spec.arguments, raw, name)


def check_nesting(raw: object, nesting_max: int, name: str) -> None:
    """An :class:`InvalidToolArguments` naming the depth and the cap when ``raw`` nests arrays and objects deeper
    than ``nesting_max`` levels (``raw`` itself, the arguments object, is level 1), or holds itself."""
    try:
        inner = {key: nesting_depth(value) for key, value in raw.items()} if isinstance(raw, dict) else {}
        depth = 1 + max(inner.values(), default=0) if isinstance(raw, dict) else nesting_depth(raw)
    except ValueError as exc:
        raise InvalidToolArguments(f"{name}: the arguments are not JSON: {exc}") from exc
    if depth <= nesting_max:
        return
    where = f" (deepest in `{max(inner, key=inner.__getitem__)}`)" if inner else ""
    raise InvalidToolArguments(
        f"{name}: the arguments nest arrays and objects {depth:,} levels deep{where}, more than "
        f"tools.json_nesting_max = {nesting_max} allows (the arguments object is level 1); send flatter values"
    )


def model_arguments(model: type[M], raw: object, name: str) -> M:
    """``raw`` validated as ``model``; an :class:`InvalidToolArguments` names each failing field."""
    if isinstance(raw, model):
        return raw
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        detail = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'arguments'}: {e['msg']}" for e in exc.errors())
        raise InvalidToolArguments(f"{name}: {detail}") from exc
