"""The folders of a warm pool's sandboxes (:mod:`~sandbox_runtime.sandbox.pool`), and how one becomes a
conversation's.

::

    STATE_DIR/pool/<lease>/
      <slot>.ext4          the slot's results filesystem (quota mode "loop"), made and mounted ahead of need
      <slot>/results/      bind-mounted into the pooled sandbox; spill/ errors/ args/ exports/ scripts/
      <slot>/outputs/

No conversation id can name them, and each process's slots are under its own lease. A new conversation takes a
slot by two renames on the same filesystem: the image to ``volumes/<conversation>.ext4``, then the folder (with the
mount on its ``results``) to ``conversations/<conversation>/``. A rename moves the mount and the loop device's
backing file with it, and the sandbox's bind mount holds the folder itself, not its path, under runc and gVisor
alike. A process that died between the two renames leaves the image under its conversation's name, which the
conversation's next use mounts (and the slot's mount, whose source is no longer the slot's image, is left alone
and logged by the sweep).

Slots of a process that ended are removed by any runtime's sweep (``gc``, start-up), once no container uses them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from pathlib import Path

from sandbox_runtime.errors import QuotaError
from sandbox_runtime.sandbox.manager_models import ResultsFolder
from sandbox_runtime.store.folders import ConversationFolders, ConversationStore

__all__ = ["PoolSlots", "ended_leases"]

logger = logging.getLogger(__name__)

_LEASE_ID = re.compile(r"[0-9a-f]{32}")


def ended_leases(folder: Path, live_leases: set[str]) -> list[str]:
    """The processes (lease ids) that have a folder in ``folder`` and are not among ``live_leases``."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if _LEASE_ID.fullmatch(n) and n not in live_leases and (folder / n).is_dir())


class PoolSlots:
    """The slots of one process (its lease) in one state directory: the
    :class:`~sandbox_runtime.sandbox.pool.SlotFolders` of its pool."""

    def __init__(self, store: ConversationStore, lease_id: str) -> None:
        self.store = store
        self.lease_id = lease_id

    @property
    def root(self) -> Path:
        """Where every process's slots are."""
        return self.store.state_dir / "pool"

    def folders(self, slot: str, lease_id: str | None = None) -> ConversationFolders:
        base = self.root / (lease_id or self.lease_id)
        return ConversationFolders(
            conversation_id=f"pool slot {slot}",
            root=base / slot,
            results=base / slot / "results",
            outputs=base / slot / "outputs",
            volume=base / f"{slot}.ext4",
            quota_mode=self.store.quota_mode,
            quota_bytes=self.store.policy.store.quota_bytes,
        )

    def make(self, slot: str) -> ResultsFolder:
        """Make the slot's folders and mount its volume."""
        folders = self.folders(slot)
        folders.root.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            self.store.prepare(folders)
        except BaseException:
            self.drop(slot)
            raise
        return ResultsFolder(str(folders.results), folders.quota_mode)

    def drop(self, slot: str, lease_id: str | None = None) -> None:
        """Unmount and remove the slot (its sandbox must be gone first), and its lease's folder once empty."""
        folders = self.folders(slot, lease_id)
        self.store.delete(folders)
        with contextlib.suppress(OSError):
            folders.root.parent.rmdir()

    def adopt(self, slot: str, conversation_id: str) -> ConversationFolders:
        """Make the slot's folders the conversation's (by renaming them). The caller holds the conversation's
        host-wide lock and has seen that it has no folders nor volume of its own."""
        slot_folders = self.folders(slot)
        target = self.store.folders(conversation_id, quota_mode=slot_folders.quota_mode)
        if target.quota_mode == "loop":
            target.volume.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.rename(slot_folders.volume, target.volume)
        target.root.parent.mkdir(parents=True, exist_ok=True)
        os.rename(slot_folders.root, target.root)
        return target

    def own(self) -> list[str]:
        """The slots of this process that no conversation took (made, being made, or half removed)."""
        return _slots_in(self.root / self.lease_id)

    def sweep(self, live_leases: set[str], slots_in_use: set[str]) -> list[str]:
        """Remove the slots of processes that ended (not in ``live_leases``) that no container uses; returns the
        slots removed."""
        removed: list[str] = []
        for lease in ended_leases(self.root, live_leases):
            base = self.root / lease
            for slot in sorted(set(_slots_in(base)) - slots_in_use):
                try:
                    self.drop(slot, lease)
                except (QuotaError, OSError) as exc:
                    logger.warning("could not remove pool slot %s of an ended process: %s", base / slot, exc)
                    continue
                removed.append(slot)
        return removed


def _slots_in(base: Path) -> list[str]:
    """The slots with a folder or an image in a lease's folder."""
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return []
    return sorted({name.removesuffix(".ext4") for name in names})
