"""The documentation site stays true: it builds with ``mkdocs build --strict`` (a warning fails it: a link to a page
or an anchor that does not exist, a page left out of the navigation), every internal link and anchor of the built
HTML resolves, nothing a page loads comes from another host, the generated reference names every policy key, tool
and command, and every code block of ``docs/`` is run or checked as the marker comment above it says:

- ``<!-- example: NAME -->``: a Python example, run as written; each ``print`` in it names what it prints in its
  trailing comment (or the comment line below it), and the lines printed must be exactly those;
- ``<!-- check: python -->``: a Python fragment (a part of a host program, a script run in a sandbox): it compiles,
  and every name it imports from ``sandbox_runtime`` exists;
- ``<!-- check: toml-policy -->``: a policy file, or part of one, that the policy models accept;
- ``<!-- check: toml -->``, ``<!-- check: json -->``, ``<!-- check: yaml -->``: a file of another program, parsed;
- ``<!-- check: command -->``: shell commands: ``bash -n`` accepts them, and each ``sandbox-runtime`` command in
  them is one the command line's parser accepts;
- ``<!-- check: shown -->``: output or a drawing, shown as printed; nothing to run.

The links are checked by a small HTML parser here rather than by ``linkchecker``: the built site is local files
only, the parser needs no network code that could be pointed at an external URL, and it checks anchors (``id``
attributes) the same way MkDocs' own validation does for the Markdown.
"""

from __future__ import annotations

import ast
import contextlib
import html as html_module
import importlib
import importlib.util
import io
import json
import os
import re
import shlex
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import mcp
import pytest
import yaml
from mcp import StdioServerParameters as StdioServer

import sandbox_runtime
from sandbox_runtime import FakeBackend, Policy, Runtime
from sandbox_runtime.cli.main import build_parser
from sandbox_runtime.tools.builtin import builtin_tools
from tests.conftest import SESSION, TEST_LABEL
from tests.mcp_helpers import server_environment

PROJECT = Path(__file__).resolve().parent.parent
DOCS = PROJECT / "docs"
BUILD_TIMEOUT_S = 300.0
MARKER = re.compile(r"<!-- (example|check): ([a-z0-9-]+) -->")
FENCE = re.compile(r"^( *)```([a-z]*)\n(.*?)^\1```$", re.MULTILINE | re.DOTALL)
CHECK_KINDS = frozenset({"python", "toml-policy", "toml", "json", "yaml", "command", "shown"})
# examples that run with no engine; every other example runs on Docker, its sandboxes labelled for clean-up
EXAMPLES_WITHOUT_ENGINE = frozenset({"fake-backend"})


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    kind: str  # "example" or "check"
    name: str  # the example's name, or the check's kind
    code: str

    def __str__(self) -> str:
        return f"{self.page}:{self.line} ({self.kind}: {self.name})"


def code_blocks(pages: list[Path] | None = None) -> Iterator[Block]:
    """Every fenced code block of the pages (the site's, by default), with the marker above it (an unmarked block
    has kind ``""``). The README's two command markers are shell commands, checked as such."""
    for page in pages if pages is not None else sorted(DOCS.rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        for found in FENCE.finditer(text):
            before = text[: found.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
            before = re.sub(r"<!-- (main|test)-command -->", "<!-- check: command -->", before)
            marker = MARKER.fullmatch(before)
            indent = len(found.group(1))
            code = "\n".join(line[indent:] for line in found.group(3).splitlines()) + "\n"
            yield Block(
                page=str(page.relative_to(PROJECT)),
                line=text.count("\n", 0, found.start()) + 1,
                kind=marker.group(1) if marker else "",
                name=marker.group(2) if marker else "",
                code=code,
            )


BLOCKS = list(code_blocks())
EXAMPLES = {block.name: block for block in BLOCKS if block.kind == "example"}


# --- the build -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Site:
    folder: Path
    seconds: float
    log: str


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Site:
    """The site built once for this module, with ``--strict``: a warning is an error."""
    folder = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1", PYTHONPATH=str(PROJECT))
    started = time.monotonic()
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert built.returncode == 0, f"mkdocs build --strict failed:\n{built.stderr}"
    return Site(folder, time.monotonic() - started, built.stderr)


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[tuple[str, str]] = []  # (attribute, value): href of <a>, <link>; src of scripts, images

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in ("id", "name") and tag != "meta":
                self.ids.add(value)
            elif (name == "href" and tag in ("a", "link")) or name == "src":
                self.links.append((f"{tag}[{name}]", value))


def _parsed(path: Path, cache: dict[Path, _Page]) -> _Page:
    if path not in cache:
        page = _Page()
        page.feed(path.read_text(encoding="utf-8"))
        cache[path] = page
    return cache[path]


def test_the_site_builds_with_warnings_as_errors(site: Site) -> None:
    assert (site.folder / "index.html").is_file()
    assert "WARNING" not in site.log
    print(f"mkdocs build --strict: {site.seconds:.1f} s")  # shown with -s: what the build costs


def test_every_internal_link_and_anchor_of_the_built_site_resolves(site: Site) -> None:
    cache: dict[Path, _Page] = {}
    broken: list[str] = []
    pages = sorted(site.folder.rglob("*.html"))
    assert len(pages) >= 20
    for path in pages:
        for attribute, link in _parsed(path, cache).links:
            parts = urlsplit(link)
            if parts.scheme or link.startswith("//"):
                continue  # another host's address: never fetched here (the next test holds assets to none)
            if not parts.path:
                target = path
            elif parts.path.startswith("/"):  # 404.html's links are from the site's root, wherever it is served
                target = site.folder / unquote(parts.path).lstrip("/")
            else:
                target = (path.parent / unquote(parts.path)).resolve()
            if target.is_dir():
                target /= "index.html"
            where = f"{path.relative_to(site.folder)}: {attribute}={link!r}"
            if not target.is_file() or not target.resolve().is_relative_to(site.folder.resolve()):
                broken.append(f"{where}: no such file")
            elif (
                parts.fragment
                and target.suffix == ".html"
                and unquote(parts.fragment) not in _parsed(target, cache).ids
            ):
                broken.append(f"{where}: no such anchor in {target.relative_to(site.folder)}")
    assert broken == []


def test_nothing_a_page_loads_comes_from_another_host(site: Site) -> None:
    external = []
    for path in sorted(site.folder.rglob("*.html")):
        page = _Page()
        page.feed(path.read_text(encoding="utf-8"))
        for attribute, link in page.links:
            if attribute != "a[href]" and (urlsplit(link).scheme in ("http", "https") or link.startswith("//")):
                external.append(f"{path.relative_to(site.folder)}: {attribute}={link}")
    assert external == []


# --- the generated reference ---------------------------------------------------------------------------------


def _text(site: Site, page: str) -> str:
    html = (site.folder / page).read_text(encoding="utf-8")
    return html_module.unescape(re.sub(r"<[^>]+>", "", html))


def _hooks() -> Any:
    """``docs/hooks.py``, loaded from its file as MkDocs loads it (``docs/`` is no package)."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_policy_reference_names_every_key_of_the_policy_models(site: Site) -> None:
    text = _text(site, "reference/policy.html")
    keys = [key.path for key in _hooks().policy_keys(Policy)]
    assert len(keys) > 100
    for key in keys:
        table, _, name = key.rpartition(".")
        assert f"[{table}]" in text if table else True, key
        assert name in text, key
    for must in ("[run]", "default_timeout_s", "[mcp.upstreams.<name>]", "[mcp.auth]", "[admission]"):
        assert must in text


def test_the_tools_reference_shows_every_built_in_tool_and_its_schema(site: Site) -> None:
    text = _text(site, "reference/tools.html")
    policy = Policy().changed({"sql": {"database_path": "/srv/data/app.sqlite3"}}, "test")
    for name, spec in builtin_tools(policy).items():
        assert name in text
        for argument in spec.input_schema().get("properties", {}):
            assert f'"{argument}"' in text, (name, argument)


def test_the_cli_reference_shows_the_help_of_every_command(site: Site) -> None:
    text = _text(site, "reference/cli.html")
    for command in (
        "doctor",
        "image build",
        "serve",
        "demo",
        "gc",
        "ls",
        "audit verify",
        "kube manifests",
        "state migrate",
    ):
        assert f"sandbox-runtime {command}" in text, command
    assert str(Path.home()) not in text  # the builder's home is shown as ~


def test_the_python_api_reference_documents_every_public_name(site: Site) -> None:
    html = (site.folder / "reference" / "python-api.html").read_text(encoding="utf-8")
    for name in sandbox_runtime.__all__:
        assert f'id="sandbox_runtime.{name}"' in html, name


# --- the code blocks ------------------------------------------------------------------------------------------


def test_every_code_block_of_the_site_says_how_it_is_checked() -> None:
    assert len(BLOCKS) >= 20
    unmarked = [str(block) for block in BLOCKS if not block.kind]
    assert unmarked == [], "put <!-- example: NAME --> or <!-- check: KIND --> above each block"
    unknown = [str(block) for block in BLOCKS if block.kind == "check" and block.name not in CHECK_KINDS]
    assert unknown == []
    names = [block.name for block in BLOCKS if block.kind == "example"]
    assert len(names) == len(set(names)), "example names are unique"


def _expected_output(code: str) -> list[str]:
    """What each ``print`` of an example says it prints: its trailing comment, or the comment line below it."""
    lines = code.splitlines()
    calls = [
        node
        for node in ast.walk(ast.parse(code))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"
    ]
    expected = []
    for call in sorted(calls, key=lambda node: node.lineno):
        last = lines[(call.end_lineno or call.lineno) - 1]
        trailing = re.search(r"\)\s+# (.*)$", last)
        below = lines[call.end_lineno].strip() if call.end_lineno and call.end_lineno < len(lines) else ""
        assert trailing or below.startswith("# "), f"print without its output in a comment: {last.strip()}"
        expected.append(trailing.group(1) if trailing else below[2:])
    return expected


def _run(block: Block, namespace: dict[str, Any]) -> None:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block.code, block.page, "exec"), namespace)  # noqa: S102  (the documentation's own example, run as written)
    assert printed.getvalue().splitlines() == _expected_output(block.code), block


@pytest.mark.parametrize("name", sorted(set(EXAMPLES) - EXAMPLES_WITHOUT_ENGINE))
def test_the_example_runs_as_written(name: str, executor_image: str, monkeypatch: pytest.MonkeyPatch) -> None:
    class LabelledRuntime(Runtime):  # the example's sandboxes carry the test label, for clean-up by label
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("extra_labels", {TEST_LABEL: SESSION})
            kwargs.setdefault("image", executor_image)
            super().__init__(*args, **kwargs)

    served: list[str] = []  # the state directories of the servers an example's MCP client starts

    def labelled_server(command: str, args: list[str], **kwargs: Any) -> mcp.StdioServerParameters:
        """The server an example names as ``sandbox-runtime``, run by this interpreter with the test label."""
        assert command == "sandbox-runtime"
        served.append(args[args.index("--state-dir") + 1])
        environment = server_environment() | {k: v for k, v in os.environ.items() if k == "PYTHONPATH"}
        command_line = [sys.executable, "-m", "sandbox_runtime", "--label", f"{TEST_LABEL}={SESSION}", *args]
        return StdioServer(command=command_line[0], args=command_line[1:], env=environment, **kwargs)

    monkeypatch.setattr(sandbox_runtime, "Runtime", LabelledRuntime)
    monkeypatch.setattr(mcp, "StdioServerParameters", labelled_server)
    try:
        _run(EXAMPLES[name], {"__name__": "docs"})
    finally:
        for state in served:  # the served conversation's sandbox, folders and quota volume, cleaned up
            with LabelledRuntime(state, reap_interval_s=None, retention_interval_s=None) as runtime:
                for record in runtime.state.conversations():
                    runtime.conversation(record.id).delete()


@pytest.mark.parametrize("name", sorted(EXAMPLES_WITHOUT_ENGINE))
def test_the_example_runs_as_written_with_no_engine(name: str, tmp_path: Path) -> None:
    _run(EXAMPLES[name], {"__name__": "docs", "tmp_path": tmp_path})
    with Runtime(tmp_path, backend=FakeBackend(), image="fake") as runtime:
        for record in runtime.state.conversations():  # the example's folders (and quota volumes), cleaned up
            runtime.conversation(record.id).delete()


def _checked(kind: str) -> list[Block]:
    return [block for block in BLOCKS if block.kind == "check" and block.name == kind]


def _commands(script: str) -> Iterator[list[str]]:
    """Each ``sandbox-runtime`` command of a shell script, as its words (after the program's name)."""
    joined = re.sub(r"\\\n\s*", " ", script)
    for line in joined.splitlines():
        for part in re.split(r"&&|;|\|\|", line.split(" #", 1)[0]):
            words = shlex.split(part)
            if words and words[0].endswith("sandbox-runtime"):
                yield words[1:]


def _parse_exit(words: list[str]) -> tuple[int | str | None, str]:
    """The exit code the command line's parser gives these words (0 when it accepts them), and what it printed."""
    with contextlib.redirect_stderr(io.StringIO()) as errors, contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(words)
        except SystemExit as exc:
            return exc.code, errors.getvalue()
    return 0, ""


def check(block: Block) -> None:
    """Check one marked block as its marker says (an example is run by its own test instead)."""
    assert block.kind == "check", block
    assert block.name in CHECK_KINDS, block
    if block.name == "python":
        for node in ast.walk(ast.parse(block.code, block.page)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sandbox_runtime"):
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), f"{block}: {node.module} has no {alias.name}"
    elif block.name == "toml-policy":
        Policy().changed(tomllib.loads(block.code), str(block))  # the defaults with the fragment laid on top
    elif block.name == "toml":
        tomllib.loads(block.code)
    elif block.name == "json":
        json.loads(block.code)
    elif block.name == "yaml":
        list(yaml.safe_load_all(block.code))
    elif block.name == "command":
        syntax = subprocess.run(
            ["bash", "-n"], input=block.code, capture_output=True, text=True, timeout=10, check=False
        )
        assert syntax.returncode == 0, f"{block}: {syntax.stderr}"
        for words in _commands(block.code):
            code, errors = _parse_exit(words)
            assert code == 0, f"{block}: sandbox-runtime {shlex.join(words)}: {errors}"


@pytest.mark.process
@pytest.mark.parametrize("block", [block for block in BLOCKS if block.kind == "check"], ids=str)
def test_the_block_is_what_its_marker_says(block: Block) -> None:
    check(block)


def test_there_is_a_block_of_every_kind_the_site_checks() -> None:
    assert {block.name for block in BLOCKS if block.kind == "check"} == CHECK_KINDS


def test_every_key_the_policies_guide_explains_is_a_key_of_the_policy_models() -> None:
    known = {key.path for key in _hooks().policy_keys(Policy)}
    known |= {path.rsplit(".", 1)[0] for path in known}  # a table named as a whole (`approval.tool_rules.<tool>`)
    explained = []
    for row in (DOCS / "how-to" / "policies.md").read_text(encoding="utf-8").splitlines():
        cell = row.split("|")[1].strip() if row.startswith("| `") else ""
        names = re.findall(r"`([^`]+)`", cell)
        if names:
            first = names[0].replace("<tool>", "<name>")
            table = first.rsplit(".", 1)[0]
            explained += [first] + [f"{table}.{name.lstrip('.')}".replace("<tool>", "<name>") for name in names[1:]]
    assert len(explained) > 40
    unknown = [path for path in explained if path not in known and path.removesuffix(".<name>") not in known]
    assert unknown == []


def test_the_home_page_shows_the_readme_commands_word_for_word() -> None:
    readme = (PROJECT / "README.md").read_text(encoding="utf-8")
    home = (DOCS / "index.md").read_text(encoding="utf-8")
    for marker in ("<!-- main-command -->", "<!-- test-command -->"):
        found = re.search(re.escape(marker) + r"\n```[a-z]*\n(.*?)```", readme, re.DOTALL)
        assert found
        assert f"```bash\n{found.group(1)}```" in home, marker
