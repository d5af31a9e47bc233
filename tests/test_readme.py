"""The README stays true: a landing page of at most ~200 lines whose Python example runs as written, whose other
blocks are checked as their markers say (the site's checks, ``tests/test_docs_site.py``), whose links reach files
that exist (they are relative, so they work on GitHub too), and whose commands are the ones CI runs."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest

import sandbox_runtime
from sandbox_runtime import Runtime
from tests.conftest import SESSION, TEST_LABEL
from tests.test_docs_site import Block, check, code_blocks

README = Path(__file__).resolve().parent.parent / "README.md"


def block_after(marker: str) -> str:
    text = README.read_text(encoding="utf-8")
    found = re.search(re.escape(marker) + r"\n```[a-z]*\n(.*?)```", text, re.DOTALL)
    assert found, f"README.md has no code block after {marker}"
    return found.group(1)


def test_the_python_example_runs_as_written(executor_image: str, monkeypatch: pytest.MonkeyPatch) -> None:
    class LabelledRuntime(Runtime):  # the example's sandboxes carry the test label, for clean-up by label
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("extra_labels", {TEST_LABEL: SESSION})
            kwargs.setdefault("image", executor_image)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(sandbox_runtime, "Runtime", LabelledRuntime)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block_after("<!-- example: python-api -->"), "README.md", "exec"), {"__name__": "readme"})  # noqa: S102  (the README's own example, run as written)
    lines = printed.getvalue().splitlines()
    assert lines == [
        "/mnt/results/spill/run_python-c1.table.jsonl 300",
        "/mnt/results/exports/run_python-c1.csv 300",
    ]


@pytest.mark.process
@pytest.mark.parametrize("block", [block for block in code_blocks([README]) if block.kind == "check"], ids=str)
def test_the_readme_block_is_what_its_marker_says(block: Block) -> None:
    check(block)


def test_every_readme_block_is_run_or_checked() -> None:
    blocks = list(code_blocks([README]))
    assert [block.name for block in blocks if block.kind == "example"] == ["python-api"]  # run above
    assert [str(block) for block in blocks if not block.kind] == []


def test_the_readme_is_a_landing_page() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200


def test_every_relative_link_of_the_readme_reaches_a_file() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    local = [link for link in links if "://" not in link]
    assert len(local) >= 20
    assert [link for link in local if not (README.parent / link).is_file()] == []


def test_ci_runs_the_readme_commands() -> None:
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "<!-- test-command -->" in ci
    assert "<!-- main-command -->" in ci
    assert block_after("<!-- test-command -->").strip() == "bash scripts/setup-dev.sh && .venv/bin/pytest"
    assert "sandbox-runtime demo" in block_after("<!-- main-command -->")
