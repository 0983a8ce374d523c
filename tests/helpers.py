"""Helpers shared by several test modules: the CLI driven as a user drives it, its one-line errors, and
synthetic run directories (written through RunWriter, whose numbers are known in advance) with
the statistics the report tests check them against, computed here independently of tiecli.report."""

import dataclasses
import importlib.util
import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from scipy import stats
from typer.testing import CliRunner

from tiecli.cli import app
from tiecli.run.layout import CONFIG, OVERRIDES
from tiecli.run.records import EvalResult, GeometryEntry, MetricsRow, Summary
from tiecli.run.writer import RunWriter

runner = CliRunner()


def script(name):
    """scripts/NAME.py, imported as a module (the scripts are not a package)."""
    path = Path(__file__).resolve().parents[1] / "scripts" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tiecli(*args):
    """`tiecli ARGS` through Typer's runner, in-process; arguments may be paths or numbers."""
    return runner.invoke(app, [str(a) for a in args])


def trained_once(folder, cache, args, name):
    """`tiecli train ARGS --name NAME` run in folder with the session's cache, outside any test's monkeypatch:
    the run a session-scoped fixture trains once and its tests copy. Its run directory."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TIECLI_CACHE_DIR", str(cache))
        mp.chdir(folder)
        result = tiecli("train", *args, "--name", name)
    assert result.exit_code == 0, result.output
    return folder / "runs" / name


def one_line_error(result, code, text):
    """The command exited with `code` and printed one line, no traceback, that contains `text`."""
    assert result.exit_code == code, result.output
    assert text in result.output and "Traceback" not in result.output, result.output
    assert result.output.strip().count("\n") == 0, result.output  # one line, whatever the width


def train_process(*args):
    """`tiecli train` in its own process, as a user runs it: a test process that has imported transformers
    must not fork its tokenizers thread pool into the data loader's tokenizing processes."""
    done = subprocess.run([sys.executable, "-m", "tiecli", "train", *args], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def rows(run):
    """metrics.jsonl's rows by step (its first line holds the format)."""
    lines = (run / "metrics.jsonl").read_text().splitlines()[1:]
    return {row["step"]: row for row in map(json.loads, lines)}


# --- synthetic run directories: a grid of nano and micro, tied and untied, seeds 0-2 --------------------

V = 256  # vocabulary
SIZES = {
    "nano": {"n_layer": 2, "n_head": 4, "n_embd": 64, "non_embedding": 40_000},
    "micro": {"n_layer": 4, "n_head": 4, "n_embd": 128, "non_embedding": 800_000},
}
# final val loss by (size, mode): one value per seed 0, 1, 2
LOSS = {
    ("nano", "untied"): [3.0, 3.1, 3.2],
    ("nano", "tied"): [2.9, 3.05, 3.1],
    ("micro", "untied"): [2.5, 2.6, 2.55],
    ("micro", "tied"): [2.45, 2.58, 2.5],
}
TOKENS_PER_STEP = 1000


def params(size, mode):
    vd, positional = V * SIZES[size]["n_embd"], 128 * SIZES[size]["n_embd"]
    split = (
        {"input_embedding": vd, "output_matrix": vd, "shared": 0}
        if mode == "untied"
        else {"input_embedding": 0, "output_matrix": 0, "shared": vd}
    )
    body = SIZES[size]["non_embedding"]
    return {**split, "positional": positional, "non_embedding": body, "total": sum(split.values()) + positional + body}


def drifts(size, mode, seed):
    """(input drift, output drift) at the last geometry step."""
    if mode == "tied":
        return (0.5 + 0.02 * seed, 0.5 + 0.02 * seed)
    return (0.3 + 0.01 * seed**2, 0.9 - 0.01 * seed)


def grad_cos(mode, seed):
    """The two logged gradient cosines of a run."""
    return [-0.1 - 0.01 * seed, -0.2 - 0.02 * seed] if mode == "tied" else [0.05, 0.05 + 0.01 * seed]


def cka_end(seed):
    """Untied runs' CKA(W_in, W_out) at the last geometry entry; 0.2 at step 0."""
    return 0.2 + 0.01 * seed


def forms_contrast(mode, seed):
    return (0.05 + 0.01 * seed, -0.1 - 0.02 * seed**2) if mode == "untied" else (-0.02, -0.02)


def make_run(
    path,
    config: dict,
    seed: int,
    final_loss: float,
    rows: list,
    entries: list,
    *,
    params: dict,
    choices: dict,
    tokens_per_s: float = 1000.0,
    status: str = "completed",
    error: str | None = None,
    keep_open: bool = False,
    corpus: dict | None = None,
):
    """A run directory written through RunWriter as `tiecli train` writes one: config (with `seed`),
    overrides, a first summary, the metrics rows, the geometry entries, a whole-split val evaluation with
    loss final_loss, then the last summary with `status`. keep_open: return the writer, still holding the
    run's lock (a run being written right now); else the run's path. corpus: summary.json's (its count-model
    baselines), else one without baselines, as runs made before them."""
    config = {**config, "seed": seed}
    last = max(rows, key=lambda r: r.step)
    summary = Summary(
        name=path.name,
        status="running",
        seed=seed,
        params=params,
        max_steps=last.step,
        tokens_per_step=last.tokens // max(last.step, 1),
        step=0,
        tokens=0,
        device="cpu",
        dtype="fp32",
        compile=False,
        versions={"tiecli": "test"},
        corpus=corpus or {"key": "test"},
        started="2025-01-01T00:00:00",
    )
    overrides = {"overrides": [f"{k}={v}" for k, v in choices.items()] + [f"seed={seed}"], "choices": choices}
    files = {CONFIG: yaml.safe_dump(config), OVERRIDES: yaml.safe_dump(overrides)}
    writer = RunWriter.create(path, files, summary, b"not a checkpoint: the report never reads one")
    for row in rows:
        writer.log(row)
    for entry in entries:
        writer.geometry(entry)
    final = EvalResult("val", last.step, final_loss, math.exp(final_loss), final_loss / 2, 5000, 10000, {})
    writer.eval(final)
    writer.summary(
        dataclasses.replace(
            summary,
            status=status,
            error=error,
            step=last.step,
            tokens=last.tokens,
            tokens_per_s=tokens_per_s,
            final_val=final.brief(),
        )
    )
    if keep_open:
        return writer
    writer.close()
    return path


def write_run(root, size, mode, seed, loss=None, status="completed", keep_open=False, named=None):
    """One run of the grid: final loss `loss`, a val curve [(0, 5.0), (10, loss + 1), (20, loss)], and
    gradient statistics and geometry. named: the tying mode's name on disk (the numbers are `mode`'s)."""
    loss = LOSS[(size, mode)][seed] if loss is None else loss
    name = named or mode
    shape = {k: v for k, v in SIZES[size].items() if k != "non_embedding"}
    config = {
        "device": "auto",
        "dtype": "auto",
        "compile": False,
        "model": {"block_size": 128, "dropout": 0.0, "bias": True, **shape},
        "train": {
            "max_steps": 20,
            "max_tokens": None,
            "batch_size": 8,
            "lr": 0.003,
            "eval_interval": 10,
            "log_interval": 10,
        },
        "eval": {"buckets": [0.5, 0.9]},
        "diag": {"every": 10, "geometry": True},
        "tying": {"mode": name},
        "data": {"name": "shakespeare", "split_seed": 1234},
        "tokenizer": {"name": "bytes", "vocab_size": V},
    }
    cos = grad_cos(mode, seed)
    rows = [
        MetricsRow(step=0, tokens=0, lr=0.0, val_loss=5.0, val_ppl=math.exp(5.0), val_bpb=2.5),
        MetricsRow(
            step=10,
            tokens=10 * TOKENS_PER_STEP,
            lr=0.003,
            loss=loss + 1.2,
            val_loss=loss + 1,
            diag={"grad_cos": cos[0], "grad_cancel": 0.1},
        ),
        MetricsRow(
            step=20,
            tokens=20 * TOKENS_PER_STEP,
            lr=0.003,
            loss=loss + 0.1,
            val_loss=loss,
            diag={"grad_cos": cos[1], "grad_cancel": 0.2},
        ),
    ]
    d_in, d_out = drifts(size, mode, seed)
    c_in, c_out = forms_contrast(mode, seed)
    n_embd = SIZES[size]["n_embd"]

    def side(drift, contrast):
        return {
            "drift": drift,
            "drift_unit": drift,
            "anisotropy": 0.1,
            "effective_rank": n_embd / 2,
            "forms_contrast": contrast,
            "singular_values": [float(n_embd - i) for i in range(n_embd)],
        }

    def agreement(cka):
        return None if mode == "tied" else {"row_cosine": 0.01, "cka": cka, "knn_overlap": 0.0, "distance": 1.4}

    entries = [
        GeometryEntry(
            step=0,
            tied=mode == "tied",
            n_tokens=V,
            input=side(0.0, 0.0),
            output=side(0.0, 0.0),
            agreement=agreement(0.2),
        ),
        GeometryEntry(
            step=20,
            tied=mode == "tied",
            n_tokens=V,
            input=side(d_in, c_in),
            output=side(d_out, c_out),
            agreement=agreement(cka_end(seed)),
        ),
    ]
    return make_run(
        root / f"{size}-{name}-s{seed}",
        config,
        seed,
        loss,
        rows,
        entries,
        params=params(size, mode),
        choices={"model": size, "tying": name, "data": "shakespeare", "tokenizer": "bytes"},
        tokens_per_s=1000.0 + seed,
        status=status,
        keep_open=keep_open,
        error="RuntimeError: CUDA out of memory" if status == "failed" else None,
    )


def interval(values):
    """Mean and 95% t-interval, computed here independently of tiecli.report."""
    n, mean = len(values), statistics.fmean(values)
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def holm(p):
    """Holm-Bonferroni adjusted p-values, written out here from the definition."""
    m, order = len(p), sorted(range(len(p)), key=lambda i: p[i])
    adjusted = [0.0] * m
    for k, i in enumerate(order):
        adjusted[i] = min(1.0, max((m - j) * p[order[j]] for j in range(k + 1)))
    return adjusted


def tost(values, margin):
    """Equivalence p-value: two one-sided t-tests against -margin and +margin, doubled (95% interval inside +-margin)."""
    low = stats.ttest_1samp(values, -margin, alternative="greater").pvalue
    high = stats.ttest_1samp(values, margin, alternative="less").pvalue
    return min(1.0, 2 * max(low, high))


def expected_verdict(row):
    """The stated rule, applied to a results.json claim row whose p-values the test has checked."""
    mean, sesoi = row["interval"]["mean"], row["sesoi"]
    if row["p_holm"] < 0.05:
        if sesoi and abs(mean) < sesoi:
            return "negligible"
        return "supported" if (mean > 0) == (row["direction"] > 0) else "contradicted"
    if row["p_equiv_holm"] is not None and row["p_equiv_holm"] < 0.05:
        return "equivalent"
    return "inconclusive"


def results(out):
    data = json.loads((out / "results.json").read_text())
    return data, {g["group"]: g for g in data["groups"]}, {(c["claim"], c["comparison"]): c for c in data["claims"]}


def clustered_slope(points):
    """(slope, low, high, p) of y on x over (x, y, cluster) points with the cluster-robust (CR1) standard error,
    written out here for a simple regression: Var(b) = G/(G-1) (n-1)/(n-2) sum_g (sum_{i in g} (x_i - x_mean) e_i)^2
    / (sum_i (x_i - x_mean)^2)^2, with t(G - 1)."""
    x = [p[0] for p in points]
    y = [p[1] for p in points]
    fit = stats.linregress(x, y)
    x_mean = statistics.fmean(x)
    residual = [b - fit.intercept - fit.slope * a for a, b in zip(x, y)]
    clusters = sorted({p[2] for p in points})
    scores = [sum((x[i] - x_mean) * residual[i] for i in range(len(x)) if points[i][2] == c) for c in clusters]
    n, g = len(x), len(clusters)
    var = g / (g - 1) * (n - 1) / (n - 2) * sum(s * s for s in scores) / sum((a - x_mean) ** 2 for a in x) ** 2
    half = stats.t.ppf(0.975, g - 1) * math.sqrt(var)
    return fit.slope, fit.slope - half, fit.slope + half, 2 * stats.t.sf(abs(fit.slope) / math.sqrt(var), g - 1)
