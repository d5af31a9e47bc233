"""The public API is exactly ``__all__``; the architecture's import rules hold."""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import sandbox_runtime

PACKAGE = Path(sandbox_runtime.__file__).parent


def test_the_public_names_are_exactly_all() -> None:
    public = {name for name in dir(sandbox_runtime) if not name.startswith("_")}
    modules = {module.name for module in pkgutil.iter_modules(sandbox_runtime.__path__)}  # imported ones show too
    assert public - modules == set(sandbox_runtime.__all__)


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_only_the_docker_backend_imports_docker() -> None:
    importers = sorted(
        str(path.relative_to(PACKAGE))
        for path in PACKAGE.rglob("*.py")
        if "_data" not in path.parts and any(name.split(".")[0] == "docker" for name in _imports(path))
    )
    assert importers == ["sandbox/docker/backend.py"]


# the layers, lowest first: a module may import its own layer and those below it, never one above
LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    ("errors", frozenset({"errors", "control", "processes", "workers"})),
    ("models", frozenset({"models", "tenancy"})),  # tenancy: conversation ids and keys
    ("policy", frozenset({"policy"})),  # one module a section of the policy file
    ("telemetry", frozenset({"telemetry"})),  # metrics, spans, structured logs: every layer above reports through it
    ("state", frozenset({"state"})),
    ("sandbox", frozenset({"sandbox"})),
    ("store", frozenset({"store"})),
    ("tables", frozenset({"tables"})),  # typed tables: cells, the table file, its readers and writers
    ("conversations", frozenset({"conversations"})),
    ("spill", frozenset({"spill"})),
    ("tools", frozenset({"tools"})),
    ("pipeline", frozenset({"pipeline"})),
    ("python api", frozenset({"api"})),
    ("adapters", frozenset({"adapters"})),  # the frameworks' sandbox contracts over the Python API
    ("mcp", frozenset({"mcp"})),
    ("cli", frozenset({"cli", "__main__", "__init__"})),
)


def _layer(dotted: str) -> int:
    top = dotted.split(".", maxsplit=1)[0]
    for number, (_, members) in enumerate(LAYERS):
        if top in members:
            return number
    raise AssertionError(f"sandbox_runtime.{dotted} is in no layer: add it to LAYERS")


def test_every_module_is_in_a_layer_and_imports_only_its_own_or_lower_ones() -> None:
    upward = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "_data":
            continue  # the image's own scripts: standard library only, never imported by the package
        own = _layer(".".join(relative.with_suffix("").parts))
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "sandbox_runtime" and len(parts) > 1 and _layer(".".join(parts[1:])) > own:
                upward.add((str(relative), name))
    assert not upward, sorted(upward)


def test_every_public_name_has_a_docstring() -> None:
    missing = [name for name in sandbox_runtime.__all__ if not (getattr(sandbox_runtime, name).__doc__ or "").strip()]
    assert not missing, missing


# what tools may use of the sandbox layer: the records of a run and of a sandbox, and the run protocol's request for a
# run; never the backend seam, an engine, the manager or the pool (a tool reaches its sandbox through its handle)
TOOLS_MAY_USE_OF_THE_SANDBOX = frozenset({"sandbox.runs", "sandbox.manager_models", "sandbox.run_protocol"})


def test_tools_never_import_the_backend_or_an_engine() -> None:
    reached = set()
    for path in sorted((PACKAGE / "tools").rglob("*.py")):
        for name in _imports(path):
            parts = name.split(".")
            if parts[:2] == ["sandbox_runtime", "sandbox"]:
                reached.add((str(path.relative_to(PACKAGE)), ".".join(parts[1:])))
    assert {module for _, module in reached} <= TOOLS_MAY_USE_OF_THE_SANDBOX, sorted(reached)
