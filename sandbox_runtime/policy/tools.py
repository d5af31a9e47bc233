"""The built-in tools other than run_python (``[tools]``) and the read-only ``sql_query`` (``[sql]``)."""

from __future__ import annotations

from pydantic import Field

from sandbox_runtime.policy.base import GiB, MiB, PositiveFloat, PositiveInt, Section

__all__ = ["SqlPolicy", "ToolsPolicy"]


class ToolsPolicy(Section):
    """Limits of the built-in tools other than run_python."""

    read_max_chars: PositiveInt = Field(
        500_000, description="read_file returns at most this many characters, then a marker with the next offset."
    )
    text_file_max_bytes: PositiveInt = Field(
        4 * MiB, description="Largest file write_file creates or edit_file reads and writes."
    )
    args_file_max_bytes: PositiveInt = Field(
        1 * MiB, description="Largest arguments file delegate_call reads (checked before it is read whole)."
    )
    render_rows_max: PositiveInt = Field(2000, description="Most rows render_table draws as Markdown.")
    parallel_calls_max: int = Field(
        32,
        ge=1,
        le=1024,
        description="Calls a runtime runs at once in its one pool of workers, across all its conversations: the "
        "built-in calls of multi-call turns and MCP tasks; more wait for a free worker. A turn of one call runs in "
        "the caller's own thread.",
    )
    sort_memory_rows_max: PositiveInt = Field(
        100_000,
        description="Rows (of up to 10 columns; wider rows count proportionally) export_table sorts in memory "
        "at once; more are sorted in runs on disk.",
    )
    attachment_max_bytes: PositiveInt = Field(
        256 * MiB, description="Largest file attach_file copies into the conversation's outputs."
    )
    record_args_max_bytes: PositiveInt = Field(
        1 * MiB, description="Arguments kept in the execution record per call; longer ones are cut and marked."
    )
    table_line_max_bytes: PositiveInt = Field(
        16 * MiB,
        description="Longest line (one JSON Lines record, one CSV row) a host-side reader of a table file accepts; "
        "a longer one is a tool error naming the line.",
    )
    table_cell_max_chars: PositiveInt = Field(
        1_048_576, description="Longest cell a host-side reader of a table file accepts; longer: a tool error."
    )
    json_nesting_max: int = Field(
        64,
        ge=1,
        le=500,  # Python's serialisers and validators recurse: far below the interpreter's recursion limit
        description="Deepest nesting of arrays and objects accepted in a table file or in tool arguments (the "
        "arguments object or the row is level 1).",
    )
    render_cell_max_chars: PositiveInt = Field(
        500, description="render_table shows at most this many characters of a cell, then a marker."
    )
    render_max_chars: PositiveInt = Field(
        100_000, description="Most characters render_table returns in all; past it rows are cut with a marker."
    )
    outputs_max_bytes: PositiveInt = Field(
        1 * GiB,
        description="Bytes of distinct content all attachments of one conversation (outputs/) may take; the same "
        "content attached again is stored once and adds nothing.",
    )
    outputs_files_max: PositiveInt = Field(
        1000,
        description="Most attachments one conversation keeps: each successful attach_file counts, also when its "
        "content is already stored.",
    )


class SqlPolicy(Section):
    """The read-only ``sql_query`` tool: offered only when a database is configured."""

    database_path: str | None = Field(
        None, description="The SQLite file sql_query reads, opened read-only; unset: no sql_query tool."
    )
    timeout_s: PositiveFloat = Field(30.0, description="A query running longer is interrupted (a tool error).")
    rows_max: PositiveInt = Field(
        1_000_000, description="Most rows one query returns; more are cut with a marker (narrow the query)."
    )
    query_max_chars: PositiveInt = Field(100_000, description="Longest SQL text accepted.")
