# Used by tiecli/report/claims.py and tiecli/report/gate.py: the claims about regularisation and stability.
"""Claim rows about what tying does to training's health: the generalisation gap (R5/C2 gap, at equal fit
too), the input matrix's drift from its initialisation (C2/C7 drift), loss spikes and gradient-norm jitter
(C2 stability), and divergence at high learning rates across a run grid (`Outcome`, C2 stability
(divergence))."""

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats as scipy_stats

from tiecli.report.claims_rules import (
    TEXTS,
    Claim,
    ClaimId,
    mean_text,
    missing,
    tested,
)
from tiecli.report.compare import Comparison
from tiecli.report.groups import Baseline, Group, ignored
from tiecli.report.load import DivergedRun
from tiecli.report.stats import (
    EARLY_FRACTION,
    EXCURSION_FACTOR,
    Interval,
    ci_text,
    diverged,
    divergence_threshold,
    early_grad_norms,
    gap,
    grad_norm_excursions,
    grad_norm_jitter,
    loss_spikes,
    mean_ci,
    paired,
)


def gap_claims(pairs: list[Comparison], margin, tied: str, untied: str) -> list[Claim]:
    """Generalisation gap (val - train loss), tied minus untied, paired by seed, at the end of training and
    at equal fit (Comparison.delta_matched_gap); below zero."""
    rows = []
    for c in pairs:
        values = c.delta(gap)
        sources = ", ".join(sorted({r.gap[2] for r in c.group.runs + c.base.runs if r.gap}))
        sources += fit_text(c, tied, untied)
        if values:
            rows.append(
                tested(
                    ClaimId.R5_C2_GAP,
                    c.group.label,
                    "generalisation gap table",
                    values,
                    -1,
                    margin,
                    lambda ci, s=sources: f"Δgap {ci_text(ci)} nats (from {s})",
                )
            )
        if matched := c.delta_matched_gap():
            rows.append(
                tested(
                    ClaimId.R5_C2_GAP_EQUAL_FIT,
                    c.group.label,
                    "generalisation gap table",
                    matched,
                    -1,
                    margin,
                    lambda ci: f"Δgap {ci_text(ci)} nats at equal train loss (metrics.jsonl)",
                )
            )
    return rows or [
        missing(
            ClaimId.R5_C2_GAP,
            f"{tied} and {untied} runs with a train-split evaluation (eval.json train or "
            "metrics.jsonl train_eval_loss)",
        )
    ]


def fit_text(c: Comparison, tied: str, untied: str) -> str:
    """The raw gap row's reminder that it is not read at equal fit: which mode fitted the training split worse, by how
    much (Δ train loss, tied - untied, paired by seed), and that a worse fit leaves less to overfit."""
    fit = mean_ci(c.delta(lambda r: r.gap[1] if r.gap else None))
    if fit is None or fit.mean == 0:
        return ""
    worse = tied if fit.mean > 0 else untied
    return (
        f"; not at equal fit: {worse} fitted the training split worse (Δtrain loss {ci_text(fit)}), and a worse fit "
        "leaves less to overfit, so the raw gap follows it (the equal-fit row reads both at one train loss)"
    )


# --- C2/C7 drift and C2's stability -----------------------------------------------------------------------


def ratio_text(ci: Interval | None) -> str:
    """A log-ratio interval as the ratio exp(x), every bound transformed alike."""
    if ci is None:
        return "-"
    shown = Interval(ci.n, math.exp(ci.mean), None, *(None if x is None else math.exp(x) for x in (ci.low, ci.high)))
    return f"{ci_text(shown)} (log ratio {ci_text(ci)})"


def log_ratios(c: Comparison, value) -> list[float]:
    """log(value(tied run) / value(untied run)) per seed both have, both positive."""
    return [math.log(a / b) for a, b in paired(c.group, c.base, value) if a > 0 and b > 0]


def drift_claims(pairs: list[Comparison], margin, tied: str, untied: str) -> list[Claim]:
    """C2/C7 drift: the input-side token matrix's scale-free drift (drift_unit, of the row-normalised matrix), tied
    (the shared matrix) over untied (wte); the norm-based drift shown."""
    rows = []
    for c in pairs:
        values = log_ratios(c, lambda r: r.diag.get("drift_unit_input"))
        if values:
            tied_in, untied_in, untied_out, norm_tied, norm_untied = (
                mean_text(mean_ci(r.diag.get(key) for r in runs))
                for runs, key in (
                    (c.group.runs, "drift_unit_input"),
                    (c.base.runs, "drift_unit_input"),
                    (c.base.runs, "drift_unit_output"),
                    (c.group.runs, "drift_input"),
                    (c.base.runs, "drift_input"),
                )
            )
            shown = (
                f"row-normalised drift {tied} {tied_in}, {untied} input {untied_in} (output {untied_out}); "
                f"|W - W0|/|W0| {tied} {norm_tied}, {untied} input {norm_untied}"
            )
            rows.append(
                tested(
                    ClaimId.C2_C7_DRIFT,
                    c.group.label,
                    "dynamics table, drift.png",
                    values,
                    -1,
                    margin,
                    lambda ci, s=shown: f"drift ratio {tied}/{untied} {ratio_text(ci)}; {s}",
                )
            )
    return rows or [
        missing(
            ClaimId.C2_C7_DRIFT,
            f"{tied} and {untied} runs with drift_unit in geometry.json (diag.geometry; `tiecli geometry RUN --write` "
            "adds it to the last entry of a run that kept its checkpoints)",
        )
    ]


def stability_claims(pairs: list[Comparison], margin: dict, tied: str, untied: str) -> list[Claim]:
    """C2 stability: loss spikes (tied - untied count, the runs' gradient-norm excursions shown beside them) and
    early gradient-norm jitter (log ratio), paired by seed."""
    rows = []
    for c in pairs:
        spikes = c.delta(loss_spikes)
        if spikes:
            counts = f"{tied} {mean_text(mean_ci(map(loss_spikes, c.group.runs)))}, {untied} {mean_text(mean_ci(map(loss_spikes, c.base.runs)))}"
            excursions = (
                f"; grad-norm excursions (> {EXCURSION_FACTOR:g}x the running median) per run: {tied} "
                f"{mean_text(mean_ci(map(grad_norm_excursions, c.group.runs)))}, {untied} "
                f"{mean_text(mean_ci(map(grad_norm_excursions, c.base.runs)))}"
            )
            rows.append(
                tested(
                    ClaimId.C2_SPIKES,
                    c.group.label,
                    "dynamics table",
                    spikes,
                    -1,
                    margin["spikes"],
                    lambda ci, s=counts, e=excursions: f"Δspikes {ci_text(ci)} per run (mean {s}){e}",
                )
            )
        if jitter := log_ratios(c, grad_norm_jitter):
            rows.append(
                tested(
                    ClaimId.C2_GRAD_NORM,
                    c.group.label,
                    "dynamics table",
                    jitter,
                    -1,
                    margin["gnorm"],
                    lambda ci: f"jitter ratio {tied}/{untied} {ratio_text(ci)}, first {EARLY_FRACTION:.0%} of steps",
                )
            )
    needs = f"{tied} and {untied} runs of the same size with logged train losses and grad_norm (metrics.jsonl)"
    found = {r.claim for r in rows}
    rows += [missing(ClaimId.C2_SPIKES, needs)] if ClaimId.C2_SPIKES not in found else []
    return rows + (
        [] if ClaimId.C2_GRAD_NORM in found else [few_early_norms(pairs) or missing(ClaimId.C2_GRAD_NORM, needs)]
    )


def few_early_norms(pairs: list[Comparison]) -> Claim | None:
    """The grad-norm row without data when the runs do log grad_norm, but too few points early to read a jitter."""
    runs = [r for c in pairs for r in c.group.runs + c.base.runs]
    if not any(r.grad_norms for r in runs):
        return None
    early = sorted({early_grad_norms(r) for r in runs})
    why = (
        f"no data: the runs log grad_norm, but {'-'.join(map(str, dict.fromkeys([early[0], early[-1]])))} points in the "
        f"first {EARLY_FRACTION:.0%} of steps (the jitter needs 3; log more often: train.log_interval)"
    )
    return Claim(ClaimId.C2_GRAD_NORM, TEXTS[ClaimId.C2_GRAD_NORM], "-", "-", "-", why, "nothing to test")


@dataclass
class Outcome:
    """One run of a learning-rate grid, for C2 stability (divergence): diverged or not, and its pairing unit."""

    unit: str  # every setting but the tying mode (those that differ between the runs), and the seed
    mode: str
    lr: float | None
    name: str
    diverged: bool
    why: str


def outcomes(groups: list[Group], failed: Sequence[DivergedRun]) -> list[Outcome]:
    """Every run of the groups (before --select) and every run that stopped on a non-finite loss, with its unit."""
    runs = [(g.setting, g.mode, r.seed, r.name, diverged(r), _why(r)) for g in groups for r in g.runs]
    for f in failed:
        setting = {k: v for k, v in f.setting.items() if k != "seed" and not ignored(k, f.setting)}
        runs.append((setting, str(f.choices.get("tying")), f.seed, f.name, 1.0, f"non-finite loss by step {f.step}"))
    axis = Baseline("tying", "")
    off = [{k: v for k, v in setting.items() if not axis.on_axis(k)} for setting, *_ in runs]
    keys = sorted(set().union(*off)) if off else []
    differing = [k for k in keys if len({json.dumps(o.get(k)) for o in off}) > 1]
    return [
        Outcome(
            " ".join([*(f"{k}={o.get(k)}" for k in differing), f"seed={seed}"]),
            mode,
            o.get("train.lr"),
            name,
            bool(value),
            why,
        )
        for o, (_, mode, seed, name, value, why) in zip(off, runs)
        if value is not None
    ]


def _why(run) -> str:
    threshold = divergence_threshold(run)
    return f"final val loss {run.loss:.4g}" + (f" vs threshold {threshold:.4g}" if threshold is not None else "")


def grid_pairs(grid: Sequence[Outcome], tied: str = "tied", untied: str = "untied") -> list[dict[str, Outcome]]:
    """The units with a tied and an untied run, {mode: outcome}, when they span two or more learning rates; else []."""
    by_unit: dict[str, dict[str, Outcome]] = {}
    for o in grid:
        by_unit.setdefault(o.unit, {})[o.mode] = o
    units = [{m: u[m] for m in (tied, untied)} for u in by_unit.values() if tied in u and untied in u]
    return units if len({u[tied].lr for u in units}) > 1 else []


def divergence_claims(grid: Sequence[Outcome], tied: str, untied: str) -> list[Claim]:
    """C2 stability (divergence): paired by unit, d = diverged tied - diverged untied; exact McNemar test."""
    units = grid_pairs(grid, tied, untied)
    rates = sorted({lr for u in units if (lr := u[tied].lr) is not None})
    if len(rates) < 2:
        return [missing(ClaimId.C2_DIVERGENCE, f"{tied} and {untied} runs at two or more train.lr values (an LR grid)")]
    d = [int(u[tied].diverged) - int(u[untied].diverged) for u in units]
    tied_only, untied_only = d.count(1), d.count(-1)
    p = float(scipy_stats.binomtest(tied_only, tied_only + untied_only).pvalue) if tied_only + untied_only else 1.0
    shares = "; ".join(
        f"lr {lr:g}: {tied} {sum(u[tied].diverged for u in at)}/{len(at)}, {untied} {sum(u[untied].diverged for u in at)}/{len(at)}"
        for lr in rates
        for at in [[u for u in units if u[tied].lr == lr]]
    )
    ci = mean_ci(d)
    return [
        Claim(
            ClaimId.C2_DIVERGENCE,
            TEXTS[ClaimId.C2_DIVERGENCE],
            f"{len(units)} {tied}/{untied} pairs over train.lr {rates[0]:g}-{rates[-1]:g}",
            "results.csv divergence rows",
            f"Δ divergence rate {ci_text(ci)}; diverged {shares}; discordant pairs: {tied} only {tied_only}, "
            f"{untied} only {untied_only} (exact McNemar)",
            interval=ci,
            direction=-1,
            p=p,
        )
    ]
