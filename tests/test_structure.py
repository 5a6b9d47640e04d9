"""The house's one-way imports: no import cycle inside rao_core (function-level imports included),
and rao_core never imports Prefect or the flows/tasks layers above it."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "rao_core"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in CORE.rglob("*.py")}


def imports(path: Path) -> set[str]:
    """Every module a file imports at run time, at any level of the file (function-level imports
    count; `if TYPE_CHECKING:` blocks, which never run, do not)."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and getattr(block.test, "id", None) == "TYPE_CHECKING"
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
            out |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in MODULES}
    return out


def graph() -> dict[str, set[str]]:
    return {m: {i for i in imports(p) if i in MODULES and i != m} for m, p in MODULES.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_inside_rao_core():
    edges = graph()
    # a package __init__ that re-exports its own modules is not a cycle: drop package -> child edges
    for m in edges:
        edges[m] = {i for i in edges[m] if not (MODULES[m].name == "__init__.py" and i.startswith(m + "."))}
        edges[m] = {i for i in edges[m] if not (MODULES[i].name == "__init__.py" and m.startswith(i + "."))}
    assert cycles(edges) == []


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_rao_core_never_imports_prefect_or_the_layers_above():
    bad = {
        (m, i)
        for m, p in MODULES.items()
        for i in imports(p)
        if i.split(".")[0] in ("prefect", "prefect_ray", "flows", "tasks")
    }
    assert bad == set()
