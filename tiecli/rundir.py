# Used by `tiecli train` (writing a run directory) and by `eval`, `report`, `runs` (reading one).
"""A run directory describes itself; this module is the only code that lays one out.

runs/<name>/
  config.yaml      the resolved config the run was trained with
  overrides.yaml   the command-line overrides and the group choices they selected
  metrics.jsonl    one JSON object per logged step (train metrics; val metrics at eval steps)
  summary.json     status (running/completed/failed/interrupted), parameter counts, final metrics, versions
  eval.json        full-split evaluations by split, from `tiecli train` and `tiecli eval`
  geometry.json    geometry of the token matrices, one entry per measured step
  checkpoints/     last.pt (model, optimizer, RNG and data position), init.pt (token matrices at
                   step 0), emb/step_N.pt (token matrices at each geometry step)

Every file is written to a temporary name in the same folder and renamed into place, so a crash
or Ctrl-C leaves either the old file or the new one, never half of one.
"""

import json
import os
import tempfile
from pathlib import Path

from tiecli.errors import TiecliError

CONFIG, OVERRIDES, METRICS, SUMMARY, EVAL = "config.yaml", "overrides.yaml", "metrics.jsonl", "summary.json", "eval.json"
GEOMETRY = "geometry.json"
CHECKPOINT = Path("checkpoints") / "last.pt"
INIT_CHECKPOINT = Path("checkpoints") / "init.pt"
SNAPSHOTS = Path("checkpoints") / "emb"


def run_path(runs_dir: Path, name: str) -> Path:
    """runs_dir/name, refusing names that are empty, absolute or would leave runs_dir."""
    if not name or Path(name).is_absolute():
        raise TiecliError(f"run name {name!r} must be a relative name inside the runs directory")
    root = Path(runs_dir).resolve()
    path = (root / name).resolve()
    if path == root or root not in path.parents:
        raise TiecliError(f"run name {name!r} would leave the runs directory {str(runs_dir)!r}")
    return path


_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write(path: Path, data: str | bytes) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_json(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise TiecliError(f"{str(path)!r} does not exist") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TiecliError(f"{str(path)!r} is not valid JSON ({e})") from None


def read_jsonl(path: Path) -> list[dict]:
    """Every complete line of a JSON-lines file; a torn last line (a killed writer) is ignored."""
    rows = []
    if not Path(path).exists():
        return rows
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def append_jsonl(path: Path, row: dict) -> None:
    """One line per call, flushed: a reader (a sweep's live table) sees whole lines as they come."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def truncate_after(run_dir: Path, last_step: int) -> None:
    """Forget what a run recorded after last_step (-1: everything): a resume is about to redo it."""
    run_dir = Path(run_dir)
    if (run_dir / METRICS).exists():
        rows = [r for r in read_jsonl(run_dir / METRICS) if r["step"] <= last_step]
        atomic_write(run_dir / METRICS, "".join(json.dumps(r) + "\n" for r in rows))
    if (run_dir / GEOMETRY).exists():
        write_json(run_dir / GEOMETRY, [e for e in read_json(run_dir / GEOMETRY) if e["step"] <= last_step])
    for snapshot in (run_dir / SNAPSHOTS).glob("step_*.pt"):
        if int(snapshot.stem.removeprefix("step_")) > last_step:
            snapshot.unlink()
    if last_step < 0:
        (run_dir / EVAL).unlink(missing_ok=True)


def record_eval(run_dir: Path, metrics: dict) -> None:
    """Add a whole-split evaluation to eval.json, under its split, keeping the other splits'."""
    path = Path(run_dir) / EVAL
    write_json(path, {**(read_json(path) if path.exists() else {}), metrics["split"]: metrics})


def check_corpus(run_dir: Path, key: str) -> None:
    """Refuse to resume or evaluate a run on data other than what it was trained on."""
    path = Path(run_dir) / SUMMARY
    trained = read_json(path).get("corpus", {}).get("key") if path.exists() else None
    if trained is not None and trained != key:
        raise TiecliError(f"the data or tokenizer changed since {Path(run_dir).name!r} was trained "
                          f"(corpus key {trained}, now {key}): its token ids would not mean the same")


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"train": {"lr": 1}} -> {"train.lr": 1}: configs compared key by key."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def is_run_dir(path: Path) -> bool:
    return (Path(path) / CONFIG).is_file()
