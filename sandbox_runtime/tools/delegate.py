"""``delegate_call``: call a tool with arguments read from a JSON file, the model's own values laid on top.

For tools that cannot read sandbox files (an upstream MCP tool, a host API): the model names the target tool,
the path of a JSON arguments file in the results folder, and ``overrides`` — the values it writes from its own
judgment. The file is read with a byte cap checked before it is read whole (1 MiB by default: 1,048,576 bytes
are accepted, 1,048,577 refused; links, FIFOs, devices and folders are refused), may be narrowed with a JSON
Pointer after ``#`` (``/mnt/results/spill/search-c1.json#/items/0``), and must hold a JSON object. The
overrides are applied as an RFC 7386 JSON Merge Patch; the dispatch pipeline then validates the merged
arguments against the target's schema, judges them (approval), and calls the target.

Nesting is bounded by the policy's ``tools.json_nesting_max`` (arrays and objects; an arguments object is level 1)
before anything recurses: the overrides, the arguments the file or its pointer selects (a file nested deeper than
the JSON parser goes is refused with its depth too), and — by the pipeline — the merged arguments.
"""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox_runtime.errors import InvalidToolArguments
from sandbox_runtime.policy import Policy
from sandbox_runtime.store.safe_paths import ResultsRoot
from sandbox_runtime.tables.jsonio import loads, nesting_depth, text_nesting_depth

__all__ = [
    "DelegateCallArgs",
    "Expanded",
    "delegate_call_description",
    "expand_delegate_call",
    "merge_patch",
    "resolve_pointer",
]


def delegate_call_description(policy: Policy) -> str:
    """What the model is told of ``delegate_call``, with the policy's results folder."""
    results = policy.sandbox.results_mount_path
    return (
        "Call another tool with its arguments read from a JSON file instead of typed out — for large or exact "
        "values (rows, bodies, call stacks) that must arrive unchanged. Two steps: 1) run_python reads the spilled "
        f"result (its path) and writes the arguments object to a file such as {results}/args/create.json; "
        "2) delegate_call {tool, args_file, overrides} sends it. `overrides` holds the values you decide yourself "
        "(merged over the file as a JSON Merge Patch; null deletes a key). `args_file` may point into a JSON file "
        f"with a JSON Pointer after '#', e.g. {results}/spill/search-c1.json#/items/0."
    )


class DelegateCallArgs(BaseModel):
    """Arguments of ``delegate_call``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: str = Field(min_length=1, description="The tool to call.")
    args_file: str = Field(
        min_length=1, description="A JSON file in the results folder holding the arguments object (#pointer ok)."
    )
    overrides: dict[str, Any] | None = Field(
        None, description="Values of your own laid over the file's arguments (JSON Merge Patch)."
    )


class Expanded(BaseModel):
    """The target and the real arguments that will be sent, and where they came from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: str
    arguments: dict[str, Any]
    source: str  # sandbox path, with the pointer when one was given
    file_bytes: int


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, ``null`` removes a key, anything else replaces (a copy is returned).
    Recurses as deep as ``patch`` nests: bound it first (:func:`expand_delegate_call` does)."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def resolve_pointer(document: Any, pointer: str) -> Any:
    """RFC 6901: ``""`` is the whole document; ``/a/0/b~1c`` walks objects and arrays (``~1`` is ``/``)."""
    if pointer == "":
        return document
    if not pointer.startswith("/"):
        raise InvalidToolArguments(f"delegate_call: the JSON Pointer {pointer!r} must start with '/'")
    here = document
    walked = ""
    for raw in pointer[1:].split("/"):
        token = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(here, dict):
            if token not in here:
                keys = ", ".join(list(map(str, here))[:20])
                raise InvalidToolArguments(f"delegate_call: no key {token!r} at {walked or '/'}; keys there: {keys}")
            here = here[token]
        elif isinstance(here, list):
            if not token.isdigit() or (len(token) > 1 and token.startswith("0")) or int(token) >= len(here):
                raise InvalidToolArguments(
                    f"delegate_call: {token!r} is not an index of the {len(here):,}-item array at {walked or '/'}"
                )
            here = here[int(token)]
        else:
            raise InvalidToolArguments(f"delegate_call: {walked or '/'} is a {type(here).__name__}, not a container")
        walked += "/" + raw
    return here


def expand_delegate_call(root: ResultsRoot, args: DelegateCallArgs, *, max_bytes: int, nesting_max: int) -> Expanded:
    """Read the arguments file (capped at ``max_bytes``), select the pointer, and lay the overrides on top; the
    overrides and the selected arguments may nest at most ``nesting_max`` levels (the object itself is level 1)."""
    path, _hash, pointer = args.args_file.partition("#")
    overrides_depth = nesting_depth(args.overrides)
    if overrides_depth > nesting_max:
        raise InvalidToolArguments(
            f"delegate_call: `overrides` nest {overrides_depth:,} levels deep, more than tools.json_nesting_max = "
            f"{nesting_max} allows; send flatter values"
        )
    data = root.read_bytes(path, max_bytes=max_bytes)
    shown = root.sandbox_path(root.parse(path))
    where = f"{shown}#{pointer}" if pointer else shown
    try:
        document = loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise InvalidToolArguments(f"delegate_call: {shown} is not UTF-8 text (byte {exc.start})") from exc
    except ValueError as exc:
        depth = text_nesting_depth(data)
        if depth > nesting_max:  # valid or not, too deep to parse: say how deep
            raise _too_deep(shown, depth, nesting_max) from exc
        raise InvalidToolArguments(f"delegate_call: {shown} is not valid JSON: {exc}") from exc
    selected = resolve_pointer(document, pointer)
    if not isinstance(selected, dict):
        raise InvalidToolArguments(
            f"delegate_call: {where} holds a JSON {type(selected).__name__}, not an object of arguments; write "
            f'{{"argument_name": value, ...}} to the file (or point into it with #/path)'
        )
    depth = nesting_depth(selected)
    if depth > nesting_max:
        raise _too_deep(where, depth, nesting_max)
    arguments = merge_patch(selected, args.overrides) if args.overrides else selected
    return Expanded(tool=args.tool, arguments=arguments, source=where, file_bytes=len(data))


def _too_deep(where: str, depth: int, nesting_max: int) -> InvalidToolArguments:
    return InvalidToolArguments(
        f"delegate_call: the arguments in {where} nest arrays and objects {depth:,} levels deep, more than "
        f"tools.json_nesting_max = {nesting_max} allows (the arguments object is level 1); write flatter arguments"
    )
