# Used by every command that touches a run directory: `train` writes one, the others read it.
"""A run directory describes itself; this module owns its format. Nothing else opens its files.

runs/<name>/
  config.yaml      the resolved config the run was trained with
  overrides.yaml   the command-line overrides and the group choices they selected
  metrics.jsonl    a format header line, then one JSON object per logged step
  summary.json     status (running/completed/failed/interrupted), parameter counts, final metrics, versions
  eval.json        full-split evaluations by split, from `tiecli train` and `tiecli eval`
  geometry.json    geometry of the token matrices, one entry per measured step
  trackers.json    with logger=[wandb]: the W&B run id, so a resumed run continues the same W&B run
  tb/, wandb/      with logger=[...]: what TensorBoard and W&B write (see tiecli/trackers.py)
  checkpoints/     last.pt (model, optimizer, RNG and data position), init.pt (token matrices at
                   step 0), emb/step_N.pt (token matrices at each geometry step), and with
                   train.keep_checkpoints, step_N.pt (earlier last.pt files, for sample/eval --step N)
  .lock            held (flock) by the one process writing the run; the OS releases it when that process dies

Every JSON file carries `format` (FORMAT); a reader refuses a newer one by name. Every file is
written to a temporary name in the same folder and renamed into place, so a crash leaves either
the old file or the new one; metrics.jsonl is appended a whole line at a time and a torn last line
is ignored. A new run directory is built in a temporary folder and renamed into place, so it
either exists whole (config, overrides, summary, init checkpoint) or not at all.

`RunWriter` is the only code that writes a run, `RunReader` the only code that reads one.
"""

import dataclasses
import fcntl
import json
import os
import shutil
import tempfile
import types
import typing
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

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
CHECKPOINT = Path("checkpoints") / "last.pt"
INIT_CHECKPOINT = Path("checkpoints") / "init.pt"
SNAPSHOTS = Path("checkpoints") / "emb"
KEPT = Path("checkpoints")  # step_N.pt: full checkpoints kept by train.keep_checkpoints
STATUSES = ("running", "completed", "failed", "interrupted")
JOB_STATES = ("pending", *STATUSES)


class FormatError(TiecliError):
    """A run-directory file that is missing, unreadable or of the wrong shape. Exit code 1."""


# --- records ------------------------------------------------------------------------------------


@dataclass
class Summary:
    """summary.json: what a run is and where it stands."""

    name: str
    status: str
    seed: int
    params: dict[str, int]
    max_steps: int
    tokens_per_step: int
    step: int
    tokens: int
    device: str
    dtype: str
    compile: bool
    versions: dict[str, str]
    corpus: dict
    started: str
    error: str | None = None
    ended: str | None = None
    wall_time: float | None = None
    train_time: float | None = None
    tokens_per_s: float | None = None
    best_val_loss: float | None = None
    best_val_step: int | None = None
    final_val: dict | None = None
    world_size: int = 1  # processes training together (DDP under torchrun)
    batch: dict | None = None  # the global batch: global = micro_batch x grad_accum x world_size sequences, and tokens
    run_id: str | None = None  # made with the run, also in each of its checkpoints: another run's last.pt is refused
    threads: int | None = None  # torch's CPU threads per process (runtime.use_threads); None in older runs
    peak_memory: dict | None = None  # rank 0's peak memory this session: {"bytes": N, "of": what was measured}
    format: int = FORMAT


@dataclass
class MetricsRow:
    """One metrics.jsonl line. Gradient statistics (grad_cos, ...) sit in `diag`, flattened on disk."""

    step: int
    tokens: int
    lr: float
    loss: float | None = None
    grad_norm: float | None = None
    tokens_per_s: float | None = None
    val_loss: float | None = None
    val_ppl: float | None = None
    val_bpb: float | None = None
    train_eval_loss: float | None = None  # the same fixed-window evaluation on the training split (generalisation gap)
    diag: dict[str, float | int | None] = field(default_factory=dict)

    def to_dict(self) -> dict:
        row = {k: v for k, v in asdict(self).items() if k != "diag" and v is not None}
        return {**row, **self.diag}


@dataclass
class EvalResult:
    """A whole-split evaluation: one value of eval.json's `splits`."""

    split: str
    step: int
    loss: float
    perplexity: float
    bits_per_byte: float
    n_tokens: int
    n_bytes: int
    by_bucket: dict[str, dict]
    subset: dict | None = None  # past eval.max_tokens: {"windows", "of", "seed", "loss_se"}; None: the whole split

    def brief(self) -> dict:
        return {
            "loss": self.loss,
            "perplexity": self.perplexity,
            "bits_per_byte": self.bits_per_byte,
            "n_tokens": self.n_tokens,
        }


@dataclass
class GeometryEntry:
    """One geometry.json entry: the token matrices' geometry at one step."""

    step: int
    tied: bool
    n_tokens: int
    input: dict
    output: dict
    agreement: dict | None = None
    pairs: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # measurements this tiecli version adds (kept, written back)

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "extra"} | self.extra


@dataclass
class SweepJob:
    """One job of a sweep manifest (sweep.json)."""

    name: str
    overrides: list[str]
    run_dir: str
    log: str
    state: str = "pending"
    exit_code: int | None = None
    error: str | None = None
    started: str | None = None
    ended: str | None = None
    attempts: int = 0
    job_id: str | None = None  # a cluster launcher's id for the job (SLURM), None for local jobs


@dataclass
class SweepManifest:
    """sweep.json: the command, its axes and every job's state."""

    name: str
    created: str
    updated: str
    command: str
    config_dir: str | None
    study: dict | None
    axes: dict[str, list]
    fixed: list[str]
    jobs: list[SweepJob]
    format: int = FORMAT

    def to_dict(self) -> dict:
        return asdict(self)


def read_manifest(path: Path) -> SweepManifest:
    """A sweep folder's sweep.json, validated: one line naming the sweep when it is not a manifest."""
    what = f"sweep {Path(path).parent.name}: {Path(path).name} is not a sweep manifest"
    obj = read_json(path, f"sweep {Path(path).parent.name}")
    check_format(obj, f"sweep {Path(path).parent.name}: {Path(path).name}")
    if not isinstance(obj, dict) or not isinstance(obj.get("jobs"), list):
        raise FormatError(what)
    manifest = parse_record(SweepManifest, {**obj, "jobs": []}, what)
    manifest.jobs = [
        parse_record(SweepJob, job, what + " (a job lacks a field or has a bad one)") for job in obj["jobs"]
    ]
    bad = next((job for job in manifest.jobs if job.state not in JOB_STATES), None)
    if bad is not None:
        raise FormatError(f"{what} (job {bad.name!r} has state {bad.state!r}; valid: {', '.join(JOB_STATES)})")
    return manifest


def write_manifest(path: Path, manifest: SweepManifest) -> None:
    write_json(path, manifest.to_dict())


def _matches(value, hint) -> bool:
    """isinstance against a simple annotation: int, float (ints accepted), str, bool, dict, list, unions."""
    allowed = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for t in allowed:
        if t is type(None):
            if value is None:
                return True
            continue
        origin = typing.get_origin(t) or t
        if origin is float and isinstance(value, int) and not isinstance(value, bool):
            return True
        if origin in (int, float) and isinstance(value, bool):
            continue
        if isinstance(value, origin):
            return True
    return False


def parse_record(cls, obj, what: str):
    """A record from parsed JSON, or FormatError(what) if it is not one: wrong type, missing or mistyped field."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    if not isinstance(obj, dict):
        raise FormatError(f"{what} (found a JSON {type(obj).__name__}, not an object)")
    values, extra = {}, {}
    for key, value in obj.items():
        if key in fields and key not in ("diag", "extra"):
            if not _matches(value, hints[key]):
                raise FormatError(f"{what} (field {key!r} is {value!r})")
            values[key] = value
        else:
            extra[key] = value
    missing = [
        n
        for n, f in fields.items()
        if n not in values and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise FormatError(f"{what} (no {missing[0]!r} field)")
    if "diag" in fields:
        values["diag"] = extra
    elif "extra" in fields:
        values["extra"] = extra
    return cls(**values)


def check_format(obj, where: str) -> None:
    version = obj.get("format", FORMAT) if isinstance(obj, dict) else FORMAT
    if not isinstance(version, int) or version > FORMAT:
        raise FormatError(
            f"{where} has format {version!r}, newer than this tiecli reads ({FORMAT}); upgrade tiecli to read it"
        )


# --- files ------------------------------------------------------------------------------------------

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
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError) and e.filename is None:  # a failed write (ENOSPC, EFBIG) names no file: name it
            raise OSError(e.errno, e.strerror, str(path)) from None
        raise


def write_json(path: Path, obj) -> None:
    atomic_write(path, json.dumps(obj, indent=2) + "\n")


def read_json(path: Path, what: str = "") -> object:
    """Parsed JSON; FormatError naming the file when it is absent, unreadable or not JSON."""
    path = Path(path)
    what = what or repr(str(path.parent))
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FormatError(f"{what}: {path.name} does not exist") from None
    except (OSError, ValueError) as e:  # ValueError: bad JSON or bad UTF-8
        raise FormatError(f"{what}: {path.name} is unreadable ({type(e).__name__})") from None


def read_yaml(path: Path, what: str) -> dict:
    try:
        obj = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FormatError(f"{what}: {Path(path).name} does not exist") from None
    except (OSError, ValueError, yaml.YAMLError) as e:
        raise FormatError(f"{what}: {Path(path).name} is unreadable ({type(e).__name__})") from None
    if not isinstance(obj, dict):
        raise FormatError(f"{what}: {Path(path).name} is not a mapping")
    return obj


def new_run_id() -> str:
    """A run's identity, which its checkpoints carry: a name can be reused, a copied last.pt keeps its run's id."""
    return uuid.uuid4().hex[:16]


def run_path(runs_dir: Path, name: str) -> Path:
    """runs_dir/name, refusing names that are empty, absolute, too long or would leave runs_dir."""
    if not name or Path(name).is_absolute():
        raise TiecliError(f"run name {name!r} must be a non-empty relative name inside the runs directory")
    if any(len(part.encode()) > 255 for part in Path(name).parts):
        raise TiecliError(f"run name {name[:40]!r}... is longer than 255 bytes, the file system's limit")
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


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"train": {"lr": 1}} -> {"train.lr": 1}: configs compared key by key."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# --- the lock -----------------------------------------------------------------------------------------


class Lock:
    """An exclusive flock on a file: one writer per run (or sweep). The OS drops it when the process dies."""

    fd: int | None

    def __init__(self, path: Path, what: str):
        self.path, self.what, self.fd = Path(path), what, None

    def acquire(self) -> "Lock":
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666 & ~_UMASK)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise TiecliError(f"{self.what} is in use by process {holder}; wait for it to finish or stop it") from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())  # for the message above only: liveness is the lock itself
        self.fd = fd
        return self

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def __enter__(self) -> "Lock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def is_locked(path: Path) -> bool:
    """Whether some process holds the lock file at path (a run being written right now)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def discard_unstarted(path: Path) -> bool:
    """Remove a run that trained no step (it failed, or was stopped, before its first), so a plain
    re-run may take its name; False, touching nothing, when it holds anything worth keeping."""
    reader = RunReader(path)
    try:
        summary = reader.summary()
    except FormatError:
        return False
    if summary.status not in ("failed", "interrupted") or summary.step > 0:
        return False
    with Lock(path / LOCK, f"run {path.name}"):
        shutil.rmtree(path)
    return True


def remove_temporaries(folder: Path) -> None:
    """Temporary files a killed writer left (`.last.pt.x1y2.tmp`): only ever called under the lock."""
    for tmp in Path(folder).rglob(".*.tmp"):
        if tmp.is_file():
            tmp.unlink(missing_ok=True)


# --- reading -----------------------------------------------------------------------------------------


class RunReader:
    """Typed, validated access to one run directory's files. Every error is one line naming the run."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.name = self.path.name

    def _what(self, filename: str, kind: str) -> str:
        return f"run {self.name}: {filename} is not {kind}"

    def config(self) -> dict:
        return read_yaml(self.path / CONFIG, f"run {self.name}")

    def overrides(self) -> dict:
        obj = read_yaml(self.path / OVERRIDES, f"run {self.name}")
        if not isinstance(obj.get("choices"), dict) or not isinstance(obj.get("overrides", []), list):
            raise FormatError(self._what(OVERRIDES, "a record of overrides and group choices"))
        return obj

    def summary(self) -> Summary:
        obj = read_json(self.path / SUMMARY, f"run {self.name}")
        check_format(obj, f"run {self.name}: {SUMMARY}")
        summary = parse_record(Summary, obj, self._what(SUMMARY, "a run summary"))
        if summary.status not in STATUSES:
            raise FormatError(self._what(SUMMARY, f"a run summary (status {summary.status!r})"))
        return summary

    def status(self) -> str | None:
        """The summary's status, None without one; a `running` run whose writer is gone reads `interrupted`."""
        if not (self.path / SUMMARY).is_file():
            return None
        status = self.summary().status
        return "interrupted" if status == "running" and not self.in_use() else status

    def in_use(self) -> bool:
        return is_locked(self.path / LOCK)

    def metrics(self) -> list[MetricsRow]:
        """Every complete row; a torn last line (a killed writer) is ignored, a malformed whole line is an error."""
        path = self.path / METRICS
        if not path.is_file():
            return []
        try:
            lines = path.read_text(encoding="utf-8").split("\n")
        except (OSError, ValueError) as e:
            raise FormatError(f"run {self.name}: {METRICS} is unreadable ({type(e).__name__})") from None
        rows = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                if number == len(lines):  # the last line, with no newline: a write cut short
                    continue
                raise FormatError(self._what(METRICS, f"JSON lines (line {number})")) from None
            if isinstance(obj, dict) and "step" not in obj and "format" in obj:
                check_format(obj, f"run {self.name}: {METRICS}")
                continue
            rows.append(parse_record(MetricsRow, obj, self._what(METRICS, f"a metrics log (line {number})")))
        return rows

    def evals(self) -> dict[str, EvalResult]:
        path = self.path / EVAL
        if not path.is_file():
            return {}
        obj = read_json(path, f"run {self.name}")
        check_format(obj, f"run {self.name}: {EVAL}")
        if not isinstance(obj, dict) or not isinstance(obj.get("splits"), dict):
            raise FormatError(self._what(EVAL, "a record of evaluations"))
        return {
            s: parse_record(EvalResult, e, self._what(EVAL, f"a record of evaluations ({s})"))
            for s, e in obj["splits"].items()
        }

    def geometry(self) -> list[GeometryEntry]:
        path = self.path / GEOMETRY
        if not path.is_file():
            return []
        obj = read_json(path, f"run {self.name}")
        check_format(obj, f"run {self.name}: {GEOMETRY}")
        if not isinstance(obj, dict) or not isinstance(obj.get("entries"), list):
            raise FormatError(self._what(GEOMETRY, "a list of geometry entries"))
        return [
            parse_record(GeometryEntry, e, self._what(GEOMETRY, "a list of geometry entries")) for e in obj["entries"]
        ]

    def trackers(self) -> dict:
        """trackers.json: what the run keeps about its trackers (the W&B run id); {} without one."""
        if not (self.path / TRACKERS).is_file():
            return {}
        obj = read_json(self.path / TRACKERS, f"run {self.name}")
        check_format(obj, f"run {self.name}: {TRACKERS}")
        if not isinstance(obj, dict):
            raise FormatError(self._what(TRACKERS, "a record of trackers"))
        return obj

    def final_val(self) -> dict | None:
        """The full validation split's metrics: eval.json's val, else summary.json's final_val."""
        val = self.evals().get("val")
        return val.brief() if val else self.summary().final_val

    def checkpoint(self) -> dict:
        from tiecli import checkpoint  # torch: only for the commands that need weights

        return checkpoint.load(self.path / CHECKPOINT, self.name)

    def snapshot_steps(self) -> list[int]:
        return _steps(self.path / SNAPSHOTS)

    def kept_steps(self) -> list[int]:
        """The steps of the full checkpoints that train.keep_checkpoints kept (checkpoints/step_N.pt)."""
        return _steps(self.path / KEPT)

    def full_checkpoint(self, step: str) -> Path:
        """The file that holds --step STEP's full weights if any does: a kept step_N.pt, else last.pt
        (whose step the caller checks once loaded: checkpoint.check_step)."""
        kept = self.path / KEPT / f"step_{int(step)}.pt" if step.isascii() and step.isdigit() else None
        return kept if kept is not None and kept.is_file() else self.path / CHECKPOINT

    def check_corpus(self, key: str) -> None:
        """Refuse to resume or evaluate a run on data other than what it was trained on."""
        corpus = self.summary().corpus
        trained = corpus.get("key")
        if trained is not None and trained != key and "key_scheme" not in corpus:
            raise TiecliError(
                f"{self.name!r} was trained by a tiecli older than 0.2, whose corpus keys hashed the split texts; "
                f"this one hashes the input files and cannot check that the data is the same (corpus key {trained}, "
                f"now {key}): evaluate or resume it with the tiecli that trained it (versions in summary.json)"
            )
        if trained is not None and trained != key:
            raise TiecliError(
                f"the data or tokenizer changed since {self.name!r} was trained "
                f"(corpus key {trained}, now {key}): its token ids would not mean the same"
            )


def _steps(folder: Path) -> list[int]:
    """N of each step_N.pt in folder, ascending."""
    return sorted(
        int(p.stem.removeprefix("step_")) for p in folder.glob("step_*.pt") if p.stem.removeprefix("step_").isdigit()
    )


# --- writing -----------------------------------------------------------------------------------------


class RunWriter:
    """The one writer of a run directory, holding its lock from open to close.

    `create` builds a new run in a temporary folder and renames it into place; `open` takes an
    existing one (resume, eval, geometry --write). Trackers and DDP's rank-0 rule plug in here.

    The trackers config.yaml's `logger` names (TensorBoard, W&B) get each metrics row, evaluation,
    geometry entry and final summary right after it is written, starting on the first of them.
    Both trackers only append, so they get only steps from `track_from` on: the run's step when
    opened, the step after the checkpoint when a resume rolls back (TensorBoard then hides what it
    had past that point), so an earlier step re-measured later (`geometry --write --step 0`) stays
    out of them.
    """

    def __init__(self, path: Path, lock: Lock, track_from: int = 0):
        self.path, self.lock = Path(path), lock
        self.reader = RunReader(self.path)
        self.track_from, self.purge_step = track_from, typing.cast(int | None, None)
        self.tracking: typing.Any = None  # trackers.Trackers, once started

    @classmethod
    def open(cls, path: Path) -> "RunWriter":
        path = Path(path)
        if not is_run_dir(path):
            raise TiecliError(f"{str(path)!r} is not a run directory (it has no {SUMMARY} or {CONFIG})")
        from tiecli import trackers  # no tracker package is imported until one is used

        lock = Lock(path / LOCK, f"run {path.name}").acquire()
        try:
            trackers.check_installed(RunReader(path).config().get("logger"))
            step = RunReader(path).summary().step if (path / SUMMARY).is_file() else 0
        except BaseException:
            lock.release()
            raise
        remove_temporaries(path)
        return cls(path, lock, track_from=step)

    @classmethod
    def create(cls, path: Path, files: dict[str, str], summary: Summary, init: bytes) -> "RunWriter":
        """A new run directory holding `files` (config, overrides), its first summary and init checkpoint."""
        from tiecli import trackers

        path = Path(path)
        if CONFIG in files:  # before anything is written: a tracker's missing package is one line
            trackers.check_installed((yaml.safe_load(files[CONFIG]) or {}).get("logger"))
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob(f".{path.name}.*.tmp"):  # a creation killed midway; its lock is gone
            if stale.is_dir() and not is_locked(stale / LOCK):
                shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
        os.chmod(tmp, 0o777 & ~_UMASK)  # mkdtemp makes 0700; give the run the usual permissions
        lock = Lock(tmp / LOCK, f"run {path.name}").acquire()  # flock follows the inode through the rename
        try:
            for name, text in files.items():
                atomic_write(tmp / name, text)
            atomic_write(tmp / INIT_CHECKPOINT, init)
            write_json(tmp / SUMMARY, asdict(summary))
            atomic_write(tmp / METRICS, json.dumps({"format": FORMAT}) + "\n")
            os.rename(tmp, path)  # fails if another process made the run meanwhile: no two writers
        except BaseException as e:
            lock.release()
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(e, OSError) and path.exists():
                raise TiecliError(f"run {path.name!r} was created by another process meanwhile") from None
            raise
        return cls(path, lock)

    def close(self) -> None:
        try:
            if self.tracking is not None:
                self.tracking.close()
        finally:
            self.tracking = None
            self.lock.release()

    def _trackers(self, step: int):
        """The run's trackers, started on first use, when `step` may still go to them; else None."""
        if step < self.track_from:
            return None
        if self.tracking is None:
            from tiecli import trackers

            self.tracking = trackers.Trackers(self.path, self.reader.config(), self.reader.trackers(), self.purge_step)
            if self.tracking.records():
                write_json(self.path / TRACKERS, {"format": FORMAT, **self.tracking.records()})
        return self.tracking

    def __enter__(self) -> "RunWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def summary(self, summary: Summary) -> None:
        write_json(self.path / SUMMARY, asdict(summary))
        if summary.status != "running" and (trackers := self._trackers(summary.step)):
            trackers.summary(asdict(summary))

    def rewrite(self, files: dict[str, str]) -> None:
        """Replace text files of the run by name: config.yaml, when --resume extends the run."""
        for name, text in files.items():
            atomic_write(self.path / name, text)

    def log(self, row: MetricsRow) -> None:
        """One line per call, flushed: a reader (a sweep's live table) sees whole lines as they come."""
        with open(self.path / METRICS, "a", encoding="utf-8") as f:
            f.write(json.dumps(row.to_dict()) + "\n")
        if trackers := self._trackers(row.step):
            trackers.row(row.to_dict())

    def geometry(self, entry: GeometryEntry) -> None:
        """Add an entry, replacing one for the same step."""
        entries = [e for e in self.reader.geometry() if e.step != entry.step]
        entries = sorted([*entries, entry], key=lambda e: e.step)
        write_json(self.path / GEOMETRY, {"format": FORMAT, "entries": [e.to_dict() for e in entries]})
        if trackers := self._trackers(entry.step):
            trackers.geometry(entry.to_dict())

    def eval(self, result: EvalResult) -> None:
        """Add a whole-split evaluation to eval.json, under its split, keeping the other splits'."""
        splits = {s: asdict(e) for s, e in self.reader.evals().items()} | {result.split: asdict(result)}
        write_json(self.path / EVAL, {"format": FORMAT, "splits": splits})
        if trackers := self._trackers(result.step):
            trackers.eval(asdict(result))

    def save(self, relative: Path, data: bytes) -> None:
        """A checkpoint file (serialised by the caller) at a path inside the run."""
        atomic_write(self.path / relative, data)

    def keep_checkpoint(self, step: int, keep: int) -> None:
        """Keep last.pt, just written at `step`, as checkpoints/step_N.pt too (a hard link: no second copy on
        disk; a copy where links are not allowed), then remove the oldest kept beyond `keep` (0: all).
        Both are atomic: the link is made under a temporary name and renamed into place."""
        if keep > 0:
            kept, last = self.path / KEPT / f"step_{step}.pt", self.path / CHECKPOINT
            tmp = kept.with_name(f".{kept.name}.{os.getpid()}.tmp")
            tmp.unlink(missing_ok=True)
            try:
                os.link(last, tmp)
                os.replace(tmp, kept)
            except OSError:
                tmp.unlink(missing_ok=True)
                atomic_write(kept, last.read_bytes())
        steps = self.reader.kept_steps()
        for old in steps[: max(0, len(steps) - keep)]:
            (self.path / KEPT / f"step_{old}.pt").unlink(missing_ok=True)

    def remove_snapshot(self, step: int) -> None:
        """Delete one step's token-matrix snapshot (train thins them to diag.max_snapshots)."""
        (self.path / SNAPSHOTS / f"step_{step}.pt").unlink(missing_ok=True)

    def truncate_after(self, last_step: int) -> None:
        """Forget what the run recorded after last_step (-1: everything): a resume is about to redo it."""
        self.track_from = self.purge_step = last_step + 1  # the trackers get the redone steps, and hide the old ones
        rows = [r for r in self.reader.metrics() if r.step <= last_step]
        header = json.dumps({"format": FORMAT}) + "\n"
        atomic_write(self.path / METRICS, header + "".join(json.dumps(r.to_dict()) + "\n" for r in rows))
        if (self.path / GEOMETRY).exists():
            kept = [e.to_dict() for e in self.reader.geometry() if e.step <= last_step]
            write_json(self.path / GEOMETRY, {"format": FORMAT, "entries": kept})
        for step in self.reader.snapshot_steps():
            if step > last_step:
                (self.path / SNAPSHOTS / f"step_{step}.pt").unlink()
        for step in self.reader.kept_steps():
            if step > last_step:
                (self.path / KEPT / f"step_{step}.pt").unlink()
        if last_step < 0:
            (self.path / EVAL).unlink(missing_ok=True)
