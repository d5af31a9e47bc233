"""The one exception tree of sandbox-runtime.

Infrastructure failures are exceptions the *host* sees; failures of the model's own code (a script that
raises, runs out of time or memory) are *results* with ``is_error`` set, never exceptions.

::

    SandboxRuntimeError
    ├── ToolFailure                            the model's call or a file the sandbox wrote cannot be used: a tool
    │   │                                      error the model reads (the pipeline catches it), never raised further;
    │   │                                      any other exception inside a tool becomes an internal-error result
    │   ├── InvalidToolArguments (ValueError)  a tool call's arguments do not fit its schema or the policy's caps
    │   │   ├── UnknownTool                    no tool has that name
    │   │   └── QueryFailed                    SQLite refused or stopped a sql_query (says why)
    │   ├── BadTableFile (ValueError)          a table file is malformed or past a reader's cap (line, cell, nesting,
    │   │                                      a value out of range); names the line and the cap
    │   ├── OutputsFull (OSError)              the conversation's attachments quota (bytes or files) is reached
    │   ├── PathRejected (PermissionError)     a model-supplied path is refused
    │   │   ├── PathOutsideResults             it resolves outside the results folder (or is malformed)
    │   │   ├── UnsafeFileType                 symlink, FIFO, device, socket, directory, hard link, other device
    │   │   ├── FileTooLarge                   larger than the cap for this read
    │   │   └── PathExists (FileExistsError)   a regular file already stands where a new one was to be made
    │   └── PathNotFound (FileNotFoundError)   a well-formed path names nothing in the results folder
    │       └── PathExpired                    it named a file that retention removed (says when; re-run)
    ├── PolicyError (ValueError)               a policy file or value is invalid
    ├── InvalidConversationId (ValueError)     a conversation id has bad characters or length
    ├── InvalidTenant (ValueError)             a tenant name is empty, too long, or holds control characters
    ├── ToolNameTaken (ValueError)             register_tool: a built-in or registered tool already has the name
    ├── ConversationDeleted                    the conversation was deleted; open it again from the runtime
    ├── AdmissionRefused                       a tenant's call did not get its turn (the queue's wait, or the
    │                                          tenant's disk share is full); nothing ran: retry after retry_after_s
    ├── ConversationInUse                      another live process uses the conversation (names it): it cannot be
    │                                          deleted or started afresh now
    ├── CallStillRunning                       the call id runs in another runtime (a replica) or thread and was not
    │                                          decided within state.call_wait_s: ask again with the same id later
    ├── StateVersionUnknown                    the state database was written by a newer version: not opened
    ├── StateUnavailable                       the state database cannot be opened or reached (a path too long for
    │                                          SQLite, no permission, a read-only disk, a PostgreSQL server that is
    │                                          down or refuses the login); says why. Nothing is half-written
    ├── EngineUnavailable (ConnectionError)    the Docker engine cannot be reached
    │   └── EngineLost                         it went away while a command ran (a daemon restart): how the command
    │                                          ended is unknown; the next call, once it is back, gets a fresh sandbox
    ├── SelfCheckFailed                        the hardening profile is not in force: no sandbox starts
    ├── ImageError                             the executor image is missing or could not be built
    ├── SandboxError                           a container could not be created, started or used
    │   └── SandboxGone                        the container was removed or stopped behind the runtime's back
    ├── UpstreamError                          an upstream MCP server is down, died in a call, or did not answer
    │                                          (in a call: a result the model reads; at gateway start: raised)
    └── QuotaError (OSError)                   the per-conversation disk quota could not be set up

Built-in mix-ins let callers catch ``ValueError``, ``PermissionError``, ``ConnectionError`` or ``OSError``
without importing this module.
"""

from __future__ import annotations

__all__ = [
    "AdmissionRefused",
    "BadTableFile",
    "CallStillRunning",
    "ConversationDeleted",
    "ConversationInUse",
    "EngineLost",
    "EngineUnavailable",
    "FileTooLarge",
    "ImageError",
    "InvalidConversationId",
    "InvalidTenant",
    "InvalidToolArguments",
    "OutputsFull",
    "PathExists",
    "PathExpired",
    "PathNotFound",
    "PathOutsideResults",
    "PathRejected",
    "PolicyError",
    "QueryFailed",
    "QuotaError",
    "SandboxError",
    "SandboxGone",
    "SandboxRuntimeError",
    "SelfCheckFailed",
    "StateUnavailable",
    "StateVersionUnknown",
    "ToolFailure",
    "ToolNameTaken",
    "UnknownTool",
    "UnsafeFileType",
    "UpstreamError",
]


class SandboxRuntimeError(Exception):
    """Root of every exception raised by sandbox-runtime."""


class PolicyError(SandboxRuntimeError, ValueError):
    """A policy file or value is invalid; the message names the field path and the reason."""


class InvalidConversationId(SandboxRuntimeError, ValueError):
    """A conversation id is empty, too long, or has characters outside ``[A-Za-z0-9_-]``."""


class InvalidTenant(SandboxRuntimeError, ValueError):
    """A tenant name is empty, longer than 256 characters, or holds control characters."""


class ToolFailure(SandboxRuntimeError):
    """What the model sent, or a file the sandbox wrote, cannot be used; the model reads the message as a tool
    error. The call pipeline catches this root (and only infrastructure failures reach the host)."""


class ToolNameTaken(SandboxRuntimeError, ValueError):
    """``register_tool`` was given a name a built-in or an already registered tool has."""


class StateVersionUnknown(SandboxRuntimeError):
    """The state database has a schema version newer than this sandbox-runtime knows (a newer version wrote
    it); nothing in it was changed."""


class StateUnavailable(SandboxRuntimeError):
    """The state database cannot be opened or reached: its path is longer than SQLite opens, the folder is not
    writable, SQLite refused it otherwise, or a PostgreSQL state server is down, unreachable or refuses the login
    (the message names it, never its password). A write it interrupted was rolled back; serving resumes by itself
    once the server is back."""


class ConversationDeleted(SandboxRuntimeError):
    """The conversation was deleted; open it again with ``runtime.conversation(id)`` to start it afresh."""


class AdmissionRefused(SandboxRuntimeError):
    """A call of a tenant over its share did not get its turn: it waited ``admission.max_wait_s`` in the queue, or
    its tenant's results folders are over ``admission.tenant_disk_max_bytes``. Nothing ran; ``retry_after_s`` says
    when trying again makes sense, ``waited_s`` how long the call waited, as measured where it waited (0 for one
    refused at once)."""

    def __init__(self, message: str, *, retry_after_s: float, waited_s: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        self.waited_s = waited_s


class CallStillRunning(SandboxRuntimeError):
    """A call id that another runtime (or thread) is running was not decided within ``state.call_wait_s``."""


class ConversationInUse(SandboxRuntimeError):
    """Another live process (named in the message) uses the conversation, so it cannot be deleted or started
    afresh now; try again once that process is done with it."""


class InvalidToolArguments(ToolFailure, ValueError):
    """A tool was called with arguments that do not fit its schema or the policy's caps; names the field."""


class UnknownTool(InvalidToolArguments):
    """A call named a tool that does not exist; the message lists the tools there are."""


class QueryFailed(InvalidToolArguments):
    """SQLite refused or stopped a ``sql_query`` (syntax, unknown table, a write, the time limit); says why."""


class BadTableFile(ToolFailure, ValueError):
    """A table file is malformed or past a reader's cap (line length, cell size, nesting, a value out of
    range); the message names the line and the cap."""


class OutputsFull(ToolFailure, OSError):
    """The conversation's attachments (``outputs/``) reached their quota in bytes or files; says which."""


class PathRejected(ToolFailure, PermissionError):
    """A model-supplied path was refused; nothing outside the results folder was opened."""


class PathOutsideResults(PathRejected):
    """The path is malformed or resolves outside the conversation's results folder."""


class UnsafeFileType(PathRejected):
    """The path names a symlink, FIFO, device, socket, directory, hard link or a file on another device."""


class FileTooLarge(PathRejected):
    """The file is larger than the byte cap of this read."""


class PathExists(PathRejected, FileExistsError):
    """A regular file already stands at the name where the host was to create one (files are never replaced)."""


class PathNotFound(ToolFailure, FileNotFoundError):
    """A well-formed path under the results folder names no file (or a parent folder is missing). ``path``: the
    file asked for, as the sandbox names it (the pipeline says :class:`PathExpired` when retention removed it)."""

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class PathExpired(PathNotFound):
    """The path named a spill, error or argument file that retention removed; the message says when."""


class EngineUnavailable(SandboxRuntimeError, ConnectionError):
    """The Docker engine cannot be reached (not installed, not running, or no permission)."""


class EngineLost(EngineUnavailable):
    """The engine went away while a command ran in a sandbox (the daemon stopped or restarted): how the command
    ended is unknown, and files it wrote stay. The sandbox is not used again: once the engine answers, the
    conversation's next call starts a fresh one (and the old container is removed)."""


class SelfCheckFailed(SandboxRuntimeError):
    """The canary container showed that a protection is missing; the message says which and how to fix it."""


class ImageError(SandboxRuntimeError):
    """The executor image is missing or could not be built."""


class SandboxError(SandboxRuntimeError):
    """A sandbox container could not be created, started, inspected or used."""


class SandboxGone(SandboxError):
    """The conversation's container no longer exists or is not running (removed or stopped from outside)."""


class UpstreamError(SandboxRuntimeError):
    """An upstream MCP server is down, died during a call, or did not answer in time; the model reads why."""


class QuotaError(SandboxRuntimeError, OSError):
    """The per-conversation disk quota could not be set up or read."""
