"""The README stays true: its Python example runs as written, and its commands are the ones CI runs."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path
from typing import Any

import pytest

import sandbox_runtime
from sandbox_runtime import FakeBackend, Runtime
from tests.conftest import SESSION, TEST_LABEL

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
        "/mnt/results/spill/run_python-c1.table.jsonl 300 ['id', 'library']",
        "/mnt/results/exports/run_python-c1.csv 300",
        "table 80",
        "True ['c1']",
    ]


def test_the_fake_backend_example_runs_as_written_with_no_engine(tmp_path: Path) -> None:
    example = block_after("<!-- example: fake-backend -->")
    exec(compile(example, "README.md", "exec"), {"__name__": "readme", "tmp_path": tmp_path})  # noqa: S102  (the README's own example, run as written)
    with Runtime(tmp_path, backend=FakeBackend(), image="fake") as runtime:
        runtime.conversation("t1").delete()  # the example's folders (and quota volume), cleaned up


def test_ci_runs_the_readme_commands() -> None:
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    assert "<!-- test-command -->" in ci
    assert "<!-- main-command -->" in ci
    assert block_after("<!-- test-command -->").strip() == "bash scripts/setup-dev.sh && .venv/bin/pytest"
    assert "sandbox-runtime demo" in block_after("<!-- main-command -->")
