# tiecli report [RUNS_OR_SWEEPS...] [--baseline tying=untied] [--out DIR]   and   tiecli runs [DIR]
"""From finished run directories to tables, plots and a verdict on each claim of CLAIMS.md.

Reads only the files of run directories (config.yaml, overrides.yaml, summary.json, metrics.jsonl,
eval.json, geometry.json); never imports torch.

Rules, stated once here and printed in every report (stated_rules):
- Grouping: runs with the same resolved config except `seed` form a group (one setting, several
  seeds). Keys that do not change what a run learns are ignored: IGNORED_KEYS, every diag.*
  key (logging, evaluation and checkpoint cadence, diagnostics, device), and train.max_steps when
  a token budget (train.max_tokens) sets the steps.
- Intervals: mean over seeds, sample sd, 95% interval mean +- t(0.975, n-1) * sd / sqrt(n).
- Baseline (--baseline KEY=VALUE, default tying=untied): a group's baseline is the group with
  KEY=VALUE that equals it in every other key. Differences are paired by seed.
- Equal total parameters: the baseline's log perplexity, seed by seed, is interpolated linearly
  in log(total parameters) between the two baseline sizes that bracket the group's total.
- Convergence target: within the groups that differ only in the baseline key, the highest of
  the runs' lowest validation losses on their training curves, so every run reaches it.
- Verdicts: see VERDICT_RULE and the claim-specific rules in CLAIM_RULES.
"""

import base64
import csv
import html
import io
import json
import math
import statistics
from pathlib import Path

import numpy as np
import yaml
from rich.markup import escape
from rich.table import Table
from scipy import stats

from tiecli import rundir
from tiecli.display import num as _num
from tiecli.errors import TiecliError

GROUPS = ("model", "tying", "data", "tokenizer")  # the config groups whose choices name a run
# Settings that change when and what is measured, not what the model learns.
IGNORED_KEYS = ("device", "compile", "train.log_interval", "train.eval_interval", "train.eval_batches",
                "train.checkpoint_interval", "eval.buckets")
IGNORED_PREFIX = "diag."  # gradient statistics and geometry never touch training's RNG or weights
SIZE_KEYS = ("model.n_layer", "model.n_head", "model.n_embd")  # what model/*.yaml set: the size ladder
BUDGET_KEYS = ("train.max_steps", "train.max_tokens")  # the data axis of R5
CONFIDENCE = 0.95
PARAM_KEYS = ("input_embedding", "output_matrix", "shared", "positional", "non_embedding", "total")  # summary.json params
# C1's own range for the share tying saves: the hypothesis under test, not an expected result.
C1_CLAIMED_SHARE = (0.15, 0.30)

VERDICT_RULE = ("supported: the 95% interval excludes zero in the claimed direction; contradicted: it excludes "
                "zero in the other direction; inconclusive: it contains zero, or there is one seed (no interval)")
CLAIM_RULES = {
    "R2": "the tied-away V x C matrix (untied total - tied total, from summary.json) against the largest other tensors, "
          "the MLP's 4C x C; deterministic (no seeds). Supported when the token matrix is larger, contradicted otherwise.",
    "C1": "parameter share saved by tying = (untied total - tied total) / untied total, from summary.json at "
          "equal architecture; deterministic (no seeds). Supported when it lies in C1's claimed range "
          f"{C1_CLAIMED_SHARE[0]:.0%}-{C1_CLAIMED_SHARE[1]:.0%}, contradicted when outside.",
    "R4": "tied runs: each run's mean over training of cos(G_in, G_out) (metrics.jsonl grad_cos); "
          "claimed direction: below zero (the two paths oppose).",
    "R3": "untied runs, last geometry entry: related-form contrast of the input matrix minus that of the output "
          "matrix (contrast = pair cosine - random-pair cosine); claimed direction: above zero (input pulls "
          "forms together more than output does).",
    "C2": "drift |W - W0|_F / |W0|_F at the last geometry entry, tied minus untied, paired by seed, once "
          "against the untied input embedding and once against the untied output matrix; claimed direction: "
          "below zero (tying drifts less).",
    "R6/C3": "steps to the convergence target, tied vs untied, paired by seed, in % of the untied steps. "
             "R6 claims above zero (untied faster), C3 below zero (tied faster): one figure, read both ways.",
    "R5/C6": "per size: perplexity of tied vs untied, paired by seed, in %; C6 claims below zero (tying "
             "lowers perplexity). Across sizes (and, for R5, token budgets): least-squares slope of those "
             "per-seed differences against log10 of non-embedding parameters (or tokens seen), 95% interval "
             "from t(n-2); claimed direction: above zero (the gain from tying shrinks as the scale grows). "
             "Needs two scales or more with two seeds or more each.",
}


class Skip(Exception):
    """A run the report leaves out; the message says why."""


# --- reading run directories ------------------------------------------------------------------


def find_run_dirs(paths: list[Path]) -> list[Path]:
    """Every run directory at or under the given paths, each once, in path order."""
    found = {}
    for path in paths:
        if not path.exists():
            raise TiecliError(f"{str(path)!r} does not exist")
        candidates = [path] if rundir.is_run_dir(path) else sorted(p.parent for p in path.rglob(rundir.CONFIG))
        for run in candidates:
            found.setdefault(run.resolve(), run)
    return list(found.values())


def _read(path: Path, parse):
    try:
        return parse(path.read_text())
    except FileNotFoundError:
        raise Skip(f"no {path.name}") from None
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as e:
        raise Skip(f"{path.name} unreadable ({type(e).__name__})") from None


def final_val(path: Path, summary: dict) -> dict:
    """The full validation split's metrics: eval.json's val, else summary.json's final_val."""
    evals = _read(path / rundir.EVAL, json.loads) if (path / rundir.EVAL).exists() else {}
    final = evals.get("val") or summary.get("final_val")
    if not final:
        raise Skip("no final validation metrics (eval.json val or summary.json final_val)")
    return final


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def diagnostics(metrics: list[dict], entries: list[dict]) -> dict:
    """Per-run diagnostic summary: gradient statistics averaged over training, geometry at the end."""
    out = {"grad_cos": _mean(r.get("grad_cos") for r in metrics), "grad_cancel": _mean(r.get("grad_cancel") for r in metrics)}
    last = entries[-1] if entries else {"input": {}, "output": {}, "agreement": None}
    for side in ("input", "output"):
        for key in ("drift", "anisotropy", "effective_rank", "forms_contrast"):
            out[f"{key}_{side}"] = last[side].get(key)
    agreement = last["agreement"] or {}
    out["cka"], out["row_cosine"] = agreement.get("cka"), agreement.get("row_cosine")
    return out


def load_run(path: Path) -> dict:
    """The numbers the report uses from one completed run directory; Skip if it cannot be used."""
    config = _read(path / rundir.CONFIG, yaml.safe_load)
    choices = _read(path / rundir.OVERRIDES, yaml.safe_load)
    summary = _read(path / rundir.SUMMARY, json.loads)
    if not all(isinstance(x, dict) for x in (config, choices, summary)):
        raise Skip("a config, overrides or summary file is not a mapping")
    status = summary.get("status")
    if status != "completed":
        error = str(summary.get("error") or "").strip().splitlines()
        raise Skip(f"status {status}" + (f": {error[-1][:120]}" if error else ""))
    if not (path / rundir.METRICS).is_file():
        raise Skip(f"no {rundir.METRICS}")
    metrics = rundir.read_jsonl(path / rundir.METRICS)
    entries = _read(path / rundir.GEOMETRY, json.loads) if (path / rundir.GEOMETRY).exists() else []
    try:
        final = final_val(path, summary)
        return {
            "name": path.name, "path": str(path), "seed": config["seed"], "setting": rundir.flatten(config),
            "choices": choices["choices"], "params": {k: summary["params"][k] for k in PARAM_KEYS}, "tokens_per_s": summary["tokens_per_s"],
            "steps": summary["step"], "tokens": summary["tokens"],
            "loss": final["loss"], "perplexity": final["perplexity"], "bits_per_byte": final["bits_per_byte"],
            "curve": [(r["step"], r["tokens"], r["val_loss"]) for r in metrics if r.get("val_loss") is not None],
            "grad": [(r["step"], r["grad_cos"]) for r in metrics if r.get("grad_cos") is not None],
            "drift": [(e["step"], e["input"].get("drift"), None if e["tied"] else e["output"].get("drift")) for e in entries],
            "spectra": (entries[-1]["input"]["singular_values"], entries[-1]["output"]["singular_values"]) if entries else None,
            "tied_geometry": bool(entries) and entries[-1]["tied"],
            "diag": diagnostics(metrics, entries),
        }
    except (KeyError, TypeError, IndexError, AttributeError) as e:
        raise Skip(f"a file lacks an expected field ({type(e).__name__}: {e})") from None


def load_runs(paths: list[Path]) -> tuple[list[dict], list[dict]]:
    runs, skipped = [], []
    for path in find_run_dirs(paths):
        try:
            runs.append(load_run(path))
        except Skip as e:
            skipped.append({"path": str(path), "reason": str(e)})
    return runs, skipped


# --- groups -----------------------------------------------------------------------------------


def ignored(key: str, setting: dict) -> bool:
    # With a token budget, train.max_steps is never read: steps = ceil(max_tokens / tokens per step).
    unused_steps = key == "train.max_steps" and setting.get("train.max_tokens") is not None
    return key in IGNORED_KEYS or key.startswith(IGNORED_PREFIX) or unused_steps


def group_runs(runs: list[dict]) -> tuple[list[dict], list[dict]]:
    """Groups of runs equal in every setting but the seed; a second run of a group's seed is skipped."""
    groups, skipped = {}, []
    for run in runs:
        setting = {k: v for k, v in run["setting"].items() if k != "seed" and not ignored(k, run["setting"])}
        group = groups.setdefault(json.dumps(setting, sort_keys=True), {"setting": setting, "choices": run["choices"], "runs": []})
        twin = next((r for r in group["runs"] if r["seed"] == run["seed"]), None)
        if twin:
            skipped.append({"path": run["path"], "reason": f"same settings and seed as {twin['path']}"})
        else:
            group["runs"].append(run)
    for group in groups.values():
        group["runs"].sort(key=lambda r: r["seed"])
    label_groups(list(groups.values()))
    return sorted(groups.values(), key=sort_key), skipped


def label_groups(groups: list[dict]) -> None:
    """Label: the model and tying choices, the other choices that differ between groups, and
    KEY=VALUE for each differing key that the choices do not explain (e.g. train.max_tokens=...)."""
    keys = sorted(set().union(*(g["setting"] for g in groups)))
    differing = [k for k in keys if len({json.dumps(g["setting"].get(k)) for g in groups}) > 1]
    shown = [c for c in GROUPS if c in ("model", "tying") or len({g["choices"].get(c) for g in groups}) > 1]

    def explained(key):  # the value follows from the group choice (model=micro sets model.n_embd)
        group = key.split(".")[0]
        if group not in GROUPS:
            return False
        by_choice = {}
        for g in groups:
            by_choice.setdefault(g["choices"].get(group), set()).add(json.dumps(g["setting"].get(key)))
        return all(len(values) == 1 for values in by_choice.values())

    unexplained = [k for k in differing if not explained(k)]
    for g in groups:
        g["parts"] = {c: str(g["choices"].get(c)) for c in shown} | {k: f"{k}={g['setting'].get(k)}" for k in unexplained}
        g["label"] = " ".join(g["parts"].values())
        g["mode"] = str(g["choices"].get("tying"))
        g["params"] = g["runs"][0]["params"]


def sort_key(group: dict):
    return (group["params"]["non_embedding"], group["label"])


def mean_ci(values) -> dict | None:
    """Mean, sample sd and 95% t-interval over seeds (None fields with one value; None with none)."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    n, mean = len(values), statistics.fmean(values)
    if n < 2:
        return {"n": 1, "mean": mean, "sd": None, "low": None, "high": None}
    sd = statistics.stdev(values)
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "low": mean - half, "high": mean + half}


# --- comparisons with the baseline ------------------------------------------------------------


def parse_baseline(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key or not value:
        raise TiecliError(f"--baseline {text!r} must be KEY=VALUE, e.g. tying=untied")
    return key.strip(), value.strip()


def on_axis(axis: str, key: str) -> bool:
    """Whether a setting belongs to the baseline's axis: the key itself or, for a group, its keys."""
    return key == axis or key.startswith(axis + ".")


def is_baseline(group: dict, axis: str, value: str) -> bool:
    if axis in GROUPS:
        return str(group["choices"].get(axis)) == value
    actual = group["setting"].get(axis)
    return str(actual) == value or (isinstance(actual, int | float) and _float(value) == actual)


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def rest(group: dict, axis: str, free=()) -> str:
    """The group's setting off the baseline axis (and off the free keys), as a comparable string."""
    return json.dumps({k: v for k, v in group["setting"].items() if not on_axis(axis, k) and k not in free}, sort_keys=True)


def paired(group: dict, base: dict, value, base_value=None) -> list[tuple]:
    """(value in group, value in base) per seed that both have and both measured; base_value, when
    given, reads the base's runs (e.g. the untied output matrix against the tied shared matrix)."""
    by_seed = {r["seed"]: (base_value or value)(r) for r in base["runs"]}
    pairs = [(value(r), by_seed[r["seed"]]) for r in group["runs"] if r["seed"] in by_seed]
    return [(a, b) for a, b in pairs if a is not None and b is not None]


def percent(pairs) -> dict | None:
    return mean_ci([100 * (a / b - 1) for a, b in pairs if b])


def target_loss(runs: list[dict]) -> float | None:
    """The highest of the runs' lowest validation losses: every run's curve reaches it."""
    lows = [min(loss for _, _, loss in r["curve"]) for r in runs if r["curve"]]
    return max(lows) if lows else None


def time_to(curve: list[tuple], target: float) -> tuple[float, float] | None:
    """(steps, tokens) where the val-loss curve first reaches target, linear between evaluations."""
    previous = None
    for step, tokens, loss in curve:
        if loss <= target:
            if previous is None:
                return step, tokens
            step0, tokens0, loss0 = previous
            f = (loss0 - target) / (loss0 - loss)
            return step0 + f * (step - step0), tokens0 + f * (tokens - tokens0)
        previous = (step, tokens, loss)
    return None


def targets(groups: list[dict], axis: str) -> dict[str, float | None]:
    """Each group's convergence target: target_loss over its comparison set, the groups that
    differ from it only on the baseline axis (e.g. every tying mode at one size)."""
    sets = {}
    for g in groups:
        sets.setdefault(rest(g, axis), []).append(g)
    return {g["label"]: target_loss([r for m in members for r in m["runs"]]) for members in sets.values() for g in members}


def reach(run: dict, target: float | None) -> tuple:
    """(steps, tokens) to the target, (None, None) when there is none or the run never gets there."""
    return (time_to(run["curve"], target) if target is not None else None) or (None, None)


def compare(groups: list[dict], axis: str, value: str) -> list[dict]:
    """Each non-baseline group against its baseline at equal architecture, paired by seed."""
    target = targets(groups, axis)
    comparisons = []
    for g in groups:
        base = next((b for b in groups if b is not g and is_baseline(b, axis, value) and rest(b, axis) == rest(g, axis)), None)
        if base is None or is_baseline(g, axis, value):
            continue
        comparisons.append({
            "group": g, "base": base,
            "perplexity": percent(paired(g, base, lambda r: r["perplexity"])),
            "loss": mean_ci(a - b for a, b in paired(g, base, lambda r: r["loss"])),
            "target": target[g["label"]],
            "steps": percent(paired(g, base, lambda r: reach(r, target[g["label"]])[0])),
            "saved_params": base["params"]["total"] - g["params"]["total"],
        })
    return comparisons


def equal_params(g: dict, groups: list[dict], axis: str, value: str) -> dict:
    """g against the baseline interpolated at g's total parameter count across the baseline's sizes:
    log perplexity linear in log(total parameters), seed by seed, between the two bracketing sizes."""
    ladder = sorted((b for b in groups if is_baseline(b, axis, value) and rest(b, axis, SIZE_KEYS) == rest(g, axis, SIZE_KEYS)),
                    key=lambda b: b["params"]["total"])
    totals = [b["params"]["total"] for b in ladder]
    total = g["params"]["total"]
    if len(ladder) < 2:
        return {"why": "baseline at one size only"}
    if not totals[0] <= total <= totals[-1]:
        return {"why": f"outside the baseline's {totals[0]:,}-{totals[-1]:,} parameters"}
    i = max(1, int(np.searchsorted(totals, total)))
    low, high = ladder[i - 1], ladder[i]
    x = [math.log(low["params"]["total"]), math.log(high["params"]["total"])]
    ppl = {b["label"]: {r["seed"]: r["perplexity"] for r in b["runs"]} for b in (low, high)}
    pairs = [(r["perplexity"], math.exp(np.interp(math.log(total), x, [math.log(ppl[low["label"]][r["seed"]]), math.log(ppl[high["label"]][r["seed"]])])))
             for r in g["runs"] if r["seed"] in ppl[low["label"]] and r["seed"] in ppl[high["label"]]]
    if not pairs:
        return {"why": "no seed in common with the bracketing baseline sizes"}
    return {"between": (low["label"], high["label"]), "base_perplexity": mean_ci(b for _, b in pairs), "perplexity": percent(pairs)}


# --- claims -----------------------------------------------------------------------------------


def verdict(ci: dict | None, direction: int) -> tuple[str, str]:
    """direction +1: the claim says the quantity is above zero; -1: below."""
    if ci is None:
        return "inconclusive", "no data"
    if ci["n"] < 2 or ci["low"] is None:
        return "inconclusive", "one seed: no spread, so no interval"
    if ci["low"] > 0 or ci["high"] < 0:
        side = 1 if ci["low"] > 0 else -1
        return ("supported" if side == direction else "contradicted"), f"95% interval excludes 0 ({'above' if side > 0 else 'below'})"
    return "inconclusive", "95% interval contains 0"


def slope(points: list[tuple[float, float]]) -> dict | None:
    """Least-squares slope of y on x with its 95% t-interval (n - 2 degrees of freedom)."""
    if len(points) < 3 or len({x for x, _ in points}) < 2:
        return None
    fit = stats.linregress(*zip(*points))
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, len(points) - 2) * fit.stderr
    return {"n": len(points), "mean": fit.slope, "sd": None, "low": fit.slope - half, "high": fit.slope + half}


def _ci_text(ci: dict | None, digits: int = 3, unit: str = "") -> str:
    if ci is None:
        return "-"
    if ci["low"] is None:
        return f"{ci['mean']:.{digits}g}{unit} (1 seed)"
    return f"{ci['mean']:.{digits}g}{unit} [{ci['low']:.{digits}g}, {ci['high']:.{digits}g}]"


def claim(claim_id, comparison, figure, ci, direction, unit="", claim_text="") -> dict:
    result, why = verdict(ci, direction)
    return {"claim": claim_id, "says": claim_text, "comparison": comparison, "figure": figure,
            "measured": _ci_text(ci, 3, unit), "verdict": result, "why": why, "interval": ci}


def missing(claim_id, text, what) -> dict:
    return {"claim": claim_id, "says": text, "comparison": "-", "figure": "-", "measured": "-",
            "verdict": "inconclusive", "why": f"no data: {what}", "interval": None}


def scaling_claims(pairs: list[dict], free: tuple, x_of, axis_name: str, claim_id: str, text: str) -> list[dict]:
    """Slope of the per-seed paired % perplexity difference against log10 of the scale, per ladder
    of comparisons that differ only in the free keys."""
    ladders = {}
    for c in pairs:
        ladders.setdefault(rest(c["group"], "tying", free), []).append(c)
    rows = []
    for ladder in ladders.values():
        scales = {x_of(c["group"]) for c in ladder}
        if len(scales) < 2:
            continue
        points = [(math.log10(x_of(c["group"])), 100 * (a / b - 1)) for c in ladder for a, b in paired(c["group"], c["base"], lambda r: r["perplexity"])]
        ci = slope(points)
        thin = min(len(paired(c["group"], c["base"], lambda r: r["perplexity"])) for c in ladder)
        row = claim(claim_id, " -> ".join(c["group"]["label"] for c in sorted(ladder, key=lambda c: x_of(c["group"]))),
                    "ppl_vs_params.png", ci, +1, " %/decade", claim_text=text)
        if thin < 2:
            row["verdict"], row["why"] = "inconclusive", "one seed at some scale: no spread at that scale"
        rows.append(row)
    return rows or [missing(claim_id, text, f"tied and untied runs at two or more values of {axis_name}")]


def claims(groups: list[dict]) -> list[dict]:
    """The claims table: tied against untied, whatever --baseline the tables use."""
    pairs = [c for c in compare(groups, "tying", "untied") if c["group"]["mode"] == "tied"]
    tied = [g for g in groups if g["mode"] == "tied"]
    untied = [g for g in groups if g["mode"] == "untied"]
    rows = []
    r2_text = "the vocabulary matrix is the largest single tensor, so tying saves a large share of parameters"
    c1_text = "tying cuts parameters from 2Vd to Vd, 15-30% of the total"
    for c in pairs:
        total = c["base"]["params"]["total"]
        share = c["saved_params"] / total
        n_embd = c["group"]["setting"]["model.n_embd"]
        matrix, mlp = c["saved_params"], 4 * n_embd * n_embd  # V x C against the largest other tensors, the MLP's 4C x C
        rows.append({"claim": "R2", "says": r2_text, "comparison": c["group"]["label"], "figure": "parameters table",
                     "measured": f"V x C = {matrix:,} vs the MLP's 4C x C = {mlp:,}; tying saves {share:.1%} of {total:,}",
                     "verdict": "supported" if matrix > mlp else "contradicted",
                     "why": f"the token matrix is {'' if matrix > mlp else 'not '}the largest tensor (exact counts: no seeds needed)",
                     "interval": None})
        inside = C1_CLAIMED_SHARE[0] <= share <= C1_CLAIMED_SHARE[1]
        rows.append({"claim": "C1", "says": c1_text, "comparison": c["group"]["label"], "figure": "parameters table",
                     "measured": f"{c['saved_params']:,} saved = {share:.1%} of {total:,}",
                     "verdict": "supported" if inside else "contradicted",
                     "why": f"{'inside' if inside else 'outside'} the claimed range (exact counts: no seeds needed)",
                     "interval": None})
    if not pairs:
        rows.append(missing("R2", r2_text, "tied and untied runs of the same size"))
        rows.append(missing("C1", c1_text, "tied and untied runs of the same size"))

    text = "with tying the input-path and output-path gradients oppose (cos < 0) and partly cancel"
    with_grad = [g for g in tied if any(r["diag"]["grad_cos"] is not None for r in g["runs"])]
    for g in with_grad:
        rows.append(claim("R4", g["label"], "grad_cos.png",
                          mean_ci(r["diag"]["grad_cos"] for r in g["runs"]), -1, claim_text=text))
    if not with_grad:
        rows.append(missing("R4", text, "tied runs with gradient statistics (diag.every > 0)"))

    text = "input embeddings pull related forms together, the output matrix pushes them apart"
    with_forms = [g for g in untied if any(r["diag"]["forms_contrast_input"] is not None for r in g["runs"])]
    for g in with_forms:
        contrast = [(r["diag"]["forms_contrast_input"], r["diag"]["forms_contrast_output"]) for r in g["runs"]]
        rows.append(claim("R3", g["label"], "diagnostics table",
                          mean_ci(a - b for a, b in contrast if a is not None and b is not None), +1, claim_text=text))
    if not with_forms:
        rows.append(missing("R3", text, "untied runs with geometry and related-form pairs found"))

    text = "tying keeps the embedding and the projection from drifting (less drift from init)"
    drift_rows = []
    for c in pairs:
        for side in ("input", "output"):
            drift = paired(c["group"], c["base"], lambda r: r["diag"]["drift_input"], lambda r, s=side: r["diag"][f"drift_{s}"])
            if drift:
                drift_rows.append(claim("C2", f"{c['group']['label']} vs untied {side}", "drift.png",
                                        mean_ci(a - b for a, b in drift), -1, claim_text=text))
    rows += drift_rows or [missing("C2", text, "tied and untied runs of the same size with geometry (diag.geometry)")]

    for claim_id, direction, text in (("R6", +1, "untie and the loss converges faster"),
                                      ("C3", -1, "tying gives a more direct gradient path: faster convergence")):
        for c in pairs:
            rows.append(claim(claim_id, c["group"]["label"], "convergence table, val_loss.png",
                              c["steps"], direction, " %", claim_text=text))
        if not pairs:
            rows.append(missing(claim_id, text, "tied and untied runs of the same size"))

    for c in pairs:
        rows.append(claim("C6", c["group"]["label"], "validation table",
                          c["perplexity"], -1, " %", claim_text="tying lowers perplexity"))
    rows += scaling_claims(pairs, SIZE_KEYS, lambda g: g["params"]["non_embedding"], "non-embedding parameters", "R5/C6",
                           "the smaller the model, the larger the gain from tying (the tied-vs-untied gap rises with size)")
    rows += scaling_claims(pairs, BUDGET_KEYS, lambda g: g["runs"][0]["tokens"], "tokens seen", "R5",
                           "with lots of data untying wins: the tied-vs-untied gap rises with tokens seen")
    return rows


# --- tables: one spec, rendered for the terminal, markdown and html ---------------------------

# Two diagnostics tables, so that each fits a terminal: training dynamics, then end-of-training geometry.
DYNAMICS_COLUMNS = (("grad_cos", "grad cos"), ("grad_cancel", "grad cancel"), ("drift_input", "drift in"), ("drift_output", "drift out"))
GEOMETRY_COLUMNS = (
    ("anisotropy_input", "anisotropy in"), ("anisotropy_output", "anisotropy out"), ("effective_rank_input", "eff. rank in"),
    ("effective_rank_output", "eff. rank out"), ("cka", "CKA in/out"), ("row_cosine", "row cos in/out"),
    ("forms_contrast_input", "forms contrast in"), ("forms_contrast_output", "forms contrast out"),
)
DIAG_COLUMNS = DYNAMICS_COLUMNS + GEOMETRY_COLUMNS
METRICS = ("loss", "perplexity", "bits_per_byte", "tokens_per_s")



def _stat(ci: dict | None, key: str = "mean", spec: str = ".4g") -> str:
    return _num(ci[key] if ci else None, spec)


def aggregate(group: dict, target: float | None) -> dict:
    """mean_ci over the group's seeds of every per-run number the tables show."""
    out = {m: mean_ci(r[m] for r in group["runs"]) for m in METRICS}
    out |= {key: mean_ci(r["diag"][key] for r in group["runs"]) for key, _ in DIAG_COLUMNS}
    out["steps_to_target"] = mean_ci(reach(r, target)[0] for r in group["runs"])
    out["tokens_to_target"] = mean_ci(reach(r, target)[1] for r in group["runs"])
    return out


def embedding_share(params: dict) -> float:
    """Token embedding and output matrices (not positions) as a share of all parameters."""
    return (params["input_embedding"] + params["output_matrix"] + params["shared"]) / params["total"]


def build_tables(groups, comparisons, equal, claim_rows, skipped, baseline: str) -> list[dict]:
    """equal: {label: equal_params()} for every non-baseline group; the other groups are baselines."""
    by_group = {c["group"]["label"]: c for c in comparisons}
    versus = f"vs {baseline}, paired by seed"

    def delta(label, key):
        c = by_group.get(label)
        return _ci_text(c[key], 3, " %") if c else "-" if label in equal else "baseline"

    tables = [{
        "title": "Parameters (equal architecture: each group at its own model size)",
        "note": "embedding share: input embedding + output matrix (+ shared) over the total; saved: the baseline's total minus the group's",
        "columns": ["group", "total", "input embedding", "output matrix", "shared", "non-embedding", "embedding share", "saved vs baseline"],
        "rows": [[g["label"], f"{g['params']['total']:,}", f"{g['params']['input_embedding']:,}", f"{g['params']['output_matrix']:,}",
                  f"{g['params']['shared']:,}", f"{g['params']['non_embedding']:,}", f"{embedding_share(g['params']):.1%}",
                  f"{by_group[g['label']]['saved_params']:,}" if g["label"] in by_group else "-"] for g in groups],
    }, {
        "title": "Validation at equal architecture (same model size)",
        "note": f"full validation split; mean over seeds, sd and 95% t-interval [low, high]; delta ppl: {versus}, in % (negative: lower perplexity than the baseline)",
        "columns": ["group", "seeds", "val loss (sd)", "perplexity [95% CI]", "bits/byte [95% CI]", "delta ppl % [95% CI]", "tokens/s"],
        "rows": [[g["label"], str(len(g["runs"])), f"{_stat(g['stats']['loss'])} ({_stat(g['stats']['loss'], 'sd', '.2g')})",
                  _ci_text(g["stats"]["perplexity"], 4), _ci_text(g["stats"]["bits_per_byte"], 4), delta(g["label"], "perplexity"),
                  _stat(g["stats"]["tokens_per_s"], spec=",.0f")] for g in groups],
    }, {
        "title": "Validation at equal total parameters",
        "note": f"the baseline's log perplexity interpolated linearly in log(total parameters) between the two baseline sizes that bracket the group's total, seed by seed; delta ppl {versus}; n/a: cannot be interpolated",
        "columns": ["group", "total params", "perplexity", "baseline ppl at equal params", "delta ppl % [95% CI]", "interpolated between"],
        "rows": [[g["label"], f"{g['params']['total']:,}", _stat(g["stats"]["perplexity"])]
                 + ([_stat(equal[g["label"]]["base_perplexity"]), _ci_text(equal[g["label"]]["perplexity"], 3, " %"), " and ".join(equal[g["label"]]["between"])]
                    if "between" in equal[g["label"]] else ["n/a", "n/a", equal[g["label"]]["why"]])
                 for g in groups if g["label"] in equal],
    }, {
        "title": "Convergence at equal architecture (claims R6/C3)",
        "note": "target: the highest of the runs' lowest in-training validation losses among the groups compared (every run reaches it); "
                f"steps and tokens interpolated linearly between evaluations; delta steps {versus}, in % (negative: faster)",
        "columns": ["group", "target loss", "steps to target [95% CI]", "tokens to target", "delta steps % [95% CI]"],
        "rows": [[g["label"], _num(g["target"]), _ci_text(g["stats"]["steps_to_target"], 4), _stat(g["stats"]["tokens_to_target"], spec=",.0f"),
                  delta(g["label"], "steps")] for g in groups],
    }]
    diagnostics = (
        ("Training dynamics at equal architecture (claims R4, C2)", DYNAMICS_COLUMNS,
         "grad cos, grad cancel: mean over training (metrics.jsonl); drift |W - W0|_F / |W0|_F at the last geometry.json entry"),
        ("Geometry at the last geometry entry, equal architecture (claim R3)", GEOMETRY_COLUMNS,
         "forms contrast = related-form pair cosine - random-pair cosine; CKA and row cosine compare the input and output matrices (untied only)"),
    )
    for title, columns, note in diagnostics:
        if any(g["stats"][key] for g in groups for key, _ in columns):
            tables.append({
                "title": title,
                "note": f"mean over seeds (intervals in results.json); in = input embedding, out = output matrix (the same matrix when tied); {note}",
                "columns": ["group", *(name for _, name in columns)],
                "rows": [[g["label"], *(_stat(g["stats"][key], spec=".3g") for key, _ in columns)] for g in groups],
            })
    tables.append({
        "title": "Claims (tied vs untied, equal architecture unless stated)",
        "note": f"verdict rule: {VERDICT_RULE}; each claim's measure is stated under Rules",
        "columns": ["claim", "comparison", "figure", "measured [95% CI]", "verdict", "why"],
        "rows": [[c["claim"], c["comparison"], c["figure"], c["measured"], c["verdict"], c["why"]] for c in claim_rows],
        "text": True,
    })
    if skipped:
        tables.append({"title": "Skipped run directories", "note": "not used anywhere in this report",
                       "columns": ["run directory", "reason"], "rows": [[s["path"], s["reason"]] for s in skipped], "text": True})
    return tables


def rich_table(spec: dict) -> Table:
    # escape(): "[95% CI]" and "[low, high]" are text here, not rich markup
    table = Table(title=escape(spec["title"]), caption=escape(spec["note"]), caption_justify="left")
    for i, column in enumerate(spec["columns"]):
        if i == 0 or spec.get("text"):
            table.add_column(escape(column), overflow="fold")
        else:  # wide enough for the longest number: cells wrap between words, never inside a number
            words = [word for row in spec["rows"] for word in row[i].split()]
            table.add_column(escape(column), justify="right", min_width=max(map(len, words), default=1))
    for row in spec["rows"]:
        table.add_row(*map(escape, row))
    return table


def markdown_table(spec: dict) -> str:
    def cells(values):
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

    lines = [f"## {spec['title']}", "", f"_{spec['note']}_", "", cells(spec["columns"]), cells(["---"] * len(spec["columns"]))]
    return "\n".join(lines + [cells(row) for row in spec["rows"]]) + "\n"


def html_table(spec: dict) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in spec["columns"])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in spec["rows"])
    return f"<h2>{html.escape(spec['title'])}</h2><p class=note>{html.escape(spec['note'])}</p><table><tr>{head}</tr>{body}</table>"


# --- results files ----------------------------------------------------------------------------


def _flat_ci(prefix: str, ci: dict | None) -> dict:
    return {f"{prefix}_{k}": (ci or {}).get(k) for k in ("mean", "sd", "low", "high")}


def result_rows(groups, comparisons, equal, target) -> list[dict]:
    """One row per run, then one per group; numbers as computed, before any rounding."""
    by_group = {c["group"]["label"]: c for c in comparisons}
    rows = []
    for g in groups:
        for r in g["runs"]:
            steps, tokens = reach(r, target[g["label"]])
            rows.append({"kind": "run", "group": g["label"], "name": r["name"], "path": r["path"], "seed": r["seed"],
                         "params_total": r["params"]["total"], "params_non_embedding": r["params"]["non_embedding"],
                         "embedding_share": embedding_share(r["params"]), **{m: r[m] for m in METRICS},
                         "steps": r["steps"], "tokens": r["tokens"], "target_loss": target[g["label"]],
                         "steps_to_target": steps, "tokens_to_target": tokens, **r["diag"]})
    for g in groups:
        c, eq = by_group.get(g["label"]), equal.get(g["label"], {})
        row = {"kind": "group", "group": g["label"], "n_seeds": len(g["runs"]), "seeds": " ".join(str(r["seed"]) for r in g["runs"]),
               "params_total": g["params"]["total"], "params_non_embedding": g["params"]["non_embedding"],
               "embedding_share": embedding_share(g["params"]), "target_loss": target[g["label"]],
               "baseline": c["base"]["label"] if c else None, "saved_params": c["saved_params"] if c else None}
        for key, ci in g["stats"].items():
            row |= _flat_ci(key, ci)
        row |= _flat_ci("delta_ppl_pct", c and c["perplexity"]) | _flat_ci("delta_steps_pct", c and c["steps"])
        row |= _flat_ci("delta_loss", c and c["loss"])
        row |= _flat_ci("equal_params_delta_ppl_pct", eq.get("perplexity")) | _flat_ci("equal_params_base_perplexity", eq.get("base_perplexity"))
        row["equal_params_note"] = " and ".join(eq["between"]) if "between" in eq else eq.get("why")
        rows.append(row)
    return rows


def csv_text(rows: list[dict]) -> str:
    fields = list(dict.fromkeys(k for row in rows for k in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


# --- the report -------------------------------------------------------------------------------

PLOT_TITLES = {
    "val_loss.png": "Validation loss by mode (R6/C3)",
    "ppl_vs_params.png": "Perplexity vs non-embedding parameters (R5/C6)",
    "grad_cos.png": "Gradient cosine over training (R4)",
    "drift.png": "Drift from initialisation (C2)",
    "spectra.png": "Singular-value spectra of the input and output matrices",
}


def default_out(paths: list[Path]) -> Path:
    """report/ inside the sweep folder when one sweep is given, else ./report."""
    if len(paths) == 1 and (paths[0] / "sweep.json").is_file():
        return paths[0] / "report"
    return Path("report")


def report(paths: list[Path], baseline: str, out: Path | None, console) -> Path:
    """Read, group, compare and judge the runs under paths; print the tables and write the report folder."""
    from tiecli import plots  # matplotlib: loaded by `tiecli report`, not by `tiecli runs`

    axis, value = parse_baseline(baseline)
    runs, skipped = load_runs(paths)
    groups, twins = group_runs(runs)
    skipped += twins
    if not groups:
        where = ", ".join(map(str, paths))
        raise TiecliError(f"no completed run directories under {where}" + (f" ({len(skipped)} skipped; `tiecli runs` says why)" if skipped else ""))
    target = targets(groups, axis)
    for g in groups:
        g["target"] = target[g["label"]]
        g["stats"] = aggregate(g, g["target"])
        g["panel"] = " ".join(v for k, v in g["parts"].items() if not on_axis(axis, k)) or "all runs"
        g["series"] = " ".join(v for k, v in g["parts"].items() if k != "model" and k not in SIZE_KEYS)
    comparisons = compare(groups, axis, value)
    equal = {g["label"]: equal_params(g, groups, axis, value) for g in groups if not is_baseline(g, axis, value)}
    claim_rows = claims(groups)
    specs = build_tables(groups, comparisons, equal, claim_rows, skipped, baseline)
    for spec in specs:
        console.print(rich_table(spec))

    out = out or default_out(paths)
    rules = stated_rules(baseline, axis)
    header = f"{len(runs) - len(twins)} runs in {len(groups)} groups, {len(skipped)} skipped; baseline {baseline}; sources: {', '.join(map(str, paths))}"
    images = plots.draw_all(groups)
    for name, png in images.items():
        if png:
            rundir.atomic_write(out / name, png)
    absent = [f"{name}: not drawn (no run has the data)" for name, png in images.items() if not png]
    rundir.atomic_write(out / "report.md", markdown_page(header, rules, specs, images, absent))
    rundir.atomic_write(out / "report.html", html_page(header, rules, specs, images, absent))
    rows = result_rows(groups, comparisons, equal, target)
    rundir.atomic_write(out / "results.csv", csv_text(rows))
    rundir.write_json(out / "results.json", {
        "baseline": baseline, "rules": rules, "runs": [r for r in rows if r["kind"] == "run"],
        "groups": [r for r in rows if r["kind"] == "group"], "claims": claim_rows, "skipped": skipped})
    console.print(f"report written to {out}")
    return out


def stated_rules(baseline: str, axis: str) -> dict[str, str]:
    """Every rule the numbers follow, printed at the top of report.md and report.html."""
    ignored_keys = ", ".join([*IGNORED_KEYS, IGNORED_PREFIX + "*", "train.max_steps when train.max_tokens is set"])
    return {"grouping": "same resolved config except seed; ignored keys: " + ignored_keys,
            "baseline": f"{baseline}: the group with that value equal in every other key; differences paired by seed",
            "interval": f"mean +- t({0.5 + CONFIDENCE / 2}, n-1) * sd / sqrt(n) over seeds",
            "convergence target": "highest of the runs' lowest in-training validation losses among the groups that differ only in "
                                  f"{axis}; steps and tokens interpolated linearly between evaluations",
            "equal parameters": "baseline log perplexity linear in log(total parameters) between the two bracketing baseline sizes, "
                                "seed by seed; n/a outside the baseline's range or with one baseline size",
            "verdict": VERDICT_RULE, **{f"claim {k}": v for k, v in CLAIM_RULES.items()}}


def markdown_page(header: str, rules: dict, specs: list[dict], images: dict, absent: list[str]) -> str:
    """report.md: the figures are linked, as files next to it."""
    return "\n".join(
        ["# tiecli report", "", header, "", "## Rules", "", *(f"- **{k}**: {v}" for k, v in rules.items()), "",
         *(markdown_table(s) for s in specs), "## Figures", "",
         *(f"### {PLOT_TITLES[name]}\n\n![{PLOT_TITLES[name]}]({name})\n" for name, png in images.items() if png), *absent, ""])


def html_page(header: str, rules: dict, specs: list[dict], images: dict, absent: list[str]) -> str:
    """One file with everything inside: the figures are base64 data URIs, no external assets."""
    style = ("body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}table{border-collapse:collapse;margin:.5em 0 1.5em}"
             "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}th{background:#f3f3f3}.note{color:#555;font-size:13px}img{max-width:100%}")
    figures = "".join(f"<h3>{html.escape(PLOT_TITLES[name])}</h3><img alt='{html.escape(PLOT_TITLES[name])}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
                      for name, png in images.items() if png)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>tiecli report</title><style>{style}</style></head><body>"
            f"<h1>tiecli report</h1><p>{html.escape(header)}</p><h2>Rules</h2><ul>"
            + "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in rules.items()) + "</ul>"
            + "".join(html_table(s) for s in specs) + f"<h2>Figures</h2>{figures}"
            + "".join(f"<p class=note>{html.escape(a)}</p>" for a in absent) + "</body></html>\n")


# --- tiecli runs ------------------------------------------------------------------------------


def runs_table(path: Path) -> Table:
    """One line per run directory under path, readable or not: name, state, size, mode, steps, val perplexity."""
    dirs = find_run_dirs([path])
    if not dirs:
        raise TiecliError(f"no run directories under {str(path)!r}")
    table = Table(title=f"runs under {path}")
    for column in ("name", "state", "size", "mode", "steps", "val perplexity"):
        table.add_column(column, justify="right" if column in ("steps", "val perplexity") else "left", overflow="fold")
    for run in dirs:
        table.add_row(*run_line(run, path))
    return table


def run_line(path: Path, root: Path) -> list[str]:
    name = str(path.relative_to(root)) if path != root else path.name  # sweeps nest runs: show where
    try:
        config = _read(path / rundir.CONFIG, yaml.safe_load)
        choices = _read(path / rundir.OVERRIDES, yaml.safe_load)["choices"]
        summary = _read(path / rundir.SUMMARY, json.loads)
        final = final_val(path, summary) if summary["status"] == "completed" else {}
        return [name, summary["status"], str(choices["model"]), str(config["tying"]["mode"]),
                f"{summary['step']:,}/{summary['max_steps']:,}", _num(final.get("perplexity"), ".2f")]
    except (Skip, KeyError, TypeError) as e:
        return [name, f"unreadable: {e}", "-", "-", "-", "-"]
