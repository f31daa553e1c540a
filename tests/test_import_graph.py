"""The import graph of the project's apps, read with `ast`, against docs/architecture.md.

The page's layer table says which modules form each layer and which layers each may import;
this test holds the tree to it, so the page stays true and a new import that would tangle the
apps again fails here first. Every import counts, module-level or inside a function, since a
function-level import is still a dependency; imports under `if TYPE_CHECKING:` count for the
layers but not for cycles, because they never run.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
APPS = ("config", "chat", "media", "inference", "ops")
ARCHITECTURE = ROOT / "docs" / "architecture.md"
ROW = re.compile(r"^\|\s*`(?P<layer>[\w.]+)`\s*\|(?P<modules>[^|]*)\|[^|]*\|(?P<imports>[^|]*)\|")
NAME = re.compile(r"`([\w.]+)`")


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    typing_only: bool


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def project_modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for app in APPS
        for path in sorted((ROOT / app).rglob("*.py"))
        if "migrations" not in path.parts
    }


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports_of(
    tree: ast.AST, typing_only: bool = False
) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, typing_only
        elif isinstance(node, ast.If) and is_type_checking(node):
            for child in node.body:
                yield from imports_of(ast.Module(body=[child], type_ignores=[]), True)
            for child in node.orelse:
                yield from imports_of(ast.Module(body=[child], type_ignores=[]), typing_only)
        else:
            yield from imports_of(node, typing_only)


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module `name` refers to: itself, or its nearest enclosing package."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def edges(modules: dict[str, Path]) -> list[Edge]:
    found = []
    for source, path in modules.items():
        package = source if path.name == "__init__.py" else source.rpartition(".")[0]
        for node, typing_only in imports_of(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                resolved = resolve(target, modules)
                if resolved is not None and resolved != source:
                    found.append(Edge(source, resolved, node.lineno, typing_only))
    return found


@dataclass(frozen=True)
class Layer:
    name: str
    modules: tuple[str, ...]
    may_import: frozenset[str]


def layers_from_page() -> list[Layer]:
    """The table under "## Layers": layer, modules, what (free text), may import."""
    text = ARCHITECTURE.read_text()
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers = []
    for line in section.splitlines():
        match = ROW.match(line)
        if match:
            layers.append(
                Layer(
                    match["layer"],
                    tuple(NAME.findall(match["modules"])),
                    frozenset(NAME.findall(match["imports"])),
                )
            )
    return layers


def layer_of(module: str, layers: list[Layer]) -> Layer | None:
    """The layer whose listed prefix matches `module` most closely."""
    best: tuple[int, Layer] | None = None
    for layer in layers:
        for prefix in layer.modules:
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > best[0]
            ):
                best = (len(prefix), layer)
    return best[1] if best else None


def strongly_connected(nodes: list[str], graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm, iteratively (the graph is small, but recursion depth is not ours)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


@pytest.fixture(scope="module")
def graph() -> tuple[dict[str, Path], list[Edge]]:
    modules = project_modules()
    return modules, edges(modules)


def test_no_import_cycle_anywhere(graph):
    modules, found = graph
    runtime: dict[str, set[str]] = {name: set() for name in modules}
    for edge in found:
        if not edge.typing_only:
            runtime[edge.source].add(edge.target)
    cycles = [c for c in strongly_connected(sorted(modules), runtime) if len(c) > 1]
    assert cycles == [], f"import cycles: {cycles}"


def test_every_module_has_one_layer_on_the_page(graph):
    modules, _ = graph
    layers = layers_from_page()
    assert layers, "docs/architecture.md has no layer table under '## Layers'"
    unplaced = [name for name in modules if layer_of(name, layers) is None]
    assert unplaced == [], f"modules no layer names: {unplaced}"
    listed = {prefix for layer in layers for prefix in layer.modules}
    missing = sorted(prefix for prefix in listed if resolve(prefix, modules) != prefix)
    assert missing == [], f"the page names modules that do not exist: {missing}"
    names = {layer.name for layer in layers}
    unknown = sorted({t for layer in layers for t in layer.may_import} - names)
    assert unknown == [], f"the page lets layers import unknown layers: {unknown}"


def test_imports_follow_the_layer_table(graph):
    _, found = graph
    layers = layers_from_page()
    wrong = []
    for edge in found:
        source, target = layer_of(edge.source, layers), layer_of(edge.target, layers)
        if source is None or target is None or source is target:
            continue
        if target.name not in source.may_import:
            where = f"{edge.source}:{edge.line} -> {edge.target}"
            wrong.append(f"{where} ({source.name} -> {target.name})")
    assert wrong == [], "imports the architecture page does not allow:\n" + "\n".join(wrong)


def test_the_layers_form_no_cycle():
    layers = layers_from_page()
    graph = {layer.name: set(layer.may_import) for layer in layers}
    cycles = [c for c in strongly_connected(sorted(graph), graph) if len(c) > 1]
    assert cycles == [], f"the page's layers import each other in a circle: {cycles}"


def test_the_engine_core_imports_no_django(graph):
    modules, _ = graph
    offenders = []
    for name, path in modules.items():
        if not name.startswith("inference.engine"):
            continue
        for node, _ in imports_of(ast.parse(path.read_text())):
            roots = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
            )
            offenders += [f"{name}:{node.lineno}" for root in roots if root.startswith("django")]
    assert offenders == []


def test_the_checker_sees_a_cycle_and_a_forbidden_import():
    """The checks above would pass on a graph they cannot read; prove they can fail."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}
    assert [sorted(c) for c in strongly_connected(sorted(graph), graph) if len(c) > 1] == [
        ["a", "b", "c"]
    ]
    layers = [Layer("low", ("media",), frozenset()), Layer("high", ("chat",), frozenset({"low"}))]
    assert layer_of("media.tasks", layers).name == "low"
    assert "high" not in layer_of("media.tasks", layers).may_import
    tree = ast.parse("import chat\nif TYPE_CHECKING:\n    import media\ndef f():\n import ops")
    seen = [(type(n).__name__, typing) for n, typing in imports_of(tree)]
    assert seen == [("Import", False), ("Import", True), ("Import", False)]


def test_every_file_the_page_names_exists():
    """The reply's walk-through names files; a move or rename must update the page."""
    named = set(re.findall(r"`([\w/]+(?:\.py|\.js|/))`", ARCHITECTURE.read_text()))
    bare = {name for name in named if "/" not in name.strip("/") or name.startswith("/")}
    assert len(named - bare) > 20, "the page names too few files for this check to mean much"
    missing = sorted(n for n in named - bare if not (ROOT / n).exists())
    assert missing == [], f"docs/architecture.md names files that do not exist: {missing}"
