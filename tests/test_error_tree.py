"""The exception tree drawn in ``errors.py``'s docstring is the code's: every class is drawn, under its real
parent, with its built-in mix-ins in parentheses, and nothing is drawn that the code does not have."""

from __future__ import annotations

import inspect
import re

from sandbox_runtime import errors

# a drawn entry: the lines of its ancestors ("│   " or "    " each), its branch, its name, its mix-ins
_ENTRY = re.compile(r"^    (?P<tree>(?:[│ ]   )*)[├└]── (?P<name>\w+)(?: \((?P<mixins>[\w, ]+)\))?(?:\s|$)")

Tree = dict[str, tuple[str | None, tuple[str, ...]]]  # class → (its parent in the tree, its built-in mix-ins)


def _drawn() -> Tree:
    """The tree as the docstring draws it: each entry's parent is the last entry drawn one level up."""
    doc = errors.__doc__ or ""
    drawing = doc.split("::\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    root = drawing[0].strip()
    tree: Tree = {root: (None, ())}
    ancestors = [root]
    for line in drawing[1:]:
        entry = _ENTRY.match(line)
        if entry is None:
            continue  # a description's next line
        depth = len(entry["tree"]) // 4 + 1
        ancestors[depth:] = [entry["name"]]
        mixins = tuple(name.strip() for name in (entry["mixins"] or "").split(",") if name.strip())
        assert entry["name"] not in tree, f"{entry['name']} is drawn twice"
        tree[entry["name"]] = (ancestors[depth - 1], mixins)
    return tree


def _coded() -> Tree:
    """The tree as the classes say: the parent is the base from this module, the mix-ins the built-in bases."""
    tree: Tree = {}
    for name, cls in inspect.getmembers(errors, inspect.isclass):
        if cls.__module__ != errors.__name__ or not issubclass(cls, BaseException):
            continue
        ours = [base.__name__ for base in cls.__bases__ if base.__module__ == errors.__name__]
        builtin = tuple(base.__name__ for base in cls.__bases__ if base.__module__ == "builtins")
        assert len(ours) <= 1, f"{name} has more than one parent in the tree: {ours}"
        tree[name] = (ours[0], builtin) if ours else (None, ())  # the root's own base (Exception) is not drawn
    return tree


def test_the_docstring_draws_every_exception_class_under_its_parent_with_its_mixins() -> None:
    drawn, coded = _drawn(), _coded()
    assert sorted(set(coded) - set(drawn)) == [], "classes the docstring does not draw"
    assert sorted(set(drawn) - set(coded)) == [], "drawn names no class has"
    wrong = {name: {"drawn": drawn[name], "coded": coded[name]} for name in coded if drawn[name] != coded[name]}
    assert wrong == {}


def test_there_is_one_root_and_every_class_is_public() -> None:
    coded = _coded()
    assert [name for name, (parent, _) in coded.items() if parent is None] == ["SandboxRuntimeError"]
    assert set(coded) == set(errors.__all__)
