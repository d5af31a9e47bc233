"""run_python as a model uses it: inline code, scripts by path, arguments, failures and their short messages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sandbox_runtime import ScriptError
from sandbox_runtime.api.runtime import Runtime
from sandbox_runtime.errors import InvalidToolArguments, PathNotFound, PathOutsideResults, UnsafeFileType
from tests.conftest import RuntimeFactory
from tests.failure_corpus.cases import Case, load_cases, prepare_run_dir

CORPUS_DIR = Path(__file__).parent / "failure_corpus"


def test_inline_code_runs_and_is_saved_as_a_script_the_model_can_run_again(runtime: Runtime) -> None:
    conversation = runtime.conversation("inline-code")
    first = conversation.run_python("print('hello from the sandbox')")
    assert first.status == "ok"
    assert first.stdout == "hello from the sandbox\n"
    assert first.script_path.startswith("/mnt/results/scripts/run-")
    again = conversation.run_python(script_path=first.script_path)
    assert again.stdout == first.stdout


def test_a_script_that_takes_the_next_runs_file_names_changes_nothing_but_the_names(runtime: Runtime) -> None:
    conversation = runtime.conversation("taken-names")
    first = conversation.run_python(
        "import os\nos.makedirs('/mnt/results/errors', exist_ok=True)\n"
        "for n in (2, 3):\n"
        "    open(f'/mnt/results/scripts/run-{n:04d}.py', 'w').write('planted')\n"
        "    open(f'/mnt/results/errors/run-{n:04d}.txt', 'w').write('planted')\n"
    )
    assert first.status == "ok", first.message
    second = conversation.run_python("print('mine')")
    failed = conversation.run_python("raise ValueError('the real error')")
    assert second.stdout == "mine\n"
    assert second.script_path.startswith("/mnt/results/scripts/run-0002-")
    assert failed.error_path is not None
    assert failed.error_path.startswith("/mnt/results/errors/run-0003-")
    assert "the real error" in failed.message
    root = conversation.folders.results
    assert (root / "errors" / Path(failed.error_path).name).read_text().count("the real error") >= 1
    assert (root / "scripts" / "run-0002.py").read_text() == "planted"  # never replaced


def test_a_long_script_is_written_once_and_run_by_path_with_arguments(runtime: Runtime) -> None:
    conversation = runtime.conversation("script-by-path")
    root = runtime.store.results_root(conversation.folders)
    root.create_file("scripts/report.py", b"import sys\nprint('|'.join(sys.argv[1:]))\n")
    by_sandbox_path = conversation.run_python(script_path="/mnt/results/scripts/report.py", args=["a b", "ü", "-x"])
    by_relative_path = conversation.run_python(script_path="scripts/report.py", args=["rel"])
    assert by_sandbox_path.stdout == "a b|ü|-x\n"
    assert by_relative_path.stdout == "rel\n"


def test_a_script_builds_office_documents_in_the_results_folder(runtime: Runtime) -> None:
    conversation = runtime.conversation("office-docs")
    result = conversation.run_python(
        "from openpyxl import Workbook\nfrom docx import Document\nfrom pptx import Presentation\n"
        "wb = Workbook(); wb.active.append(['a', 1]); wb.save('/mnt/results/exports/t.xlsx')\n"
        "d = Document(); d.add_heading('Report', 1); d.save('/mnt/results/exports/t.docx')\n"
        "p = Presentation(); p.slides.add_slide(p.slide_layouts[0]); p.save('/mnt/results/exports/t.pptx')\n"
    )
    assert result.status == "ok", result.message
    exports = conversation.folders.results / "exports"
    assert {p.name for p in exports.iterdir()} == {"t.xlsx", "t.docx", "t.pptx"}


def test_the_sandbox_is_reused_across_calls_and_found_again_after_a_restart(runtime_factory: RuntimeFactory) -> None:
    first_runtime = runtime_factory()
    conversation = first_runtime.conversation("reattach")
    conversation.run_python("open('/tmp/marker', 'w').write('still here')")
    container = conversation.sandbox().container_id
    assert conversation.run_python("print(1)").status == "ok"
    assert conversation.sandbox().container_id == container
    first_runtime.close()

    second_runtime = runtime_factory(state_dir=first_runtime.state_dir)
    again = second_runtime.conversation("reattach")
    assert again.sandbox().container_id == container
    assert again.run_python("print(open('/tmp/marker').read())").stdout == "still here\n"


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({}, "exactly one of"),
        ({"code": "pass", "script_path": "x.py"}, "exactly one of"),
        ({"code": "pass", "timeout_s": -1}, "timeout_s"),
        ({"code": "pass", "timeout_s": 10_000}, "at most"),
        ({"code": "pass", "extra": 1}, "extra"),
        ({"code": "pass", "args": ["a\x00b"]}, "NUL"),
        ({"code": "x" * (1024 * 1024 + 1)}, "inline_code_max_bytes"),
    ],
)
def test_bad_arguments_are_typed_errors_that_name_the_field(
    runtime: Runtime, arguments: dict[str, object], fragment: str
) -> None:
    with pytest.raises(InvalidToolArguments, match=fragment):
        runtime.conversation("bad-args").call_run_python(arguments)


@pytest.mark.parametrize(
    ("script_path", "error"),
    [
        ("../../etc/passwd", PathOutsideResults),
        ("/etc/passwd", PathOutsideResults),
        ("scripts/missing.py", PathNotFound),
        ("scripts/link.py", UnsafeFileType),
    ],
)
def test_a_script_path_outside_the_results_folder_or_through_a_link_is_refused(
    runtime: Runtime, script_path: str, error: type[Exception]
) -> None:
    conversation = runtime.conversation("bad-paths")
    (conversation.folders.results / "scripts" / "link.py").symlink_to("/etc/passwd")
    with pytest.raises(error):
        conversation.run_python(script_path=script_path)


def _failing_cases() -> list[Case]:
    return [case for case in load_cases(CORPUS_DIR) if case.exit_code != 0]


def test_the_corpus_has_at_least_26_failing_scripts() -> None:
    assert len(_failing_cases()) >= 26


def test_every_failing_script_gets_a_short_message_with_its_exception_line_and_error_file(
    runtime: Runtime, tmp_path: Path
) -> None:
    conversation = runtime.conversation("failure-corpus")
    root = runtime.store.results_root(conversation.folders)
    local = tmp_path / "corpus"
    prepare_run_dir(CORPUS_DIR, local)
    for path in sorted(local.iterdir()):
        if path.suffix == ".py":
            root.create_file(f"corpus/{path.name}", path.read_bytes())
    outcomes: dict[str, str] = {}
    for case in _failing_cases():
        result = conversation.run_python(script_path=f"corpus/{case.script_name}", timeout_s=60)
        problems = []
        if result.status != "error" or result.exit_code is None or not case.exit_code_ok(result.exit_code):
            problems.append(f"status {result.status}, exit code {result.exit_code}")
        problems += [f"missing {text!r}" for text in case.expect + case.expect_in_message if text not in result.message]
        if result.error_path is None or result.error_path not in result.message:
            problems.append("no error file path in the message")
        else:
            full = root.read_text(result.error_path, max_bytes=16 * 1024 * 1024)
            if full != result.stderr and len(result.stderr) < runtime.policy.run.stderr_max_bytes:
                problems.append("the error file is not the full stderr")
        if case.user_frame and f"/mnt/results/corpus/{case.user_file}" not in result.message:
            problems.append(f"no user frame {case.user_file} in the message")
        if len(result.message) > runtime.policy.run.error_message_max_chars:
            problems.append(f"message of {len(result.message)} chars")
        outcomes[case.name] = "; ".join(problems) or "ok"
    failed = {name: why for name, why in outcomes.items() if why != "ok"}
    assert not failed, f"{len(failed)} of {len(outcomes)} cases failed: {failed}"
    assert len(outcomes) >= 26


def test_a_failed_run_gives_its_exception_and_the_line_of_the_script_as_fields(runtime: Runtime) -> None:
    conversation = runtime.conversation("structured-errors")
    raised = conversation.run_python("rows = [1, 2]\n\nprint(rows[5])\n")
    assert raised.error == ScriptError(
        type="IndexError", message="list index out of range", file=raised.script_path, line=3, signal=None
    )
    decoded = conversation.run_python("import json\njson.loads('{')\n")  # raised inside the library, called here
    assert decoded.error is not None
    assert (decoded.error.type, decoded.error.file, decoded.error.line) == (
        "json.decoder.JSONDecodeError",
        decoded.script_path,
        2,
    )
    assert decoded.error.message.startswith("Expecting property name enclosed in double quotes")
    said = conversation.run_python("import sys\nsys.exit('no rows for 2026')\n")  # no traceback: its last words
    assert said.error == ScriptError(type=None, message="no rows for 2026", file=None, line=None, signal=None)
    assert conversation.run_python("import sys\nsys.exit(3)\n").error is None  # the exit code says it all
    killed = conversation.run_python("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    assert killed.error is not None
    assert (killed.error.type, killed.error.signal) == (None, 11)
    huge = conversation.run_python("raise ValueError('v' * 150_000)")
    assert huge.error is not None
    assert len(huge.error.message) <= runtime.policy.run.error_message_max_chars
    assert huge.error.message.startswith("vvv")
    assert conversation.run_python("print('fine')").error is None


def test_a_traceback_longer_than_100_kb_is_kept_whole_in_the_error_file(runtime: Runtime) -> None:
    conversation = runtime.conversation("huge-traceback")
    result = conversation.run_python("raise ValueError('v' * 150_000)")
    assert result.status == "error"
    assert "ValueError: vvv" in result.message
    assert len(result.message) <= runtime.policy.run.error_message_max_chars
    assert result.error_path is not None
    saved = runtime.store.results_root(conversation.folders).read_text(result.error_path, max_bytes=1 << 20)
    assert saved.count("v") >= 150_000


_FAILING_SCRIPTS = {
    "raised": "def total(rows):\n    return sum(row['amount'] for row in rows)\n\nprint(total([{'sum': 1}]))\n",
    "chained": "try:\n    {}['missing']\nexcept KeyError as exc:\n    raise ValueError('no amount') from exc\n",
    "syntax": "print('unclosed'\n",
}


@pytest.mark.parametrize("kind", sorted(_FAILING_SCRIPTS))
def test_a_failed_scripts_full_error_is_what_python_script_py_prints(
    runtime: Runtime, tmp_path: Path, kind: str
) -> None:
    conversation = runtime.conversation(f"plain-traceback-{kind}")
    source = _FAILING_SCRIPTS[kind]
    conversation.call("write_file", {"path": "/mnt/results/scripts/failing.py", "content": source}, call_id="w")
    result = conversation.run_python(script_path="/mnt/results/scripts/failing.py")
    assert result.status == "error"
    assert result.error_path is not None
    saved = runtime.store.results_root(conversation.folders).read_text(result.error_path, max_bytes=1 << 20)
    # the same script run by the host's own python3 (the image's version: Debian's 3.11), at its own path
    on_host = tmp_path / "failing.py"
    on_host.write_text(source)
    plain = subprocess.run([sys.executable, str(on_host)], capture_output=True, text=True, check=False, timeout=60)
    expected = plain.stderr.replace(str(on_host), "/mnt/results/scripts/failing.py")
    assert saved == expected
    assert result.stderr == expected
    assert "executor.py" not in saved


def test_the_strict_policy_runs_code_within_its_tighter_limits(runtime_factory: RuntimeFactory) -> None:
    runtime = runtime_factory("strict")
    assert runtime.doctor().ok
    conversation = runtime.conversation("strict")
    result = conversation.run_python(
        "import resource\nprint(resource.getrlimit(resource.RLIMIT_NOFILE)[0])\n"
        "print(open('/sys/fs/cgroup/pids/pids.max').read().strip())"
    )
    assert result.status == "ok", result.message
    assert result.stdout.split() == ["256", "64"]
    assert conversation.usage().limit_bytes == 256 * 1024 * 1024
