"""A model reads text files from its hostile results folder with ``read_file``, one bounded page at a time.

Every test plants the file directly on disk (no Docker needed) and reads it the way a model would: by an
in-sandbox or relative path, with ``offset``/``limit`` paging, following ``next_offset`` until it is None.
"""

from __future__ import annotations

import io
import os
import re
import tracemalloc
from pathlib import Path

import pytest

from sandbox_runtime.errors import (
    FileTooLarge,
    InvalidToolArguments,
    PathNotFound,
    PathOutsideResults,
    UnsafeFileType,
)
from sandbox_runtime.policy import Policy
from sandbox_runtime.store.capped import CappedReader
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tables.source import ACCEPTED_FORMATS
from sandbox_runtime.tools.read_file import (
    ReadFileArgs,
    ReadFileResult,
    read_file,
    read_file_description,
)

QUOTA = 64 * 1024 * 1024
MARKER = "[read_file:"


def plant(results: Path, name: str, data: bytes | str) -> Path:
    target = results / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return target


def read(root: ResultsRoot, path: str, max_chars: int = 500_000, **args: object) -> ReadFileResult:
    return read_file(root, {"path": path, **args}, max_chars=max_chars, max_file_bytes=QUOTA)


def content_of(result: ReadFileResult) -> str:
    """The file content of a page: its text without the marker line (and the break added before a cut line's)."""
    if not result.truncated:
        return result.text
    body, marker = result.text.rsplit("\n", 1)
    assert marker.startswith(MARKER)
    assert marker.endswith(".]")
    return body if " was cut after " in marker else body + "\n"


def page_through(root: ResultsRoot, path: str, max_chars: int, **args: object) -> tuple[str, list[ReadFileResult]]:
    """Follow next_offset from line 1 to the end, as a model would; return the joined content and the pages."""
    pages: list[ReadFileResult] = []
    offset: int | None = 1
    while offset is not None:
        page = read(root, path, max_chars, offset=offset, **args)
        assert page.first_line == offset
        assert len(content_of(page)) <= max_chars
        pages.append(page)
        offset = page.next_offset
        assert len(pages) < 1000
    return "".join(content_of(page) for page in pages), pages


# ---------------------------------------------------------------------------------------------- whole files
def test_a_small_file_is_returned_whole_without_a_marker(root: ResultsRoot, results: Path) -> None:
    plant(results, "out/report.txt", "total: 3 rows\nmean: 2.5\nok\n")

    result = read(root, "/mnt/results/out/report.txt")

    assert result == ReadFileResult(
        path="/mnt/results/out/report.txt",
        text="total: 3 rows\nmean: 2.5\nok\n",
        first_line=1,
        last_line=3,
        next_offset=None,
        truncated=False,
        bytes=27,
    )
    assert read(root, "out/report.txt") == result
    assert read(root, "./out/../out/report.txt", offset=1, limit=3) == result


def test_crlf_and_a_missing_final_line_break_are_kept(root: ResultsRoot, results: Path) -> None:
    plant(results, "windows.csv", b"a,b\r\n1,2\r\n3,4")

    whole = read(root, "windows.csv")
    assert whole.text == "a,b\r\n1,2\r\n3,4"
    assert (whole.last_line, whole.next_offset, whole.truncated) == (3, None, False)

    last = read(root, "windows.csv", offset=3)
    assert (last.text, last.first_line, last.last_line) == ("3,4", 3, 3)

    first = read(root, "windows.csv", limit=1)
    assert first.text.startswith("a,b\r\n" + MARKER)
    assert first.next_offset == 2


def test_a_carriage_return_alone_does_not_end_a_line(root: ResultsRoot, results: Path) -> None:
    plant(results, "progress.log", "10%\r50%\r100%\ndone\n")

    result = read(root, "progress.log", limit=1)

    assert content_of(result) == "10%\r50%\r100%\n"
    assert result.next_offset == 2


def test_invalid_utf8_is_replaced_not_fatal(root: ResultsRoot, results: Path) -> None:
    plant(results, "latin1.txt", b"caf\xe9 ok\n\xff\xfe half \xe2\x82\n")

    result = read(root, "latin1.txt")

    assert result.text == "caf\ufffd ok\n\ufffd\ufffd half \ufffd\n"
    assert result.last_line == 2


def test_an_empty_file_says_so(root: ResultsRoot, results: Path) -> None:
    plant(results, "empty.txt", b"")

    result = read(root, "empty.txt")

    assert result.text == "(empty file, 0 lines)"
    assert (result.first_line, result.last_line, result.next_offset, result.truncated, result.bytes) == (
        0,
        0,
        None,
        False,
        0,
    )


# ------------------------------------------------------------------------------------------------- paging
def test_paging_with_offset_and_limit_reconstructs_the_file(root: ResultsRoot, results: Path) -> None:
    text = "".join(f"row {n}: {'x' * (n % 7)}\n" for n in range(1, 26))
    plant(results, "rows.txt", text)

    joined, pages = page_through(root, "rows.txt", 500_000, limit=10)

    assert joined == text
    assert [(p.first_line, p.last_line, p.next_offset) for p in pages] == [(1, 10, 11), (11, 20, 21), (21, 25, None)]
    assert [p.truncated for p in pages] == [True, True, False]
    marker = pages[0].text.rsplit("\n", 1)[1]
    assert marker == (
        "[read_file: showed lines 1-10 of 25 (108 characters); the limit of 10 lines was reached; "
        "15 more lines follow: continue with offset=11.]"
    )


def test_a_limit_ending_exactly_at_the_end_needs_no_marker(root: ResultsRoot, results: Path) -> None:
    plant(results, "three.txt", "a\nb\nc\n")

    result = read(root, "three.txt", offset=2, limit=2)

    assert (result.text, result.first_line, result.last_line, result.next_offset) == ("b\nc\n", 2, 3, None)
    assert not result.truncated


def test_the_character_cap_stops_at_a_whole_line_with_a_marker(root: ResultsRoot, results: Path) -> None:
    plant(results, "lines.txt", "".join(f"line {n:04d}\n" for n in range(1, 101)))  # 10 characters a line

    result = read(root, "lines.txt", max_chars=95)

    assert result.text.startswith("line 0001\n")
    assert content_of(result) == "".join(f"line {n:04d}\n" for n in range(1, 10))
    assert (result.first_line, result.last_line, result.next_offset, result.truncated) == (1, 9, 10, True)
    assert result.text.endswith(
        "[read_file: showed lines 1-9 of 100 (90 characters); the cap of 95 characters per call was reached; "
        "91 more lines follow: continue with offset=10.]"
    )


def test_a_read_that_fills_the_cap_exactly(root: ResultsRoot, results: Path) -> None:
    plant(results, "lines.txt", "line 0001\nline 0002\nline 0003\n")

    assert read(root, "lines.txt", max_chars=30).text == "line 0001\nline 0002\nline 0003\n"  # no marker
    two = read(root, "lines.txt", max_chars=20)
    assert two.text == (
        "line 0001\nline 0002\n[read_file: showed lines 1-2 of 3 (20 characters); the cap of 20 characters per "
        "call was reached; 1 more line follows: continue with offset=3.]"
    )


def test_paging_under_the_character_cap_reconstructs_the_file(root: ResultsRoot, results: Path) -> None:
    text = "".join(f"{n}: {'é€😀' * (n % 13)}\r\n" for n in range(200)) + "tail without break"
    plant(results, "mixed.txt", text)

    joined, pages = page_through(root, "mixed.txt", max_chars=120)

    assert joined == text
    assert len(pages) > 10
    assert all(MARKER not in content_of(page) for page in pages)
    assert pages[-1].last_line == 201


def test_the_default_cap_counts_code_points_not_bytes(root: ResultsRoot, results: Path) -> None:
    line = "数据分析结果表格汉字" * 10 + "\n"  # 101 code points, 301 bytes
    text = line * 4000  # 404,000 code points in 1.2 MB
    plant(results, "cjk.txt", text)
    assert len(text.encode()) > 1_200_000

    whole = read_file(root, {"path": "cjk.txt"}, max_file_bytes=QUOTA)

    assert (whole.text, whole.truncated, whole.next_offset, whole.bytes) == (text, False, None, 1_204_000)

    plant(results, "cjk-big.txt", line * 6000)  # 606,000 code points: over the default cap
    big = read_file(root, {"path": "cjk-big.txt"}, max_file_bytes=QUOTA)

    assert content_of(big) == line * 4950  # 499,950 code points: line 4951 would not fit whole
    assert big.next_offset == 4951
    assert "cap of 500,000 characters per call" in big.text


# --------------------------------------------------------------------------------------------- huge lines
def test_a_single_huge_line_is_cut_at_the_cap_and_the_marker_says_so(root: ResultsRoot, results: Path) -> None:
    plant(results, "minified.json", "{}\n" + "[" + "1," * 5000 + "1]\n" + "end\n")

    first = read(root, "minified.json", max_chars=100)
    assert (content_of(first), first.next_offset) == ("{}\n", 2)  # line 2 does not fit: left to the next page

    huge = read(root, "minified.json", max_chars=100, offset=2)
    assert huge.text == "[" + "1," * 49 + "1\n" + (
        "[read_file: showed line 2 of 3 (100 characters); line 2 was cut after 100 characters by the cap of "
        "100 characters per call: read that line with run_python; 1 more line follows: continue with offset=3.]"
    )
    assert (huge.first_line, huge.last_line, huge.next_offset, huge.truncated) == (2, 2, 3, True)

    last = read(root, "minified.json", max_chars=100, offset=3)
    assert (last.text, last.next_offset) == ("end\n", None)


def test_a_cut_last_line_says_no_more_lines_follow(root: ResultsRoot, results: Path) -> None:
    plant(results, "one-line.txt", "x" * 1000)

    result = read(root, "one-line.txt", max_chars=10)

    assert result.text.startswith("x" * 10 + "\n[read_file: showed line 1 of 1 (10 characters); line 1 was cut")
    assert result.text.endswith("no more lines follow.]")
    assert (result.next_offset, result.truncated) == (None, True)


def test_a_cut_falls_on_a_code_point_boundary(root: ResultsRoot, results: Path) -> None:
    plant(results, "emoji.txt", "😀" * 700_000)  # 2.8 MB, one line without a break

    result = read_file(root, {"path": "emoji.txt"}, max_file_bytes=QUOTA)

    assert content_of(result) == "😀" * 500_000
    assert "line 1 was cut after 500,000 characters" in result.text
    assert "read that line with run_python" in result.text


def test_a_line_whose_break_alone_does_not_fit_is_reported_cut(root: ResultsRoot, results: Path) -> None:
    plant(results, "exact.txt", "abcde\nfg\n")

    result = read(root, "exact.txt", max_chars=5)

    assert result.text.startswith("abcde\n" + MARKER)
    assert "line 1 was cut after 5 characters" in result.text
    assert result.next_offset == 2


def test_huge_lines_are_streamed_not_loaded(root: ResultsRoot, results: Path) -> None:
    with (results / "big.log").open("wb") as out:
        out.write(b"y" * (24 * 1024 * 1024) + b"\nsecond line\n")

    tracemalloc.start()
    try:
        head = read(root, "big.log", max_chars=1000)
        second = read(root, "big.log", max_chars=1000, offset=2)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert "line 1 was cut after 1,000 characters" in head.text
    assert "more lines may follow: continue with offset=2" in head.text  # too big to count cheaply
    assert (second.text, second.next_offset) == ("second line\n", None)
    assert peak < 2 * 1024 * 1024


# --------------------------------------------------------------------------------------------- bad requests
@pytest.mark.parametrize(
    ("data", "offset", "said"),
    [
        ("a\nb\nc\n", 4, "which has 3 lines"),
        ("a\nb\nc\n", 99, "which has 3 lines"),
        ("a\nb", 3, "which has 2 lines"),
        ("only\n", 2, "which has 1 line"),
        ("", 2, "which is empty (0 lines)"),
    ],
)
def test_an_offset_past_the_end_names_the_line_count(
    root: ResultsRoot, results: Path, data: str, offset: int, said: str
) -> None:
    plant(results, "short.txt", data)

    expected = f"read_file: offset={offset} is past the end of /mnt/results/short.txt, {said}"
    with pytest.raises(InvalidToolArguments, match=f"^{re.escape(expected)}$"):
        read(root, "short.txt", offset=offset)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ({"path": "a.txt", "offset": 0}, "offset"),
        ({"path": "a.txt", "limit": 0}, "limit"),
        ({"path": "a.txt", "lines": 5}, "lines"),
        ({"offset": 1}, "path"),
        ({"path": 7}, "path"),
    ],
)
def test_bad_arguments_name_the_field(root: ResultsRoot, results: Path, args: dict[str, object], field: str) -> None:
    plant(results, "a.txt", "a\n")

    with pytest.raises(InvalidToolArguments, match=rf"read_file: {field}: "):
        read_file(root, args, max_file_bytes=QUOTA)


def test_a_binary_file_is_refused_with_advice(root: ResultsRoot, results: Path) -> None:
    plant(results, "chart.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + b"\x00" * 100)

    with pytest.raises(UnsafeFileType, match=r"looks binary \(116 bytes.*use run_python to inspect it"):
        read(root, "chart.png")


# ------------------------------------------------------------------------------------------ hostile folder
def test_links_fifos_folders_and_outside_paths_are_refused(root: ResultsRoot, results: Path, tmp_path: Path) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("host-only secret\n")
    (results / "link.txt").symlink_to(secret)
    (results / "escape").symlink_to(tmp_path)
    os.link(secret, results / "hard.txt")
    os.mkfifo(results / "pipe")
    (results / "folder").mkdir()
    fds = len(os.listdir("/proc/self/fd"))

    for path in ["link.txt", "escape/shadow", "hard.txt", "pipe", "folder"]:
        with pytest.raises(UnsafeFileType):
            read(root, path)
    for path in ["../shadow", "/etc/passwd", "/mnt/results/../shadow", "a\x00b"]:
        with pytest.raises(PathOutsideResults):
            read(root, path)
    with pytest.raises(PathNotFound):
        read(root, "missing.txt")
    assert len(os.listdir("/proc/self/fd")) == fds


def test_a_file_over_the_byte_cap_is_refused(root: ResultsRoot, results: Path) -> None:
    plant(results, "large.txt", "z" * 1000)

    with pytest.raises(FileTooLarge, match="1000 bytes"):
        read_file(root, {"path": "large.txt"}, max_file_bytes=999)
    assert read_file(root, {"path": "large.txt"}, max_file_bytes=1000).bytes == 1000


def test_a_file_that_grows_while_read_is_read_no_further_than_the_cap(results: Path) -> None:
    grown = plant(results, "grown.txt", "line\n" * 100)  # 500 bytes, as if it had grown after a check at 100

    with io.FileIO(grown, "r") as file:
        capped = CappedReader(file, 100, "/mnt/results/grown.txt")
        reader = io.BufferedReader(capped)
        with pytest.raises(FileTooLarge, match="grew past the cap of 100 bytes"):
            reader.read()


# ------------------------------------------------------------------------------------------ the tool itself
def test_the_description_tells_a_model_how_to_use_the_tool() -> None:
    description = read_file_description(Policy())
    sentences = [s for s in description.split(". ") if s]
    assert 2 <= len(sentences) <= 4
    for phrase in ["results folder", "offset", "limit", "500,000 characters", "export_table", "render_table"]:
        assert phrase in description
    assert ACCEPTED_FORMATS in description  # the table formats the table tools read, and only those
    schema = ReadFileArgs.model_json_schema()
    assert set(schema["properties"]) == {"path", "offset", "limit"}
    assert schema["required"] == ["path"]
    assert schema["additionalProperties"] is False


def test_arguments_may_be_passed_as_a_model(root: ResultsRoot, results: Path) -> None:
    plant(results, "a.txt", "1\n2\n3\n")

    result = read_file(root, ReadFileArgs(path="a.txt", offset=2, limit=1), max_chars=10, max_file_bytes=QUOTA)

    assert content_of(result) == "2\n"
    assert result.next_offset == 3
