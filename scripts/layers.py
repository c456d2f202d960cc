"""The package's rooms and their layers, measured from the code.

    python scripts/layers.py            # print the table
    python scripts/layers.py --write    # put it into docs/architecture.md
    python scripts/layers.py --check    # exit 1 when docs/architecture.md differs

A room is a folder of ``dagrunner/`` (a subpackage) or a module directly in it.  Every
import counts -- top-level, inside a function, under ``TYPE_CHECKING`` -- and an import
from one room into another is an arrow.  The rooms must form no cycle; a room's layer is one
more than the highest layer it imports (0: it imports no other room).
``tests/test_structure.py`` runs ``--check``, so the table in the docs cannot go stale.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "dagrunner"
DOC = ROOT / "docs" / "architecture.md"
BEGIN, END = "<!-- layers: begin (scripts/layers.py --write) -->", "<!-- layers: end -->"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_of(module: str) -> str:
    """``dagrunner.git.command`` -> ``git``; ``dagrunner.errors`` -> ``errors``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports(path: Path, modules: set[str]) -> set[str]:
    """The dagrunner modules ``path`` imports, at any depth of its code."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dagrunner"):
            module = node.module or ""
            for alias in node.names:
                full = f"{module}.{alias.name}"
                found.add(full if full in modules else module)
    return found & modules


def rooms() -> tuple[nx.DiGraph[str], dict[str, list[str]]]:
    """The room graph (arrows: who imports whom) and each room's modules."""
    paths = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    members: dict[str, list[str]] = {}
    graph: nx.DiGraph[str] = nx.DiGraph()
    for module, path in paths.items():
        room = room_of(module)
        inside = module.removeprefix(f"dagrunner.{room}").removeprefix(".")
        members.setdefault(room, [])
        if inside:
            members[room].append(inside)
        graph.add_node(room)
        for target in imports(path, set(paths)):
            if room_of(target) != room and room != "__init__":
                graph.add_edge(room, room_of(target))
    graph.remove_nodes_from(["__init__", "__main__"])
    return graph, members


def layers(graph: nx.DiGraph[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for room in reversed(list(nx.topological_sort(graph))):
        found[room] = 1 + max((found[t] for t in graph.successors(room)), default=-1)
    return found


def table() -> str:
    graph, members = rooms()
    cycles = list(nx.simple_cycles(graph))
    if cycles:
        raise SystemExit(f"rooms import each other in a cycle: {cycles[:3]}")
    rows = ["| layer | room | modules | imports |", "| --- | --- | --- | --- |"]
    for room, layer in sorted(layers(graph).items(), key=lambda item: (item[1], item[0])):
        folder = (PACKAGE / room).is_dir()
        name = f"`{room}/`" if folder else f"`{room}`"
        inside = ", ".join(f"`{m}`" for m in sorted(members[room]))
        below = ", ".join(f"`{t}`" for t in sorted(graph.successors(room)))
        rows.append(f"| {layer} | {name} | {inside} | {below} |")
    folders = [r for r in graph if (PACKAGE / r).is_dir()]
    count = sum(len(members[r]) for r in folders) + len(graph) - len(folders)
    rows.append("")
    rows.append(
        f"{len(graph)} rooms: {len(folders)} folders and {len(graph) - len(folders)} modules "
        f"directly in `dagrunner/` (with `__init__` and `__main__`, {len(graph) - len(folders) + 2}); "
        f"{count} modules in all, besides the folders' docstring `__init__`s."
    )
    return "\n".join(rows)


def documented() -> str:
    text = DOC.read_text()
    return text[text.index(BEGIN) + len(BEGIN) : text.index(END)].strip()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    current = table()
    if args.check:
        if documented() != current:
            print("docs/architecture.md's layer table is stale: run scripts/layers.py --write")
            return 1
        return 0
    if args.write:
        text = DOC.read_text()
        start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
        DOC.write_text(text[:start] + "\n" + current + "\n" + text[end:])
        return 0
    print(current)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
