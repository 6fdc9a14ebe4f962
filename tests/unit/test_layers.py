"""The package's folders form layers: each imports only the layers below it.

Read from the source (``ast``), counting every import of an ``rb_lightning``
module: at module level, inside functions and under ``if TYPE_CHECKING:`` alike
(:mod:`test_import_graph` reads the same edges). docs/layout.md draws the layers.
"""

from __future__ import annotations

from test_import_graph import PACKAGE, import_graph

#: Bottom to top. A unit is a folder of the package, or a module at its top
#: (``errors.py``): the base layer. An import may go to its own unit or to a lower
#: layer only; units of one layer do not import each other.
LAYERS: list[tuple[str, set[str]]] = [
    ("base", {"base"}),
    ("persistence", {"persist"}),
    ("buffers", {"buffers"}),
    ("sources", {"sources"}),
    ("stream", {"stream"}),
    ("lightning", {"lightning"}),
    ("plugins", {"distributed", "hf", "runs"}),
    ("examples", {"rl", "llm"}),
    ("public surface", {"", "checkpoint"}),  # rb_lightning/__init__.py and rb_lightning.checkpoint
]


#: The modules (and the torchrl_compat package) at the package's top that form its base layer
#: (they may import each other).
BASE = {"errors", "namespaces", "torchrl_compat", "columns", "validation", "policy_version"}


def unit_of(module: str) -> str:
    """``rb_lightning.stream.sampling`` -> ``stream``; ``rb_lightning.errors`` -> ``base``;
    ``rb_lightning`` -> ``""``."""
    parts = module.split(".")
    if len(parts) == 1:
        return ""
    return "base" if parts[1] in BASE else parts[1]  # torchrl_compat is a package


def layer_of(unit: str) -> int:
    for index, (_, units) in enumerate(LAYERS):
        if unit in units:
            return index
    raise AssertionError(
        f"rb_lightning/{unit} is in no layer: add it to LAYERS in {__name__} (and to "
        "docs/layout.md)"
    )


def violations(graph: dict[str, set[str]]) -> list[str]:
    """Each import that goes up, or sideways to another unit of the same layer."""
    found = []
    for module, targets in sorted(graph.items()):
        source_unit = unit_of(module)
        for target in sorted(targets):
            target_unit = unit_of(target)
            if target_unit == source_unit:
                continue
            if layer_of(target_unit) >= layer_of(source_unit):
                found.append(
                    f"{module} ({LAYERS[layer_of(source_unit)][0]}) imports {target} "
                    f"({LAYERS[layer_of(target_unit)][0]})"
                )
    return found


def test_every_import_goes_down_the_layers():
    graph = import_graph()
    assert f"{PACKAGE}.stream.sampling" in graph  # the walk found the source
    found = violations(graph)
    assert not found, "imports against the layer order:\n" + "\n".join(found)


def test_an_upward_import_is_caught():
    graph = {"rb_lightning.persist.dumps": {"rb_lightning.lightning.datamodule"}}
    assert violations(graph) == [
        "rb_lightning.persist.dumps (persistence) imports rb_lightning.lightning.datamodule "
        "(lightning)"
    ]
    sideways = {"rb_lightning.hf.export": {"rb_lightning.runs.cli"}}
    assert len(violations(sideways)) == 1


def _third_party_roots(path) -> set[str]:
    """The top-level packages a module imports (any import, anywhere in the module)."""
    import ast

    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_layers_below_lightning_know_no_trainer():
    from test_import_graph import ROOT

    below = {unit for _, units in LAYERS[: layer_of("lightning")] for unit in units}
    found = [
        str(path.relative_to(ROOT.parent))
        for path in sorted(ROOT.rglob("*.py"))
        if unit_of(".".join(path.relative_to(ROOT.parent).with_suffix("").parts)) in below
        and "lightning" in _third_party_roots(path)
    ]
    assert not found, f"these import the lightning package below the Lightning layer: {found}"


def test_every_folder_of_the_package_is_in_the_wheel():
    # setuptools takes the packages listed in pyproject.toml only: a new layer left out of it
    # installs a wheel that fails at its first import (.ci/run checks the wheel too, later).
    import tomllib
    from test_import_graph import ROOT

    listed = set(
        tomllib.loads((ROOT.parent / "pyproject.toml").read_text())["tool"]["setuptools"][
            "packages"
        ]
    )
    folders = {
        ".".join(path.parent.relative_to(ROOT.parent).parts) for path in ROOT.rglob("__init__.py")
    }
    assert folders - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
