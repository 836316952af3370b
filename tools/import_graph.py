"""Print the project's import graph: nodes, edges, floors, arrows back up and cycles.

Every ``import`` of every module is read with :mod:`ast` (lazy imports inside functions and
``TYPE_CHECKING`` imports included, since both are a dependency a reader must follow).
``from pkg import name`` counts as an import of ``pkg.name`` when that is a module, else of ``pkg``.

Three views are printed: the top-level packages, the rooms of ``txn`` (its modules and
subpackages, ``txn/__init__`` as ``txn``), and the modules of ``txn.delivery``.

* floors: strongly connected components are condensed; a room that imports nothing in the view
  is on floor 0, any other one floor above the highest room it imports;
* arrows back up: for the packages, an import of a higher layer (:data:`LAYERS`); inside a
  package, the edges that close a cycle (the back edges of a depth-first walk in name order);
* cycles: the strongly connected components with more than one room.

Usage: ``python tools/import_graph.py [ROOT]`` (ROOT defaults to the repository).
:func:`module_graph` and :func:`cycles` are what ``tests/test_import_graph.py`` checks.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("txn", "spark_jobs", "coordinator_api", "txn_shell")
#: Intended layer of each top-level package: an import of a higher one is an arrow back up.
LAYERS = {"txn": 0, "spark_jobs": 1, "coordinator_api": 1, "txn_shell": 2}

Graph = dict[str, set[str]]


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources(root: Path) -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        if (root / pkg).is_dir():
            for p in sorted((root / pkg).rglob("*.py")):
                if "__pycache__" not in p.parts:
                    found[_module_name(root, p)] = p
    return found


def _targets(mod: str, path: Path, known: set[str]) -> Iterable[str]:
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in known]
            yield from subs
            if len(subs) < len(node.names):
                yield target


def module_graph(root: Path = ROOT) -> Graph:
    """Module -> the project modules it imports (the nearest existing module for a dotted path)."""
    src = _sources(root)
    known = set(src)
    graph: Graph = {m: set() for m in src}
    for mod, path in src.items():
        for target in _targets(mod, path, known):
            t = target
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != mod:
                graph[mod].add(t)
    return graph


def collapse(graph: Graph, prefix: str | None, depth: int) -> Graph:
    """The graph of the rooms ``prefix.X`` (``depth`` name parts) inside ``prefix`` (None: top level)."""

    def room(m: str) -> str | None:
        if prefix is not None and m != prefix and not m.startswith(prefix + "."):
            return None
        return ".".join(m.split(".")[:depth])

    out: Graph = {}
    for m, targets in graph.items():
        r = room(m)
        if r is None:
            continue
        out.setdefault(r, set())
        for t in targets:
            rt = room(t)
            if rt is not None and rt != r:
                out[r].add(rt)
                out.setdefault(rt, set())
    return out


def cycles(graph: Graph) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan), each sorted, by first name."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(comps)


def back_edges(graph: Graph) -> list[tuple[str, str]]:
    """Edges that close a cycle: the back edges of a depth-first walk in name order."""
    state: dict[str, int] = {}
    found: list[tuple[str, str]] = []

    def walk(v: str) -> None:
        state[v] = 1
        for w in sorted(graph.get(v, ())):
            if state.get(w) == 1:
                found.append((v, w))
            elif w not in state:
                walk(w)
        state[v] = 2

    for v in sorted(graph):
        if v not in state:
            walk(v)
    return found


def floors(graph: Graph) -> dict[str, int]:
    """Floor of each node once the back edges are removed (0: imports nothing in the view)."""
    back = set(back_edges(graph))
    memo: dict[str, int] = {}

    def floor(v: str) -> int:
        if v not in memo:
            memo[v] = 0
            memo[v] = max((floor(w) + 1 for w in graph[v] if (v, w) not in back), default=0)
        return memo[v]

    return {v: floor(v) for v in sorted(graph)}


def report(title: str, graph: Graph, layers: dict[str, int] | None = None) -> str:
    edges = sorted((u, v) for u, ts in graph.items() for v in ts)
    fl = floors(graph)
    if layers is not None:
        up = [(u, v) for u, v in edges if layers.get(v, 0) > layers.get(u, 0)]
    else:
        up = back_edges(graph)
    cyc = cycles(graph)
    lines = [f"== {title}: {len(graph)} rooms, {len(edges)} edges, {max(fl.values(), default=-1) + 1} floors, "
             f"{len(up)} arrows back up, {len(cyc)} cycles"]
    for level in sorted(set(fl.values()), reverse=True):
        lines.append(f"  floor {level:2}: " + " ".join(v for v in fl if fl[v] == level))
    lines += [f"  edge {u} -> {v}" for u, v in edges]
    lines += [f"  UP   {u} -> {v}" for u, v in up]
    lines += [f"  CYCLE ({len(c)}): " + " ".join(c) for c in cyc]
    return "\n".join(lines)


def main(root: Path = ROOT) -> str:
    g = module_graph(root)
    return "\n\n".join([
        report("packages", collapse(g, None, 1), LAYERS),
        report("inside txn", collapse(g, "txn", 2)),
        report("inside txn.delivery", collapse(g, "txn.delivery", 3)),
        report("txn modules", collapse(g, "txn", 99)),
    ])


if __name__ == "__main__":
    print(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT))
