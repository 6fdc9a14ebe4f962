"""The package's import graph, read from the source with ``ast``, has no cycle.

Edges: every ``import`` / ``from ... import`` of an ``rb_lightning`` module
anywhere in a module: at module level, inside functions and inside
``if TYPE_CHECKING:`` blocks alike. A deferred import, or one made for type
hints only, still makes two modules depend on each other: one cannot be read, or
changed, without the other (issue 46: a circle of three sharded-buffer modules
hid its back edges behind ``TYPE_CHECKING``).
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = "rb_lightning"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(tree: ast.AST, module: str, is_package: bool, known: set[str]) -> set[str]:
    """Modules of the package that ``module`` imports (resolved to known module names)."""
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        # "rb_lightning.hf.to_hf_dataset" -> "rb_lightning.hf": the longest known prefix.
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            candidate = ".".join(parts[:end])
            if candidate in known:
                return candidate
        return None

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = resolve(alias.name)
                if target:
                    found.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:
                # "from rb_lightning import hf" imports the module rb_lightning.hf
                target = resolve(f"{prefix}.{alias.name}") or resolve(prefix)
                if target:
                    found.add(target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    found.discard(module)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """``{module: modules of the package it imports}`` for every module under ``root``."""
    paths = sorted(root.rglob("*.py"))
    names = {path: _module_name(path, root) for path in paths}
    known = set(names.values())
    return {
        name: _imported(
            ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py", known
        )
        for path, name in names.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or ``None``.

    A package's ``__init__`` (named as the package) is a module like any other:
    its imports of submodules are edges, so a submodule importing names from
    the package that re-exports it closes a cycle.
    """

    white, grey, black = 0, 1, 2
    colour = dict.fromkeys(graph, white)
    stack: list[str] = []

    def dfs(module: str) -> list[str] | None:
        colour[module] = grey
        stack.append(module)
        for target in sorted(graph[module]):
            if colour[target] == grey:
                return stack[stack.index(target) :] + [target]
            if colour[target] == white:
                cycle = dfs(target)
                if cycle:
                    return cycle
        stack.pop()
        colour[module] = black
        return None

    for module in sorted(graph):
        if colour[module] == white:
            cycle = dfs(module)
            if cycle:
                return cycle
    return None


def test_rb_lightning_has_no_import_cycle():
    graph = import_graph()
    assert (
        f"{PACKAGE}.stream.datasets" in graph and f"{PACKAGE}.hf.export" in graph
    )  # the walk found the source
    cycle = find_cycle(graph)
    assert cycle is None, (
        "Import cycle in rb_lightning: " + " -> ".join(cycle) + ". Move what both sides need "
        "into a module of its own that imports neither (as rb_lightning.stream is for the "
        "datasets and the HF export), or invert the dependency (a method on the caller's side)."
    )


def _package(root: Path, modules: dict[str, str]) -> Path:
    package = root / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name, source in modules.items():
        (package / f"{name}.py").write_text(source)
    return package


def test_function_level_imports_are_edges(tmp_path):
    package = _package(
        tmp_path, {"a": "from pkg import b\n", "b": "def f():\n    from pkg.a import x\n"}
    )
    graph = import_graph(package)
    assert graph["pkg.b"] == {"pkg.a"}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]


def test_type_checking_imports_are_edges(tmp_path):
    package = _package(
        tmp_path,
        {
            "a": "from pkg import b\n",
            "b": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n",
            "c": "import typing\nif typing.TYPE_CHECKING:\n    from . import a\nelse:\n    a = None\n",
        },
    )
    graph = import_graph(package)
    assert graph["pkg.b"] == {"pkg.a"} and graph["pkg.c"] == {"pkg.a"}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.a"]
