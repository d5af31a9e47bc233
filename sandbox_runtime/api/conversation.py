"""A :class:`Conversation` of a :class:`~sandbox_runtime.api.runtime.Runtime`: its sandbox, folders, calls and records.

A ``Conversation`` object stands for the conversation as it was when the object first used it. After it is
deleted (by this object, another one, another runtime or ``sandbox-runtime rm``) the object raises
:class:`~sandbox_runtime.errors.ConversationDeleted`: ``runtime.conversation(id)`` opens the id again, as a new,
empty conversation. A sandbox removed from outside is no deletion: the next call starts a fresh sandbox on the
same results folder.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from sandbox_runtime.api.sandbox_access import SandboxAccess
from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import ConversationDeleted
from sandbox_runtime.models import (
    Attachment,
    CallRecord,
    HostResult,
    SavedResult,
    SpillMode,
    StoredResult,
    ToolCall,
    ToolOutcome,
    TurnReport,
)
from sandbox_runtime.pipeline.script_tools import PipelineScriptTools
from sandbox_runtime.sandbox.manager_models import Sandbox
from sandbox_runtime.spill.history import HistoryRebuild, rebuild_history
from sandbox_runtime.store.folders import ConversationFolders
from sandbox_runtime.store.quota import QuotaUsage
from sandbox_runtime.tenancy import DEFAULT_TENANT, conversation_key
from sandbox_runtime.tools.run_python import RunPythonArgs, RunPythonResult, run_python

if TYPE_CHECKING:
    from sandbox_runtime.api.runtime import Runtime

__all__ = ["Conversation"]


class Conversation(SandboxAccess):
    """One conversation: its sandbox (started on first use) and its folders.

    Once the conversation is deleted — by :meth:`delete`, or by anyone else after this object used it — every
    method raises :class:`~sandbox_runtime.errors.ConversationDeleted` (open it again with
    ``runtime.conversation(id)``), except :meth:`delete` and :meth:`close`, which then do nothing: nothing of
    it is left to end, and a conversation made since under the same id is not this object's. A sandbox removed or
    stopped from outside is replaced on the next call; the results folder stays as it was.

    ``id`` is the id its tenant named, ``tenant`` whose it is, ``key`` how the runtime keeps it (the id itself for
    the default tenant, ``<tag>.<id>`` for another; records name the conversation by its key)."""

    def __init__(self, runtime: Runtime, conversation_id: str, *, tenant: str = DEFAULT_TENANT) -> None:
        self.runtime = runtime
        self.key = conversation_key(tenant, conversation_id)  # how every layer below knows it (see tenancy)
        self.id: str = conversation_id
        self.tenant = tenant
        if tenant != DEFAULT_TENANT:
            runtime.state.tenants.register(tenant)
        self._created_at: float | None = None  # of the record this object first saw: whose conversation it is
        self._deleted = False

    def _deleted_error(self) -> ConversationDeleted:
        self._deleted = True
        return ConversationDeleted(
            f"conversation {self.id!r} was deleted; open it again with runtime.conversation({self.id!r}) "
            "(it starts afresh: no files, no stored results)"
        )

    def _gone(self) -> bool:
        """Whether the conversation this object used was deleted since (no record, or a record made anew)."""
        if self._deleted:
            return True
        record = self.runtime.state.conversation(self.key)
        if self._created_at is None:
            if record is not None:
                self._created_at = record.created_at
            return False
        self._deleted = record is None or record.created_at != self._created_at
        return self._deleted

    @contextlib.contextmanager
    def _live(self) -> Iterator[None]:
        """Refuse a deleted conversation; afterwards, remember the record a first use made."""
        if self._gone():
            raise self._deleted_error()
        yield
        if self._created_at is None:
            self._gone()

    def sandbox(self) -> Sandbox:
        """The running sandbox, started (or re-attached) when needed."""
        with self._live():
            return self.runtime.conversations.sandbox(self.key)

    @property
    def folders(self) -> ConversationFolders:
        """Where the conversation's files are on the host (made and mounted when needed)."""
        with self._live():
            return self.runtime.conversations.folders(self.key)

    def run_python(
        self,
        code: str | None = None,
        *,
        script_path: str | None = None,
        args: list[str] | None = None,
        timeout_s: float | None = None,
    ) -> RunPythonResult:
        """Run inline ``code`` or a ``script_path`` in the results folder; see :mod:`~.tools.run_python`. The
        script's tool calls (``sandbox_tools``) go through the pipeline, recorded as made by a call id of their
        own (``api-<hex>``: this run has no stored decision)."""
        raw: dict[str, object] = {
            "code": code,
            "script_path": script_path,
            "args": list(args or []),
            "timeout_s": timeout_s,
        }
        return self.call_run_python(raw)

    def call_run_python(self, arguments: RunPythonArgs | dict[str, object]) -> RunPythonResult:
        """Run with arguments exactly as a model sent them (validated against the tool schema)."""
        dispatcher = self.runtime.dispatcher
        with self._live():
            context = dispatcher.context(self.key)
            scripts = PipelineScriptTools(dispatcher, context, f"api-{uuid.uuid4().hex[:16]}", None, None)
            return run_python(context.sandbox, arguments, scripts=scripts)

    def call(
        self,
        tool: str,
        arguments: dict[str, Any] | None = None,
        *,
        call_id: str | None = None,
        control: CallControl | None = None,
    ) -> ToolOutcome:
        """Run one built-in tool call as a turn of its own; see :meth:`run_turn`. ``control`` lets another
        thread cancel it (a run ends every process it started) and hear its progress."""
        item = ToolCall(tool=tool, arguments=arguments or {}, call_id=call_id)
        return self.run_turn([item], control=control).outcomes[0]

    def submit(
        self,
        tool: str,
        call_id: str,
        result: object,
        *,
        is_error: bool = False,
        spill_mode: SpillMode = "normal",
        threshold_chars: int | None = None,
    ) -> ToolOutcome:
        """Hand in the result of one of the host's own tools as a turn of its own (spill applies); a
        ``self_bounded`` tool is never spilled, ``threshold_chars`` sets its own spill threshold."""
        item = HostResult(
            tool=tool,
            call_id=call_id,
            result=result,
            is_error=is_error,
            spill_mode=spill_mode,
            threshold_chars=threshold_chars,
        )
        return self.run_turn([item]).outcomes[0]

    def run_turn(
        self, items: Sequence[ToolCall | HostResult], *, turn_id: str | None = None, control: CallControl | None = None
    ) -> TurnReport:
        """Run a batch of calls together: built-in calls in parallel, host results taken in, then the spill and
        the per-turn budget over all of them. Each decision is stored before this returns; a call id seen
        before gives its stored outcome again without running anything."""
        with self._live():
            return self.runtime.dispatcher.run_turn(self.key, items, turn_id, control=control)

    def rebuild_history(self, messages: list[Any]) -> HistoryRebuild:
        """The host's message list with every decided tool result replayed byte for byte (see
        :mod:`~sandbox_runtime.spill.history`); ``messages`` itself is not changed."""
        with self._live():
            decided = self.runtime.state.stored_results(self.key)
        return rebuild_history(messages, {call_id: r.text for call_id, r in decided.items()})

    def calls(self) -> list[CallRecord]:
        """The execution record: every call with its short and expanded arguments, status and timings."""
        with self._live():
            return self.runtime.state.calls(self.key)

    def attachments(self) -> list[Attachment]:
        """Files handed to the user as downloads (kept in ``outputs/``, outside retention), oldest first."""
        with self._live():
            return self.runtime.state.attachments(self.key)

    def spills(self) -> list[SavedResult]:
        """Every result saved to a file (spills, exports, built files), oldest first, with its descriptor."""
        with self._live():
            decided = self.runtime.state.stored_results(self.key)
        return [
            SavedResult(
                call_id=d.call_id,
                tool=d.tool,
                decided_at=d.decided_at,
                descriptor=d.descriptor,
            )
            for d in decided.values()
            if d.descriptor is not None
        ]

    def decisions(self) -> list[StoredResult]:
        """Every stored tool-result decision of this conversation, oldest first."""
        with self._live():
            return list(self.runtime.state.stored_results(self.key).values())

    def usage(self) -> QuotaUsage:
        """Bytes used in the results folder against the conversation's quota (a look: a volume mounted for it
        is released again when nothing else uses the conversation)."""
        with self._live():
            return self.runtime.conversations.usage(self.key)

    def close(self) -> bool:
        """End the sandbox and release the quota volume (unmounted until the next use; not while another live
        process holds the conversation); the folders stay. True when a sandbox was running; False, doing
        nothing, when the conversation was deleted."""
        if self._gone():
            return False
        return self.runtime.conversations.close(self.key)

    def delete(self) -> None:
        """End the sandbox and delete every file of the conversation (results, outputs, quota volume). Deleting
        a deleted conversation does nothing (a conversation made since under the same id stays)."""
        conversations = self.runtime.conversations
        with conversations.lock(self.key):
            if self._gone():
                return
            conversations.delete(self.key)
            self._deleted = True
