"""Lexical rules for a model-supplied path: what it may look like before anything on disk is touched.

A path is accepted in the in-sandbox absolute form (``/mnt/results/spill/a.json``) or relative to the results
folder (``spill/a.json``); ``.`` and ``a/../b`` are normalised lexically, which is safe because nothing is ever
resolved through a link. Everything malformed, encoded, or outside the folder is a :class:`PathOutsideResults`.
"""

from __future__ import annotations

import re

from sandbox_runtime.errors import PathOutsideResults

__all__ = ["DEFAULT_MOUNT_PATH", "MAX_NAME_BYTES", "MAX_PATH_BYTES", "display_name", "parse_model_path"]

DEFAULT_MOUNT_PATH = "/mnt/results"
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENCODED = re.compile(r"%(?:25)*(?:2e|2f|5c)", re.IGNORECASE)
_UNDISPLAYABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_ACCEPTED = "a path inside the results folder, e.g. 'spill/a.json' or '{mount}/spill/a.json'"


def display_name(name: str) -> str:
    """Escape control characters, bidi marks and undecodable bytes so ``name`` is safe to show."""

    def escape(match: re.Match[str]) -> str:
        code = ord(match.group())
        if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, kept by surrogateescape
            return f"\\x{code - 0xDC00:02x}"
        return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"

    return _UNDISPLAYABLE.sub(escape, name)


def parse_model_path(raw: object, mount: str, *, allow_root: bool = False) -> tuple[str, ...]:
    """Validate a model-supplied path and return its components relative to the results folder.

    Accepts ``{mount}/x/y`` and ``x/y`` / ``./x/y``; ``.`` and ``a/../b`` are normalised lexically. Raises
    :class:`PathOutsideResults` for anything malformed, encoded, or outside the folder.
    """
    text = _require_str(raw)
    accepted = _ACCEPTED.format(mount=mount)

    def reject(problem: str) -> PathOutsideResults:
        shown = display_name(text[:80]) + ("..." if len(text) > 80 else "")
        return PathOutsideResults(f"path '{shown}' {problem}; give {accepted}")

    problem = _text_problem(text)
    if problem is not None:
        raise reject(problem)
    rest = text
    if text.startswith("/"):
        if text != mount and not text.startswith(mount + "/"):
            raise reject(f"is an absolute path outside {mount}")
        rest = text[len(mount) :]
    parts: list[str] = []
    for part in rest.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                raise reject("climbs above the results folder with '..'")
            parts.pop()
            continue
        if len(part.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
            raise reject(f"has a name longer than {MAX_NAME_BYTES} bytes")
        parts.append(part)
    if not parts and not allow_root:
        raise reject("names the results folder itself, not a file in it")
    return tuple(parts)


def _text_problem(text: str) -> str | None:
    """What is wrong with the characters of a path, before it is split; None if nothing."""
    try:
        size = len(text.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:
        size = -1
    checks = (
        (not text.strip(), "is empty"),
        ("\x00" in text, "contains a NUL byte"),
        (_CONTROL.search(text) is not None, "contains a control character"),
        (size < 0, "contains an unpaired surrogate"),
        (size > MAX_PATH_BYTES, f"is {size} bytes long, more than {MAX_PATH_BYTES}"),
        (
            _ENCODED.search(text) is not None,
            "contains a percent-encoded '.', '/' or '\\' (an encoding trick)",
        ),
        ("\\" in text, "contains a backslash; use '/' between folders"),
    )
    return next((problem for bad, problem in checks if bad), None)


def _require_str(value: object) -> str:
    if not isinstance(value, str):
        raise PathOutsideResults(f"a path must be a string, not {type(value).__name__}")
    return value
