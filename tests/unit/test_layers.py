"""The package's layers, read from its source: `core/` is pure (no client, no kopf, nothing of the
operator's), `controller/` sits on it, `cli` on both; only `controller/kube.py` imports the
Kubernetes client; no module imports, even lazily, one that imports it back; no module imports a
library's private module (kopf._core and the like); and every pass starts from the work queue.
And the tests' own layout: every test module in a tier's folder, no test module importing another
(what tests share lives in tests/support/), the support package importing no test module, and its
plugins loaded by the root conftest alone."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.paths import ROOT

PACKAGE = ROOT / "operator" / "kata_sizing"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(path: Path) -> set[str]:
    """Every module `path` imports (at any depth: a function's lazy import counts), absolute."""
    return _imports_in(path.read_text(), _module_name(path), path.name == "__init__.py", str(path))


def _imports_in(text: str, module: str, is_package: bool = False, filename: str = "<test>") -> set[str]:
    package = module if is_package else module.rpartition(".")[0]
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
        for inner in ast.iter_child_nodes(node):
            visit(inner)

    visit(ast.parse(text, filename))
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
            assert not {i for i in GRAPH[name] if i == "kata_sizing.cli" or i.startswith("kata_sizing.cli.")}, name


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


def _is_private(module: str) -> bool:
    """A library module its authors keep to themselves: a name part with a leading underscore
    (kopf._core, pydantic._internal), or one of the helpers aiohttp documents as internal."""
    return any(part.startswith("_") for part in module.split(".")) or module.startswith(("aiohttp.helpers",))


def test_no_module_imports_a_private_module_of_a_library():
    # kopf, aiohttp and pydantic change their internals in any release, without notice.
    for name, path in MODULES.items():
        private = sorted(i for i in _imports(path)
                         if not i.startswith(("kata_sizing", "__future__")) and _is_private(i))
        assert not private, f"{name} imports {private}, which its library keeps private"


def test_the_private_import_check_catches_kopfs_internals():
    text = "import kopf\nfrom kopf._core.engines import posting\n\ndef late():\n    import aiohttp.helpers\n"
    found = {i for i in _imports_in(text, "kata_sizing.controller.sample") if _is_private(i)}
    assert found == {"kopf._core.engines", "kopf._core.engines.posting", "aiohttp.helpers"}


def _references(tree: ast.AST, name: str) -> list[str]:
    """The functions (by name) whose body names `name` (a call, or the function handed on)."""
    found: list[str] = []

    def visit(node: ast.AST, function: str) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            function = node.name
        if (isinstance(node, ast.Name) and node.id == name) or (isinstance(node, ast.Attribute) and node.attr == name):
            found.append(function)
        for child in ast.iter_child_nodes(node):
            visit(child, function)

    visit(tree, "<module>")
    return found


def passes_started_by(sources: dict[str, str]) -> set[tuple[str, str]]:
    """(module, function) of every place that names reconcile.run_pass, other than its own
    definition and imports."""
    return {(module, function) for module, text in sources.items()
            for function in _references(ast.parse(text), "run_pass")}


def test_every_pass_starts_from_the_work_queue():
    """One entry path: the queue's processor. A kopf handler, a timer or a callback that ran a pass
    itself would have its own retry, its own lock and its own idea of what a failure means."""
    sources = {name: path.read_text() for name, path in MODULES.items()}
    assert passes_started_by(sources) == {("kata_sizing.controller.worker", "process")}
    assert not GRAPH["kata_sizing.controller.handlers"] & {
        "kata_sizing.controller.reconcile", "kata_sizing.controller.execute"}, "kopf's handlers only queue work"


def test_the_entry_path_check_catches_a_second_caller():
    sources = {"kata_sizing.controller.worker": "async def process(state, name, trigger):\n"
                                               "    await run_pass(state, name, trigger)\n",
               "kata_sizing.controller.handlers": "from . import reconcile\n"
                                                 "async def resync(memo, **_):\n"
                                                 "    await reconcile.run_pass(memo.state, 'p', 'resync')\n"}
    assert passes_started_by(sources) == {("kata_sizing.controller.worker", "process"),
                                          ("kata_sizing.controller.handlers", "resync")}


# --- the tests' layout (docs/testing.md) --------------------------------------------------------

TESTS = ROOT / "tests"
TIERS = ("unit", "api", "node", "vm")


def _test_module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


TEST_MODULES = {_test_module_name(p): p for p in sorted(TESTS.rglob("*.py"))
                if p.name.startswith("test_") or p.name == "conftest.py"}


def imports_of_test_modules(sources: dict[str, str]) -> dict[str, list[str]]:
    """{module: the test modules (and conftests) it imports, at any depth}; a module of the
    support package counts too."""
    found = {}
    for module, text in sources.items():
        imported = sorted({i for i in _imports_in(text, module) if i.startswith("tests.") and (
            i in TEST_MODULES or i == "tests.conftest" or i.rpartition(".")[2].startswith("test_"))} - {module})
        if imported:
            found[module] = imported
    return found


def test_no_test_module_imports_another_and_support_imports_none():
    sources = {_test_module_name(p): p.read_text() for p in sorted(TESTS.rglob("*.py"))}
    assert imports_of_test_modules(sources) == {}, "move what they share into tests/support/"


def test_the_test_import_check_catches_a_test_module_importing_another():
    sources = {"tests.api.test_a": "from tests.unit.test_b import helper\n",
               "tests.api.test_c": "def late():\n    from .test_a import thing\n",
               "tests.support.tiers": "import tests.node.test_d\n",
               "tests.unit.test_e": "from tests.conftest import fixture\n",
               "tests.unit.test_f": "from tests.support.policies import example\n"}
    assert imports_of_test_modules(sources) == {
        "tests.api.test_a": ["tests.unit.test_b"], "tests.api.test_c": ["tests.api.test_a"],
        "tests.support.tiers": ["tests.node.test_d"], "tests.unit.test_e": ["tests.conftest"]}


def test_every_test_module_sits_in_a_tier_and_only_the_root_conftest_loads_plugins():
    misplaced = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")
                       if p.relative_to(TESTS).parts[0] not in TIERS)
    assert misplaced == [], f"test modules outside tests/{{{','.join(TIERS)}}}/: {misplaced}"
    assert sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("conftest.py")) == ["conftest.py"]
