"""``attach_file``: hand a file from the results folder to the user as a download, kept apart and as it is.

The file is copied byte for byte (no format change) into the conversation's ``outputs/`` folder, which the
sandbox never sees and retention never touches, within its own quota (``tools.outputs_max_bytes`` of distinct
content, ``tools.outputs_files_max`` attachments): the same content attached again is stored once
(:mod:`sandbox_runtime.store.outputs` says how it is counted and kept consistent). The attachment's file is a
plain 0644 regular file (never a symbolic link, no special bits; a hard link to its content), published whole
or not at all. The source is opened through the safe resolver (no link followed, nothing outside the results
folder, one hard link) and streamed with a cap, so a file that grows while it is copied is refused rather than
copied in part.
"""

from __future__ import annotations

import logging
import mimetypes
import os
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from sandbox_runtime.errors import InvalidToolArguments
from sandbox_runtime.models import Attachment
from sandbox_runtime.policy import Policy, ToolsPolicy
from sandbox_runtime.store.outputs import AttachmentStore, OutputsLimits
from sandbox_runtime.store.safe_paths import ResultsRoot

__all__ = ["AttachFileArgs", "Attachment", "attach_file", "attach_file_description"]

logger = logging.getLogger(__name__)


def attach_file_description(policy: Policy) -> str:
    """What the model is told of ``attach_file``, with the policy's retention."""
    return (
        "Give the user a file from the results folder as a download (a report, an export). The file is copied as it "
        f"is and kept after the {policy.spill.retention_s / 86400:g}-day cleanup, within the conversation's "
        "attachments quota. Optional `filename` sets the name the user sees."
    )


_DEFAULT_LIMITS = OutputsLimits.from_policy(ToolsPolicy())
_UNSAFE = re.compile(r"[^A-Za-z0-9._ ()+-]+")
_NAME_MAX_CHARS = 120


class AttachFileArgs(BaseModel):
    """Arguments of ``attach_file``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="The file in the results folder, e.g. /mnt/results/exports/report.docx.")
    filename: str | None = Field(None, description="The name the user sees (default: the file's own name).")


def _display_name(raw: str) -> str:
    name = _UNSAFE.sub("_", os.path.basename(raw.replace("\\", "/"))).strip(" ._")
    return name[:_NAME_MAX_CHARS] or "attachment"


def attach_file(
    root: ResultsRoot,
    outputs: Path,
    args: AttachFileArgs,
    *,
    max_bytes: int,
    limits: OutputsLimits = _DEFAULT_LIMITS,
) -> Attachment:
    """Store the file as ``outputs/<attachment_id>/<filename>`` (its content once per conversation) and describe
    it; :class:`~sandbox_runtime.errors.OutputsFull` (nothing stored) when the attachments quota would be passed.
    ``limits`` defaults to the policy's default quota; pass the conversation's policy's."""
    components = root.parse(args.path)
    source = root.sandbox_path(components)
    if args.filename is not None and not args.filename.strip():
        raise InvalidToolArguments("attach_file: `filename` is empty")
    filename = _display_name(args.filename or components[-1])
    with root.open_regular(components, max_bytes=max_bytes) as (file, _st):
        stored = AttachmentStore(outputs, limits).add(file, filename, max_bytes=max_bytes, shown=source)
    mime_type = mimetypes.guess_type(filename)[0] or "application/octet-stream"
    logger.info("attached %s as %s (%d bytes)", source, stored.host_path, stored.bytes)
    return Attachment(
        attachment_id=stored.attachment_id,
        filename=filename,
        bytes=stored.bytes,
        mime_type=mime_type,
        sha256=stored.sha256,
        source=source,
        host_path=str(stored.host_path),
    )
