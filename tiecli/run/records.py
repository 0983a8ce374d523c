"""The records a run directory (and a sweep's manifest) holds, and their typed validation.

Each record is a dataclass; `parse_record` builds one from parsed JSON, checking every field
against its annotation, so a reader gets either a well-typed record or one line naming the file.
"""

import dataclasses
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tiecli.run.files import FormatError, read_json, write_json
from tiecli.run.layout import FORMAT

# Keys added after runs were written, with the value that keeps those runs' behaviour where conf/'s own default
# differs (config.compose.recompose reads them): a run without train.checkpoints saved every checkpoint_interval
# steps, also where conf/hardware/gpu.yaml now gives 4; one without eval.max_tokens evaluated whole splits, one
# without eval.max_seconds without a time bound. A sweep job's override that states such a value names the same
# run as one that omits it (sweep.manifest).
ADDED = {"train.checkpoints": None, "eval.max_tokens": None, "eval.max_seconds": None}
STATUSES = ("running", "completed", "failed", "interrupted")
JOB_STATES = ("pending", *STATUSES)


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


def flatten(tree: dict, prefix: str = "") -> dict:
    """{"train": {"lr": 1}} -> {"train.lr": 1}: configs compared key by key."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
