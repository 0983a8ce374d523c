"""The package's layers point down: no import cycle among tiecli's modules, function-level imports included."""

import ast
from pathlib import Path

import tiecli

PACKAGE = Path(tiecli.__file__).parent


def module_names(root: Path) -> dict[str, Path]:
    """tiecli's modules by dotted name (a package by its own name, for its __init__.py)."""
    names = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def imported(node: ast.AST, package: str) -> list[str]:
    """The dotted names an import statement reaches: `from a import b` reaches a.b when b is a module, else a."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: from . import x, from ..a import b
        parent = package.split(".")[: len(package.split(".")) - node.level + 1]
        base = ".".join([*parent, *([node.module] if node.module else [])])
    return [f"{base}.{alias.name}" for alias in node.names] + [base]


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the tiecli modules it imports anywhere in its file (top level, in functions, under TYPE_CHECKING)."""
    modules = module_names(root)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = imported(node, package)
            submodules = [t for t in targets if t in modules and t != targets[-1]]
            for target in submodules or targets[-1:]:  # `from a import b` with b a module: a.b, not a
                while target and target not in modules:  # `import a.b.c` or `from a.b import func`: the module a.b
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_the_checker_finds_a_cycle_through_a_function_level_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "low.py").write_text("def f():\n    from pkg.sub import high\n    return high\n")
    (pkg / "sub" / "high.py").write_text("from pkg import low\n")
    (pkg / "alone.py").write_text("from pkg.sub import high\nimport os\n")
    graph = import_graph(pkg)
    assert graph["pkg.low"] == {"pkg.sub.high"} and graph["pkg.alone"] == {"pkg.sub.high"}
    assert cycles(graph) == [["pkg.low", "pkg.sub.high"]]


def test_tiecli_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 30 and graph["tiecli.cli"]  # the whole package, with its edges
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(
        " <-> ".join(f"{m} (imports {sorted(graph[m] & set(c))})" for m in c) for c in found
    )
