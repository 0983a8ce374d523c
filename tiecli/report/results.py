# Used by `tiecli report`: results.csv and results.json, every number unrounded.
"""One row per run, then one per group, as flat dicts: the same rows go to results.csv and results.json."""

import csv
import io
from dataclasses import asdict

from tiecli.report.groups import Group
from tiecli.report.load import Run
from tiecli.report.stats import (
    METRICS,
    Comparison,
    EqualParams,
    Interval,
    embedding_share,
    gap,
    mean_ci,
    reach,
    run_values,
)


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
        **r.diag,
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
        row |= _flat_ci(f"{name}_base_perplexity", view.base_perplexity) | {f"{name}_note": view.note()}
    return row


def result_rows(
    groups: list[Group], comparisons: list[Comparison], equal: dict[str, EqualParams], compute: dict[str, EqualParams]
) -> list[dict]:
    """One row per run, then one per group; numbers as computed, before any rounding."""
    by_group = {c.group.label: c for c in comparisons}
    runs = [run_row(g, r) for g in groups for r in g.runs]
    return runs + [
        group_row(g, by_group.get(g.label), equal.get(g.label, EqualParams()), compute.get(g.label, EqualParams()))
        for g in groups
    ]


def results_json(baseline: str, rules: dict, rows: list[dict], claims: list, skipped: list, settings: dict) -> dict:
    """settings: sesoi, target_loss, select, multiple_comparisons, not_selected."""
    return {
        "baseline": baseline,
        **settings,
        "rules": rules,
        "runs": [r for r in rows if r["kind"] == "run"],
        "groups": [r for r in rows if r["kind"] == "group"],
        "claims": [asdict(c) for c in claims],
        "skipped": [asdict(s) for s in skipped],
    }


def csv_text(rows: list[dict]) -> str:
    fields = list(dict.fromkeys(k for row in rows for k in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
