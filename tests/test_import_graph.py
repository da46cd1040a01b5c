"""The package's import graph, read from the source (ast): no cycles, no layer importing a
layer above it, no sibling method importing another, and dclens modules imported at the
top of a module (a function-level import of a dclens module is how cycles hide).

Layers, lowest first (a module may import its own layer and the layers below):

0. ``common``      plumbing with no privacy and no algorithm
1. ``privacy``     accounting: no TensorFlow, no files
2. ``data``        datasets and the disjoint partitions
3. ``runs``        the run directory, journal and checkpoints
4. ``evaluation``  classifiers, FID, the authors' protocol
5. ``datalens``, ``gswgan``, ``dpsgd``   the methods (siblings: none imports another)
6. ``experiments``, ``parity``           reproductions, tables, benchmarks, side by side
7. ``cli``         the command-line tools
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "dclens"
LAYERS = {"common": 0, "privacy": 1, "data": 2, "runs": 3, "evaluation": 4,
          "datalens": 5, "gswgan": 5, "dpsgd": 5, "experiments": 6, "parity": 6, "cli": 7}
METHODS = {"datalens", "gswgan", "dpsgd"}
#: Third-party modules a privacy module may not import.
NOT_IN_PRIVACY = ("tensorflow", "keras")


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(tree: ast.AST) -> list[tuple[str, ast.stmt]]:
    """(imported module, statement) for every import of a dclens module; ``from dclens
    import x`` names the module ``dclens.x``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "dclens":
                found += [(f"dclens.{alias.name}", node) for alias in node.names]
            elif node.module.startswith("dclens."):
                found += [(node.module + "." + alias.name, node) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, node) for alias in node.names
                      if alias.name.startswith("dclens.")]
    return found


def _resolve(name: str, modules: dict[str, pathlib.Path]) -> str | None:
    """The module a dotted import name refers to (``dclens.a.b.Name`` -> ``dclens.a.b``)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "dclens"


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        targets = {_resolve(imported, modules) for imported, _ in
                   _imports(ast.parse(path.read_text()))}
        graph[name] = {t for t in targets if t and t != name and t != "dclens"}
    return graph


def test_every_module_belongs_to_a_named_layer():
    unknown = sorted(m for m in _modules() if m != "dclens" and _layer(m) not in LAYERS)
    assert not unknown, f"modules outside the named layers: {unknown}"


def test_no_layer_imports_a_layer_above_it_and_no_method_imports_another():
    wrong = []
    for module, targets in _graph().items():
        if module == "dclens":
            continue
        mine = _layer(module)
        for target in targets:
            theirs = _layer(target)
            if LAYERS[theirs] > LAYERS[mine]:
                wrong.append(f"{module} (layer {mine}) imports {target} (layer {theirs})")
            elif mine in METHODS and theirs in METHODS and mine != theirs:
                wrong.append(f"{module} imports the sibling method {target}")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_import_graph_has_no_cycle():
    graph = _graph()
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_dclens_modules_are_imported_at_the_top_of_a_module():
    """Function-level imports of dclens modules hide cycles; the only exception is the CLI
    runner, which imports the tool it is asked for by name (after setting TensorFlow's
    environment)."""
    deferred = []
    for name, path in _modules().items():
        tree = ast.parse(path.read_text())
        top = {id(node) for node in tree.body}
        for node in tree.body:          # imports under `if` / `try` at module level count
            if isinstance(node, (ast.If, ast.Try)):
                top |= {id(child) for child in ast.walk(node)
                        if isinstance(child, (ast.Import, ast.ImportFrom))}
        for imported, node in _imports(tree):
            if id(node) not in top:
                deferred.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {imported}")
    assert not deferred, "\n".join(sorted(set(deferred)))


@pytest.mark.parametrize("module", sorted(m for m in _modules() if _layer(m) == "privacy"))
def test_the_privacy_layer_imports_no_tensorflow_and_opens_no_file(module):
    tree = ast.parse(_modules()[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""])
            assert not any(n.split(".")[0] in NOT_IN_PRIVACY for n in names), (module, names)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id != "open", f"{module} opens a file (line {node.lineno})"
