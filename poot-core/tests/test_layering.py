"""Layering of poot-core: no import cycle among its modules, counting imports inside
functions, and no import of a backend package or of poot_quant.

The graph is read from the source with `ast`, so an import hidden in a function body
counts like one at the top of the module. Only imports under `if TYPE_CHECKING:` are
left out: they never run (every module uses `from __future__ import annotations`).
An edge goes to the module an import names (`from poot.ir import ops` -> poot.ir.ops;
`from poot.ir.graph import Lit` -> poot.ir.graph), not to the packages above it.
"""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "poot").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _runtime_nodes(tree: ast.AST):
    """Every node of `tree` except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _imports(name: str, path: Path, mods) -> list[tuple[str, int]]:
    """(imported module name, line) for every import that runs."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in _runtime_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            for a in node.names:  # a submodule, else a name defined in `base`
                sub = f"{base}.{a.name}"
                out.append((sub if sub in mods else base, node.lineno))
    return out


def _graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], int], list[str]]:
    """(edges between poot-core modules, the line of each edge, forbidden imports)."""
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    lines: dict[tuple[str, str], int] = {}
    forbidden = []
    for m, path in mods.items():
        for target, line in _imports(m, path, mods):
            top = target.split(".")[0]
            if top.startswith("poot_"):  # poot_quant, poot_cuda, poot_wgpu, poot_toy, ...
                forbidden.append(f"{path.relative_to(SRC)}:{line} imports {target}")
                continue
            while target and target not in mods:  # `from poot.x import name` -> poot.x
                target = target.rpartition(".")[0]
            if target and target != m:
                edges[m].add(target)
                lines.setdefault((m, target), line)
    return edges, lines, forbidden


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
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
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def _path(edges, lines, comp: list[str]) -> str:
    """One loop through a component, each edge with its line, for the failure message."""
    inside, start = set(comp), comp[0]
    prev: dict[str, str] = {}
    walk = [start]
    while walk:  # breadth-first until an edge leads back to the start
        v = walk.pop(0)
        for w in sorted(edges[v] & inside):
            if w == start:
                loop = [v]
                while loop[-1] != start:
                    loop.append(prev[loop[-1]])
                loop = loop[::-1] + [start]
                return " -> ".join(f"{a} (line {lines[(a, b)]})"
                                   for a, b in zip(loop, loop[1:], strict=False)) + f" -> {start}"
            if w not in prev:
                prev[w] = v
                walk.append(w)
    return ", ".join(comp)  # pragma: no cover


def test_no_import_cycle_among_poot_core_modules():
    edges, lines, _ = _graph()
    cycles = _cycles(edges)
    assert not cycles, "import cycles in poot-core:\n" + "\n".join(
        f"  {len(c)} modules: {_path(edges, lines, c)}" for c in cycles)


def test_poot_core_imports_no_backend_and_no_quant_package():
    _, _, forbidden = _graph()
    assert not forbidden, "poot-core must not import plugin packages:\n  " + \
        "\n  ".join(forbidden)


def test_the_graph_sees_imports_inside_functions():
    """The checker itself: an import in a function body is an edge."""
    edges, _, _ = _graph()
    # poot.formats reaches the plugin manager only from inside a function
    assert "poot.plugin" in edges["poot.formats"]
    assert len(edges) > 100


def test_the_cycle_finder_reports_a_loop():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    (comp,) = _cycles(edges)
    assert comp == ["a", "b", "c"]
    lines = {("a", "b"): 1, ("b", "c"): 2, ("c", "a"): 3}
    assert _path(edges, lines, comp) == "a (line 1) -> b (line 2) -> c (line 3) -> a"
