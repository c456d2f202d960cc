"""The package's shape: imports go one way (no cycle, counting every import), no module
borrows another's private names, every module stays small enough to hold one concept, and
the folders keep their layers."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parent.parent / "dagrunner"
MAX_LINES = 450


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def every_import(tree: ast.Module) -> list[ast.ImportFrom | ast.Import]:
    """Every import, at any depth: in functions and under ``if TYPE_CHECKING:`` too (a type
    that names a module is a dependency on it all the same)."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def import_graph() -> tuple[nx.DiGraph[str], list[str]]:
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: nx.DiGraph[str] = nx.DiGraph()
    private: list[str] = []
    for name, path in modules.items():
        graph.add_node(name)
        for node in every_import(ast.parse(path.read_text())):
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


# -- folders: the house by concept ------------------------------------------------------------

ROOT = PACKAGE.parent
FOLDERS = sorted(p.parent for p in PACKAGE.glob("*/__init__.py"))


def test_rooms_import_downward_and_the_documented_table_is_the_codes() -> None:
    """Every import between rooms (folders, and modules directly in the package) -- top-level,
    in a function or under TYPE_CHECKING -- goes to a lower layer; docs/architecture.md's
    table is the one scripts/layers.py measures now."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "layers.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_folders_init_is_a_map_not_a_pile_of_imports() -> None:
    for folder in FOLDERS:
        body = ast.parse((folder / "__init__.py").read_text()).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr), folder.name
        assert isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)
        for name in (p.stem for p in folder.glob("*.py") if p.stem != "__init__"):
            assert f"``{name}``" in body[0].value.value, f"{folder.name}/__init__ names no {name}"


def test_the_package_stays_a_house_of_small_rooms() -> None:
    top = [p for p in PACKAGE.glob("*.py")]
    assert len(top) <= 12, sorted(p.name for p in top)
    assert len(FOLDERS) >= 6
    crowded = {f.name: n for f in FOLDERS if (n := len(list(f.glob("*.py"))) - 1) > 16}
    assert not crowded, crowded
