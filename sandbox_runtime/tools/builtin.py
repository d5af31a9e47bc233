"""The built-in tools as the dispatch pipeline sees them (more join with the path-taking tools)."""

from __future__ import annotations

import dataclasses

from sandbox_runtime.errors import InvalidToolArguments
from sandbox_runtime.models import ResultDescriptor
from sandbox_runtime.policy import Policy
from sandbox_runtime.store.outputs import AttachmentStore, OutputsLimits
from sandbox_runtime.tables.source import TableLimits
from sandbox_runtime.telemetry.tracing import span
from sandbox_runtime.tools.attach import AttachFileArgs, attach_file, attach_file_description
from sandbox_runtime.tools.base import ToolContext, ToolReturn, ToolSpec
from sandbox_runtime.tools.delegate import DelegateCallArgs, delegate_call_description
from sandbox_runtime.tools.export_table import ExportTableArgs, export_table, export_table_description
from sandbox_runtime.tools.files import (
    EDIT_FILE_DESCRIPTION,
    EditFileArgs,
    WriteFileArgs,
    edit_file,
    write_file,
    write_file_description,
)
from sandbox_runtime.tools.read_file import ReadFileArgs, read_file, read_file_description
from sandbox_runtime.tools.render_table import RenderTableArgs, render_table, render_table_description
from sandbox_runtime.tools.run_python import RunPythonArgs, run_python_description, run_python_tool
from sandbox_runtime.tools.sql_query import SqlQueryArgs, sql_query, sql_query_description

__all__ = ["builtin_tools"]


def _read_file(ctx: ToolContext, args: ReadFileArgs) -> ToolReturn:
    result = read_file(
        ctx.root, args, max_chars=ctx.policy.tools.read_max_chars, max_file_bytes=ctx.policy.store.quota_bytes
    )
    return ToolReturn(content=result.text, details=result.model_dump(exclude={"text"}))


def _write_file(ctx: ToolContext, args: WriteFileArgs) -> ToolReturn:
    written = write_file(ctx.root, args, max_bytes=ctx.policy.tools.text_file_max_bytes)
    return ToolReturn(content=written.message, details=written.model_dump())


def _edit_file(ctx: ToolContext, args: EditFileArgs) -> ToolReturn:
    written = edit_file(ctx.root, args, max_bytes=ctx.policy.tools.text_file_max_bytes)
    return ToolReturn(content=written.message, details=written.model_dump())


def _attach_file(ctx: ToolContext, args: AttachFileArgs) -> ToolReturn:
    limits = OutputsLimits.from_policy(ctx.policy.tools)
    made = attach_file(ctx.root, ctx.outputs, args, max_bytes=ctx.policy.tools.attachment_max_bytes, limits=limits)
    try:
        ctx.record_attachment(made)
    except BaseException:
        AttachmentStore(ctx.outputs, limits).discard(made.attachment_id)  # no attachment is left without its record
        raise
    return ToolReturn(
        content=f"Attached {made.filename} ({made.bytes:,} bytes, {made.mime_type}) as {made.attachment_id}; the "
        f"user sees it as a download. It is kept after the results folder's cleanup.",
        details=made.model_dump(),
    )


def _export_table(ctx: ToolContext, args: ExportTableArgs) -> ToolReturn:
    with span("export", {"sandbox_runtime.export.format": args.format}) as exporting:
        made = export_table(
            ctx.root,
            args,
            max_source_bytes=ctx.policy.store.read_max_bytes,
            max_table_file_bytes=ctx.policy.store.quota_bytes,  # streamed: no larger than the folder itself
            sort_memory_rows=ctx.policy.tools.sort_memory_rows_max,
            limits=TableLimits.from_policy(ctx.policy.tools),
        )
        exporting.set_attributes({"sandbox_runtime.export.rows": made.rows, "sandbox_runtime.export.bytes": made.bytes})
    descriptor = ResultDescriptor(
        path=made.path,
        format=made.format,
        bytes=made.bytes,
        chars=None,  # not counted for built files
        sha256=made.sha256,
        rows=made.rows,
        columns=made.columns,
        column_types=list(made.column_types),
        preview="",
        truncated_inline=False,
        expires_at=None,
    )
    return ToolReturn(content=made.message, descriptor=descriptor, details=made.model_dump())


def _render_table(ctx: ToolContext, args: RenderTableArgs) -> ToolReturn:
    drawn = render_table(
        ctx.root,
        args,
        max_source_bytes=ctx.policy.store.read_max_bytes,
        max_table_file_bytes=ctx.policy.store.quota_bytes,
        max_rows=ctx.policy.tools.render_rows_max,
        max_cell_chars=ctx.policy.tools.render_cell_max_chars,
        max_chars=ctx.policy.tools.render_max_chars,
        limits=TableLimits.from_policy(ctx.policy.tools),
    )
    return ToolReturn(content=drawn.markdown, note=drawn.message, details=drawn.model_dump(exclude={"markdown"}))


def _delegate_call(ctx: ToolContext, args: DelegateCallArgs) -> ToolReturn:
    raise InvalidToolArguments("delegate_call is expanded by the dispatch pipeline, never run directly")


def _sql_query(ctx: ToolContext, args: SqlQueryArgs) -> ToolReturn:
    return ToolReturn(content=sql_query(ctx.policy.sql, args))


# what each tool does to the world (MCP tool annotations): scripts and edits may overwrite files of the results
# folder; exports and attachments add new files under new names; delegate_call does what its target does (an
# upstream tool too)
_READS = {"readOnlyHint": True, "idempotentHint": True, "openWorldHint": False}
_ADDS = {"readOnlyHint": False, "destructiveHint": False, "idempotentHint": False, "openWorldHint": False}
_CHANGES = {"readOnlyHint": False, "destructiveHint": True, "idempotentHint": False, "openWorldHint": False}


def builtin_tools(policy: Policy | None = None) -> dict[str, ToolSpec]:
    """Every built-in tool by name, in the stable order ``tools/list`` shows them; ``sql_query`` when the
    policy names a database. What the model is told of each (its description, its arguments' descriptions) names
    the policy's values: its results folder, spill threshold and limits (without a policy: the default's)."""
    policy = policy or Policy()
    results = policy.sandbox.results_mount_path
    specs = [
        ToolSpec(
            "run_python",
            run_python_description(policy),
            RunPythonArgs,
            run_python_tool,
            title="Run Python in the sandbox",
            annotations=_CHANGES,
            long_running=True,
        ),
        ToolSpec(
            "read_file",
            read_file_description(policy),
            ReadFileArgs,
            _read_file,
            spill_mode="self_bounded",
            title="Read a results file",
            annotations=_READS,
        ),
        ToolSpec(
            "write_file",
            write_file_description(policy),
            WriteFileArgs,
            _write_file,
            title="Write a text file",
            annotations=_CHANGES,
        ),
        ToolSpec(
            "edit_file", EDIT_FILE_DESCRIPTION, EditFileArgs, _edit_file, title="Edit a text file", annotations=_CHANGES
        ),
        ToolSpec(
            "export_table",
            export_table_description(policy),
            ExportTableArgs,
            _export_table,
            title="Export a table to CSV or XLSX",
            annotations=_ADDS,
        ),
        ToolSpec(
            "render_table",
            render_table_description(policy),
            RenderTableArgs,
            _render_table,
            spill_mode="self_bounded",
            title="Show a table",
            annotations=_READS,
        ),
        ToolSpec(
            "attach_file",
            attach_file_description(policy),
            AttachFileArgs,
            _attach_file,
            title="Attach a file for the user",
            annotations=_ADDS,
        ),
        ToolSpec(
            "delegate_call",
            delegate_call_description(policy),
            DelegateCallArgs,
            _delegate_call,
            title="Call a tool with arguments from a file",
            annotations={**_CHANGES, "openWorldHint": True},
            long_running=True,
        ),
    ]
    if policy.sql.database_path is not None:
        specs.append(
            ToolSpec(
                "sql_query",
                sql_query_description(policy),
                SqlQueryArgs,
                _sql_query,
                title="Query the database (read-only)",
                annotations=_READS,
                long_running=True,
            )
        )
    return {spec.name: dataclasses.replace(spec, results_path=results) for spec in specs}
