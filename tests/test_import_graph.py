"""The package graph: the library never reaches up (no broker needed).

Layers, bottom to top: ``txn`` (the library), the faces ``spark_jobs`` and ``coordinator_api``,
and the application shell ``txn_shell`` (CLI, demo, examples, local broker and Spark cluster
launchers). Every ``import`` of every module is read with :mod:`ast`, lazy ones inside functions
included, and checked against three rules:

1. ``txn`` imports nothing from ``spark_jobs``, ``coordinator_api`` or ``txn_shell``;
2. ``spark_jobs`` and ``coordinator_api`` import nothing from ``txn_shell``;
3. across packages only public names are imported: no ``from txn.x import _private`` and no
   module path with a ``_private`` component.

:func:`violations` takes any tree, so the rules can be checked on an old checkout too
(``python tests/test_import_graph.py DIR`` prints what breaks them there).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PACKAGES = ("txn", "spark_jobs", "coordinator_api", "txn_shell")

#: What each package must never import (rules 1 and 2).
FORBIDDEN = {
    "txn": {"spark_jobs", "coordinator_api", "txn_shell"},
    "spark_jobs": {"txn_shell"},
    "coordinator_api": {"txn_shell"},
    "txn_shell": set(),
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(root: Path, path: Path) -> Iterator[tuple[int, str, list[str]]]:
    """``(line, absolute module, names taken from it)`` for every import in ``path``.

    ``import a.b`` yields ``("a.b", [])``; ``from a import b, c`` yields ``("a", ["b", "c"])``;
    relative imports are resolved against the module's own package."""
    mod = module_name(root, path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            yield node.lineno, target, [a.name for a in node.names]


def modules(root: Path) -> Iterator[Path]:
    for pkg in PACKAGES:
        if (root / pkg).is_dir():
            yield from sorted(p for p in (root / pkg).rglob("*.py") if "__pycache__" not in p.parts)


def violations(root: Path) -> list[str]:
    """Every import under ``root`` that breaks one of the three rules, as ``path:line: why``."""
    found = []
    for path in modules(root):
        rel = path.relative_to(root)
        own = rel.parts[0]
        for line, target, names in imports(root, path):
            top = target.split(".")[0]
            where = f"{rel}:{line}"
            if top in FORBIDDEN[own]:
                found.append(f"{where}: {own} imports {target} (a higher layer)")
            if top in PACKAGES and top != own:
                private_parts = [p for p in target.split(".") if _private(p)]
                if private_parts:
                    found.append(f"{where}: imports the private module {target}")
                private_names = [n for n in names if _private(n)]
                if private_names:
                    found.append(f"{where}: imports private {', '.join(private_names)} from {target}")
    return found


def test_package_graph_has_no_arrow_back_up_and_no_private_reach_in() -> None:
    assert (ROOT / "txn_shell").is_dir()
    assert violations(ROOT) == []


def test_checker_sees_lazy_relative_and_private_imports(tmp_path: Path) -> None:
    (tmp_path / "txn" / "sub").mkdir(parents=True)
    (tmp_path / "spark_jobs").mkdir()
    (tmp_path / "txn" / "__init__.py").write_text("")
    (tmp_path / "txn" / "sub" / "__init__.py").write_text("")
    (tmp_path / "txn" / "sub" / "m.py").write_text(
        "from __future__ import annotations\nfrom .. import core\n"
        "def f():\n    from spark_jobs import x\n    import txn_shell.cli\n")
    (tmp_path / "spark_jobs" / "__init__.py").write_text(
        "from txn.producer import _hash, ok\nimport txn._impl\nfrom txn import core\n"
        "def g():\n    from txn_shell import cli\n")
    got = sorted(violations(tmp_path))
    assert got == [
        "spark_jobs/__init__.py:1: imports private _hash from txn.producer",
        "spark_jobs/__init__.py:2: imports the private module txn._impl",
        "spark_jobs/__init__.py:5: spark_jobs imports txn_shell (a higher layer)",
        "txn/sub/m.py:4: txn imports spark_jobs (a higher layer)",
        "txn/sub/m.py:5: txn imports txn_shell.cli (a higher layer)",
    ]
    assert list(imports(tmp_path, tmp_path / "txn" / "sub" / "m.py"))[1] == (2, "txn", ["core"])


#: The core below the client: none of these imports :mod:`txn.client` (nor :mod:`txn.sync` above it),
#: not even lazily or for type hints. The client is a factory that hands them a
#: :class:`txn.context.ClientContext`; messages and transactions know a consumer only through
#: :class:`txn.message.ConsumerRef`, so they import no consumer either.
BELOW_CLIENT = {
    "txn.producer": {"txn.client", "txn.sync"},
    "txn.consumer": {"txn.client", "txn.sync"},
    "txn.reader": {"txn.client", "txn.sync"},
    "txn.context": {"txn.client", "txn.sync", "txn.producer", "txn.consumer", "txn.reader"},
    "txn.transaction": {"txn.client", "txn.sync", "txn.producer", "txn.consumer", "txn.reader"},
    "txn.coordinator": {"txn.client", "txn.sync", "txn.producer", "txn.consumer", "txn.reader", "txn.transaction"},
    "txn.message": {"txn.client", "txn.sync", "txn.producer", "txn.consumer", "txn.reader", "txn.transaction",
                    "txn.coordinator"},
}


def module_files(root: Path, mod: str) -> list[Path]:
    """The files of module ``mod``: ``a/b.py``, or every module of the package ``a/b/``."""
    base = root / mod.replace(".", "/")
    if base.is_dir():
        return sorted(p for p in base.rglob("*.py") if "__pycache__" not in p.parts)
    path = base.with_suffix(".py")
    return [path] if path.exists() else []  # none: an older checkout (no txn/context.py)


def upward_core_imports(root: Path) -> list[str]:
    """Imports of a module in :data:`BELOW_CLIENT` that name a module it must not import
    (for a package such as ``txn.producer``: any module of it)."""
    found = []
    for mod, banned in BELOW_CLIENT.items():
        for path in module_files(root, mod):
            for line, target, names in imports(root, path):
                if target in banned or any(target.startswith(b + ".") for b in banned):
                    hits = [target]
                else:  # ``from . import client`` too
                    hits = [f"{target}.{n}" for n in names if f"{target}.{n}" in banned]
                found += [f"{path.relative_to(root)}:{line}: {mod} imports {hit}" for hit in hits]
    return found


def test_core_modules_below_the_client_import_nothing_above_them() -> None:
    assert all(module_files(ROOT, m) for m in BELOW_CLIENT)
    assert upward_core_imports(ROOT) == []


def test_upward_check_reads_every_module_of_a_package(tmp_path: Path) -> None:
    (tmp_path / "txn" / "producer").mkdir(parents=True)
    (tmp_path / "txn" / "producer" / "__init__.py").write_text("from .sender import S\n")
    (tmp_path / "txn" / "producer" / "sender.py").write_text("def f():\n    from ..client import AsyncClient\n")
    (tmp_path / "txn" / "message.py").write_text("import txn.producer.sender\n")
    assert sorted(upward_core_imports(tmp_path)) == [
        "txn/message.py:1: txn.message imports txn.producer.sender",
        "txn/producer/sender.py:2: txn.producer imports txn.client",
    ]


def _graph_tool():
    """``tools/import_graph.py`` (the script that prints the graph), loaded from the tree."""
    spec = importlib.util.spec_from_file_location("import_graph_tool", ROOT / "tools" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_no_import_cycle_among_library_modules() -> None:
    """No circle among the modules of ``txn`` (lazy and type-checking imports count too), e.g. the
    ordering guard and the processor: the processor imports the guard, and the guard knows the
    processor only as :class:`txn.delivery.ordering.OrderingHost`."""
    tool = _graph_tool()
    graph = tool.collapse(tool.module_graph(ROOT), "txn", 99)
    assert "txn.delivery.ordering" in graph["txn.delivery.processor.config"]
    assert tool.cycles(graph) == []
    assert tool.cycles(tool.collapse(tool.module_graph(ROOT), None, 1)) == []  # nor among the packages


def test_no_import_cycle_among_the_modules_of_any_package() -> None:
    """No circle among the modules of each package (``txn``, ``spark_jobs``, ``coordinator_api``,
    ``txn_shell``), lazy and type-checking imports included; e.g. the Spark runtime imports its
    driver, and the driver takes the rows it needs from :mod:`spark_jobs.runtime_rows`, never from
    the runtime."""
    tool = _graph_tool()
    whole = tool.module_graph(ROOT)
    found = {pkg: tool.cycles(tool.collapse(whole, pkg, 99)) for pkg in PACKAGES}
    assert found == {pkg: [] for pkg in PACKAGES}
    spark = tool.collapse(whole, "spark_jobs", 99)
    assert "spark_jobs.runtime_driver" in spark["spark_jobs.runtime"]
    assert "spark_jobs.runtime" not in spark["spark_jobs.runtime_driver"]


def test_cycle_finder_sees_lazy_and_type_checking_circles(tmp_path: Path) -> None:
    (tmp_path / "txn" / "p").mkdir(parents=True)
    (tmp_path / "txn" / "__init__.py").write_text("")
    (tmp_path / "txn" / "p" / "__init__.py").write_text("from .m import X\n")
    (tmp_path / "txn" / "a.py").write_text("def f():\n    from .b import g\n")
    (tmp_path / "txn" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from txn import a\nfrom txn.p import m\n")
    (tmp_path / "txn" / "p" / "m.py").write_text("import txn.client\nX = 1\n")
    (tmp_path / "txn" / "client.py").write_text("from txn.p.m import X\n")
    tool = _graph_tool()
    graph = tool.collapse(tool.module_graph(tmp_path), "txn", 99)
    assert graph["txn.b"] == {"txn.a", "txn.p.m"}
    assert tool.cycles(graph) == [["txn.a", "txn.b"], ["txn.client", "txn.p.m"]]
    assert tool.cycles(tool.collapse(tool.module_graph(tmp_path), "txn", 2)) == [
        ["txn.a", "txn.b"], ["txn.client", "txn.p"]]


#: Module specs ("pkg.mod:attr") that the library would load by name at run time: an import that
#: ast does not see.
_SPEC = re.compile(r"^(spark_jobs|coordinator_api|txn_shell)(\.\w+)*(:\w+)?$")


def named_higher_modules(root: Path) -> list[str]:
    """String constants in ``txn`` that name a module of a higher layer (loaded by name)."""
    found = []
    for path in (root / "txn").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _SPEC.match(node.value):
                found.append(f"{path.relative_to(root)}:{node.lineno}: {node.value}")
    return sorted(found)


def test_library_names_no_higher_module() -> None:
    assert named_higher_modules(ROOT) == []


if __name__ == "__main__":  # python tests/test_import_graph.py [ROOT]
    bad = violations(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
    print("\n".join(bad) or "no violations")
    sys.exit(1 if bad else 0)
