"""One error policy: every error rb_lightning raises on purpose has one root.

Read from the source with ``ast``: each ``raise SomeClass(...)`` in the package
names a class of :mod:`rb_lightning.errors` (all under ``RBLightningError`` and
the built-in they stand for), apart from the few places where Python's own
protocols ask for a built-in; and docs/errors.md lists every class.
"""

from __future__ import annotations

import ast
import builtins
import re
from pathlib import Path

import pytest

from rb_lightning import errors

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rb_lightning"

#: (module, enclosing function, built-in): raises that a Python protocol asks for.
PROTOCOL_RAISES = {
    ("buffers/mixture.py", "items", "IndexError"),  # sequence indexing past the end
    ("stream/datasets.py", "__len__", "TypeError"),  # len() of an unbounded stream
    ("namespaces.py", "__getattr__", "AttributeError"),  # a module's missing attribute
    ("distributed/__init__.py", "__getattr__", "AttributeError"),  # lazy module attribute
}
#: Built-ins that are not errors a user causes with an argument.
#: (ImportError: an optional dependency is missing; its message names the extra.)
NOT_USAGE = {
    "NotImplementedError",
    "SystemExit",
    "KeyboardInterrupt",
    "StopIteration",
    "ImportError",
}


class _Raises(ast.NodeVisitor):
    """``(function, class)`` of every ``raise Class(...)``, in its innermost function."""

    def __init__(self) -> None:
        self.functions = ["<module>"]
        self.found: list[tuple[str, str]] = []

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    def visit_Raise(self, node: ast.Raise) -> None:
        if isinstance(node.exc, ast.Call) and isinstance(node.exc.func, ast.Name):
            self.found.append((self.functions[-1], node.exc.func.id))


def _raises() -> list[tuple[str, str, str]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        visitor = _Raises()
        visitor.visit(ast.parse(path.read_text()))
        module = str(path.relative_to(PACKAGE))
        found += [(module, func, cls) for func, cls in visitor.found]
    return found


def test_every_raised_builtin_is_a_protocol_raise():
    ours = set(errors.__all__)
    stray = sorted(
        {
            (module, func, cls)
            for module, func, cls in _raises()
            if cls not in ours
            and hasattr(builtins, cls)
            and cls not in NOT_USAGE
            and (module, func, cls) not in PROTOCOL_RAISES
        }
    )
    assert not stray, (
        "these raise a bare built-in; raise a class of rb_lightning.errors instead "
        f"(UsageError, ArgumentTypeError, BufferStateError, ...): {stray}"
    )


@pytest.mark.parametrize("name", errors.__all__)
def test_every_error_class_has_one_root(name):
    cls = getattr(errors, name)
    assert issubclass(cls, errors.RBLightningError)
    if cls is not errors.RBLightningError:
        builtin = [b for b in cls.__mro__ if b.__module__ == "builtins" and b is not object]
        assert builtin[0] is not Exception, f"{name} derives from no specific built-in"


def test_no_error_class_is_defined_outside_rb_lightning_errors():
    defined = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "errors.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and re.search(r"(Error|Exception)$", node.name):
                defined.append(f"{path.relative_to(PACKAGE)}:{node.name}")
    assert not defined, f"define error classes in rb_lightning/errors.py: {defined}"


def test_docs_errors_lists_every_error_class():
    text = (ROOT / "docs" / "errors.md").read_text()
    listed = set(re.findall(r"^\| `(\w+)` \|", text, re.M))
    assert listed == set(errors.__all__), (
        f"docs/errors.md's table of error classes is out of date: missing "
        f"{sorted(set(errors.__all__) - listed)}, extra {sorted(listed - set(errors.__all__))}"
    )
