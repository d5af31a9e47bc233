"""The failure summary, checked against real failures: every corpus script is run with this interpreter.

The scripts run in a temp folder, wherever that lives, each started as ``/proc/self/cwd/<name>`` from that
folder (the kernel's own short name for the working folder), so their tracebacks, faulthandler's too (it cuts
a file name past 500 characters), name their files by that short path. The summary is then asked about the
stderr as ``run_python`` would see it, the run folder written as ``/mnt/results`` (the sandbox's results
folder; two scripts name their own folder by its real path, which is written the same way), so no
expectation depends on where the clone or the temp folder is or how long its path is. What a long path does
to a summary is tested on its own: the exception's class name and the start of its message survive script
paths of every length, and a user frame whose path faulthandler cut is still found.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import ModuleType

import pytest

from sandbox_runtime.tools.error_summary import FailureSummary, summarize_failure

CORPUS_DIR = Path(__file__).parent / "failure_corpus"
ERROR_FILE = "/mnt/results/errors/run-0001.txt"
RESULTS = "/mnt/results"
WORKING_FOLDER = "/proc/self/cwd"
SCRIPT_TIMEOUT_S = 30
FAULTHANDLER_PATH_MAX_CHARS = 500  # CPython's faulthandler prints at most this much of a file name, then "..."


def _load_cases_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("failure_corpus_cases", CORPUS_DIR / "cases.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


corpus = _load_cases_module()
CASES = corpus.load_cases(CORPUS_DIR)
CASE_BY_NAME = {case.name: case for case in CASES}


def _as_faulthandler_prints(path: str) -> str:
    return path if len(path) <= FAULTHANDLER_PATH_MAX_CHARS else path[:FAULTHANDLER_PATH_MAX_CHARS] + "..."


@dataclass(frozen=True)
class Run:
    """One script's real failure, run in ``run_dir``."""

    run_dir: Path
    returncode: int
    real_stderr: str

    @cached_property
    def stderr(self) -> str:
        """The stderr as in the sandbox: the run folder, by either name, written as /mnt/results. Only the
        folder's name changes; every line is the script's own."""
        return self.real_stderr.replace(str(self.run_dir), RESULTS).replace(WORKING_FOLDER, RESULTS)

    def host_path(self, sandbox_path: str) -> Path:
        return self.run_dir / Path(sandbox_path).relative_to(RESULTS)

    def summarize(self, *, max_chars: int = 2000, prefixes: list[str] | None = None) -> FailureSummary:
        return summarize_failure(
            self.stderr,
            exit_code=self.returncode,
            user_path_prefixes=[RESULTS + "/"] if prefixes is None else prefixes,
            error_file_path=ERROR_FILE,
            max_chars=max_chars,
        )


def _run_script(script: Path, cwd: Path, *, by_its_own_path: bool = False) -> tuple[int, str]:
    """Run ``script`` from ``cwd``, started as /proc/self/cwd/<its path below cwd> unless ``by_its_own_path``."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONWARNINGS", "PYTHONFAULTHANDLER"}}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    started_as = str(script) if by_its_own_path else f"{WORKING_FOLDER}/{script.relative_to(cwd)}"
    done = subprocess.run(
        [sys.executable, started_as],
        cwd=cwd,
        env=env,
        capture_output=True,
        timeout=SCRIPT_TIMEOUT_S,
        check=False,
    )
    return done.returncode, done.stderr.decode("utf-8", errors="replace")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    run_dir = tmp_path_factory.mktemp("corpus").resolve()
    cases = corpus.prepare_run_dir(CORPUS_DIR, run_dir)
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        results = list(pool.map(lambda case: _run_script(case.script_in(run_dir), run_dir), cases))
    return {case.name: Run(run_dir, code, err) for case, (code, err) in zip(cases, results, strict=True)}


def _source_line(path: Path, line: int) -> str:
    return path.read_text(encoding="utf-8").splitlines()[line - 1].strip()


by_case = pytest.mark.parametrize("name", [case.name for case in CASES])


def test_the_corpus_holds_at_least_thirty_cases_each_with_an_expectation() -> None:
    assert len(CASES) >= 30
    assert all(case.expect and all(case.expect) for case in CASES)


@by_case
def test_each_corpus_script_fails_the_way_its_header_says(name: str, runs: dict[str, Run]) -> None:
    run, case = runs[name], CASE_BY_NAME[name]
    assert case.exit_code_ok(run.returncode), (run.returncode, run.stderr[-2000:])
    assert len(run.real_stderr) >= case.min_stderr_chars


@by_case
def test_the_summary_quotes_the_exception_line_and_the_error_file_path(name: str, runs: dict[str, Run]) -> None:
    run, case = runs[name], CASE_BY_NAME[name]
    summary = run.summarize()
    for text in case.expect:
        assert text in summary.message
        if not case.exception_line_empty:
            assert text in summary.exception_line
    if case.exception_line_empty:
        assert summary.exception_line == ""
    for text in case.expect_in_message:
        assert text in summary.message
    assert ERROR_FILE in summary.message
    assert len(summary.message) <= 2000


@by_case
def test_the_summary_points_at_the_innermost_frame_of_the_users_own_files(name: str, runs: dict[str, Run]) -> None:
    run, case = runs[name], CASE_BY_NAME[name]
    summary = run.summarize()
    frame = summary.user_frame
    if not case.user_frame:
        assert frame is None
        return
    assert frame is not None, run.stderr[-2000:]
    assert frame.file == f"{RESULTS}/{case.user_file}"
    assert f"{frame.file}, line {frame.line}" in summary.message
    if case.user_source:
        assert frame.source == _source_line(run.host_path(frame.file), frame.line)
        assert frame.source in summary.message
    else:
        assert frame.source is None


def _exception_head(summary: FailureSummary) -> str:
    """The exception's class name, whole, and the first 40 characters of its message."""
    line = summary.exception_line
    if summary.exception_type is None or not line.startswith(summary.exception_type + ":"):
        return line[:40]
    return line[: len(summary.exception_type) + 2 + 40]


@by_case
def test_a_300_character_budget_keeps_the_exception_head_and_the_error_file(name: str, runs: dict[str, Run]) -> None:
    summary = runs[name].summarize(max_chars=300)
    assert len(summary.message) <= 300
    assert ERROR_FILE in summary.message
    assert _exception_head(summary) in summary.message


# the script's folder below /mnt/results: none, then every 3rd length up to 1,500 characters (every 37th for a
# stderr over 100 kB, which each summary parses whole); the summary's layout changes only at a few lengths
SCRIPT_FOLDER_CHARS = range(0, 1500, 3)
SCRIPT_FOLDER_CHARS_HUGE = range(0, 1500, 37)


@by_case
@pytest.mark.parametrize("max_chars", [300, 500, 1000, 2000])
def test_the_class_name_and_the_message_start_survive_a_script_path_of_any_length(
    name: str, max_chars: int, runs: dict[str, Run]
) -> None:
    run = runs[name]
    for extra in SCRIPT_FOLDER_CHARS if len(run.stderr) < 100_000 else SCRIPT_FOLDER_CHARS_HUGE:
        folder = RESULTS + ("/" + "d" * extra if extra else "")
        summary = summarize_failure(
            run.stderr.replace(RESULTS, folder),  # the same failure, its files in a folder of that length
            exit_code=run.returncode,
            user_path_prefixes=[folder + "/"],
            error_file_path=ERROR_FILE,
            max_chars=max_chars,
        )
        assert len(summary.message) <= max_chars, extra
        assert ERROR_FILE in summary.message, extra
        assert _exception_head(summary) in summary.message, (extra, summary.message)


def test_a_frame_outside_the_user_prefix_is_never_the_user_frame(runs: dict[str, Run]) -> None:
    run = runs["12_csv_keyerror_amount"]
    almost = RESULTS[:-1]  # a sibling folder whose name merely starts the same way
    summary = run.summarize(prefixes=[almost, RESULTS + "-old/"])
    assert summary.user_frame is None
    assert "KeyError: 'amount'" in summary.message
    assert "raised inside" in summary.message  # the innermost frame is still shown, as a non-user frame


def test_the_library_frame_is_dropped_before_the_user_frame_when_room_is_short(runs: dict[str, Run]) -> None:
    run = runs["01_openpyxl_invalid_sheet_title"]
    full = run.summarize().message
    assert "raised inside openpyxl/" in full
    shorter = run.summarize(max_chars=len(full) - 1).message
    assert "raised inside" not in shorter
    assert "in your script" in shorter
    assert "ws = wb.create_sheet(title=title)" in shorter


def test_the_full_error_size_is_given_with_units(runs: dict[str, Run]) -> None:
    run = runs["21_huge_recursion_traceback"]
    summary = run.summarize()
    lines = len(run.stderr.splitlines())
    assert f"Full error ({len(run.stderr):,} characters, {lines:,} lines): {ERROR_FILE}" in summary.message


@pytest.fixture(scope="module")
def megabyte_failure(tmp_path_factory: pytest.TempPathFactory) -> Run:
    run_dir = tmp_path_factory.mktemp("huge").resolve()
    script = run_dir / "huge_message.py"
    script.write_text(
        'def check(rows):\n    raise ValueError("bad rows: " + "0123456789" * 100_000 + " END")\n\ncheck([])\n',
        encoding="utf-8",
    )
    return Run(run_dir, *_run_script(script, run_dir))


@pytest.mark.parametrize("max_chars", [300, 2000, 10_000])
def test_a_one_megabyte_exception_line_is_cut_in_its_middle(megabyte_failure: Run, max_chars: int) -> None:
    summary = megabyte_failure.summarize(max_chars=max_chars)
    assert len(summary.exception_line) > 1_000_000
    assert summary.exception_line.startswith("ValueError: bad rows: 0123")
    assert len(summary.message) <= max_chars
    assert ERROR_FILE in summary.message
    first = summary.message.splitlines()[0]
    assert "ValueError: bad rows: 0123" in first
    assert first.endswith(" END")
    marker = re.search(r" …\[([\d,]+) chars cut\]… ", first)
    assert marker is not None
    head, tail = first.split(marker.group(0))
    kept = len(head) - len("Script failed (exit code 1): ") + len(tail)
    assert kept + int(marker.group(1).replace(",", "")) == len(summary.exception_line)


def test_the_user_frame_survives_a_huge_exception_line_at_the_default_budget(megabyte_failure: Run) -> None:
    summary = megabyte_failure.summarize()
    assert summary.user_frame is not None
    assert summary.user_frame.function == "check"
    assert "in your script" in summary.message


def test_a_shell_style_exit_code_137_with_no_output_reads_as_killed_by_sigkill() -> None:
    summary = summarize_failure("", exit_code=137, user_path_prefixes=["/mnt/results"], error_file_path=ERROR_FILE)
    assert summary.exception_line.startswith("Killed by signal 9 (SIGKILL)")
    assert "signal 9 (SIGKILL)" in summary.message
    assert summary.signal_number == 9


def test_an_unknown_exit_code_and_empty_stderr_still_name_the_error_file() -> None:
    summary = summarize_failure("", exit_code=None, user_path_prefixes=[], error_file_path=ERROR_FILE)
    assert summary.exception_line == ""
    assert summary.exception_type is None
    assert summary.message.startswith("Script failed and wrote nothing to stderr.")
    assert ERROR_FILE in summary.message


def test_a_budget_below_the_minimum_is_refused() -> None:
    with pytest.raises(ValueError, match="max_chars"):
        summarize_failure("x", exit_code=1, user_path_prefixes=[], error_file_path=ERROR_FILE, max_chars=100)


@pytest.mark.process
def test_a_long_exception_line_pushes_out_the_library_frame_before_the_user_frame(tmp_path: Path) -> None:
    run_dir = tmp_path.resolve()
    script = run_dir / "dates.py"
    script.write_text(
        "from datetime import datetime\n\n\n"
        "def parse(text):\n"
        '    return datetime.strptime(text, "%Y-%m-%d")\n\n\n'
        'parse("2024-13-01 " + "padding " * 400)\n',
        encoding="utf-8",
    )
    run = Run(run_dir, *_run_script(script, run_dir))
    roomy = run.summarize(max_chars=10_000)
    assert "raised inside _strptime.py" in roomy.message
    summary = run.summarize()
    assert len(summary.exception_line) > 2000
    assert summary.exception_line.startswith("ValueError: time data '2024-13-01 padding")
    assert "raised inside" not in summary.message
    assert "in your script" in summary.message
    assert 'return datetime.strptime(text, "%Y-%m-%d")' in summary.message
    assert "chars cut]" in summary.message
    assert len(summary.message) <= 2000


@pytest.mark.process
def test_a_fatal_error_in_a_script_whose_long_path_faulthandler_cut_still_names_the_users_frame(
    tmp_path: Path,
) -> None:
    folder = tmp_path.resolve()
    while len(str(folder)) < len(str(tmp_path)) + FAULTHANDLER_PATH_MAX_CHARS:
        folder /= "f" * 200
    folder.mkdir(parents=True)
    script = folder / "crash.py"
    script.write_text(
        "import faulthandler\n\nfaulthandler.enable()\n\n\ndef crash():\n    faulthandler._sigsegv()\n\n\ncrash()\n"
    )
    code, stderr = _run_script(script, folder, by_its_own_path=True)
    printed = _as_faulthandler_prints(str(script))
    assert printed.endswith("..."), "faulthandler cuts a file name this long"
    assert f'File "{printed}", line 7 in crash' in stderr, stderr[-2000:]
    for prefix in (str(tmp_path.resolve()) + "/", str(folder) + "/"):  # a prefix shorter and longer than the cut
        summary = summarize_failure(stderr, exit_code=code, user_path_prefixes=[prefix], error_file_path=ERROR_FILE)
        assert summary.exception_line == "Fatal Python error: Segmentation fault"
        assert summary.user_frame is not None, prefix
        assert (summary.user_frame.file, summary.user_frame.line) == (printed, 7)
