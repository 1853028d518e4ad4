"""The package's layers, read from its source: `core/` is pure (no client, no kopf, nothing of the
operator's), `controller/` sits on it, `cli` on both; only `controller/kube.py` imports the
Kubernetes client; and no module imports, even lazily, one that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "operator" / "kata_sizing"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path) -> set[str]:
    """Every module `path` imports (at any depth: a function's lazy import counts), absolute."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _type_checking_only(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            found.add(target)
            # `from . import podfit` imports the module kata_sizing.core.podfit.
            found.update(f"{target}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {name: {i for i in _imports(path) if i in MODULES and i != name} for name, path in MODULES.items()}
EXTERNAL = {name: {i.split(".")[0] for i in _imports(path)} for name, path in MODULES.items()}


def test_core_is_pure_and_imports_nothing_above_it():
    for name in MODULES:
        if not name.startswith("kata_sizing.core."):
            continue
        above = {i for i in GRAPH[name] if not i.startswith("kata_sizing.core")}
        assert not above, f"{name} imports {sorted(above)}"
        assert not EXTERNAL[name] & {"kopf", "kubernetes", "aiohttp", "prometheus_client", "asyncio"}, name


def test_the_controller_never_imports_the_cli():
    for name in MODULES:
        if name.startswith("kata_sizing.controller."):
            assert "kata_sizing.cli" not in GRAPH[name], name


def test_only_the_api_wrapper_imports_the_kubernetes_client():
    users = sorted(name for name in MODULES if "kubernetes" in EXTERNAL[name])
    assert users == ["kata_sizing.controller.kube"]


def test_no_import_cycle():
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def walk(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(GRAPH[name]):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if target not in state:
                walk(target, [*path, target])
        state[name] = 2

    for name in sorted(MODULES):
        if name not in state:
            walk(name, [name])
