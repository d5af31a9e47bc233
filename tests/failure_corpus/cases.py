"""The failure corpus: deliberately failing scripts and what a failure summary must say about each.

Every case is ``NN_short_name.py``, or ``NN_short_name.py.txt`` for a script that is not valid Python
(SyntaxError, IndentationError, TabError), which :func:`prepare_run_dir` copies to ``NN_short_name.py``.
The first lines of each file are header comments::

    # expect: <text>          one or more; must appear in ``exception_line`` and in ``message``
    # message: <text>         must appear in ``message`` only (e.g. "raised inside openpyxl/")
    # user-frame: yes|no|no-source
                              whether a frame of the user's own files is expected (default yes);
                              "no-source" when the frame comes from a faulthandler stack without source
    # user-file: <path>       the user frame's file, relative to the run folder (default: the script)
    # exception-line: empty   ``exception_line`` must be "" (``expect`` is then checked in ``message``)
    # exit-code: <n>          the exit status the script ends with (default: any non-zero status)
    # stderr-at-least: <n>    the script writes at least this many characters to stderr

Expectations never depend on where the corpus lives. Scripts use only the standard library, openpyxl,
python-docx and python-pptx; they write only to the current folder, a temp folder or (for helper
modules they import) their own folder, and run from any working directory. Run a copy made by
:func:`prepare_run_dir`, never the corpus folder itself: two scripts write helper modules beside themselves.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Case", "load_cases", "prepare_run_dir"]

_NAME_RE = re.compile(r"(?P<stem>\d{2}_\w+)\.py(?P<txt>\.txt)?$")
_HEADER_RE = re.compile(r"# (?P<key>[a-z-]+): (?P<value>.*)$")
_KEYS = {"expect", "message", "user-frame", "user-file", "exception-line", "exit-code", "stderr-at-least"}


@dataclass(frozen=True)
class Case:
    """One corpus script and the expectations on its failure summary."""

    name: str
    source: Path
    script_name: str
    expect: tuple[str, ...]
    expect_in_message: tuple[str, ...]
    user_frame: bool
    user_source: bool
    user_file: str
    exception_line_empty: bool
    exit_code: int | None
    min_stderr_chars: int

    def script_in(self, run_dir: Path) -> Path:
        """The path to run once :func:`prepare_run_dir` has filled ``run_dir``."""
        return run_dir / self.script_name

    def exit_code_ok(self, code: int) -> bool:
        """Whether ``code`` is the exit status this case should end with."""
        return code == self.exit_code if self.exit_code is not None else code != 0


def _parse_case(path: Path) -> Case | None:
    match = _NAME_RE.fullmatch(path.name)
    if match is None:
        return None
    headers: list[tuple[str, str]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        header = _HEADER_RE.match(line)
        if header is None:
            break
        if header["key"] not in _KEYS:
            raise ValueError(f"{path.name}: unknown header {header['key']!r}")
        headers.append((header["key"], header["value"].strip()))
    if not headers or headers[0][0] != "expect":
        raise ValueError(f"{path.name}: the first line must be '# expect: <text>'")
    values: dict[str, str] = dict(headers)
    frame = values.get("user-frame", "yes")
    if frame not in {"yes", "no", "no-source"}:
        raise ValueError(f"{path.name}: user-frame must be yes, no or no-source, not {frame!r}")
    script_name = f"{match['stem']}.py"
    return Case(
        name=match["stem"],
        source=path,
        script_name=script_name,
        expect=tuple(value for key, value in headers if key == "expect"),
        expect_in_message=tuple(value for key, value in headers if key == "message"),
        user_frame=frame != "no",
        user_source=frame == "yes",
        user_file=values.get("user-file", script_name),
        exception_line_empty=values.get("exception-line") == "empty",
        exit_code=int(values["exit-code"]) if "exit-code" in values else None,
        min_stderr_chars=int(values.get("stderr-at-least", "0")),
    )


def load_cases(corpus_dir: Path) -> list[Case]:
    """Every case in ``corpus_dir``, sorted by name."""
    cases = [case for path in sorted(corpus_dir.iterdir()) if (case := _parse_case(path)) is not None]
    names = [case.name for case in cases]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate case names in {corpus_dir}")
    return cases


def prepare_run_dir(corpus_dir: Path, run_dir: Path) -> list[Case]:
    """Copy the corpus scripts into ``run_dir`` (``.py.txt`` becomes ``.py``) and return the cases."""
    run_dir.mkdir(parents=True, exist_ok=True)
    cases = load_cases(corpus_dir)
    for case in cases:
        shutil.copyfile(case.source, case.script_in(run_dir))
    return cases
