# Used by `tiecli report`: results.csv and results.json, every number unrounded.
"""One row per run, then one per group, as flat dicts: the same rows go to results.csv and results.json."""

import csv
import io
from collections import Counter
from dataclasses import asdict

from tiecli.report.claims_embedding import alike, early_path_ratio
from tiecli.report.claims_stability import Outcome
from tiecli.report.compare import Comparison, EqualParams
from tiecli.report.groups import Group
from tiecli.report.load import Run
from tiecli.report.stats import METRICS, Interval, embedding_share, final_loss, gap, gap_at, mean_ci, reach, run_values


def _flat_ci(prefix: str, ci: Interval | None) -> dict:
    return {f"{prefix}_{k}": getattr(ci, k) if ci else None for k in ("mean", "sd", "low", "high")}


def run_row(g: Group, r: Run) -> dict:
    steps, tokens, before = reach(r, g.target)
    return {
        "kind": "run",
        "group": g.label,
        "name": r.name,
        "path": r.path,
        "seed": r.seed,
        "split_seed": r.unit[1],  # data.split_seed: with the seed, the unit runs pair by
        "params_total": r.params["total"],
        "params_non_embedding": r.params["non_embedding"],
        "embedding_share": embedding_share(r.params),
        **{m: getattr(r, m) for m in METRICS},
        **run_values(r),
        "gap_source": r.gap[2] if r.gap else None,
        "steps": r.steps,
        "tokens": r.tokens,
        "target_loss": g.target,
        "steps_to_target": steps,
        "tokens_to_target": tokens,
        "evals_before_target": before,
        "device": r.device,
        "dtype": r.dtype,
        "threads": r.threads,
        **r.diag,
    }


def claim_inputs(r: Run, c: Comparison | None) -> dict:
    """The per-seed numbers the claims read off the pair that are not the run's own: the same-seed baseline run, its
    steps to this pair's target (R6/C3; the run's own: steps_to_target), Δloss on the claims split (C6 and the slopes' y), and the equal-fit reading
    (R5/C2 gap (equal fit)): the train loss both runs reach, each run's val - train gap there."""
    base = next((b for b in c.base.runs if b.seed == r.seed), None) if c else None
    if c is None or base is None:
        return {"early_out_in": early_path_ratio(r)}
    level = max(r.fit[-1][0], base.fit[-1][0]) if r.fit and base.fit else None
    loss, base_loss = final_loss(r, c.split), final_loss(base, c.split)
    return {
        "baseline_run": base.name,
        "baseline_steps_to_target": reach(base, c.target)[0],
        "claims_delta_loss": None if loss is None or base_loss is None else loss - base_loss,
        "equal_fit_train_loss": level,
        "equal_fit_gap": gap_at(r.fit, level) if level is not None and len(r.fit) > 1 else None,
        "baseline_equal_fit_gap": gap_at(base.fit, level) if level is not None and len(base.fit) > 1 else None,
        "early_out_in": early_path_ratio(r),
        **alike(r, base),  # L1: this run's input matrix against the baseline run's two
    }


def comparison_columns(c: Comparison | None) -> dict:
    """The group against its baseline: Δloss and % perplexity (val, test), convergence of the pair, Δcos, Δgap."""
    row = {
        "baseline": c.base.label if c else None,
        "saved_params": c.saved_params if c else None,
        "convergence_note": c.note() if c else None,
        "claims_split": c.split if c else None,
    }
    row |= _flat_ci("delta_loss", c.loss if c else None) | _flat_ci("delta_ppl_pct", c.perplexity if c else None)
    row |= _flat_ci("test_delta_loss", mean_ci(c.delta_loss("test")) if c else None) | _flat_ci(
        "test_delta_ppl_pct", c.test_perplexity if c else None
    )
    row |= _flat_ci("delta_steps_pct", c.steps if c else None)
    row |= _flat_ci("baseline_steps_to_target", mean_ci(reach(r, c.target)[0] for r in c.base.runs) if c else None)
    row |= _flat_ci("delta_grad_cos", mean_ci(c.delta(lambda r: r.diag.get("grad_cos"))) if c else None)
    row |= _flat_ci("delta_gap", mean_ci(c.delta(gap)) if c else None)
    return row | _flat_ci("delta_gap_equal_fit", mean_ci(c.delta_matched_gap()) if c else None)


def group_row(g: Group, c: Comparison | None, eq: EqualParams, compute: EqualParams) -> dict:
    row = {
        "kind": "group",
        "group": g.label,
        "n_seeds": len(g.runs),
        "seeds": " ".join(str(r.seed) for r in g.runs),
        "split_seeds": " ".join(str(r.unit[1]) for r in g.runs),
        "params_total": g.params["total"],
        "params_non_embedding": g.params["non_embedding"],
        "embedding_share": embedding_share(g.params),
        "target_loss": g.target,
    }
    for key, ci in g.stats.items():
        row |= _flat_ci(key, ci)
    row |= comparison_columns(c)
    for name, view in (("equal_params", eq), ("equal_compute", compute)):
        row |= _flat_ci(f"{name}_delta_loss", view.loss) | _flat_ci(f"{name}_delta_ppl_pct", view.perplexity)
        row |= {f"{name}_split": view.split} | _flat_ci(f"{name}_perplexity", view.own_perplexity)
        row |= _flat_ci(f"{name}_base_perplexity", view.base_perplexity) | {f"{name}_note": view.note()}
    return row


def result_rows(
    groups: list[Group], comparisons: list[Comparison], equal: dict[str, EqualParams], compute: dict[str, EqualParams]
) -> list[dict]:
    """One row per run, then one per group; numbers as computed, before any rounding."""
    by_group = {c.group.label: c for c in comparisons}
    runs = [run_row(g, r) | claim_inputs(r, by_group.get(g.label)) for g in groups for r in g.runs]
    return runs + [
        group_row(g, by_group.get(g.label), equal.get(g.label, EqualParams()), compute.get(g.label, EqualParams()))
        for g in groups
    ]


def divergence_rows(units: list[dict[str, Outcome]]) -> list[dict]:
    """One row per run that C2 stability (divergence) pairs (claims_stability.grid_pairs), unselected and diverged runs included."""
    return [
        {"kind": "divergence", "name": o.name, "tying": o.mode, "unit": o.unit, "train_lr": o.lr}
        | {"diverged": int(o.diverged), "divergence_why": o.why}
        for unit in units
        for o in unit.values()
    ]


def scope(runs: list[Run]) -> dict:
    """What the runs are: counts of runs by device and dtype (bf16: bf16 autocast) and by CPU threads."""
    return {
        "precision": dict(Counter(f"{r.dtype} on {r.device}" for r in runs)),
        "threads": dict(Counter(str(r.threads) if r.threads else "not recorded" for r in runs)),
    }


def scope_text(scope: dict) -> str:
    def counts(by: dict) -> str:
        return ", ".join(f"{k} ({n} run{'s' if n > 1 else ''})" for k, n in sorted(by.items()))

    precision = counts({k.replace("bf16 on", "bf16 autocast on"): n for k, n in scope["precision"].items()})
    threads = counts(scope["threads"]) + (
        " (not recorded: trained before tiecli recorded threads)" if "not recorded" in scope["threads"] else ""
    )
    return f"precision: {precision}; CPU threads: {threads}"


def results_json(baseline: str, rules: dict, rows: list[dict], claims: list, skipped: list, settings: dict) -> dict:
    """settings: sesoi, target_loss, select, multiple_comparisons, not_selected."""
    return {
        "baseline": baseline,
        **settings,
        "rules": rules,
        "runs": [r for r in rows if r["kind"] == "run"],
        "groups": [r for r in rows if r["kind"] == "group"],
        "divergence": [r for r in rows if r["kind"] == "divergence"],
        "claims": [asdict(c) for c in claims],
        "skipped": [asdict(s) for s in skipped],
    }


# Columns added after reports were first committed, in the order added: results.csv puts them (and a group's
# _mean, _sd, _low, _high of them) after every other column, so an earlier results.csv is a prefix of each line.
# A name ending in "_" stands for every column it starts (R4 (cancellation)'s, drift_unit's, L1's).
LATER_COLUMNS = ("grad_norm_excursions", "pair_cancel_", "pair_row_cos", "drift_unit_", "alike_", "early_out_in")


def later(field: str) -> int | None:
    """The place of a field in LATER_COLUMNS (a group's interval of one included), None for an earlier column."""

    def is_of(name: str) -> bool:
        return field.startswith(name) if name.endswith("_") else field == name or field.startswith(name + "_")

    return next((i for i, name in enumerate(LATER_COLUMNS) if is_of(name)), None)


def csv_text(rows: list[dict]) -> str:
    fields = list(dict.fromkeys(k for row in rows for k in row))
    fields = [f for f in fields if later(f) is None] + sorted(
        (f for f in fields if later(f) is not None), key=lambda f: later(f) or 0
    )
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
