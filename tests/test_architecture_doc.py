"""docs/architecture.md stays true: every file it names exists, it draws every layer the import rules know, and
the walk of one call says how many files and shapes it crosses, counted from the walk itself."""

from __future__ import annotations

import re
from pathlib import Path

from tests.test_public_api import LAYERS

PROJECT = Path(__file__).resolve().parent.parent
DOC = PROJECT / "docs" / "architecture.md"
NAMED_FILE = re.compile(r"`([\w/.-]+\.(?:py|toml|md))`")
WALK = re.compile(r"^## One `run_python` call.*?(?=^## )", re.MULTILINE | re.DOTALL)


def _walk() -> str:
    found = WALK.search(DOC.read_text())
    assert found is not None, "the walk of one call is missing"
    return found.group(0)


def test_every_file_the_page_names_exists() -> None:
    named = set(NAMED_FILE.findall(DOC.read_text()))
    missing = sorted(
        name for name in named if not (PROJECT / "sandbox_runtime" / name).exists() and not (PROJECT / name).exists()
    )
    assert named
    assert not missing, missing


def test_the_page_draws_every_layer() -> None:
    drawing = DOC.read_text().split("```")[1]
    for name, packages in LAYERS:
        for package in packages:
            assert package in drawing or name in drawing, f"layer {name} ({package}) is not drawn"


def test_the_walk_counts_the_files_and_shapes_it_names() -> None:
    walk = _walk()
    files = {name for name in NAMED_FILE.findall(walk) if name.endswith(".py")}
    stated = re.search(r"Steps 1 to 11 name (\d+) files", walk)
    assert stated is not None
    assert int(stated.group(1)) == len(files), sorted(files)
    shapes = re.search(r"takes (\d+) shapes on its way: (.*?)\.\s", walk, re.DOTALL)
    assert shapes is not None
    assert int(shapes.group(1)) == shapes.group(2).count("→") + 1
