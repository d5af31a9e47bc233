"""Conversations apart from sandboxes: the service that owns folders, records, locks, run numbers and deletion,
and the handle a tool gets of its conversation's sandbox."""

from sandbox_runtime.conversations.handle import SandboxHandle
from sandbox_runtime.conversations.service import ConversationService

__all__ = ["ConversationService", "SandboxHandle"]
