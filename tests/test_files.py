"""write_file and edit_file: a long script is written once and changed in place, never retyped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandbox_runtime.errors import InvalidToolArguments, PathExists, PathNotFound, UnsafeFileType
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tools.files import EditFileArgs, WriteFileArgs, edit_file, write_file

CAP = 1024 * 1024
SCRIPT = "import json\n\nROWS = '/mnt/results/spill/sql-c1.table.jsonl'\nprint('libpthread.so.0')\n"


def test_a_script_is_written_once_and_one_line_is_changed_in_place(root: ResultsRoot, results: Path) -> None:
    written = write_file(root, WriteFileArgs(path="scripts/report.py", content=SCRIPT), max_bytes=CAP)
    assert written.path == "/mnt/results/scripts/report.py"
    assert written.lines == 4
    edited = edit_file(
        root, EditFileArgs(path=written.path, old="print('libpthread", new="print('found libpthread"), max_bytes=CAP
    )
    assert "Replaced 1 occurrence" in edited.message
    assert (results / "scripts" / "report.py").read_text() == SCRIPT.replace("print('", "print('found ")


def test_an_existing_file_is_not_overwritten_unless_asked(root: ResultsRoot, results: Path) -> None:
    write_file(root, WriteFileArgs(path="a.txt", content="one"), max_bytes=CAP)
    with pytest.raises(PathExists, match="overwrite=true"):
        write_file(root, WriteFileArgs(path="a.txt", content="two"), max_bytes=CAP)
    write_file(root, WriteFileArgs(path="a.txt", content="two", overwrite=True), max_bytes=CAP)
    assert (results / "a.txt").read_text() == "two"


@pytest.mark.parametrize(("old", "count", "fragment"), [("absent", 1, "it does not occur"), ("o", 1, "occurs 3")])
def test_an_edit_that_does_not_match_exactly_changes_nothing(
    root: ResultsRoot, results: Path, old: str, count: int, fragment: str
) -> None:
    write_file(root, WriteFileArgs(path="s.py", content="foo = 'bo'\n"), max_bytes=CAP)
    with pytest.raises(InvalidToolArguments, match=fragment):
        edit_file(root, EditFileArgs(path="s.py", old=old, new="x", count=count), max_bytes=CAP)
    assert (results / "s.py").read_text() == "foo = 'bo'\n"


def test_count_replaces_every_occurrence_when_it_matches(root: ResultsRoot, results: Path) -> None:
    write_file(root, WriteFileArgs(path="s.py", content="a a a"), max_bytes=CAP)
    edit_file(root, EditFileArgs(path="s.py", old="a", new="b", count=3), max_bytes=CAP)
    assert (results / "s.py").read_text() == "b b b"


def test_planted_links_are_replaced_never_written_through(root: ResultsRoot, results: Path, tmp_path: Path) -> None:
    outside = tmp_path / "host-file"
    outside.write_text("host secret")
    os.symlink(outside, results / "link.py")
    with pytest.raises(UnsafeFileType):
        edit_file(root, EditFileArgs(path="link.py", old="host", new="x"), max_bytes=CAP)
    write_file(root, WriteFileArgs(path="link.py", content="mine", overwrite=True), max_bytes=CAP)
    assert outside.read_text() == "host secret"
    assert not (results / "link.py").is_symlink()


def test_limits_and_missing_files_are_clear_errors(root: ResultsRoot) -> None:
    with pytest.raises(InvalidToolArguments, match="more than the cap of 10"):
        write_file(root, WriteFileArgs(path="big.txt", content="x" * 11), max_bytes=10)
    with pytest.raises(PathNotFound):
        edit_file(root, EditFileArgs(path="missing.py", old="a", new="b"), max_bytes=CAP)
    with pytest.raises(ValueError, match="at least 1"):
        EditFileArgs(path="s.py", old="", new="b")
