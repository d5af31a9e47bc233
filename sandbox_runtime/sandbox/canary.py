"""The self-check gate of a :class:`~sandbox_runtime.sandbox.manager.SandboxManager`: before the first sandbox of
a process starts, a canary container runs the self-check (:mod:`~sandbox_runtime.sandbox.selfcheck`) on a results
folder apart from every conversation's (made for the check and removed after it by whoever owns the folders); the
report is kept, and when it failed no sandbox ever starts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from sandbox_runtime.errors import ImageError, SelfCheckFailed
from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.backend import ContainerSpec, SandboxBackend
from sandbox_runtime.sandbox.profile import LABEL_CONVERSATION, LABEL_CREATED_AT
from sandbox_runtime.sandbox.records import ResultsFolder
from sandbox_runtime.sandbox.selfcheck import SelfCheckReport, run_self_check

__all__ = ["CANARY_CONVERSATION", "CANARY_MAX_AGE_S", "SelfCheckGate"]

CANARY_CONVERSATION = "_canary"  # a label value no conversation id can take (ids start with a letter or digit)
CANARY_MAX_AGE_S = 300  # a canary lives for seconds; an older one was left by a killed process


class SelfCheckGate:
    """Runs the canary check once per process (again when forced) and keeps its report; ``canary_folder`` makes
    the check's results folder for the block it is entered for."""

    def __init__(
        self,
        *,
        backend: SandboxBackend,
        policy: Policy,
        canary_folder: Callable[[], AbstractContextManager[ResultsFolder]],
        image: str,
        base_labels: dict[str, str],
        spec_for: Callable[[ResultsFolder, dict[str, str]], ContainerSpec],
        lock: Callable[[str], threading.RLock],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._backend = backend
        self._policy = policy
        self._canary_folder = canary_folder
        self._image = image
        self._base_labels = base_labels
        self._spec_for = spec_for
        self._lock = lock
        self._clock = clock
        self._guard = threading.Lock()
        self._report: SelfCheckReport | None = None

    def check(self, *, force: bool = False) -> SelfCheckReport:
        """The kept report, or a new one (the first time, or with ``force``)."""
        with self._guard:
            cached = self._report
        if cached is not None and not force:
            return cached
        if not self._backend.image_exists(self._image):
            raise ImageError(f"the executor image {self._image} is not built: run `sandbox-runtime image build`")
        with self._lock(CANARY_CONVERSATION):
            with self._guard:
                cached = self._report
            if cached is not None and not force:
                return cached  # made by another thread while this one waited
            report = self._run()
        with self._guard:
            self._report = report
        return report

    def _run(self) -> SelfCheckReport:
        with self._canary_folder() as folder:
            return run_self_check(
                self._backend,
                self._policy,
                lambda labels: self._spec_for(folder, labels),
                quota_mode=folder.quota_mode,
                labels={
                    **self._base_labels,
                    LABEL_CONVERSATION: CANARY_CONVERSATION,
                    LABEL_CREATED_AT: str(int(self._clock())),
                },
            )

    def require(self) -> None:
        """Raise :class:`SelfCheckFailed` (saying what is missing) unless the check passed."""
        report = self.check()
        if not report.ok:
            raise SelfCheckFailed(report.summary())
