"""Layers point one way: no module imports a higher layer, the import graph has no cycle, no package
reaches into another's private names, and the math never imports Lightning.

Layers, low to high (``diffusion_rl.<package>``, or ``<package>.<subpackage>`` where a package holds
more than one layer)::

    core < models < sampling < likelihood < sandbox < rewards < tasks < rl (the batch types)
    < rl.advantages, rl.objectives < rl.rollout < training < app, report

Imports inside functions count: a lazy import is still a dependency.
"""

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

SRC = ROOT / "src" / "diffusion_rl"
LAYERS = [
    {"core"},
    {"models"},
    {"sampling"},
    {"likelihood"},
    {"sandbox"},
    {"rewards"},
    {"tasks"},
    {"rl"},
    {"rl.advantages", "rl.objectives"},
    {"rl.rollout"},
    {"training"},
    {"app", "report"},
]
LAYER_OF = {name: i for i, names in enumerate(LAYERS) for name in names}
NO_LIGHTNING = {"core", "models", "sampling", "likelihood", "sandbox", "rewards", "rl", "rl.advantages",
                "rl.objectives", "rl.rollout"}


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[str, list[str], int]]:
    """``(imported module, names, line)`` of every import in a file, top-level or not."""
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.module, [a.name for a in node.names], node.lineno))
    return out


FILES = sorted(SRC.rglob("*.py"))
GRAPH = {module_name(f): imports(f) for f in FILES}


def top(module: str) -> str:
    """The layer a module belongs to: ``diffusion_rl.rl.objectives.grpo`` -> ``rl.objectives``,
    ``diffusion_rl.models.llada`` -> ``models`` (the longest name in LAYERS that prefixes it)."""
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYER_OF:
            return ".".join(parts[:n])
    return parts[0] if parts else ""


def test_every_module_has_a_layer():
    missing = sorted({top(m) for m in GRAPH if top(m) and top(m) not in LAYER_OF})
    assert not missing, f"modules of no layer (add them to LAYERS): {missing}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if top(m)))
def test_no_import_of_a_higher_layer(module):
    mine = LAYER_OF[top(module)]
    for target, _, line in GRAPH[module]:
        if target.startswith("diffusion_rl.") and top(target) in LAYER_OF:
            assert LAYER_OF[top(target)] <= mine, f"{module}:{line} imports {target} (a higher layer)"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if top(m) in NO_LIGHTNING))
def test_the_math_never_imports_lightning(module):
    for target, _, line in GRAPH[module]:
        assert not target.startswith(("lightning", "pytorch_lightning")), f"{module}:{line} imports {target}"


def test_no_private_name_crosses_a_package():
    for module, deps in GRAPH.items():
        for target, names, line in deps:
            if not target.startswith("diffusion_rl."):
                continue
            private = [n for n in names if n.startswith("_")] + [p for p in target.split(".") if p.startswith("_")]
            assert not (private and top(target) != top(module)), f"{module}:{line} takes {private} from {target}"


def edges(graph: dict[str, list[tuple[str, list[str], int]]]) -> dict[str, set[str]]:
    """Module -> the modules it imports. ``from pkg import mod`` names the module ``pkg.mod`` when there
    is one (else ``pkg``); a package's ``__init__`` importing its own modules, or a module importing its
    own package's ``__init__``, does not count."""
    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        targets = set()
        for t, names, _ in deps:
            subs = {f"{t}.{n}" for n in names if f"{t}.{n}" in graph}
            targets |= subs
            if t in graph and (not names or len(subs) < len(names)):
                targets.add(t)
        out[m] = {t for t in targets if not m.startswith(t + ".") and not t.startswith(m + ".")}
    return out


def find_cycle(graph_edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or None."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for t in sorted(graph_edges[m]):
            if state.get(t) == 1:
                return [*path[path.index(t):], m, t] if t in path else [m, t]
            if t not in state and (found := visit(t, [*path, m])):
                return found
        state[m] = 2
        return None

    for m in sorted(graph_edges):
        if m not in state and (found := visit(m, [])):
            return found
    return None


def test_the_import_graph_has_no_cycle():
    cycle = find_cycle(edges(GRAPH))
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_cycle_check_sees_a_lazy_import_back(tmp_path):
    """The shape ``rewards/math500.py`` and ``rewards/verify_pool.py`` once had: one imports the other
    at the top through its package, the other imports it back inside a function."""
    (tmp_path / "a.py").write_text("from diffusion_rl.rewards import b\n")
    (tmp_path / "b.py").write_text("def worker():\n    from diffusion_rl.rewards import a\n")
    graph = {f"diffusion_rl.rewards.{n}": imports(tmp_path / f"{n}.py") for n in ("a", "b")}
    graph["diffusion_rl.rewards"] = [("diffusion_rl.rewards.a", ["x"], 1)]  # the package re-exports a
    assert find_cycle(edges(graph)) == ["diffusion_rl.rewards.a", "diffusion_rl.rewards.b", "diffusion_rl.rewards.a"]
    (tmp_path / "b.py").write_text("def worker():\n    return 1\n")
    graph["diffusion_rl.rewards.b"] = imports(tmp_path / "b.py")
    assert find_cycle(edges(graph)) is None


def test_the_checker_sees_a_violation(tmp_path):
    """The AST walk finds lazy imports (a check that could never fail would prove nothing)."""
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from diffusion_rl.training.module import DiffusionRLModule\n")
    assert imports(f) == [("diffusion_rl.training.module", ["DiffusionRLModule"], 2)]
