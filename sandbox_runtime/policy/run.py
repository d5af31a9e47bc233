"""One ``run_python`` call (``[run]``) and the tool calls its script makes (``[script_tools]``)."""

from __future__ import annotations

from pydantic import Field

from sandbox_runtime.policy.base import MiB, PositiveFloat, PositiveInt, Section

__all__ = ["RunPolicy", "ScriptToolsPolicy"]


class RunPolicy(Section):
    """Limits of one ``run_python`` call, and of one command a host program runs (``Conversation.exec``: the time
    limits and the grace are the same)."""

    default_timeout_s: float = Field(60.0, gt=0, description="Wall-clock limit when the call names none.")
    max_timeout_s: float = Field(600.0, gt=0, description="Largest timeout_s a call may ask for.")
    kill_grace_s: float = Field(2.0, ge=0, le=30, description="SIGTERM to SIGKILL grace on timeout (seconds).")
    host_deadline_margin_s: float = Field(
        15.0,
        gt=0,
        le=600,
        description="How long past a run's time limit and kill grace the host waits for the in-sandbox runner's "
        "verdict before it ends the run itself (an executor that was stopped or wedged) and replaces the sandbox.",
    )
    stdout_max_bytes: PositiveInt = Field(1 * MiB, description="Captured stdout cap; past it: output_limit.")
    stderr_max_bytes: PositiveInt = Field(1 * MiB, description="Captured stderr cap; past it: output_limit.")
    inline_code_max_bytes: PositiveInt = Field(1 * MiB, description="Largest inline `code` argument.")
    script_args_max_count: PositiveInt = Field(256, description="Most entries in `args`.")
    error_message_max_chars: PositiveInt = Field(2000, description="Longest short error message for the model.")
    command_output_max_bytes: PositiveInt = Field(
        10 * MiB,
        description="Largest stdout or stderr cap one command (Conversation.exec) may ask for, and its cap when it "
        "asks none; past its cap the command is ended and its result says output_limit.",
    )
    command_line_max_bytes: int = Field(
        2 * MiB,
        gt=0,
        le=3 * MiB,
        description="Largest command line of one command: its words, working directory and variables, as JSON "
        "with every non-ASCII character escaped (as the executor is sent it; at most 3 MiB, under the executor's own "
        "4 MiB line). The kernel's own limit still holds: about 2 MiB of words and variables, 128 KiB each.",
    )


class ScriptToolsPolicy(Section):
    """Tools a ``run_python`` script may call through ``sandbox_tools``, and how much per run. Every such call goes
    through the pipeline as a model's call does (validation, approval, the record, spill)."""

    allowed: list[str] = Field(
        default_factory=lambda: ["sql_query", "read_file", "export_table", "render_table"],
        description="Names (shell patterns: 'tracker__*') of the tools scripts may call. The default lets scripts "
        "read and reshape data inside the conversation only; host and upstream tools must be named. run_python "
        "can never be called from a run.",
    )
    calls_max_count: int = Field(100, ge=0, le=100_000, description="Most tool calls one run may make (0: none).")
    call_args_max_bytes: PositiveInt = Field(
        1 * MiB, description="Largest arguments of one call from a script, as JSON in UTF-8 (like argument files)."
    )
    calls_max_s: PositiveFloat = Field(
        300.0,
        description="Seconds one run may spend in tool calls, all together (an approval's wait included); a call "
        "is refused once they are spent. The run's own time limit stands still while a call is answered.",
    )
    reply_max_chars: PositiveInt = Field(
        100_000,
        description="Longest result text a script gets back inline; a longer one (a self-bounded tool's) is cut "
        "with a marker. Spilled results come as their path.",
    )
