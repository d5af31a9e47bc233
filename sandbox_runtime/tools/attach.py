"""``attach_file``: hand a file from the results folder to the user as a download, kept apart and as it is.

The file is copied byte for byte (no format change) into the conversation's ``outputs/`` folder, which the
sandbox never sees and retention never touches. The copy is a plain 0644 file of its own (never a link, no
special bits), written to a temporary name, synced and renamed, so a half-copied attachment is never visible.
The source is opened through the safe resolver and read with a cap, so a file that grows while it is copied is
refused rather than copied in part.
"""

from __future__ import annotations

import hashlib
import logging
import mimetypes
import os
import re
import secrets
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from sandbox_runtime.errors import FileTooLarge, InvalidToolArguments
from sandbox_runtime.records import Attachment
from sandbox_runtime.store.safe_paths import ResultsRoot

__all__ = ["ATTACH_FILE_DESCRIPTION", "AttachFileArgs", "Attachment", "attach_file"]

logger = logging.getLogger(__name__)

ATTACH_FILE_DESCRIPTION = (
    "Give the user a file from the results folder as a download (a report, an export). The file is copied as it "
    "is and kept after the 7-day cleanup. Optional `filename` sets the name the user sees."
)
_CHUNK_BYTES = 1 << 20
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


def attach_file(root: ResultsRoot, outputs: Path, args: AttachFileArgs, *, max_bytes: int) -> Attachment:
    """Copy the file into ``outputs/<attachment_id>/<filename>`` and describe it."""
    components = root.parse(args.path)
    source = root.sandbox_path(components)
    filename = _display_name(args.filename or components[-1])
    if args.filename is not None and not args.filename.strip():
        raise InvalidToolArguments("attach_file: `filename` is empty")
    attachment_id = f"att-{secrets.token_hex(8)}"
    folder = outputs / attachment_id
    folder.mkdir(parents=True, mode=0o755)
    target = folder / filename
    temporary = folder / f".{filename}.partial"
    digest = hashlib.sha256()
    copied = 0
    try:
        with root.open_regular(components, max_bytes=max_bytes) as (file, _st), temporary.open("xb") as out:
            while chunk := file.read(_CHUNK_BYTES):
                copied += len(chunk)
                if copied > max_bytes:
                    raise FileTooLarge(f"{source} grew past the attachment cap of {max_bytes:,} bytes while copied")
                digest.update(chunk)
                out.write(chunk)
            out.flush()
            os.fchmod(out.fileno(), 0o644)
            os.fsync(out.fileno())
        temporary.rename(target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        folder.rmdir()
        raise
    mime_type = mimetypes.guess_type(filename)[0] or "application/octet-stream"
    logger.info("attached %s as %s (%d bytes)", source, target, copied)
    return Attachment(
        attachment_id=attachment_id,
        filename=filename,
        bytes=copied,
        mime_type=mime_type,
        sha256=digest.hexdigest(),
        source=source,
        host_path=str(target),
    )
