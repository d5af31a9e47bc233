"""inspect_ai's own sandbox conformance suite (``inspect_ai.util._sandbox.self_check``: 44 checks, imported as they
ship) against the ``sandbox_runtime`` sandbox on Docker and on Podman, every expected failure declared in one place
with its reason (an inspect ``eval`` through the same sandbox: tests/test_adapter_inspect_ai_eval.py).

Stories: an evaluation author writes ``Task(sandbox="sandbox_runtime")`` and inspect's tools behave as they do in
inspect's Docker sandbox, minus what the hardening forbids (docs/how-to/inspect-ai.md lists it, with these counts).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from inspect_ai.util import SandboxEnvironment
from inspect_ai.util._sandbox import self_check
from inspect_ai.util._sandbox.self_check import *  # noqa: F403  (inspect's 44 checks, collected here as they ship)

from sandbox_runtime.adapters.inspect_ai import SandboxRuntimeConfig, SandboxRuntimeEnvironment
from tests.conftest import SESSION, TEST_LABEL

pytestmark = pytest.mark.anyio

# inspect's checks this sandbox fails by design, each with why (strict: one that passes fails the run)
DECLARED = {
    "test_exec_as_user": "one non-root uid: user='root' (or any other user) raises SandboxUserUnsupportedError, and "
    "the read-only root has no adduser to run",
}
SELF_CHECK_COUNT = 44
ENGINES = [
    pytest.param("default", marks=pytest.mark.docker, id="docker"),
    pytest.param("podman", marks=[pytest.mark.docker, pytest.mark.podman], id="podman"),
]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


def config_for(policy: str, state_dir: Path) -> SandboxRuntimeConfig:
    """A config whose containers carry this session's test label (removed by it)."""
    return SandboxRuntimeConfig(state_dir=str(state_dir), policy=policy, labels=(f"{TEST_LABEL}={SESSION}",))


@pytest.fixture(scope="module", params=ENGINES)
async def _environment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[SandboxEnvironment]:
    """One sample's sandbox for the whole suite on one engine, made and cleaned up as an eval does."""
    request.getfixturevalue("executor_image" if request.param == "default" else "podman_image")
    config = config_for(request.param, tmp_path_factory.mktemp("inspect-state"))
    await SandboxRuntimeEnvironment.task_init("self_check", config)
    environments = await SandboxRuntimeEnvironment.sample_init("self_check", config, {"__sample_id__": "1"})
    try:
        yield environments["default"]
    finally:
        await SandboxRuntimeEnvironment.sample_cleanup("self_check", config, environments, False)
        await SandboxRuntimeEnvironment.task_cleanup("self_check", config, True)


@pytest.fixture
def sandbox_env(request: pytest.FixtureRequest, _environment: SandboxEnvironment) -> SandboxEnvironment:
    """The fixture inspect's checks take; a declared check is marked as the failure it is (strict)."""
    reason = DECLARED.get(request.node.originalname)
    if reason is not None:
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    return _environment


def test_the_declared_failures_name_real_checks_and_every_check_is_collected() -> None:
    assert len(self_check.__all__) == SELF_CHECK_COUNT
    assert set(DECLARED) <= set(self_check.__all__)


def test_the_documentation_gives_these_counts() -> None:
    page = (Path(__file__).parent.parent / "docs" / "how-to" / "inspect-ai.md").read_text()
    passed = SELF_CHECK_COUNT - len(DECLARED)
    assert f"{passed} of inspect's {SELF_CHECK_COUNT} sandbox checks pass" in page
    for name in DECLARED:
        assert f"`{name}`" in page
