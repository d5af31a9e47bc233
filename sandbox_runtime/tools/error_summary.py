"""Turn the stderr of a failed script into the short message the model sees.

The host keeps the complete stderr in a file; the model gets the exception line, the innermost frame of
its *own* files (under one of the user path prefixes, never openpyxl, docx, pptx or stdlib frames) and the
error file's path. Understood: plain, chained and exception-group tracebacks, folded recursion, the
SyntaxError family, ``SystemExit("message")``, multi-line messages, noise before the traceback,
``Fatal Python error`` stacks, deaths by signal and empty output. Pure functions: no file is read.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

__all__ = ["FailureSummary", "Frame", "summarize_failure"]

_TB_HEADER = "Traceback (most recent call last):"
_GROUP_HEADER = "Exception Group Traceback (most recent call last):"
_GROUP_HEADER_RE = re.compile(r"( *)\+ Exception Group Traceback \(most recent call last\):$")
_GROUP_SEP_RE = re.compile(r"( *)\+(-\+)?-+(?: (?:\d+|\.\.\.) -+)?$")
_GROUP_PIPE_RE = re.compile(r"( *)\|(?: (.*))?$")
_FRAME_RE = re.compile(r'\s*File "(?P<file>[^"]*)", line (?P<line>\d+)(?:,? in (?P<func>.+))?$')
_EXC_RE = re.compile(r"(?P<type>[A-Za-z_][\w.]*)(?::|$)")
_CARET_RE = re.compile(r"\s*[~^]+\s*$")
_FAULT_THREAD_RE = re.compile(r"(Current thread|Thread) 0x[0-9a-fA-F]+ .*\(most recent call first\):$")
_STDLIB_RE = re.compile(r"/python3\.\d+/(?!site-packages/|dist-packages/)(.+)$")
_CHAIN_PREFIXES = ("During handling of the above exception", "The above exception was the direct cause")
_FATAL = "Fatal Python error: "
_SIGNAL_HINTS = {9: "often the memory limit", 11: "a crash in native code", 24: "the CPU time limit"}
_MIN_EXCEPTION_CHARS = 60
# the start of the exception line no cut ever takes: its class name, whole, and this much of its message
_MESSAGE_START_CHARS = 40
_CUT_MARKER_MAX_CHARS = len(" …[999,999,999,999 chars cut]… ")
_CUT_TAIL_MIN_CHARS = 12  # beside a user frame, the exception line keeps at least this much of its end
_FAULT_PATH_MAX_CHARS = 500  # faulthandler prints at most this much of a file name, then "..."
_MAX_SOURCE_CHARS = 240
_MIN_MAX_CHARS = 160


@dataclass(frozen=True, slots=True)
class Frame:
    """One traceback frame: ``function`` is None for SyntaxError reports, ``source`` when not printed."""

    file: str
    line: int
    function: str | None
    source: str | None


@dataclass(frozen=True, slots=True)
class FailureSummary:
    """What went wrong, where in the user's script, and the short model-facing ``message``.

    ``exception_line`` is the Python exception line (for a group: the group's line and its first
    sub-exception), a ``Fatal Python error`` line, the last stderr line when there is no traceback,
    ``Killed by signal N (NAME)`` for a silent death by signal, or "" when stderr is empty.
    """

    exception_line: str
    exception_type: str | None
    user_frame: Frame | None
    message: str
    library_frame: Frame | None = None
    signal_number: int | None = None

    def exception_message(self, max_chars: int) -> str:
        """The exception's message without its class name, cut in its middle past ``max_chars``; for no Python
        exception, the line that says how the run ended."""
        line = self.exception_line
        if self.exception_type and line.startswith(self.exception_type):
            line = line[len(self.exception_type) :].removeprefix(":").strip()
        return _cut_middle(line, max_chars)


@dataclass(slots=True, eq=False)
class _Block:
    """One traceback (or faulthandler stack) as parsed; ``indent`` is its exception-group depth."""

    indent: int
    group: bool = False
    fault: bool = False
    frames: list[Frame] = field(default_factory=list)
    exc: str | None = None

    def ordered(self) -> list[Frame]:
        """Frames outermost first (faulthandler prints them innermost first)."""
        return self.frames[::-1] if self.fault else self.frames

    def is_group(self) -> bool:
        return self.group or (self.exc is not None and _exc_type(self.exc).endswith("ExceptionGroup"))


_Sep = tuple[int, bool]  # a group separator: its indent, and whether it is the "+-+" opening a list


def _exc_type(line: str) -> str:
    match = _EXC_RE.match(line)
    return match["type"] if match else ""


class _Parser:
    """A line-by-line state machine: ``idle`` → ``frames`` → ``message`` (``sep`` after a group separator)."""

    def __init__(self) -> None:
        self.items: list[_Block | _Sep] = []  # tracebacks and exception-group separator lines
        self.fatal: str | None = None
        self.cur = _Block(0)
        self.state = "idle"
        self.awaiting_source = False
        self.group_mode = False

    def _unwrap(self, raw: str) -> tuple[int, str] | None:
        """Strip exception-group decoration: (group indent, text), or None for a separator line."""
        if match := _GROUP_HEADER_RE.match(raw):
            self.group_mode = True
            return len(match[1]), _GROUP_HEADER
        if not self.group_mode:
            return 0, raw
        if match := _GROUP_SEP_RE.match(raw):
            self.items.append((len(match[1]), match[2] is not None))
            self.state = "sep"
            return None
        if match := _GROUP_PIPE_RE.match(raw):
            return len(match[1]), match[2] or ""
        return 0, raw

    def _open(self, block: _Block, state: str) -> None:
        self.cur = block
        self.items.append(block)
        self.state, self.awaiting_source = state, False

    def feed(self, raw: str) -> None:
        """Consume one stderr line."""
        unwrapped = self._unwrap(raw)
        if unwrapped is None:
            return
        indent, text = unwrapped
        flush = bool(text) and not text[0].isspace()
        if text in (_TB_HEADER, _GROUP_HEADER):
            self._open(_Block(indent, group=text == _GROUP_HEADER), "frames")
        elif text.startswith(_FATAL):
            self.fatal = self.fatal or text.strip()
            self.state = "idle"
        elif _FAULT_THREAD_RE.match(text):
            self._open(_Block(indent, fault=True), "frames")
        elif self.state in ("idle", "frames") and (match := _FRAME_RE.match(text)):
            if self.state == "idle":  # a SyntaxError report has no "Traceback" header
                self._open(_Block(indent), "frames")
            self.cur.frames.append(Frame(match["file"], int(match["line"]), match["func"], None))
            self.awaiting_source = not self.cur.fault
        elif self.state == "frames":
            self._frame_detail(text, flush)
        elif self.state == "sep" and flush and _EXC_RE.match(text):
            self._open(_Block(indent, exc=text.rstrip()), "message")  # a sub-exception never raised
        elif self.state == "message" and text.startswith(_CHAIN_PREFIXES):
            self.state = "idle"

    def _frame_detail(self, text: str, flush: bool) -> None:
        """A line after a ``File`` line: its source, a caret line, or the exception line."""
        if self.cur.fault:
            self.state = "idle"
        elif self.awaiting_source and not flush and text.strip() and not _CARET_RE.match(text):
            if not text.strip().startswith("[Previous line repeated"):
                self.cur.frames[-1] = replace(self.cur.frames[-1], source=text.strip())
            self.awaiting_source = False
        elif flush and _EXC_RE.match(text):
            self.cur.exc, self.state = text.rstrip(), "message"


def _first_sub(items: list[_Block | _Sep], group: _Block) -> tuple[_Block | None, list[_Block]]:
    """The first sub-exception of ``group`` and every block printed inside it."""
    start = next(i for i, item in enumerate(items) if item is group) + 1
    if start >= len(items) or isinstance(items[start], _Block):
        return None, []
    child = group.indent + 2
    inside: list[_Block] = []
    for item in items[start + 1 :]:
        if isinstance(item, _Block):
            inside.append(item)
        elif item == (child, False):
            break
    own = [b for b in inside if b.indent == child and b.exc is not None]
    return (own[-1] if own else None), inside


def _is_user(path: str, prefixes: Sequence[str]) -> bool:
    if len(path) == _FAULT_PATH_MAX_CHARS + 3 and path.endswith("..."):  # faulthandler cut a long file name
        seen = path[:-3]
        return any(prefix and (seen.startswith(prefix) or prefix.startswith(seen)) for prefix in prefixes)
    for prefix in prefixes:
        norm = prefix.rstrip("/") or "/"
        if prefix and (path == norm or path.startswith(norm if norm.endswith("/") else norm + "/")):
            return True
    return False


def _short_path(path: str) -> str:
    for marker in ("site-packages/", "dist-packages/"):
        if (i := path.rfind(marker)) >= 0:
            return path[i + len(marker) :]
    match = _STDLIB_RE.search(path)
    return match[1] if match else path


def _signal_of(exit_code: int | None, by_signal: bool | None) -> int | None:
    if exit_code is None or by_signal is False:
        return None
    if exit_code < 0:
        return -exit_code
    return exit_code - 128 if 128 < exit_code <= 128 + 64 else None


def _signal_text(number: int, *, hint: bool = False) -> str:
    try:
        name = f" ({signal.Signals(number).name})"
    except ValueError:
        name = ""
    why = _SIGNAL_HINTS.get(number) if hint else None
    return f"signal {number}{name}" + (f", {why}" if why else "")


def _count(n: int, unit: str) -> str:
    return f"{n:,} {unit}" + ("" if n == 1 else "s")


def _cut_middle(text: str, limit: int, head_min: int = 0) -> str:
    """Shorten ``text`` to at most ``limit`` characters, cutting its middle and saying how much went; the first
    ``head_min`` characters are never cut (with no room for both ends, the head is what stays)."""
    if len(text) <= limit:
        return text
    widest = f" …[{len(text):,} chars cut]… "
    keep = limit - len(widest)
    if keep < max(20, head_min):
        return text[: max(limit - 1, 0)] + "…" if limit > 0 else ""
    head = max(keep * 2 // 3, head_min)
    marker = f" …[{len(text) - keep:,} chars cut]… "
    return text[:head] + marker + text[len(text) - (keep - head) :]


def _fit(
    first: tuple[str, str, str],
    frames: list[list[str]],
    extra: list[str],
    tails: list[str],
    limit: int,
    head: int,
) -> str:
    """Assemble the message, dropping and cutting parts in priority order until it fits ``limit``; the first
    ``head`` characters of the exception line are never cut while the budget holds them at all."""
    prefix, exc, suffix = first
    floor = min(len(exc), max(_MIN_EXCEPTION_CHARS, limit // 4, head + _CUT_MARKER_MAX_CHARS + _CUT_TAIL_MIN_CHARS))
    # Optional lines stay only beside a whole exception line; the user frame (whose path may be of any length)
    # may share the room with a cut exception line that keeps at least ``floor`` characters, its head whole;
    # then only the short tail is left, so what stays of the exception line never depends on a path.
    options = [(tails[0], frames[0] + extra, len(exc))] + [(tails[0], body, floor) for body in frames]
    for tail, body, needed in [*options, (tails[-1], [], -limit)]:
        room = limit - len("\n".join([prefix + suffix, *body, tail]))
        if room >= needed:
            break
    return "\n".join([prefix + _cut_middle(exc, max(room, 40), head) + suffix, *body, tail])


def _locate(lines: Sequence[str], prefixes: Sequence[str]) -> tuple[str, str | None, Frame | None, Frame | None]:
    """The exception line, its type, the user frame and the innermost frame when it is not the user's."""
    parser = _Parser()
    for raw in lines:
        parser.feed(raw)
    items = parser.items
    blocks = [item for item in items if isinstance(item, _Block)]
    raised = [b for b in blocks if b.exc is not None and not b.fault]
    top = [b for b in raised if b.indent <= 2] or raised
    candidates: list[_Block] = []  # where to look for frames, most relevant first
    exception_line, exception_type = "", None
    final = top[-1] if top else None
    if final is not None and final.exc is not None:
        exception_line, exception_type = final.exc, _exc_type(final.exc)
        nested: list[_Block] = []  # first sub-exception, its first sub-exception, ... down to a leaf
        sub, inside = _first_sub(items, final) if final.is_group() else (None, [])
        while sub is not None and sub not in nested:
            nested.append(sub)
            sub = _first_sub(items, sub)[0] if sub.is_group() else None
        if nested and nested[-1].exc is not None:
            exception_line += f"; first sub-exception: {nested[-1].exc}"
        candidates += [*reversed(nested), *reversed(inside)]
        candidates += [final, *reversed(blocks[: blocks.index(final)])]
    candidates += [b for b in blocks if b.fault] if final else blocks[::-1]  # a cut-off traceback too
    if parser.fatal is not None:
        exception_line, exception_type = parser.fatal, None
    user_frame = next((f for b in candidates for f in reversed(b.ordered()) if _is_user(f.file, prefixes)), None)
    innermost = next((b.ordered()[-1] for b in candidates if b.frames), None)
    return exception_line, exception_type, user_frame, innermost if innermost != user_frame else None


def _first_line(exception_line: str, exit_code: int | None, sig: int | None, last: str) -> tuple[str, str, str]:
    """The message's first line as (prefix, the cuttable exception line, suffix)."""
    code = f"exit code {exit_code}"
    if exception_line:
        if exit_code is None:
            prefix = "Script failed: "
        elif sig is not None:
            prefix = f"Script failed ({code}, killed by {_signal_text(sig)}): "
        elif exit_code == 0:
            prefix = "Script exited with code 0 but reported an error: "
        else:
            prefix = f"Script failed ({code}): "
        return prefix, exception_line, ""
    if sig is not None:
        return (
            f"Script failed ({code}): ",
            f"Killed by {_signal_text(sig, hint=True)}",
            " (no Python exception was reported).",
        )
    if last:
        where = "failed" if exit_code is None else f"exited with code {exit_code}"
        return f"Script {where} without a traceback: ", last, ""
    what = {None: "failed", 0: "exited with code 0"}.get(exit_code, f"failed ({code})")
    return f"Script {what} and wrote nothing to stderr.", "", ""


def _head_chars(exception_line: str, exception_type: str | None) -> int:
    """How much of the exception line no cut takes: the class name and the start of the message."""
    name = len(exception_type) + 2 if exception_type and exception_line.startswith(exception_type) else 0
    return min(len(exception_line), name + _MESSAGE_START_CHARS)


def _frame_line(label: str, frame: Frame, path: str) -> str:
    func = f", in {frame.function}" if frame.function else ""
    return f"  {label} {path}, line {frame.line}{func}"


def summarize_failure(
    stderr: str,
    *,
    exit_code: int | None,
    user_path_prefixes: Sequence[str],
    error_file_path: str,
    max_chars: int = 2000,
    by_signal: bool | None = None,
) -> FailureSummary:
    """Summarize a failed script run for the model.

    ``stderr`` is the complete error output (decoded with ``errors="replace"``), ``exit_code`` the
    process status (negative for a signal, as ``subprocess`` reports it, or 128+N from a shell; ``by_signal``
    says whether a signal ended it when the caller knows, so that a script's own ``exit(137)`` is no SIGKILL),
    ``user_path_prefixes`` the folders holding the user's own files, ``error_file_path`` where the host
    saved the full stderr. The message is at most ``max_chars`` long (at least 160); it always holds the
    exception line and the error-file path, then when room allows the user's frame and the innermost
    library frame. A long exception line is cut in its middle, never within its class name or the first 40
    characters of its message, whatever the length of the paths in the traceback (only a budget too small
    for the prefix, that head and the error-file path cuts the head itself, at its end). Only an error-file
    path too long for the budget can make the message longer.
    """
    if max_chars < _MIN_MAX_CHARS:
        raise ValueError(f"max_chars must be at least {_MIN_MAX_CHARS}, got {max_chars}")
    lines = stderr.splitlines()
    exception_line, exception_type, user, library = _locate(lines, user_path_prefixes)
    sig = _signal_of(exit_code, by_signal)
    last = next((line.strip() for line in reversed(lines) if line.strip()), "")
    first = _first_line(exception_line, exit_code, sig, last)
    extra: list[str] = []
    if library is not None:
        extra.append(_frame_line("raised inside", library, _short_path(library.file)))
    if not exception_line and sig is not None and last:
        extra.append("  last stderr line: " + _cut_middle(last, _MAX_SOURCE_CHARS))
    frames: list[list[str]] = [[]]
    if user is not None:
        where = _frame_line("in your script", user, user.file)
        frames = [[where], []]
        if user.source:
            frames.insert(0, [where, "    " + _cut_middle(user.source, _MAX_SOURCE_CHARS)])
    size = f"{_count(len(stderr), 'character')}, {_count(len(lines), 'line')}"
    tails = [
        f"Full error ({size}): {error_file_path} — read it with read_file.",
        f"Full error: {error_file_path}",
    ]
    return FailureSummary(
        exception_line=exception_line or first[1],
        exception_type=exception_type,
        user_frame=user,
        message=_fit(first, frames, extra, tails, max_chars, _head_chars(first[1], exception_type)),
        library_frame=library,
        signal_number=sig,
    )
