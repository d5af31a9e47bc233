"""What a ``tools/call`` answer carries, in every channel a client may show the model, and what ``tools/list`` says.

Clients differ in what they hand the model: some show ``content``, some (pydantic-ai, and by public reports
Claude Code) show ``structuredContent`` whenever the content is all text. So both channels carry the whole result:

- ``content``: one text block with exactly the text the model is given (the text history replays), then the
  blocks a host tool passed on (resource links), then a ``resource_link`` to each file the call made — the
  spill, the export, the full error, the attachment — with its size and MIME type;
- ``structuredContent``: the tool's result — the same ``text``, ``is_error``, the ``file`` the result was saved
  to or the tool made (its descriptor), the ``error_path``, and the tool's own fields (for ``run_python``:
  ``status``, ``exit_code``, ``duration_s``, ``script_path``). It conforms to the ``outputSchema`` the tool
  declares. A host tool with an output schema of its own gets its own structured result there when the result
  is shown whole; when it was saved to a file, the result object with the file's descriptor instead (its
  declared schema allows both);
- ``_meta``: the call's metadata (call id, conversation, whether a stand-in replaced the result, replayed; the
  server adds ``sandbox-runtime/quota``: what the tenant uses of its share, may use, and how long the call waited).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox_runtime.mcp.resources import attachment_uri, mime_type, result_uri
from sandbox_runtime.models import Attachment, AttachmentCard, ResultDescriptor, RunStatus, ToolOutcome
from sandbox_runtime.tools.base import ToolSpec
from sandbox_runtime.tools.run_result import ScriptError

__all__ = [
    "META_CALL_ID",
    "META_CONVERSATION",
    "META_QUOTA",
    "META_REPLACED",
    "META_REPLAYED",
    "META_TURN",
    "ToolResult",
    "call_result",
    "tool_listing",
]

META_CONVERSATION = "sandbox-runtime/conversation"
META_QUOTA = "sandbox-runtime/quota"  # what the call's tenant uses and may use, and how long the call waited
META_TURN = "sandbox-runtime/turn"
META_CALL_ID = "sandbox-runtime/call-id"
META_REPLACED = "sandbox-runtime/replaced"
META_REPLAYED = "sandbox-runtime/replayed"


class ToolResult(BaseModel):
    """The structured result every tool of this server returns (tools add their own fields)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    text: str = Field(description="Exactly the text the model is given (the result, or its address and preview).")
    is_error: bool = Field(description="The call failed; `text` says why.")
    file: ResultDescriptor | None = Field(
        None, description="The file the result was saved to, or the file the tool made: path, format, bytes, rows..."
    )
    error_path: str | None = Field(None, description="The file holding the full error text, when the call failed.")


class RunPythonOutput(ToolResult):
    status: RunStatus | None = Field(None, description="How the run ended (None when it did not start).")
    exit_code: int | None = None
    duration_s: float | None = None
    script_path: str | None = Field(None, description="The script that ran (inline code is saved first).")
    error: ScriptError | None = Field(
        None, description="A failed run's exception (type, message) and the line of your script that raised it."
    )


class ReadFileOutput(ToolResult):
    path: str | None = None
    first_line: int | None = None
    last_line: int | None = None
    next_offset: int | None = Field(None, description="The `offset` to read on from, when the text was cut.")
    truncated: bool | None = None


class FileWriteOutput(ToolResult):
    path: str | None = None
    bytes: int | None = None
    lines: int | None = None


class RenderTableOutput(ToolResult):
    rows: int | None = None
    columns: list[str] | None = None


class AttachFileOutput(ToolResult):
    attachment: AttachmentCard | None = Field(None, description="The download the user was given.")


_OUTPUTS: dict[str, type[ToolResult]] = {
    "run_python": RunPythonOutput,
    "read_file": ReadFileOutput,
    "write_file": FileWriteOutput,
    "edit_file": FileWriteOutput,
    "render_table": RenderTableOutput,
    "attach_file": AttachFileOutput,
}

_SCHEMAS: dict[str, dict[str, Any]] = {name: model.model_json_schema() for name, model in _OUTPUTS.items()}
_SCHEMAS[""] = ToolResult.model_json_schema()


def tool_listing(spec: ToolSpec) -> dict[str, Any]:
    """The ``Tool`` entry of ``tools/list`` (JSON fields): name, title, description, schemas, annotations, and
    ``execution.taskSupport`` for the tools that may run as tasks."""
    output_schema = _SCHEMAS.get(spec.name, _SCHEMAS[""])
    if spec.output_schema is not None:  # a host tool's own: shown whole, or the result object when saved to a file
        output_schema = {"type": "object", "anyOf": [spec.output_schema, _SCHEMAS[""]]}
    listed: dict[str, Any] = {
        "name": spec.name,
        "title": spec.title or spec.name,
        "description": spec.description,
        "inputSchema": spec.input_schema(),
        "outputSchema": output_schema,
    }
    if spec.annotations:
        listed["annotations"] = spec.annotations
    if spec.long_running:
        listed["execution"] = {"taskSupport": "optional"}
    return listed


def call_result(
    outcome: ToolOutcome, conversation_id: str, mount: str, *, turn_id: str | None = None
) -> dict[str, Any]:
    """The ``CallToolResult`` (as its JSON fields) for one outcome."""
    text_block: dict[str, Any] = {"type": "text", "text": outcome.text}
    if outcome.annotations:
        text_block["annotations"] = outcome.annotations
    content: list[dict[str, Any]] = [text_block, *outcome.blocks]
    d = outcome.descriptor
    if d is not None:
        content.append(_link(result_uri(conversation_id, d.path, mount), d.path, mime_type(d.path, d.format), d))
    if outcome.error_path is not None:
        uri = result_uri(conversation_id, outcome.error_path, mount)
        content.append(_link(uri, outcome.error_path, "text/plain", None, "The full error text."))
    attachment = _attachment(outcome)
    if attachment is not None:
        content.append(
            {
                "type": "resource_link",
                "uri": attachment_uri(conversation_id, attachment.attachment_id),
                "name": attachment.filename,
                "mimeType": attachment.mime_type,
                "size": attachment.bytes,
                "description": "A file for the user (a download).",
            }
        )
    meta: dict[str, Any] = {
        META_CALL_ID: outcome.call_id,
        META_CONVERSATION: conversation_id,
        META_REPLACED: outcome.replaced,
        META_REPLAYED: outcome.replayed,
    }
    if turn_id is not None:
        meta[META_TURN] = turn_id
    return {
        "content": content,
        "structuredContent": structured_result(outcome, attachment),
        "isError": outcome.is_error,
        "_meta": meta,
    }


def structured_result(outcome: ToolOutcome, attachment: Attachment | None = None) -> Any:
    """The tool's result as ``structuredContent`` (see the module text)."""
    if outcome.structured is not None and outcome.descriptor is None and not outcome.is_error:
        return outcome.structured
    model = _OUTPUTS.get(outcome.tool, ToolResult)
    fields: dict[str, Any] = {
        "text": outcome.text,
        "is_error": outcome.is_error,
        "file": outcome.descriptor,
        "error_path": outcome.error_path,
    }
    details = outcome.details or {}
    for name in model.model_fields:
        if name not in fields and name in details:
            fields[name] = details[name]
    if model is AttachFileOutput and attachment is not None:
        fields["attachment"] = AttachmentCard.model_validate(attachment.model_dump(exclude={"source", "host_path"}))
    return model.model_validate(fields).model_dump(mode="json")


def _link(uri: str, path: str, mime: str, d: ResultDescriptor | None, description: str | None = None) -> dict[str, Any]:
    link: dict[str, Any] = {"type": "resource_link", "uri": uri, "name": path.rsplit("/", 1)[-1], "mimeType": mime}
    if d is not None:
        link["size"] = d.bytes
        shape = f"{d.rows:,} rows; columns: {', '.join(d.columns or [])}" if d.rows is not None else d.format
        link["description"] = f"{path} ({shape})"
    elif description:
        link["description"] = f"{path}: {description}"
    return link


def _attachment(outcome: ToolOutcome) -> Attachment | None:
    if outcome.tool != "attach_file" or outcome.is_error or not outcome.details:
        return None
    try:
        return Attachment.model_validate(outcome.details)
    except ValueError:
        return None
