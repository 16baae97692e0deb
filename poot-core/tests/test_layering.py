"""Layering of poot-core: its modules form layers, each importing only its own and lower
layers; no import cycle among its modules; no import of a backend package or of poot_quant.

The layers, lowest first (`LAYERS`; each names top-level modules and packages of poot):

    foundation  the package root, errors, dtypes, optional, paths, versions, checked
    ir          the graph IR, its ops and types (a packed weight's format registry is
                installed into it from above: poot.ir.packed)
    seam        the backend contract and the plugin registry
    meaning     the oracle (what an op computes) and capability tables (what a device takes)
    codegen     kernel programs, their lowerings, the packed formats they decode, and the
                KernelBackend base every printing backend subclasses
    tracing     the tracer and the op library models trace with (packed weights included)
    compiler    graph passes
    plan        buffer planning
    runtime     executors, sessions, weight caches, stream runtimes
    models      model builders, loaders, sampling, tensor parallelism
    backends    the built-in reference backend and the conformance suite
    serve       the HTTP server
    cli         the command line

The graph is read from the source with `ast`, so an import hidden in a function body
counts like one at the top of the module. Only imports under `if TYPE_CHECKING:` are
left out: they never run (every module uses `from __future__ import annotations`).
An edge goes to the module an import names (`from poot.ir import ops` -> poot.ir.ops;
`from poot.ir.graph import Lit` -> poot.ir.graph), and to the packages above it that the
import runs first (`poot.oracle.scalar` runs poot/oracle/__init__.py), except the importer's
own packages, which are initialised before it.
"""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

#: (layer, the top-level modules and packages of poot in it), lowest first
LAYERS = (
    ("foundation", {"poot", "errors", "dtypes", "optional", "paths", "versions", "checked",
                    "digest"}),
    ("ir", {"ir"}),
    ("seam", {"contract", "plugin"}),
    ("meaning", {"oracle", "capability"}),
    ("codegen", {"formats", "builtin_formats", "codegen", "kernel_backend", "simt_backend"}),
    ("tracing", {"tracer", "ops"}),
    ("compiler", {"compiler"}),
    ("plan", {"plan"}),
    ("runtime", {"runtime"}),
    ("models", {"models", "parallel"}),
    ("backends", {"backends", "conformance"}),
    ("serve", {"serve"}),
    ("cli", {"cli", "__main__"}),
)


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
            for t in (target, *_packages(target)):  # importing poot.a.b runs poot.a first
                if t and t != m and t not in _packages(m):
                    edges[m].add(t)
                    lines.setdefault((m, t), line)
    return edges, lines, forbidden


def _packages(name: str) -> list[str]:
    """The packages above module `name`: poot.a.b -> [poot.a, poot]."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def _layer(module: str, layers=LAYERS) -> int | None:
    """The index of `module`'s layer (None: in none), by its top-level name under poot."""
    top = module.split(".")[1] if "." in module else module
    return next((i for i, (_, names) in enumerate(layers) if top in names), None)


def _upward(edges, lines, layers=LAYERS) -> list[str]:
    """Every import of a module of a higher layer than the importer's, and every module
    in no layer, as failure lines."""
    out = [f"{m} is in no layer of LAYERS" for m in sorted(edges)
           if _layer(m, layers) is None]
    for m in sorted(edges):
        here = _layer(m, layers)
        for t in sorted(edges[m]):
            there = _layer(t, layers)
            if here is not None and there is not None and there > here:
                out.append(f"{m} (line {lines[(m, t)]}, layer {layers[here][0]}) imports "
                           f"{t} (layer {layers[there][0]})")
    return out


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


def test_no_module_imports_from_a_higher_layer():
    edges, lines, _ = _graph()
    upward = _upward(edges, lines)
    assert not upward, "imports against the layers of poot-core (see LAYERS):\n  " + \
        "\n  ".join(upward)


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


def test_the_graph_sees_the_packages_an_import_runs():
    """The checker itself: importing a submodule runs its packages' __init__ first, an
    edge; the importer's own packages are not."""
    edges, _, _ = _graph()
    assert {"poot.oracle.scalar", "poot.oracle"} <= edges["poot.codegen.expr"]
    assert "poot.ir" not in edges["poot.ir.ops.composite"]


def test_the_layer_check_reports_an_upward_import_and_a_module_in_no_layer():
    layers = (("low", {"a"}), ("high", {"b"}))
    edges = {"poot.a": {"poot.b.x"}, "poot.b.x": {"poot.a"}, "poot.c": set()}
    lines = {("poot.a", "poot.b.x"): 7, ("poot.b.x", "poot.a"): 3}
    assert _upward(edges, lines, layers) == [
        "poot.c is in no layer of LAYERS",
        "poot.a (line 7, layer low) imports poot.b.x (layer high)"]


def test_the_cycle_finder_reports_a_loop():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    (comp,) = _cycles(edges)
    assert comp == ["a", "b", "c"]
    lines = {("a", "b"): 1, ("b", "c"): 2, ("c", "a"): 3}
    assert _path(edges, lines, comp) == "a (line 1) -> b (line 2) -> c (line 3) -> a"
