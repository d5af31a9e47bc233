"""Retention: spill, error and argument files older than ``retention_s`` are removed; attachments never are.

A long-running host gets this from the runtime's own scheduler (every ``retention_interval_s``); others run
``sandbox-runtime gc`` from cron. Every removed file is recorded in the state database, so a later call that names
it gets :class:`~sandbox_runtime.errors.PathExpired` — when it went and what to do — instead of "not found". Only
``spill/``, ``errors/`` and ``args/`` in each results folder are swept; ``outputs/`` (attachments) lies outside the
results folder and is never touched, and so are the model's own exports and scripts.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from sandbox_runtime.state.database import StateDB
from sandbox_runtime.state.records import ExpiredFile
from sandbox_runtime.store.sweep import sweep_older_than

__all__ = ["EXPIRING_FOLDERS", "RetentionReport", "expire_results"]

logger = logging.getLogger(__name__)

EXPIRING_FOLDERS = ("spill", "errors", "args")


class RetentionReport(BaseModel):
    """What one conversation's sweep removed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    conversation_id: str
    removed_files: int
    removed_bytes: int
    kept_files: int
    complete: bool
    errors: list[str]


def _storable(path: str) -> bool:
    """A name with bytes that are not UTF-8 cannot be named in a tool call either: nothing to explain later."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def expire_results(
    state: StateDB, conversation_id: str, results: Path, mount_path: str, *, retention_s: float, now: float
) -> RetentionReport:
    """Remove the conversation's expiring files last modified more than ``retention_s`` seconds before ``now``."""
    report = sweep_older_than(results, EXPIRING_FOLDERS, now - retention_s)
    if report.removed:
        state.record_expired(
            [
                ExpiredFile(
                    conversation_id=conversation_id,
                    path=f"{mount_path}/{swept.path}",
                    bytes=swept.bytes,
                    modified_at=swept.mtime,
                    removed_at=now,
                )
                for swept in report.removed
                if _storable(swept.path)
            ]
        )
    for error in report.errors:
        logger.warning("retention in %s: %s", conversation_id, error)
    return RetentionReport(
        conversation_id=conversation_id,
        removed_files=len(report.removed),
        removed_bytes=report.removed_bytes,
        kept_files=report.kept_files,
        complete=report.complete,
        errors=list(report.errors),
    )
