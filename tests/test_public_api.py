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
    assert importers == ["sandbox/docker_backend.py"]


def test_lower_layers_never_import_higher_ones() -> None:
    layers = ["policy", "sandbox", "store", "spill", "tools", "runtime", "mcp", "cli"]
    # store (safe paths, quota) sits beside the sandbox layer; neither may reach tools, the API or the CLI
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        top = relative.parts[0].removesuffix(".py")
        if top not in layers:
            continue
        higher = set(layers[layers.index(top) + 1 :]) - {"store", "sandbox"}
        for name in _imports(path):
            parts = name.split(".")
            if parts[0] == "sandbox_runtime" and len(parts) > 1:
                assert parts[1] not in higher, f"{relative} imports {name}"


def test_every_public_name_has_a_docstring() -> None:
    missing = [name for name in sandbox_runtime.__all__ if not (getattr(sandbox_runtime, name).__doc__ or "").strip()]
    assert not missing, missing
