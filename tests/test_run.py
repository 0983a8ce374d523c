"""The storage layer, tiecli/run/: what it imports, and what its writer hands the listeners a caller attaches."""

import ast
import json
from dataclasses import asdict
from pathlib import Path

import pytest

import tiecli
from tiecli.errors import TiecliError
from tiecli.run.layout import CONFIG, METRICS, OVERRIDES, SUMMARY
from tiecli.run.reader import RunReader
from tiecli.run.records import EvalResult, GeometryEntry, MetricsRow, Summary
from tiecli.run.writer import RunWriter

PACKAGE = Path(tiecli.__file__).parent


def imports(path: Path) -> set[str]:
    """The tiecli modules a file imports, at any level (function-level imports included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path.name}: a relative import"
            found |= {node.module or ""} | {f"{node.module}.{a.name}" for a in node.names}
    modules = {str(p.relative_to(PACKAGE.parent).with_suffix("")).replace("/", ".") for p in PACKAGE.rglob("*.py")}
    modules = {m.removesuffix(".__init__") for m in modules}
    return {name for name in found if name in modules}


def graph() -> dict[str, set[str]]:
    return {
        str(p.relative_to(PACKAGE.parent).with_suffix("")).replace("/", ".").removesuffix(".__init__"): imports(p)
        for p in PACKAGE.rglob("*.py")
    }


def reachable(edges: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in edges.get(todo.pop(), set()) - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def test_storage_imports_nothing_of_tiecli_but_errors():
    edges = graph()
    storage = {m for m in edges if m.startswith("tiecli.run.") or m == "tiecli.run"}
    assert storage >= {"tiecli.run.files", "tiecli.run.layout", "tiecli.run.reader", "tiecli.run.writer"}
    for module in sorted(storage):
        assert edges[module] <= storage | {"tiecli.errors"}, (module, edges[module] - storage)


def test_storage_and_trackers_are_in_no_import_cycle():
    """Nothing that tiecli.run or tiecli.train.trackers import, directly or not, imports them back."""
    edges = graph()
    for module in sorted(m for m in edges if m.startswith("tiecli.run") or m == "tiecli.train.trackers"):
        assert module not in reachable(edges, module), module


def on_disk(path: Path, kind: str, record: dict) -> bool:
    """Whether the run directory already holds `record`, read back through RunReader."""
    reader = RunReader(path)
    held = {
        "metrics": lambda: [r.to_dict() for r in reader.metrics()],
        "geometry": lambda: [e.to_dict() for e in reader.geometry()],
        "eval": lambda: [asdict(e) for e in reader.evals().values()],
        "summary": lambda: [asdict(reader.summary())],
    }
    return record in held[kind]()


class Recorder:
    """A listener that notes each call in a shared log: its name, the record's kind and step, whether
    the run was still locked (in use) at that moment, and whether the record was on disk already."""

    def __init__(self, name: str, path: Path, log: list):
        self.name, self.path, self.log = name, path, log

    def written(self, kind: str, record: dict) -> None:
        self.log.append(
            (self.name, kind, record["step"], RunReader(self.path).in_use(), on_disk(self.path, kind, record))
        )

    def truncated(self, last_step: int) -> None:
        self.log.append((self.name, "truncated", last_step, RunReader(self.path).in_use(), True))

    def close(self) -> None:
        self.log.append((self.name, "close", None, RunReader(self.path).in_use(), True))


def new_run(path: Path) -> RunWriter:
    summary = Summary(
        path.name, "running", 0, {}, 8, 128, 0, 0, "cpu", "fp32", False, {}, {}, "2026-01-01T00:00:00+00:00"
    )
    files = {CONFIG: "seed: 0\nlogger:\n  tensorboard: {projector: false}\n", OVERRIDES: "overrides: []\nchoices: {}\n"}
    return RunWriter.create(path, files, summary, b"")


def test_the_writer_hands_each_record_to_its_listeners_after_writing_it(tmp_path):
    path, log = tmp_path / "run", []
    with new_run(path) as run:
        run.listeners += [Recorder("a", path, log), Recorder("b", path, log)]
        run.log(MetricsRow(0, 0, 0.1, loss=3.0))
        run.log(MetricsRow(4, 512, 0.1, loss=2.0))
        run.geometry(GeometryEntry(4, True, 10, {"anisotropy": 0.5}, {"anisotropy": 0.5}))
        run.eval(EvalResult("val", 4, 2.0, 7.39, 1.0, 100, 300, {}))
        run.truncate_after(0)
        run.summary(Summary(**{**json.loads((path / SUMMARY).read_text()), "status": "completed"}))
    calls = [
        ("metrics", 0),
        ("metrics", 4),
        ("geometry", 4),
        ("eval", 4),
        ("truncated", 0),
        ("summary", 0),
        ("close", None),  # the lock is still held: what a listener writes into the run is complete before
    ]
    assert log == [(name, kind, step, True, True) for kind, step in calls for name in ("a", "b")]
    assert not RunReader(path).in_use()
    assert [r.step for r in RunReader(path).metrics()] == [0] and RunReader(path).geometry() == []


def test_a_writer_without_listeners_starts_no_tracker(tmp_path):
    """Storage knows no trackers: config.yaml names TensorBoard, yet a bare RunWriter writes only the run's files."""
    path = tmp_path / "run"
    with new_run(path) as run:
        run.log(MetricsRow(0, 0, 0.1, loss=3.0))
        run.summary(Summary(**{**json.loads((path / SUMMARY).read_text()), "status": "completed"}))
    assert sorted(p.name for p in path.iterdir()) == sorted(
        [".lock", "checkpoints", CONFIG, METRICS, OVERRIDES, SUMMARY]
    )


def test_a_failed_check_on_open_leaves_the_run_as_it_was(tmp_path):
    """RunWriter.open's `check` runs under the lock before anything changes: a refusal touches nothing."""
    path = tmp_path / "run"
    new_run(path).close()
    stale = path / "checkpoints" / ".last.pt.x1y2.tmp"  # what a killed writer leaves; an opened writer removes it
    stale.write_bytes(b"partial")
    before = {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}

    def refuse(reader: RunReader) -> None:
        assert reader.in_use()  # the lock is held while the caller checks
        raise TiecliError(f"run {reader.name}: refused")

    with pytest.raises(TiecliError, match="run run: refused"):
        RunWriter.open(path, check=refuse)
    assert {p: p.read_bytes() for p in path.rglob("*") if p.is_file()} == before and not RunReader(path).in_use()
    RunWriter.open(path).close()
    assert not stale.exists()
