"""torchrl's and tensordict's private names are used in ``rb_lightning/torchrl_compat/`` only.

Read from the source with ``ast``: moving the pin means re-checking that one package. Outside
it, a module fails here when it

- imports a ``_name`` from torchrl or tensordict (or from a ``_module`` of theirs);
- reads, sets or names in ``getattr`` / ``setattr`` / ``hasattr`` a ``_name`` attribute
  (one underscore, not a dunder) that torchrl or tensordict use privately, on
  - a name imported from torchrl or tensordict, or
  - ``self`` / ``cls`` in a class derived from one of their classes, or
  - any other object (a parameter, a local), unless a class of the same module defines that
    attribute: rb_lightning's own privates.

Other libraries' privates (``os._exit``) and rb_lightning's own on ``self`` are not this test's.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "rb_lightning"
COMPAT = PACKAGE / "torchrl_compat"
UPSTREAM = ("torchrl", "tensordict")
ATTRIBUTE_CALLS = {"getattr", "setattr", "hasattr", "delattr"}
_DEFINED = re.compile(
    r"\.(_[A-Za-z0-9]\w*)|\bdef (_[A-Za-z0-9]\w*)|^\s*(_[A-Za-z0-9]\w*)\s*[:=]", re.M
)
#: A top-level class of torchrl's source: from ``class X`` to the next line at column 0.
_CLASS_BLOCK = re.compile(r"^class (\w+).*?(?=^[^\s)#]|\Z)", re.M | re.S)


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name != "_"


@functools.cache
def _upstream_sources() -> tuple[str, ...]:
    texts = []
    for package in UPSTREAM:
        spec = importlib.util.find_spec(package)
        assert spec and spec.submodule_search_locations, package
        for root in spec.submodule_search_locations:
            texts += [path.read_text(errors="replace") for path in Path(root).rglob("*.py")]
    return tuple(texts)


def _names(text: str) -> set[str]:
    return {next(group for group in match.groups() if group) for match in _DEFINED.finditer(text)}


def upstream_private_names() -> set[str]:
    """Every ``_name`` torchrl and tensordict define or read as an attribute, from their source."""
    return set().union(*map(_names, _upstream_sources()))


@functools.cache
def _upstream_class_privates() -> dict[str, set[str]]:
    """Top-level class name -> the ``_names`` its body uses, in torchrl's and tensordict's source."""
    found: dict[str, set[str]] = {}
    for text in _upstream_sources():
        for block in _CLASS_BLOCK.finditer(text):
            found.setdefault(block.group(1), set()).update(_names(block.group(0)))
    return found


def _is_upstream(module: str | None) -> bool:
    return (module or "").split(".")[0] in UPSTREAM


def _imports(tree: ast.AST) -> dict[str, str]:
    """Local name -> the module it was imported from (``import a.b``: ``a`` -> ``a``)."""
    found: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found[alias.asname or alias.name.split(".")[0]] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            for alias in node.names:
                found[alias.asname or alias.name] = node.module or ""
    return found


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _accesses(tree: ast.AST) -> Iterator[tuple[ast.ClassDef | None, ast.expr, str, int]]:
    """``(enclosing class, object, attribute, line)`` of each private attribute access."""

    def visit(node: ast.AST, cls: ast.ClassDef | None) -> Iterator[tuple]:
        if isinstance(node, ast.ClassDef):
            cls = node
        if isinstance(node, ast.Attribute) and _private(node.attr):
            yield cls, node.value, node.attr, node.lineno
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ATTRIBUTE_CALLS
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
        ):
            yield cls, node.args[0], node.args[1].value, node.lineno
        for child in ast.iter_child_nodes(node):
            yield from visit(child, cls)

    yield from visit(tree, None)


def _upstream_object(expr: ast.expr, imports: dict[str, str]) -> object | None:
    """The torchrl/tensordict object ``expr`` (``ReplayBuffer``, ``td.Sampler``) names, if any."""
    names = []
    while isinstance(expr, ast.Attribute):
        names.insert(0, expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name) or not _is_upstream(imports.get(expr.id)):
        return None
    origin = imports[expr.id]
    obj: object = importlib.import_module(origin)
    if origin.split(".")[-1] != expr.id:  # "from torchrl.data import X": X is an attribute
        names.insert(0, expr.id)
    for name in names:
        obj = getattr(obj, name)
    return obj


def _class_privates(klass: type) -> set[str]:
    """The private names the torchrl/tensordict classes of ``klass``'s MRO use, from their source."""
    by_class = _upstream_class_privates()
    ancestors = [c.__name__ for c in klass.__mro__ if _is_upstream(c.__module__)]
    return set().union(*(by_class.get(name, set()) for name in ancestors))


def _upstream_classes(trees: dict[str, ast.AST]) -> dict[str, set[str]]:
    """rb_lightning's classes derived (at any depth) from a torchrl/tensordict class: for each,
    the private names its torchrl/tensordict ancestors use."""
    bases: dict[str, list[str]] = {}
    derived: dict[str, set[str]] = {}
    for tree in trees.values():
        imports = _imports(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for base in node.bases:
                    klass = _upstream_object(base, imports)
                    if isinstance(klass, type):
                        derived.setdefault(node.name, set()).update(_class_privates(klass))
                bases[node.name] = [b.id for b in node.bases if isinstance(b, ast.Name)]
    changed = True
    while changed:
        changed = False
        for name, roots in bases.items():
            inherited = set().union(*(derived.get(root, set()) for root in roots))
            if inherited - derived.get(name, set()):
                derived.setdefault(name, set()).update(inherited)
                changed = True
    return derived


def _own_privates(tree: ast.AST, upstream_classes: set[str]) -> set[str]:
    """Private attributes the module's own classes (not derived from torchrl's) define."""
    own: set[str] = set()
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef) or cls.name in upstream_classes:
            continue
        for node in ast.walk(cls):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in ("self", "cls")
            ):
                own.add(node.attr)
    return {name for name in own if _private(name)}


def violations(sources: dict[str, str], upstream_private: set[str]) -> list[str]:
    """``"path:line: what"`` for each use of a torchrl/tensordict private name in ``sources``."""
    trees = {path: ast.parse(text) for path, text in sources.items()}
    upstream_classes = _upstream_classes(trees)
    found = []
    for path, tree in trees.items():
        imports = _imports(tree)
        own = _own_privates(tree, upstream_classes)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and _is_upstream(node.module):
                module_parts = (node.module or "").split(".")
                for alias in node.names:
                    if _private(alias.name) or any(map(_private, module_parts)):
                        found.append(f"{path}:{node.lineno}: imports {node.module}.{alias.name}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if _is_upstream(alias.name) and any(map(_private, alias.name.split("."))):
                        found.append(f"{path}:{node.lineno}: imports {alias.name}")
        for cls, obj, attribute, line in _accesses(tree):
            root = _root_name(obj)
            origin = imports.get(root or "")
            if isinstance(obj, ast.Name) and obj.id in ("self", "cls") and cls is not None:
                torchrls = attribute in upstream_classes.get(cls.name, set())
            elif origin is not None:  # a module or object imported from a library
                torchrls = _is_upstream(origin)
            else:
                torchrls = attribute in upstream_private and attribute not in own
            if torchrls:
                found.append(f"{path}:{line}: .{attribute} of {ast.unparse(obj)}")
    return found


def _package_sources() -> dict[str, str]:
    return {
        str(path.relative_to(PACKAGE.parent)): path.read_text()
        for path in sorted(PACKAGE.rglob("*.py"))
        if COMPAT not in path.parents
    }


def test_no_private_torchrl_name_outside_torchrl_compat():
    sources = _package_sources()
    assert "rb_lightning/distributed/ray.py" in sources and COMPAT.is_dir()
    found = violations(sources, upstream_private_names())
    assert not found, (
        "torchrl/tensordict private names outside rb_lightning/torchrl_compat/: move each behind "
        "a small named function of torchrl_compat.internals (or .workarounds, naming the torchrl "
        "version and the test that fails once upstream fixes it):\n" + "\n".join(found)
    )


def test_the_rule_catches_what_the_package_once_did_and_spares_its_own_privates():
    upstream = upstream_private_names()
    assert {"_sum_tree", "_rb", "_delayed_init", "_client", "_write_count"} <= upstream
    caught = """
from torchrl.data import RayReplayBuffer
from torchrl.data.replay_buffers.ray_buffer import _RayReplayBufferClient
import torchrl.data as td

class View(RayReplayBuffer):
    def __init__(self, actor):
        self._rb = actor
        self._delayed_init = False

def mass(sampler, n):
    td._secret
    return sampler._sum_tree.query(0, n), getattr(sampler, "_min_tree", None)
"""
    spared = """
import os

class Own:
    _cache = None

    def __init__(self):
        self._rb = None
        self._sum_tree = 0

    def _helper(self):
        return self._rb, os._exit

def peek(own: Own):
    return own._sum_tree, own._helper(), own._cache
"""
    assert [line.split(": ", 1)[1] for line in violations({"m.py": caught}, upstream)] == [
        "imports torchrl.data.replay_buffers.ray_buffer._RayReplayBufferClient",
        "._rb of self",
        "._delayed_init of self",
        "._secret of td",
        "._sum_tree of sampler",
        "._min_tree of sampler",
    ]
    assert violations({"own.py": spared}, upstream) == []
