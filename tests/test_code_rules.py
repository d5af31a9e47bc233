"""The written rules of the codebase are the checked ones: lint, format and strict types on the package, the
tests and the benchmarks; every ``noqa`` says why; no issue numbers or work-in-progress notes in the code."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent
CHECKED = ("sandbox_runtime", "tests", "bench")
TOOL_TIMEOUT_S = 600
NOQA = re.compile(r"#\s*noqa\b(?P<rest>.*)$")
NOQA_WITH_REASON = re.compile(r":\s*[A-Z]+[0-9]+(\s*,\s*[A-Z]+[0-9]+)*\s+\(.+\)")
STALE = re.compile(r"\bissue\s+\d+|\bnot yet wired\b|\bTODO\b|\bFIXME\b", re.IGNORECASE)


def _sources(*folders: str) -> list[Path]:
    return sorted(path for folder in folders for path in (PROJECT / folder).rglob("*.py"))


def _tool(*command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *command],
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT_S,
        check=False,
    )


@pytest.mark.parametrize(
    "command",
    [("ruff", "check", "."), ("ruff", "format", "--check", "."), pytest.param(("mypy",), marks=pytest.mark.first)],
    ids=["ruff-check", "ruff-format", "mypy-strict"],
)
@pytest.mark.process
def test_the_package_tests_and_benchmarks_pass_lint_format_and_strict_types(command: tuple[str, ...]) -> None:
    done = _tool(*command)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]


def test_mypy_checks_the_tests_and_benchmarks_too() -> None:
    config = (PROJECT / "pyproject.toml").read_text()
    section = config[config.index("[tool.mypy]") :].split("\n[", 1)[0]
    assert "strict = true" in section
    for folder in CHECKED:
        assert f'"{folder}"' in section, f"[tool.mypy] does not check {folder}"


def test_every_noqa_names_its_codes_and_says_why() -> None:
    bare = [
        f"{path.relative_to(PROJECT)}:{number}: {line.strip()}"
        for path in _sources(*CHECKED)
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if (found := NOQA.search(line)) and not NOQA_WITH_REASON.match(found.group("rest"))
    ]
    assert bare == []


def test_the_package_holds_no_issue_numbers_or_work_in_progress_notes() -> None:
    stale = [
        f"{path.relative_to(PROJECT)}:{number}: {line.strip()}"
        for path in _sources("sandbox_runtime", "bench")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if STALE.search(line)
    ]
    assert stale == []
