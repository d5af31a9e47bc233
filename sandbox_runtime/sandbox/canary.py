"""The self-check gate of a :class:`~sandbox_runtime.sandbox.manager.SandboxManager`: before the first sandbox of
a process starts, a canary container runs the self-check (:mod:`~sandbox_runtime.sandbox.selfcheck`) on a results
folder apart from every conversation's (made for the check and removed after it by whoever owns the folders); no
sandbox starts until it passed.

A check that passed is kept for the process, per sandbox configuration: the engine (its address and what it says
of itself), the sandbox's identity (:func:`~sandbox_runtime.sandbox.profile.sandbox_identity`: image, protections,
limits, mounts, runtime) and the quota mode. Every runtime of the process with that configuration starts its
sandboxes on it; ``doctor`` (``force``) checks again. A check that failed is never kept: the next sandbox to start
runs it again (the engine may have been mended meanwhile), and fails as long as it fails.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager

from sandbox_runtime.errors import ImageError, SelfCheckFailed
from sandbox_runtime.policy import Policy
from sandbox_runtime.sandbox.backend import ContainerSpec, SandboxBackend
from sandbox_runtime.sandbox.labels import LABEL_CONVERSATION, LABEL_CREATED_AT
from sandbox_runtime.sandbox.manager_models import ResultsFolder
from sandbox_runtime.sandbox.selfcheck import SelfCheckReport, run_self_check

__all__ = ["CANARY_CONVERSATION", "CANARY_MAX_AGE_S", "SelfCheckGate"]

CANARY_CONVERSATION = "_canary"  # a label value no conversation id can take (ids start with a letter or digit)
CANARY_MAX_AGE_S = 300  # a canary lives for seconds; an older one was left by a killed process

_passed_guard = threading.Lock()
_passed: dict[tuple[str, ...], SelfCheckReport] = {}  # the checks that passed in this process, by configuration


class SelfCheckGate:
    """Runs the canary check once per process and sandbox configuration (again when forced: see the module text)
    and keeps a report that passed; ``canary_folder`` makes the check's results folder for the block it is entered
    for (its ``quota_mode`` the store's), ``identity`` is the sandbox's (what shapes it)."""

    def __init__(
        self,
        *,
        backend: SandboxBackend,
        policy: Policy,
        canary_folder: Callable[[], AbstractContextManager[ResultsFolder]],
        image: str,
        identity: str,
        quota_mode: str,
        base_labels: dict[str, str],
        spec_for: Callable[[ResultsFolder, dict[str, str]], ContainerSpec],
        lock: Callable[[str], threading.RLock],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._backend = backend
        self._policy = policy
        self._canary_folder = canary_folder
        self._image = image
        self._identity = identity
        self._quota_mode = quota_mode
        self._base_labels = base_labels
        self._spec_for = spec_for
        self._lock = lock
        self._clock = clock
        self._guard = threading.Lock()
        self._report: SelfCheckReport | None = None

    def check(self, *, force: bool = False) -> SelfCheckReport:
        """The report of a check that passed (this gate's, or another of the process's with the same
        configuration), or a new one (with ``force``, or when none passed)."""
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
            key = self._configuration()
            with _passed_guard:
                shared = None if key is None or force else _passed.get(key)
            report = shared or self._run()
        if report.ok:
            with self._guard:
                self._report = report
            if key is not None:
                with _passed_guard:
                    _passed[key] = report
        elif key is not None:
            with _passed_guard:
                _passed.pop(key, None)
        return report

    def _configuration(self) -> tuple[str, ...] | None:
        """What a check's outcome depends on: the engine (an engine the backend cannot name: none, the check is
        this gate's alone), the sandbox's identity and the quota mode of the canary's folder."""
        address = self._backend.engine_address
        if address is None:
            return None
        engine = self._backend.engine_info().model_dump_json()
        return (self._backend.name, address, engine, self._identity, self._quota_mode)

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
