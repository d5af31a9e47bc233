"""MkDocs hooks (``hooks:`` in ``mkdocs.yml``): the reference pages' tables are made from the code at build time, so
they cannot drift from it.

A page asks for a table with a marker comment on a line of its own; :func:`on_page_markdown` replaces it:

- ``<!-- generated: policy-keys -->``: every key of :class:`sandbox_runtime.policy.Policy`, found by walking the
  model's fields recursively (nested models become TOML tables, ``dict[str, Model]`` fields ``<name>`` tables), with
  its type, default, unit and description;
- ``<!-- generated: tool-schemas -->``: every built-in tool with its title, annotations and JSON input schema;
- ``<!-- generated: cli-help -->``: the ``--help`` of ``sandbox-runtime`` and of each of its subcommands;
- ``<!-- generated: python-api -->``: a mkdocstrings block for each name of ``sandbox_runtime.__all__``.

The same functions are what ``tests/test_docs_site.py`` checks the built site against.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)

# A key's unit, from the suffix of its name (every limit has its unit in its name).
UNIT_SUFFIXES = (
    ("_bytes", "bytes"),
    ("_mib", "MiB"),
    ("_s", "seconds"),
    ("_ms", "milliseconds"),
    ("_chars", "characters"),
    ("_tokens", "tokens (estimated as characters / 4)"),
    ("_rows", "rows"),
    ("_count", "count"),
    ("_max", "count"),
)


@dataclass(frozen=True)
class PolicyKey:
    """One key of a policy file: the TOML table it is in (``run``, ``spill.tools.<tool>``) and its name."""

    table: str
    name: str
    type: str
    default: str
    unit: str
    description: str

    @property
    def path(self) -> str:
        """The dotted path, e.g. ``run.default_timeout_s``."""
        return f"{self.table}.{self.name}" if self.table else self.name


def _model_in(annotation: Any) -> tuple[type[BaseModel] | None, bool]:
    """The model a field holds, and whether it holds one per name (``dict[str, Model]``)."""
    origin = typing.get_origin(annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, False
    if origin is dict:
        _, value = typing.get_args(annotation)
        if isinstance(value, type) and issubclass(value, BaseModel):
            return value, True
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            model, per_name = _model_in(arg)
            if model is not None:
                return model, per_name
    return None, False


def _type_name(annotation: Any) -> str:  # noqa: PLR0911  (one return per kind of annotation reads best)
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin is typing.Literal:
        return " or ".join(json.dumps(arg) for arg in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(arg) for arg in typing.get_args(annotation))
    if origin is not None:
        args = ", ".join(_type_name(arg) for arg in typing.get_args(annotation))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type):
        return {"str": "string", "int": "integer", "float": "float", "bool": "boolean"}.get(
            annotation.__name__, annotation.__name__
        )
    return str(annotation)


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]  # pydantic's factories here take no argument
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and value >= 1024 and value % 1024 == 0:
        for size, unit in ((1024**4, "TiB"), (1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB")):
            if value % size == 0:
                return f"{value} ({value // size} {unit})"
    return json.dumps(value, ensure_ascii=False)


def _unit(name: str, description: str) -> str:
    for suffix, unit in UNIT_SUFFIXES:
        if name.endswith(suffix):
            return unit
    if name == "cpus":
        return "cores"
    if "in seconds" in description or "seconds" in description.split(".", maxsplit=1)[0]:
        return "seconds"
    return "—"


def policy_keys(model: type[BaseModel] | None = None, table: str = "") -> Iterator[PolicyKey]:
    """Every key of a policy file, depth first in the models' own field order."""
    if model is None:
        from sandbox_runtime.policy import Policy  # noqa: PLC0415  (imported when the site is built, not at load)

        model = Policy
    for name, field in model.model_fields.items():
        nested, per_name = _model_in(field.annotation)
        description = " ".join((field.description or "").split())
        if nested is not None:
            yield from policy_keys(nested, f"{table}.{name}".lstrip(".") + (".<name>" if per_name else ""))
            continue
        yield PolicyKey(
            table=table,
            name=name,
            type=_type_name(field.annotation),
            default=_default(field),
            unit=_unit(name, description),
            description=description,
        )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def policy_table() -> str:
    """The policy reference: one table per TOML table, each key with its type, default, unit and description."""
    from sandbox_runtime.policy import Policy  # noqa: PLC0415  (imported when the site is built, not at load)

    tables: dict[str, list[PolicyKey]] = {}  # in the order each table first appears; a table's keys together
    for key in policy_keys(Policy):
        tables.setdefault(key.table, []).append(key)
    out: list[str] = []
    for table, keys in tables.items():
        title = f"`[{table}]`" if table else "Top level"
        out += [
            "",
            f"### {title}",
            "",
            '<div class="policy-keys" markdown>',  # the stylesheet keeps a key's name on one line
            "",
            "| key | type | default | unit | description |",
            "| --- | --- | --- | --- | --- |",
        ]
        out += [
            f"| `{key.name}` | {_cell(key.type)} | `{_cell(key.default)}` | {key.unit} | {_cell(key.description)} |"
            for key in keys
        ]
        out += ["", "</div>"]
    return "\n".join(out).strip() + "\n"


def tool_schemas() -> str:
    """Every built-in tool (``sql_query`` included, as when a database is named): its title, annotations, what the
    model is told, and its JSON input schema."""
    from sandbox_runtime.policy import load_policy  # noqa: PLC0415  (imported when the site is built)
    from sandbox_runtime.tools.builtin import builtin_tools  # noqa: PLC0415  (imported when the site is built)

    policy = load_policy("default").changed({"sql": {"database_path": "/srv/data/app.sqlite3"}}, "docs")
    out: list[str] = []
    for name, spec in builtin_tools(policy).items():
        hints = ", ".join(f"`{key}: {json.dumps(value)}`" for key, value in sorted((spec.annotations or {}).items()))
        out += [f"### `{name}`", "", f"**{spec.title}**" if spec.title else "", ""]
        if hints:
            out += [f"Annotations: {hints}.", ""]
        if spec.long_running:
            out += ["May run as an MCP task.", ""]
        out += ["What the model is told:", "", "```text", spec.description.strip(), "```", ""]
        out += [
            "Input schema:",
            "",
            "```json",
            json.dumps(spec.input_schema(), indent=2, ensure_ascii=False),
            "```",
            "",
        ]
    return "\n".join(out)


def _parsers(parser: argparse.ArgumentParser, prog: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield prog, parser
    for action in parser._actions:  # argparse keeps its subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            listed = {choice.dest for choice in action._choices_actions}  # those its own help lists
            for name, sub in action.choices.items():
                if name in listed:  # not the internal ones (serve's watcher of a stdio client)
                    yield from _parsers(sub, f"{prog} {name}")


def cli_help() -> str:
    """``--help`` of the command and of every subcommand, as argparse prints it at 100 columns."""
    from sandbox_runtime.cli.main import build_parser  # noqa: PLC0415  (imported when the site is built)

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse's wrapping width: the same page on every machine
    try:
        out: list[str] = []
        for prog, parser in _parsers(build_parser(), "sandbox-runtime"):
            parser.prog = prog
            shown = parser.format_help().rstrip().replace(str(Path.home()), "~")  # not the builder's own home
            out += [f"### `{prog}`", "", "```text", shown, "```", ""]
        return "\n".join(out)
    finally:
        if previous is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = previous


def python_api() -> str:
    """One mkdocstrings block (``::: sandbox_runtime.Name``) per public name, in ``__all__``'s order: classes and
    functions first, then the exceptions (their tree is drawn in :mod:`sandbox_runtime.errors`)."""
    import sandbox_runtime  # noqa: PLC0415  (imported when the site is built)

    names = list(sandbox_runtime.__all__)
    errors = [
        n
        for n in names
        if isinstance(getattr(sandbox_runtime, n), type) and issubclass(getattr(sandbox_runtime, n), BaseException)
    ]
    out = ["## Classes and functions", ""]
    out += [_api_block(name, names) for name in names if name not in errors]
    out += ["## Exceptions", ""]
    out += [f"::: sandbox_runtime.{name}\n" for name in errors]
    return "\n".join(out)


def _api_block(name: str, public: list[str]) -> str:
    """A name's mkdocstrings block; a class with methods from a private base of the package (``Conversation``'s
    commands and files, from ``SandboxAccess``) shows them as its own."""
    import sandbox_runtime  # noqa: PLC0415  (imported when the site is built)

    found = getattr(sandbox_runtime, name)
    private_bases = [
        base
        for base in getattr(found, "__mro__", ())[1:]
        if base.__module__.startswith("sandbox_runtime.") and base.__name__ not in public
    ]
    if not private_bases:
        return f"::: sandbox_runtime.{name}\n"
    return f"::: sandbox_runtime.{name}\n    options:\n      inherited_members: true\n"


GENERATORS = {
    "policy-keys": policy_table,
    "tool-schemas": tool_schemas,
    "cli-help": cli_help,
    "python-api": python_api,
}


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs hook: each marker line becomes the table it names; an unknown marker fails the build."""

    def generated(found: re.Match[str]) -> str:
        name = found.group(1)
        if name not in GENERATORS:
            raise ValueError(f"unknown generated section {name!r}: one of {sorted(GENERATORS)}")
        return GENERATORS[name]()

    return MARKER.sub(generated, markdown)
