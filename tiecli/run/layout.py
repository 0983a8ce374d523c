"""What a run directory holds and where it lives: its files' names, FORMAT, run ids, run paths.

The folder itself is described in tiecli/run/__init__.py.
"""

import uuid
from pathlib import Path

from tiecli.errors import TiecliError

FORMAT = 1
CONFIG, OVERRIDES, METRICS, SUMMARY, EVAL = (
    "config.yaml",
    "overrides.yaml",
    "metrics.jsonl",
    "summary.json",
    "eval.json",
)
GEOMETRY, LOCK, TRACKERS = "geometry.json", ".lock", "trackers.json"
ROW_SAMPLE = "rows.npz"  # a fixed sample of the token matrices' rows at the last geometry step, float16
UNDO = ".undo"  # while --resume extends a completed run: hard links to its files as they were (RunWriter.undo)
CHECKPOINT = Path("checkpoints") / "last.pt"
INIT_CHECKPOINT = Path("checkpoints") / "init.pt"
SNAPSHOTS = Path("checkpoints") / "emb"
KEPT = Path("checkpoints")  # step_N.pt: full checkpoints kept by train.keep_checkpoints
MANIFEST = "sweep.json"  # a sweep folder's manifest (runs/sweeps/NAME/sweep.json): its jobs and their states


def new_run_id() -> str:
    """A run's identity, which its checkpoints carry: a name can be reused, a copied last.pt keeps its run's id."""
    return uuid.uuid4().hex[:16]


NAME_BYTES = 255 - len("..12345678.tmp")  # RunWriter.create builds a run in runs/.NAME.<8 random>.tmp


def run_path(runs_dir: Path, name: str) -> Path:
    """runs_dir/name, refusing names that are empty, absolute, too long or would leave runs_dir."""
    if not name or Path(name).is_absolute():
        raise TiecliError(f"run name {name!r} must be a non-empty relative name inside the runs directory")
    if any(len(part.encode()) > 255 for part in Path(name).parts):
        raise TiecliError(f"run name {name[:40]!r}... is longer than 255 bytes, the file system's limit")
    if len(Path(name).name.encode()) > NAME_BYTES:
        raise TiecliError(
            f"run name {name[:40]!r}... is longer than {NAME_BYTES} bytes: the file system's limit of 255, "
            f"less {255 - NAME_BYTES} for the temporary name a new run is built under (.NAME.x1y2z3w4.tmp)"
        )
    if Path(runs_dir).exists() and not Path(runs_dir).is_dir():
        raise TiecliError(f"the runs directory {str(runs_dir)!r} is a file, not a folder")
    root = Path(runs_dir).resolve()
    path = (root / name).resolve()
    if path == root or root not in path.parents:
        raise TiecliError(f"run name {name!r} would leave the runs directory {str(runs_dir)!r}")
    return path


def is_run_dir(path: Path) -> bool:
    """A folder holding a run: a summary.json, or a config.yaml with its overrides.yaml (a conf/ folder has no such pair)."""
    path = Path(path)
    return (path / SUMMARY).is_file() or ((path / CONFIG).is_file() and (path / OVERRIDES).is_file())
