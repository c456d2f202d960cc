"""The package's shape: imports go one way (no cycle), no module borrows another's private
names, and every module stays small enough to hold one concept."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parent.parent / "dagrunner"
MAX_LINES = 450


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def runtime_imports(tree: ast.Module) -> list[ast.ImportFrom | ast.Import]:
    """Every import, at any depth, except those under ``if TYPE_CHECKING:`` (types only)."""
    found: list[ast.ImportFrom | ast.Import] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for branch in node.orelse:
                visit(branch)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph() -> tuple[nx.DiGraph[str], list[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: nx.DiGraph[str] = nx.DiGraph()
    private: list[str] = []
    for name, path in modules.items():
        graph.add_node(name)
        for node in runtime_imports(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.startswith("dagrunner")]
                graph.add_edges_from((name, t) for t in targets if t != name)
                continue
            if not node.module or not node.module.startswith("dagrunner"):
                continue
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                target = full if full in modules else node.module
                if target != name:
                    graph.add_edge(name, target)
                borrowed = alias.name.startswith("_") and not alias.name.startswith("__")
                if full not in modules and borrowed:
                    private.append(f"{name} imports {node.module}.{alias.name}")
    return graph, private


def test_no_import_cycle() -> None:
    graph, _ = import_graph()
    assert len(graph) > 30, "the walk found too few modules to be looking at the package"
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_no_module_imports_another_modules_private_name() -> None:
    _, private = import_graph()
    assert not private, private


def test_no_module_over_the_size_of_one_concept() -> None:
    sizes = {module_name(p): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    big = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines: {big}"
