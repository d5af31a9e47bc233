"""sandbox-runtime: hardened per-conversation sandboxes and a data path that bypasses model output."""

from sandbox_runtime.approval import ApprovalRequest
from sandbox_runtime.calls import HostResult, ToolCall, ToolOutcome, TurnReport
from sandbox_runtime.control import CallControl
from sandbox_runtime.errors import (
    BadTableFile,
    ConversationDeleted,
    EngineUnavailable,
    FileTooLarge,
    ImageError,
    InvalidConversationId,
    InvalidToolArguments,
    OutputsFull,
    PathExists,
    PathExpired,
    PathNotFound,
    PathOutsideResults,
    PathRejected,
    PolicyError,
    QueryFailed,
    QuotaError,
    SandboxError,
    SandboxGone,
    SandboxRuntimeError,
    SelfCheckFailed,
    StateVersionUnknown,
    ToolFailure,
    ToolNameTaken,
    UnknownTool,
    UnsafeFileType,
    UpstreamError,
)
from sandbox_runtime.policy import Policy, load_policy
from sandbox_runtime.records import Attachment, CallRecord
from sandbox_runtime.runtime import Conversation, Runtime, SavedResult
from sandbox_runtime.spill.spiller import ResultDescriptor
from sandbox_runtime.spill.streamed import TableStream
from sandbox_runtime.tools.host import HostCall
from sandbox_runtime.tools.run_python import RunPythonResult

__all__ = [
    "ApprovalRequest",
    "Attachment",
    "BadTableFile",
    "CallControl",
    "CallRecord",
    "Conversation",
    "ConversationDeleted",
    "EngineUnavailable",
    "FileTooLarge",
    "HostCall",
    "HostResult",
    "ImageError",
    "InvalidConversationId",
    "InvalidToolArguments",
    "OutputsFull",
    "PathExists",
    "PathExpired",
    "PathNotFound",
    "PathOutsideResults",
    "PathRejected",
    "Policy",
    "PolicyError",
    "QueryFailed",
    "QuotaError",
    "ResultDescriptor",
    "RunPythonResult",
    "Runtime",
    "SandboxError",
    "SandboxGone",
    "SandboxRuntimeError",
    "SavedResult",
    "SelfCheckFailed",
    "StateVersionUnknown",
    "TableStream",
    "ToolCall",
    "ToolFailure",
    "ToolNameTaken",
    "ToolOutcome",
    "TurnReport",
    "UnknownTool",
    "UnsafeFileType",
    "UpstreamError",
    "load_policy",
]
