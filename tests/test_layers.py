"""The layers point down: each folder of tiecli, and each module at its top, sits in one layer, declared once
here, low to high; no module imports from a layer above its own (function-level imports included), every
module has a layer, and docs/code.md's table lists exactly the modules each folder holds.

`python tests/test_layers.py` rewrites that table's modules column from the tree (each row's job stays)."""

import re
from pathlib import Path

from test_imports import PACKAGE, import_graph

ROOT = "tiecli"

# Low to high. A member is a folder (every module in it) or one module at tiecli's top.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("base", ("tiecli", "tiecli.errors", "tiecli.formats")),
    ("storage", ("tiecli.run",)),
    ("config", ("tiecli.config",)),
    ("data", ("tiecli.data",)),
    ("model", ("tiecli.model",)),
    ("runtime", ("tiecli.runtime",)),
    ("measure", ("tiecli.measure",)),
    ("train", ("tiecli.train",)),
    ("commands", ("tiecli.commands", "tiecli.sweep", "tiecli.report")),
    ("command line", ("tiecli.cli", "tiecli.__main__", "tiecli.arguments", "tiecli.display")),
)

DOCS = PACKAGE.parent / "docs" / "code.md"
HEADER = "| layer | folder | modules | job |"
REGENERATE = "python tests/test_layers.py"


def layer_of(module: str, layers=LAYERS, root: str = ROOT) -> int | None:
    """The index of the module's layer: the longest member that is the module or a folder holding it."""
    best, index = "", None
    for i, (_, members) in enumerate(layers):
        for member in members:
            holds = module == member or (member != root and module.startswith(member + "."))
            if holds and len(member) > len(best):
                best, index = member, i
    return index


def climbing(graph: dict[str, set[str]], layers=LAYERS, root: str = ROOT) -> list[str]:
    """Each import from a layer above the importing module's own, as 'module (layer) imports target (layer)'."""
    found = []
    for module in sorted(graph):
        own = layer_of(module, layers, root)
        for target in sorted(graph[module]):
            above = layer_of(target, layers, root)
            if own is not None and above is not None and above > own:
                found.append(f"{module} ({layers[own][0]}) imports {target} ({layers[above][0]})")
    return found


def rows(package: Path = PACKAGE) -> list[tuple[str, str, list[str]]]:
    """The table the tree gives: (layer, folder, its modules' file names), a row per folder and one per layer's
    modules at the top."""
    table = []
    for name, members in LAYERS:
        top = [m for m in members if not (package / m.rpartition(".")[2]).is_dir()]
        for member in members:
            if member in top:
                continue
            folder = package / member.rpartition(".")[2]
            table.append((name, f"{folder.name}/", sorted(p.name for p in folder.glob("*.py") if p.stem != "__init__")))
        if top:
            files = ["__init__.py" if m == ROOT else m.rpartition(".")[2] + ".py" for m in top]
            table.append((name, f"{ROOT}/", [f for f in files if (package / f).is_file()]))
    return table


def documented(text: str) -> list[tuple[str, str, list[str], str]]:
    """docs/code.md's layer table: (layer, folder, the modules its row names, the row's job)."""
    lines = text.splitlines()
    start = lines.index(HEADER) + 2
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        layer, folder, modules, job = (cell.strip() for cell in line.strip("|").split("|", 3))
        table.append((layer, folder.strip("`"), re.findall(r"`([^`]+)`", modules), job.strip()))
    return table


def rewritten(text: str) -> str:
    """docs/code.md with its table's rows made from the tree: a row keeps its job and its modules' order, new
    modules join at its end."""
    jobs = {(layer, folder): (modules, job) for layer, folder, modules, job in documented(text)}
    lines = text.splitlines(keepends=True)
    start = lines.index(HEADER + "\n") + 2
    end = next(i for i in range(start, len(lines) + 1) if i == len(lines) or not lines[i].startswith("|"))
    new = []
    for layer, folder, modules in rows():
        listed, job = jobs.get((layer, folder), ([], ""))
        ordered = [m for m in listed if m in modules] + [m for m in modules if m not in listed]
        new.append(f"| {layer} | `{folder}` | {', '.join(f'`{m}`' for m in ordered)} | {job} |\n")
    return "".join(lines[:start] + new + lines[end:])


def test_every_module_has_a_layer_and_every_member_exists():
    unplaced = [m for m in import_graph() if layer_of(m) is None]
    assert not unplaced, f"modules in no layer (add their folder or name to LAYERS in tests/test_layers.py): {unplaced}"
    graph = import_graph()
    missing = [m for _, members in LAYERS for m in members if m not in graph]
    assert not missing, f"LAYERS names what tiecli does not hold: {missing}"


def test_no_module_imports_from_a_layer_above_its_own():
    graph = import_graph()
    assert len(graph) > 30 and graph["tiecli.cli"]  # the whole package, with its edges
    found = climbing(graph)
    assert not found, (
        "imports that climb the layers (low to high: " + ", ".join(n for n, _ in LAYERS) + "):\n" + ("\n".join(found))
    )


def test_the_checker_finds_an_import_from_a_layer_above(tmp_path):
    pkg = tmp_path / "pkg"
    for folder in ("low", "high"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "low" / "leaf.py").write_text("def f():\n    from pkg.high import top\n    return top\n")
    (pkg / "high" / "top.py").write_text("from pkg.low import leaf\nfrom pkg import edge\n")
    (pkg / "edge.py").write_text("import pkg.low.leaf\n")
    (pkg / "stray.py").write_text("")
    layers = (("bottom", ("pkg", "pkg.edge", "pkg.low")), ("top", ("pkg.high",)))
    graph = import_graph(pkg)
    assert climbing(graph, layers, "pkg") == ["pkg.low.leaf (bottom) imports pkg.high.top (top)"]
    assert layer_of("pkg.stray", layers, "pkg") is None and layer_of("pkg", layers, "pkg") == 0


def test_docs_code_md_lists_the_modules_each_folder_holds():
    text = DOCS.read_text(encoding="utf-8")
    have = [(layer, folder, sorted(modules)) for layer, folder, modules, _ in documented(text)]
    want = [(layer, folder, sorted(modules)) for layer, folder, modules in rows()]
    assert have == want, f"docs/code.md's layer table is not the tree's; `{REGENERATE}` rewrites its modules column"
    assert all(job for *_, job in documented(text)), "a row of docs/code.md's layer table says no job"


if __name__ == "__main__":
    DOCS.write_text(rewritten(DOCS.read_text(encoding="utf-8")), encoding="utf-8")
