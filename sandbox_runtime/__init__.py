"""sandbox-runtime: hardened per-conversation sandboxes and a data path that bypasses model output."""

from sandbox_runtime.errors import (
    EngineUnavailable,
    FileTooLarge,
    ImageError,
    InvalidConversationId,
    InvalidToolArguments,
    PathExists,
    PathNotFound,
    PathOutsideResults,
    PathRejected,
    PolicyError,
    QuotaError,
    SandboxError,
    SandboxGone,
    SandboxRuntimeError,
    SelfCheckFailed,
    UnsafeFileType,
)
from sandbox_runtime.policy import Policy, load_policy
from sandbox_runtime.runtime import Conversation, Runtime
from sandbox_runtime.tools.run_python import RunPythonResult

__all__ = [
    "Conversation",
    "EngineUnavailable",
    "FileTooLarge",
    "ImageError",
    "InvalidConversationId",
    "InvalidToolArguments",
    "PathExists",
    "PathNotFound",
    "PathOutsideResults",
    "PathRejected",
    "Policy",
    "PolicyError",
    "QuotaError",
    "RunPythonResult",
    "Runtime",
    "SandboxError",
    "SandboxGone",
    "SandboxRuntimeError",
    "SelfCheckFailed",
    "UnsafeFileType",
    "load_policy",
]
