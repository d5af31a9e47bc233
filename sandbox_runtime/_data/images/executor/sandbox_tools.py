"""Call the host's tools from a script, like functions: the data goes from tool to tool without the model.

    import sandbox_tools as tools

    print(tools.list_tools())                       # what this run may call, one line each
    found = tools.sql_query(query="SELECT title, body FROM reports")
    for row in found.rows():                        # inline or from the file the host saved: the same rows
        tools.tracker__create_issue(title=row["title"], body=row["body"])   # approved and recorded
    help(tools.tracker__create_issue)                # its arguments, from the tool's JSON Schema

Every call goes through the host's pipeline, as a model's call does: its arguments are checked against the tool's
schema, the policy may ask the user to approve it (showing the real arguments), it is recorded (naming this run),
and a large result is saved to a file whose path you get (``result.path``) instead of the whole text. The host
decides which tools a run may call (``script_tools.allowed`` in its policy) and how many calls, how many bytes
of arguments and how much time a run may spend on them; past a limit a call raises :class:`ToolLimitExceeded`.

A call that fails raises a :class:`ToolError` (or one of its kinds below) carrying the short message and, when
the host saved the full error, its path; ``call(..., check=False)`` returns a failed tool's result instead (its
``is_error`` set). The calls travel over a pipe the sandbox's executor gave this process: there is no network.
Only the run's own process can call tools (not a subprocess it starts); calls from threads take turns.

Spans, for the host's traces (OpenTelemetry), over the same pipe::

    with tools.span("load workbook", path=path) as step:   # a child of the run's span on the host
        book = openpyxl.load_workbook(path)
        step.set_attribute("sheets", len(book.sheetnames))
        tools.event("workbook loaded")                      # an event of the innermost open span
        tools.sql_query(query="...")                        # the call's own span is a child of this one

A span never fails the script: while the host records no traces, past the run's limits, or outside a run, it does
nothing. The host stamps the times and checks every name and value (strings, numbers, booleans, lists of them).
"""

from __future__ import annotations

import inspect
import json
import keyword
import math
import os
import threading

__all__ = [
    "ToolArgumentsInvalid",
    "ToolCallFailed",
    "ToolDenied",
    "ToolError",
    "ToolInfo",
    "ToolLimitExceeded",
    "ToolNotAllowed",
    "ToolResult",
    "ToolsUnavailable",
    "call",
    "event",
    "list_tools",
    "span",
]

_READ_CHUNK = 65536
_TABLE_SUFFIX = ".table.jsonl"  # a table the host saved: a header line, then one JSON array per row
# "channel": (calls out, replies in, pid), set by the executor in the run's process; "catalog": the tools of
# this run by name, once asked
# "tracing": False once the host said it records no traces (or there is no channel); "full": once the run's spans
# reached the host's limit (open spans still end)
_state = {"channel": None, "catalog": None, "tracing": True, "full": False}
_lock = threading.Lock()
_numbers = iter(range(1, 1 << 62))
_span_numbers = iter(range(1, 1 << 62))
_open_spans = threading.local()  # .numbers: the spans this thread opened and has not ended, innermost last


class ToolError(Exception):
    """A tool call that did not give a result: ``message`` says why, ``error_path`` (when set) holds the full
    error, ``call_id`` names the call in the host's record."""

    def __init__(self, message, *, tool=None, error_path=None, call_id=None):
        super().__init__(message)
        self.message, self.tool, self.error_path, self.call_id = message, tool, error_path, call_id


class ToolCallFailed(ToolError):
    """The tool ran and failed (its result has ``is_error``)."""


class ToolArgumentsInvalid(ToolCallFailed):
    """The arguments do not fit the tool's schema (or are not JSON); nothing was called."""


class ToolDenied(ToolError):
    """The policy or the user refused the call; nothing was called. Do not retry it unchanged."""


class ToolNotAllowed(ToolError):
    """The policy does not let scripts call this tool (or it does not exist); nothing was called."""


class ToolLimitExceeded(ToolError):
    """The run made as many calls, or spent as much time on calls, as the policy allows; or the arguments are
    larger than one call may send. Nothing was called."""


class ToolsUnavailable(ToolError):
    """This process cannot call tools: it is not the run's own process, or the host ended the channel."""


_KINDS = {
    "failed": ToolCallFailed,
    "invalid_arguments": ToolArgumentsInvalid,
    "denied": ToolDenied,
    "not_allowed": ToolNotAllowed,
    "limit": ToolLimitExceeded,
    "unavailable": ToolsUnavailable,
}


class ToolResult:
    """What a call gave back: ``text`` is what a model would have read (for a large result, its start and the
    file's path), ``path`` the file that holds the whole result when the host saved one (else None),
    ``descriptor`` that file's description (format, bytes, rows and columns of a table)."""

    def __init__(self, tool, call_id, text, descriptor, is_error, error_path):
        self.tool, self.call_id, self.text = tool, call_id, text
        self.descriptor, self.is_error, self.error_path = descriptor, is_error, error_path

    @property
    def path(self):
        return (self.descriptor or {}).get("path")

    def read(self):
        """The whole result as text: the saved file when there is one, else ``text``."""
        if self.path is None:
            return self.text
        with open(_here(self.path), encoding="utf-8") as handle:
            return handle.read()

    def json(self):
        """The whole result parsed as JSON (a saved table: its rows, as :meth:`rows` gives them)."""
        if (self.path or "").endswith(_TABLE_SUFFIX):
            return self.rows()
        return json.loads(self.read())

    def rows(self):
        """A table result's rows as dicts (column name to value), whether it came inline or as a file: a query's
        rows, a JSON array of objects, or ``{"columns": [...], "rows": [[...]]}``."""
        if (self.path or "").endswith(_TABLE_SUFFIX):
            with open(_here(self.path), encoding="utf-8") as handle:
                columns = json.loads(handle.readline())["columns"]
                return [dict(zip(columns, json.loads(line), strict=True)) for line in handle if line.strip()]
        value = json.loads(self.read())
        if isinstance(value, dict) and isinstance(value.get("columns"), list) and isinstance(value.get("rows"), list):
            return [dict(zip(value["columns"], row, strict=True)) for row in value["rows"]]
        if isinstance(value, list) and all(isinstance(row, dict) for row in value):
            return value
        raise ValueError(f"the result of {self.tool} is not a table")

    def __repr__(self):
        where = f", path={self.path!r}" if self.path else ""
        return f"ToolResult(tool={self.tool!r}, call_id={self.call_id!r}, is_error={self.is_error}{where})"

    def __str__(self):
        return self.text


class ToolInfo:
    """One tool a run may call: its name, the Python name of its function, its description and JSON Schema."""

    def __init__(self, name, description, schema):
        self.name, self.description, self.schema = name, description, schema
        self.function = _python_name(name)

    def __repr__(self):
        return f"ToolInfo({self.name!r})"

    def __str__(self):
        first = (self.description or "").strip().split("\n", 1)[0]
        shown = self.function if self.function == self.name else f"{self.function} ({self.name})"
        return f"{shown}({', '.join(_parameters(self.schema))}): {first}"


class _Catalog(list):
    def __str__(self):
        return "\n".join(str(info) for info in self) or "(no tools may be called from this run)"


def _here(path):
    """A path in the results folder, as the host names it (the sandbox's path), where this process finds it: the
    same path in a sandbox; under the fake backend, which runs the code on the host, the host folder
    (``SANDBOX_RESULTS``) that stands for the sandbox's path (``SANDBOX_RESULTS_MOUNT``, set by that backend only)."""
    mount, folder = os.environ.get("SANDBOX_RESULTS_MOUNT"), os.environ.get("SANDBOX_RESULTS")
    if mount and folder and (path == mount or path.startswith(mount.rstrip("/") + "/")):
        return folder + path[len(mount.rstrip("/")) :]
    return path


def _connect(calls_fd, replies_fd):
    """Called by the sandbox's executor in the run's process, before the script starts."""
    _state["channel"] = (calls_fd, replies_fd, os.getpid())
    _state["tracing"], _state["full"] = True, False


def _exchange(request):
    """Send one request, wait for its reply (a dict)."""
    channel = _state["channel"]
    if channel is None or channel[2] != os.getpid():
        raise ToolsUnavailable(
            "tool calls are available only in the process of a run_python run (not in a process it starts, "
            "nor outside the sandbox's executor)"
        )
    calls_fd, replies_fd, _pid = channel
    with _lock:
        request["id"] = next(_numbers)
        try:
            line = json.dumps(request, ensure_ascii=False, allow_nan=False).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError, RecursionError) as exc:
            raise ToolArgumentsInvalid(
                f"the arguments of {request.get('tool')} are not JSON: {exc}", tool=request.get("tool")
            ) from None
        data = memoryview(line + b"\n")
        try:
            while data:
                data = data[os.write(calls_fd, data) :]
            reply = _read_line(replies_fd)
        except OSError as exc:
            raise ToolsUnavailable(f"the channel to the host is closed ({exc})") from None
    if reply.get("id") not in (request["id"], None):  # None: a line too long to be read
        raise ToolsUnavailable("the host's reply does not answer this call")
    return reply


def _read_line(fd):
    data = b""
    while not data.endswith(b"\n"):
        chunk = os.read(fd, _READ_CHUNK)
        if not chunk:
            raise OSError("the host ended the channel")
        data += chunk
    return json.loads(data)


def _raise(reply, tool):
    kind = _KINDS.get(reply.get("error"), ToolError)
    raise kind(
        reply.get("message") or "the call failed",
        tool=tool,
        error_path=reply.get("error_path"),
        call_id=reply.get("call_id"),
    )


def call(tool, arguments=None, /, *, check=True, **keyword_arguments):
    """Call ``tool`` with ``arguments`` (a dict) and/or keyword arguments; its :class:`ToolResult`.

    A failed call raises a :class:`ToolError`; with ``check=False`` a tool that ran and failed returns its
    result (``is_error`` set, ``error_path`` naming the full error) instead of raising."""
    merged = dict(arguments or {})
    merged.update(keyword_arguments)
    reply = _exchange({"op": "call", "tool": tool, "arguments": merged, "span": _innermost()})
    failed = not reply.get("ok")
    if failed and not (reply.get("error") == "failed" and not check):
        _raise(reply, tool)
    return ToolResult(
        tool,
        reply.get("call_id"),
        reply.get("text", reply.get("message", "")),
        reply.get("descriptor"),
        failed,
        reply.get("error_path"),
    )


class _Span:
    """One span of the run (see :func:`span`)."""

    def __init__(self, name, attributes):
        self.name, self.number = str(name), None
        self._attributes, self._late = attributes, {}

    def set_attribute(self, key, value):
        """Set an attribute, sent when the span ends."""
        self._late[str(key)] = value

    def event(self, name, **attributes):
        """An event of this span (of the run's when this one was not taken)."""
        _new_event(self.number, name, attributes)

    def __enter__(self):
        if _state["full"]:
            return self
        number = next(_span_numbers)
        opened = _opened()
        reply = _traced(
            {
                "op": "span",
                "phase": "start",
                "span": number,
                "parent": opened[-1] if opened else None,
                "name": self.name,
                "attributes": _plain(self._attributes),
            }
        )
        if reply.get("ok"):
            self.number = number
            opened.append(number)
        return self

    def __exit__(self, kind, error, traceback):
        if self.number is None:
            return False
        opened = _opened()
        if self.number in opened:
            opened.remove(self.number)
        failure = None if kind is None else f"{kind.__name__}: {error}"
        _traced({"op": "span", "phase": "end", "span": self.number, "attributes": _plain(self._late), "error": failure})
        return False

    def __repr__(self):
        return f"<span {self.name!r}>"


def span(name, **attributes):
    """A span of this run's trace, for a ``with`` block: a child of the run's span on the host (or of the
    innermost span open in this thread). ``attributes``: strings, numbers, booleans or lists of them."""
    return _Span(name, attributes)


def event(name, **attributes):
    """An event of the innermost span open in this thread (else of the run's span)."""
    _new_event(_innermost(), name, attributes)


def _new_event(number, name, attributes):
    if not _state["full"]:
        _traced({"op": "event", "span": number, "name": str(name), "attributes": _plain(attributes)})


def _opened():
    numbers = getattr(_open_spans, "numbers", None)
    if numbers is None:
        numbers = _open_spans.numbers = []
    return numbers


def _innermost():
    opened = getattr(_open_spans, "numbers", None)
    return opened[-1] if opened else None


def _traced(request):
    """Send a span's or an event's request; its reply, or {} when it could not go (never raises)."""
    if not _state["tracing"]:
        return {}
    try:
        reply = _exchange(request)
    except ToolError:  # no channel (outside a run, or a process the run started), or it closed
        _state["tracing"] = False
        return {}
    if reply.get("error") == "off":
        _state["tracing"] = False  # the host records no traces: nothing more is sent
    elif reply.get("error") == "limit":
        _state["full"] = True  # no more spans or events: only the ends of those open
    return reply


def _plain(attributes):
    """Attribute values as JSON can carry them: strings, finite numbers, booleans, lists of them; else text."""
    plain = {}
    for key, value in attributes.items():
        if isinstance(value, (list, tuple)):
            plain[str(key)] = [_scalar(item) for item in value[:64]]
        else:
            plain[str(key)] = _scalar(value)
    return plain


def _scalar(value):
    if isinstance(value, str):
        return value[:1024]
    if isinstance(value, (bool, int)) or (isinstance(value, float) and math.isfinite(value)):
        return value
    return str(value)[:1024]


def list_tools():
    """The tools this run may call (``print()`` it for one line each; ``help(sandbox_tools.<name>)`` for one)."""
    return _Catalog(_tools().values())


def _tools():
    if _state["catalog"] is None:
        reply = _exchange({"op": "list"})
        if not reply.get("ok"):
            _raise(reply, None)
        found = {}
        for entry in reply.get("tools", []):
            info = ToolInfo(entry["name"], entry.get("description") or "", entry.get("input_schema") or {})
            found[info.name] = info
        _state["catalog"] = found
    return _state["catalog"]


def _python_name(name):
    cleaned = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
    if not cleaned or cleaned[0].isdigit() or keyword.iskeyword(cleaned):
        cleaned = "_" + cleaned
    return cleaned


def _type_of(spec):
    """A short name of a JSON Schema's type: ``string``, ``integer|null``, ``"a"|"b"``, ``any``."""
    if not isinstance(spec, dict):
        return "any"
    if "enum" in spec and isinstance(spec["enum"], list):
        return "|".join(json.dumps(value) for value in spec["enum"][:8])
    kind = spec.get("type")
    if isinstance(kind, list):
        return "|".join(map(str, kind))
    if isinstance(kind, str):
        return f"{kind}[{_type_of(spec['items'])}]" if kind == "array" and "items" in spec else kind
    for key in ("anyOf", "oneOf"):
        if isinstance(spec.get(key), list):
            return "|".join(_type_of(option) for option in spec[key])
    return "any"


def _parameters(schema):
    required = set(schema.get("required") or ())
    return [
        f"{name}: {_type_of(spec)}" + ("" if name in required else " = ...")
        for name, spec in (schema.get("properties") or {}).items()
    ]


class _Unset:
    def __repr__(self):
        return "<not sent>"


_UNSET = _Unset()


def _function(info):
    def tool_function(**arguments):
        return call(info.name, {k: v for k, v in arguments.items() if v is not _UNSET})

    schema = info.schema
    required = set(schema.get("required") or ())
    parameters, lines = [], []
    for name, raw in (schema.get("properties") or {}).items():
        spec = raw if isinstance(raw, dict) else {}
        if name.isidentifier() and not keyword.iskeyword(name):
            default = inspect.Parameter.empty if name in required else _UNSET
            parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default))
        need = "required" if name in required else "optional"
        about = " ".join(str(spec.get("description") or "").split())
        lines.append(f"    {name} ({_type_of(spec)}, {need}){': ' + about if about else ''}")
    tool_function.__signature__ = inspect.Signature(sorted(parameters, key=lambda p: p.default is not _UNSET))
    tool_function.__name__ = tool_function.__qualname__ = info.function
    doc = info.description.strip() or f"The tool {info.name}."
    if lines:
        doc += "\n\nArguments:\n" + "\n".join(lines)
    tool_function.__doc__ = (
        doc + f"\n\nReturns a ToolResult; raises a ToolError when the call fails. Tool: {info.name!r}."
    )
    return tool_function


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    for info in _tools().values():
        if info.function == name:
            function = _function(info)
            globals()[name] = function
            return function
    raise AttributeError(
        f"no tool {name!r} may be called from this run; sandbox_tools.list_tools() names those that may"
    )


def __dir__():
    names = list(__all__)
    channel = _state["channel"]
    if channel is not None and channel[2] == os.getpid():
        names += [info.function for info in _tools().values()]
    return sorted(names)
