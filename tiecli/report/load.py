# Used by `tiecli report` and `tiecli runs`: which folders are runs, and each usable run as a typed record.
"""Finding run directories and reading each completed one, through RunReader, into a `Run`.

A run that cannot be used raises `Skip` with a one-line reason (the run's name left out: the
report shows it next to the path).
"""

import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard, cast

from tiecli.errors import TiecliError
from tiecli.run.files import FormatError
from tiecli.run.layout import CONFIG, METRICS, SUMMARY, is_run_dir
from tiecli.run.reader import RunReader
from tiecli.run.records import ADDED, EvalResult, GeometryEntry, MetricsRow, flatten

PARAM_KEYS = (
    "input_embedding",
    "output_matrix",
    "shared",
    "positional",
    "non_embedding",
    "total",
)  # summary.json params
# Keys conf/ gained after runs were written, with the tying choices whose files have them (None: every choice) and
# the value at which a run trains (or is evaluated) as those older runs were: an older run reads that value, so the
# two group together (records.ADDED's keys too: docs_ladder's seed-0 runs, written before eval.max_seconds existed,
# and its later jobs, which pin eval.max_seconds=null, are one group).
ADDED_SETTINGS = {
    "model.embedding_norm": (None, False),
    "tying.embedding_std": (("untied",), None),
    "tying.output_std": (("untied",), None),
    **{key: (None, value) for key, value in ADDED.items()},
}
# Diagnostics each run contributes: gradient statistics (metrics.jsonl diag keys) averaged over training,
# then geometry at the last geometry.json entry: KEY_input and KEY_output of each side, and the agreement
# (untied modes) at the last entry and, as KEY_init, at the step-0 entry.
TRAINING_DIAG = (
    "grad_cos",
    "grad_cancel",
    "grad_cos_z",
    "grad_cos_null_mean",
    "grad_cos_null_sd",
    "grad_norm_lost_pct",
    # R4 at the related-form pairs (tiecli/measure/diagnostics.py pair_gradients); KEY_null: the matched random pairs
    *(
        f"pair_{key}{null}"
        for key in ("claimed", "opposed", "pull_in", "push_in", "pull_out", "push_out", "cos_in", "cos_out")
        for null in ("", "_null")
    ),
    "pair_claimed_null_sd",
    # R4 (cancellation) (tiecli/measure/cancellation.py): per-step means whose ratio over training is the cancelled fraction
    *(
        f"pair_cancel_{kind}{null}_{part}"
        for kind in ("grad", "adam")
        for null in ("", "_null")
        for part in ("num", "den")
    ),
    "pair_cancel_cover",
    "pair_row_cos",
    "pair_row_cos_null",
)
# Every metrics.jsonl diag key the report reads: TRAINING_DIAG's means and the per-step curves' (curves below).
# scripts/pack_findings.py keeps these in a committed archive and leaves the others out.
READ_DIAG = frozenset((*TRAINING_DIAG, "grad_norm_in", "grad_norm_out"))
SIDE_DIAG = ("drift", "anisotropy", "effective_rank", "forms_contrast", "drift_unit")
AGREEMENT_DIAG = ("cka", "knn_overlap", "row_cosine", "distance")
FLOPS_PER_PARAM_TOKEN = 6  # forward and backward: 2 + 4 FLOPs per matmul parameter per token (Kaplan et al. 2020)


class Skip(Exception):
    """A run the report leaves out; the message says why."""


@dataclass
class DivergedRun:
    """A run that stopped on a non-finite training loss (train.Diverged, status failed): what the
    divergence row of the claims table needs from it."""

    name: str
    seed: int
    setting: dict  # the resolved config, flattened
    choices: dict
    step: int  # the step it stopped at


@dataclass
class Skipped:
    path: str
    reason: str
    diverged: DivergedRun | None = None  # set when the run was skipped because its loss diverged


@dataclass
class Run:
    """The numbers the report uses from one completed run directory."""

    name: str
    path: str
    seed: int
    setting: dict  # the resolved config, flattened: {"train.lr": 0.003, ...}
    choices: dict  # the config group choices: {"model": "micro", "tying": "tied", ...}
    params: dict[str, int]
    tokens_per_s: float | None
    steps: int
    tokens: int
    loss: float  # the full validation split
    perplexity: float
    bits_per_byte: float
    test: dict | None  # the full test split (eval.json test: loss, perplexity, bits_per_byte), None when not evaluated
    gap: tuple[float, float, str] | None  # generalisation gap: (val loss, train loss, where both come from)
    flops: float | None  # training FLOPs = FLOPS_PER_PARAM_TOKEN * matmul_params * tokens
    curve: list[tuple[int, int, float]]  # (step, tokens, in-training val loss)
    fit: list[tuple[float, float]]  # (train_eval_loss, val_loss) of each metrics.jsonl row with both, in step order
    grad: list[tuple[int, float]]  # (step, grad_cos)
    # (step, grad_norm_in, grad_norm_out) of each diag step: the two paths' gradient norms on the token matrices
    paths: list[tuple[int, float, float]]
    # rows.npz (RunReader.row_sample): (step, token ids, input rows, output rows or None when one matrix), or None
    rows: tuple | None
    drift: list[tuple[int, float | None, float | None]]  # (step, input drift, output drift; None when tied)
    spectra: tuple[list[float], list[float]] | None  # singular values (input, output) at the last geometry entry
    tied_geometry: bool
    diag: dict[str, float | None]  # TRAINING_DIAG means, then the geometry keys: drift_input, ..., cka, row_cosine
    # the last geometry entry's related-form pairs: its `pairs` (source, found, skipped_lines) and "used",
    # the pairs whose tokens occur (forms_n_pairs); None without geometry
    pairs: dict | None = None
    # summary.json's corpus: its key, train_tokens, vocab_size and (since tiecli 0.1) the count-model
    # baselines of the validation split (tiecli/measure/baselines.py)
    corpus: dict | None = None
    train_losses: list[tuple[int, float]] = field(default_factory=list)  # (step, logged mean train loss)
    grad_norms: list[tuple[int, float]] = field(default_factory=list)  # (step, global gradient norm before clipping)
    device: str | None = None  # summary.json's device, dtype (bf16: bf16 autocast) and CPU threads
    dtype: str | None = None
    threads: int | None = None  # None: the run predates tiecli recording it

    @property
    def unit(self) -> tuple:
        """What one replicate is: (seed, data.split_seed); runs pair by it (the held-out split may vary with the seed)."""
        return (self.seed, self.setting.get("data.split_seed"))

    @property
    def epochs(self) -> float | None:
        """Passes over the training split: tokens trained on / tokens in the split."""
        train_tokens = (self.corpus or {}).get("train_tokens")
        return self.tokens / train_tokens if train_tokens else None


# --- which folders are runs -------------------------------------------------------------------------


def find_run_dirs(paths: list[Path]) -> list[Path]:
    """Every run directory at or under the given paths, each once, in path order. Hidden folders
    (.git, .venv, a run still being created in .NAME.tmp) are not searched."""
    found: dict[Path, Path] = {}
    for path in paths:
        if not path.exists():
            raise TiecliError(f"{str(path)!r} does not exist")
        for run in [path] if is_run_dir(path) else _search(path):
            found.setdefault(run.resolve(), run)
    return list(found.values())


def _search(root: Path) -> list[Path]:
    candidates = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [s for s in subfolders if not s.startswith(".")]
        if (SUMMARY in files or CONFIG in files) and is_run_dir(Path(folder)):
            candidates.append(Path(folder))
    return sorted(candidates)


# --- reading one run --------------------------------------------------------------------------------


def reason(error: Exception, name: str) -> str:
    """A run-directory error without its leading "run NAME: " (the report shows the run next to it)."""
    text = str(error)
    return text.removeprefix(f"run {name}: ")


def curves(metrics: list[MetricsRow]) -> dict[str, list]:
    """The run's curves from metrics.jsonl: validation loss by step and tokens, (train, val) loss pairs for the
    equal-fit gap, the gradient cosine, the two paths' gradient norms, the training loss and the gradient norm."""
    return {
        "curve": [(r.step, r.tokens, r.val_loss) for r in metrics if r.val_loss is not None],
        "fit": [(r.train_eval_loss, r.val_loss) for r in metrics if None not in (r.val_loss, r.train_eval_loss)],
        "grad": [(r.step, cast(float, r.diag["grad_cos"])) for r in metrics if _number(r.diag.get("grad_cos"))],
        "paths": [
            (r.step, cast(float, r.diag["grad_norm_in"]), cast(float, r.diag["grad_norm_out"]))
            for r in metrics
            if _number(r.diag.get("grad_norm_in")) and _number(r.diag.get("grad_norm_out"))
        ],
        "train_losses": [(r.step, r.loss) for r in metrics if _number(r.loss)],
        "grad_norms": [(r.step, r.grad_norm) for r in metrics if _number(r.grad_norm)],
    }


def run_setting(config: dict, choices: dict, dtype: str | None) -> dict:
    """The run's flattened config as reports group it: keys added to conf/ since at the value older runs trained
    with, and `dtype: auto` as the precision the run trained in (bf16 on one machine, fp32 on another)."""
    setting = flatten(config)
    for key, (modes, value) in ADDED_SETTINGS.items():
        if modes is None or choices.get("tying") in modes:
            setting.setdefault(key, value)
    if setting.get("dtype") == "auto" and dtype:
        setting["dtype"] = dtype
    return setting


def load_run(path: Path) -> Run:
    """One completed run directory as a Run; Skip, with the reason, when it cannot be used."""
    reader = RunReader(path)
    try:
        config, choices, summary = reader.config(), reader.overrides()["choices"], reader.summary()
        status = reader.status()
        if status != "completed":
            error = str(summary.error or "").strip().splitlines()
            raise Skip(f"status {status}" + (f": {error[-1][:120]}" if error else ""))
        if not (path / METRICS).is_file():
            raise Skip(f"{METRICS} does not exist")
        metrics, entries, evals, final = reader.metrics(), reader.geometry(), reader.evals(), reader.final_val()
        sample = reader.row_sample()
    except FormatError as e:
        raise Skip(reason(e, reader.name)) from None
    if not final:
        raise Skip("no final validation metrics (eval.json val or summary.json final_val)")
    if not any(r.val_loss is not None for r in metrics):  # an emptied file: no curve to reach a target on
        raise Skip(f"{METRICS} has no rows" if not metrics else f"{METRICS} has no validation rows")
    if bad := not_finite(final, evals, metrics):
        raise Skip(f"losses are NaN or infinite: {bad}")
    try:
        setting, params = run_setting(config, choices, summary.dtype), counts(summary.params)
        return Run(
            name=path.name,
            path=str(path),
            seed=config["seed"],
            setting=setting,
            choices=choices,
            params=params,
            tokens_per_s=summary.tokens_per_s,
            steps=summary.step,
            tokens=summary.tokens,
            loss=final["loss"],
            perplexity=final["perplexity"],
            bits_per_byte=final["bits_per_byte"],
            test=evals["test"].brief() if "test" in evals else None,
            gap=generalisation_gap(evals, metrics),
            flops=training_flops(setting, params["non_embedding"], summary.tokens),
            **curves(metrics),
            rows=sample,
            drift=[(e.step, e.input.get("drift"), None if e.tied else e.output.get("drift")) for e in entries],
            spectra=(entries[-1].input["singular_values"], entries[-1].output["singular_values"]) if entries else None,
            tied_geometry=bool(entries) and entries[-1].tied,
            diag=diagnostics(metrics, entries),
            pairs={**entries[-1].pairs, "used": entries[-1].input.get("forms_n_pairs")} if entries else None,
            corpus=summary.corpus,
            device=summary.device,
            dtype=summary.dtype,
            threads=summary.threads,
        )
    # What the files can lack: config.yaml's seed, final_val's losses, the last geometry entry's singular values.
    # Only that is caught: a coding error (AttributeError, TypeError) stops the report with its traceback.
    except KeyError as e:
        raise Skip(f"a file lacks an expected field ({type(e).__name__}: {e})") from None


def counts(params: dict) -> dict[str, int]:
    """summary.json's parameter counts the report reads (PARAM_KEYS; KeyError when one is missing); Skip when one
    is not a count (summary.json's schema checks that params is a mapping, not what it holds)."""
    out = {k: params[k] for k in PARAM_KEYS}
    if bad := [k for k, v in out.items() if not isinstance(v, int) or isinstance(v, bool)]:
        raise Skip(f"{SUMMARY} params {bad[0]!r} is {out[bad[0]]!r}, not a count")
    return out


def not_finite(final: dict, evals: dict[str, EvalResult], metrics: list[MetricsRow]) -> str | None:
    """Which of a completed run's losses are NaN or infinite (the whole-split ones, and the first
    metrics.jsonl row with one), or None: a diverged run would turn every mean and interval into NaN."""
    whole = {"val": final.get("loss")} | {split: e.loss for split, e in evals.items() if split != "val"}
    bad = [f"{split} loss {value}" for split, value in whole.items() if not _finite(value)]
    for row in metrics:
        values = {"loss": row.loss, "val_loss": row.val_loss, "train_eval_loss": row.train_eval_loss}
        if named := [f"{k} {v}" for k, v in values.items() if v is not None and not _finite(v)]:
            bad.append(f"{', '.join(named)} from step {row.step} (metrics.jsonl)")
            break
    return "; ".join(bad) or None


def _finite(value) -> bool:
    return _number(value) and math.isfinite(value)


def generalisation_gap(evals: dict[str, EvalResult], metrics: list[MetricsRow]) -> tuple[float, float, str] | None:
    """(val loss, train loss, source): eval.json's whole-split val and train when both exist, else the
    last metrics.jsonl row with both val_loss and train_eval_loss (the in-training fixed windows)."""
    if "train" in evals and "val" in evals:
        return evals["val"].loss, evals["train"].loss, "eval.json"
    row = next((r for r in reversed(metrics) if r.val_loss is not None and r.train_eval_loss is not None), None)
    if not row:
        return None
    assert row.val_loss is not None and row.train_eval_loss is not None  # the search above required both
    return row.val_loss, row.train_eval_loss, f"metrics.jsonl step {row.step}"


def training_flops(setting: dict, non_embedding: int, tokens: int) -> float | None:
    """FLOPS_PER_PARAM_TOKEN * (non-embedding parameters + V * C) * tokens: the output head is a V x C
    matmul whether tied or not; the input embedding is a lookup, no matmul. None without V or C."""
    vocab, width = setting.get("tokenizer.vocab_size"), setting.get("model.n_embd")
    if not (_number(vocab) and _number(width)):
        return None
    return float(FLOPS_PER_PARAM_TOKEN * (non_embedding + vocab * width) * tokens)


def _number(value) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def diagnostics(metrics: list[MetricsRow], entries: list[GeometryEntry]) -> dict[str, float | None]:
    """Per-run diagnostic summary: each TRAINING_DIAG key's mean over the logged steps that have it,
    the geometry at the last entry, and the agreement at the step-0 entry as KEY_init (None where not measured)."""
    out = {}
    for key in TRAINING_DIAG:
        values = [cast(float, r.diag[key]) for r in metrics if _number(r.diag.get(key))]
        out[key] = statistics.fmean(values) if values else None
    last = entries[-1] if entries else None
    for side in ("input", "output"):
        measured = getattr(last, side) if last else {}
        out |= {f"{key}_{side}": _measured(measured.get(key)) for key in SIDE_DIAG}
    out |= cancelled_fractions(out)
    agreement = (last.agreement if last else None) or {}
    start = (entries[0].agreement if entries and entries[0].step == 0 else None) or {}
    return (
        out
        | {key: _measured(agreement.get(key)) for key in AGREEMENT_DIAG}
        | {f"{key}_init": _measured(start.get(key)) for key in AGREEMENT_DIAG}
    )


def _measured(value):
    """A geometry value, None where it was undefined: runs before 2026-12-06 wrote the CKA of a zero matrix (a
    zero-initialised output matrix at step 0) as NaN, which would make every mean over seeds NaN."""
    return None if _number(value) and not _finite(value) else value


def cancelled_fractions(means: dict) -> dict[str, float | None]:
    """R4 (cancellation) accumulated over training: 1 - sum |s_in + s_out| / sum (|s_in| + |s_out|) over the diag
    steps (the per-step means' ratio, tiecli/measure/cancellation.py), for the related pairs, the matched null, and the
    excess, for the raw gradients (grad) and Adam's step (adam)."""
    out: dict[str, float | None] = {}
    for kind in ("grad", "adam"):
        for null in ("", "_null"):
            num, den = means.get(f"pair_cancel_{kind}{null}_num"), means.get(f"pair_cancel_{kind}{null}_den")
            out[f"pair_cancel_{kind}{null}"] = 1 - num / den if num is not None and den else None
        forms, null_value = out[f"pair_cancel_{kind}"], out[f"pair_cancel_{kind}_null"]
        out[f"pair_cancel_{kind}_excess"] = None if forms is None or null_value is None else forms - null_value
    return out


def diverged_run(path: Path) -> DivergedRun | None:
    """The run, when it failed on a non-finite training loss (train.Diverged); else None."""
    reader = RunReader(path)
    try:
        summary = reader.summary()
        if summary.status != "failed" or not (summary.error or "").startswith("Diverged"):
            return None
        config, choices = reader.config(), reader.overrides()["choices"]
        return DivergedRun(
            path.name, config["seed"], run_setting(config, choices, summary.dtype), choices, summary.step
        )
    except (FormatError, KeyError):
        return None


def load_runs(paths: list[Path]) -> tuple[list[Run], list[Skipped]]:
    runs, skipped = [], []
    for path in find_run_dirs(paths):
        try:
            runs.append(load_run(path))
        except Skip as e:
            skipped.append(Skipped(str(path), str(e), diverged_run(path)))
    return runs, skipped
