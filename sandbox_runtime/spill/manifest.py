"""The manifest: an append-only index of every spill in ``results/manifest.jsonl``.

One JSON object per line — ``id``, ``tool``, ``call_id``, ``created``, ``expires``, ``path``, ``bytes``, ``chars``,
``rows``, ``columns``, ``format``, ``sha256`` — so a model whose context was compacted can find earlier results
again (``read_file`` on the manifest, or a script that reads it). Lines are only ever appended; entries of
expired files stay and say when they expired. The sandbox may damage the file: the host never reads it back, and
a manifest it cannot append to (replaced by a link, grown past its cap) gives a warning, never a failed call.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from sandbox_runtime.errors import PathRejected
from sandbox_runtime.store.safe_paths import PRIVATE_FILE_MODE, ResultsRoot

if TYPE_CHECKING:
    from sandbox_runtime.models import ResultDescriptor

__all__ = ["MANIFEST_PATH", "record_in_manifest"]

logger = logging.getLogger(__name__)

MANIFEST_PATH = "manifest.jsonl"


def record_in_manifest(
    root: ResultsRoot,
    descriptor: ResultDescriptor,
    *,
    stem: str,
    tool: str,
    call_id: str,
    created_at: str,
    max_bytes: int,
    durable: bool = True,
) -> str | None:
    """Append one spill's entry; return a warning instead of raising when it cannot be written.

    Past ``max_bytes`` (the policy's ``manifest_max_bytes``) spills are still made, only no longer listed.
    """
    entry = {
        "id": stem,
        "tool": tool,
        "call_id": call_id,
        "created": created_at,
        "expires": descriptor.expires_at,
        "path": descriptor.path,
        "format": descriptor.format,
        "bytes": descriptor.bytes,
        "chars": descriptor.chars,
        "rows": descriptor.rows,
        "columns": descriptor.columns,
        "sha256": descriptor.sha256,
    }
    line = json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n"
    try:
        root.append_bytes(
            MANIFEST_PATH,
            line.encode("utf-8", "surrogatepass"),
            max_bytes=max_bytes,
            durable=durable,
            mode=PRIVATE_FILE_MODE,
        )
    except (OSError, PathRejected) as exc:
        warning = f"the spill {descriptor.path} is not listed in {MANIFEST_PATH}: {exc}"
        logger.warning(warning)
        return warning
    return None
