# Used by tiecli/report/claims.py: the claims about the token matrices themselves.
"""Claim rows about the embedding matrices: their size (R2, C1), the two gradient paths of a tied matrix
(R4, R4 (pairs), R4 (cancellation)), related word forms in the untied spaces (R3), how alike the two spaces
stay (C2/C7), and which untied matrix a tied one comes to resemble (L1, from the literature)."""

import math
from typing import cast

import numpy as np

from tiecli.report.claims_rules import (
    C1_CLAIMED_SHARE,
    R4_CANCEL_SESOI,
    R4_PAIRS_SESOI,
    TEXTS,
    UNTIED_INIT,
    Claim,
    ClaimId,
    mean_text,
    missing,
    tested,
)
from tiecli.report.compare import Comparison
from tiecli.report.groups import Group
from tiecli.report.load import Run
from tiecli.report.stats import EARLY_FRACTION, ci_text, mean_ci, pair_excess, paired


def parameter_claims(pairs: list[Comparison], same_size: str) -> list[Claim]:
    """R2 and C1 from the exact parameter counts: no seeds, so a plain verdict and no test."""
    if not pairs:
        return [missing(ClaimId.R2, same_size), missing(ClaimId.C1, same_size)]
    rows = []
    for c in pairs:
        total = c.base.params["total"]
        share = c.saved_params / total
        n_embd = c.group.setting["model.n_embd"]
        matrix, mlp = c.saved_params, 4 * n_embd * n_embd  # V x C against the largest other tensors, the MLP's 4C x C
        rows.append(
            Claim(
                ClaimId.R2,
                TEXTS[ClaimId.R2],
                c.group.label,
                "parameters table",
                f"V x C = {matrix:,} vs the MLP's 4C x C = {mlp:,}; tying saves {share:.1%} of {total:,}",
                "supported" if matrix > mlp else "contradicted",
                f"the token matrix is {'' if matrix > mlp else 'not '}the largest tensor (exact counts: no test)",
            )
        )
        inside = C1_CLAIMED_SHARE[0] <= share <= C1_CLAIMED_SHARE[1]
        rows.append(
            Claim(
                ClaimId.C1,
                TEXTS[ClaimId.C1],
                c.group.label,
                "parameters table",
                f"{c.saved_params:,} saved = {share:.1%} of {total:,}" + c1_side(share),
                "supported" if inside else "contradicted",
                f"{'inside' if inside else 'outside'} the claimed range (exact counts: no test)",
            )
        )
    return rows


def c1_side(share: float) -> str:
    """Which way a share outside C1's range misses it: saving more than claimed is no mark against tying."""
    low, high = C1_CLAIMED_SHARE
    if share > high:
        return (
            f": tying saves more than the claimed {low:.0%}-{high:.0%} (the claim's number, not tying, is contradicted)"
        )
    return f": tying saves less than the claimed {low:.0%}-{high:.0%}" if share < low else ""


def gradient_claims(pairs: list[Comparison], tied_groups: list[Group], tied: str, untied: str, margin) -> list[Claim]:
    """R4: Δcos = tied - untied mean grad_cos, paired by seed, below zero; the tied z and norm lost shown.
    Then R4 (pairs): pair_claims, and R4 (cancellation): cancellation_claims."""
    rows = global_gradient_claims(pairs, tied_groups, tied, untied, margin) + pair_claims(tied_groups, tied)
    return rows + cancellation_claims(pairs, tied, untied)


def global_gradient_claims(
    pairs: list[Comparison], tied_groups: list[Group], tied: str, untied: str, margin
) -> list[Claim]:
    if not any(r.diag.get("grad_cos") is not None for g in tied_groups for r in g.runs):
        return [missing(ClaimId.R4, f"{tied} runs with gradient statistics (diag.every > 0)")]
    rows = []
    for c in pairs:
        values = c.delta(lambda r: r.diag.get("grad_cos"))
        if values:
            tied_mean = {
                k: mean_ci(r.diag.get(k) for r in c.group.runs)
                for k in ("grad_cos", "grad_cos_z", "grad_norm_lost_pct")
            }
            shown = ", ".join(
                f"{name} {ci.mean:.3g}" for name, ci in zip(("tied cos", "z", "norm lost %"), tied_mean.values()) if ci
            )
            rows.append(
                tested(
                    ClaimId.R4,
                    c.group.label,
                    "gradient table, grad_cos.png",
                    values,
                    -1,
                    margin,
                    lambda ci, s=shown: f"Δcos {ci_text(ci)}; {s}",
                )
            )
    return rows or [missing(ClaimId.R4, f"{untied} runs with gradient statistics at the same size as the {tied} ones")]


def pair_claims(tied_groups: list[Group], tied: str) -> list[Claim]:
    """R4 (pairs): per seed, the share of related pairs in the claimed opposition minus the matched null's, above zero."""
    rows = []
    for g in tied_groups:
        values = [pair_excess(r, "claimed") for r in g.runs]
        if not any(v is not None for v in values):
            continue
        paths = {k: mean_ci(pair_excess(r, k) for r in g.runs) for k in ("pull_in", "push_out")}
        null_sd = mean_ci(r.diag.get("pair_claimed_null_sd") for r in g.runs)
        in_sds = f" = {R4_PAIRS_SESOI / null_sd.mean:.2g} null sds" if null_sd and null_sd.mean > 0 else ""
        shown = (
            f"input pull share {mean_text(paths['pull_in'])}, output push share {mean_text(paths['push_out'])} beyond the null"
            f"; null sd {mean_text(null_sd)} (one step), SESOI {R4_PAIRS_SESOI:g}{in_sds}"
        )
        rows.append(
            tested(
                ClaimId.R4_PAIRS,
                g.label,
                "results.csv (pair_* columns)",
                [v for v in values if v is not None],
                +1,
                (R4_PAIRS_SESOI, f"{R4_PAIRS_SESOI:g} share"),
                lambda ci, s=shown: f"Δclaimed share {ci_text(ci)}; {s}",
            )
        )
    return rows or [
        missing(
            ClaimId.R4_PAIRS,
            f"{tied} runs with pair gradient statistics (diag.every > 0, related pairs in the vocabulary)",
        )
    ]


def forms_claims(untied_groups: list[Group], untied: str, margin) -> list[Claim]:
    """R3: the input matrix's related-form contrast minus the output matrix's, above zero."""
    rows = []
    for g in untied_groups:
        contrast = [(r.diag.get("forms_contrast_input"), r.diag.get("forms_contrast_output")) for r in g.runs]
        values = [a - b for a, b in contrast if a is not None and b is not None]
        if values:
            rows.append(tested(ClaimId.R3, g.label, "geometry table", values, +1, margin))
    return rows or [missing(ClaimId.R3, f"{untied} runs with geometry and related-form pairs found")]


def agreement_claims(groups: list[Group], untied: str, margin) -> list[Claim]:
    """C2/C7: ΔCKA(W_in, W_out) from step 0 to the last geometry entry, in runs without a tie; below zero."""
    rows = []
    for g in groups:
        values = [
            cast(float, r.diag["cka"]) - cast(float, r.diag["cka_init"])
            for r in g.runs
            if r.diag.get("cka") is not None and r.diag.get("cka_init") is not None
        ]
        if values:
            at = {k: mean_ci(r.diag.get(k) for r in g.runs) for k in ("cka_init", "cka", "distance_init", "distance")}
            shown = f"CKA {mean_text(at['cka_init'])} -> {mean_text(at['cka'])}, distance {mean_text(at['distance_init'])} -> {mean_text(at['distance'])}"
            rows.append(
                tested(
                    ClaimId.C2_C7,
                    g.label,
                    "agreement table",
                    values,
                    -1,
                    margin,
                    lambda ci, s=shown: f"ΔCKA {ci_text(ci)}; {s}",
                )
            )
    return rows or [
        missing(ClaimId.C2_C7, f"{untied} or {UNTIED_INIT} runs with geometry at step 0 and later (diag.geometry)")
    ]


def cancellation_claims(pairs: list[Comparison], tied: str, untied: str) -> list[Claim]:
    """R4 (cancellation): per seed, the tied run's excess cancelled fraction of Adam's step along the related
    pairs (over the frequency- and cosine-matched null) minus the untied control's; above zero."""
    rows = []
    for c in pairs:
        values = c.delta(lambda r: r.diag.get("pair_cancel_adam_excess"))
        if not values:
            continue
        excess = {
            f"{mode} {kind}": mean_text(mean_ci(r.diag.get(f"pair_cancel_{kind}_excess") for r in runs))
            for mode, runs in ((tied, c.group.runs), (untied, c.base.runs))
            for kind in ("adam", "grad")
        }
        fraction = mean_text(mean_ci(r.diag.get("pair_cancel_adam") for r in c.group.runs))
        cover = mean_text(mean_ci(r.diag.get("pair_cancel_cover") for r in c.group.runs))
        shown = (
            f"excess cancelled fraction beyond the null, Adam's step: {tied} {excess[f'{tied} adam']}, {untied} "
            f"{excess[f'{untied} adam']}; raw gradients: {tied} {excess[f'{tied} grad']}, {untied} "
            f"{excess[f'{untied} grad']}; {tied} cancelled fraction {fraction}; pairs matched {cover}"
        )
        rows.append(
            tested(
                ClaimId.R4_CANCELLATION,
                c.group.label,
                "results.csv (pair_cancel_* columns)",
                values,
                +1,
                (R4_CANCEL_SESOI, f"{R4_CANCEL_SESOI:g} of the paths' step"),
                lambda ci, s=shown: f"Δexcess {tied} - {untied} {ci_text(ci)}; {s}",
            )
        )
    return rows or [
        missing(
            ClaimId.R4_CANCELLATION,
            f"{tied} and {untied} runs of the same size with the cancellation statistics (diag.every > 0, related "
            "pairs in the vocabulary; tiecli since R4 (cancellation))",
        )
    ]


def linear_cka(x: np.ndarray, y: np.ndarray) -> float | None:
    """Linear CKA (Kornblith et al. 2019) of two (n, C) row sets, rows as examples, columns centred:
    |Y^T X|_F^2 / (|X^T X|_F |Y^T Y|_F); None when either is constant."""
    x = x.astype(np.float64) - x.mean(0, dtype=np.float64)
    y = y.astype(np.float64) - y.mean(0, dtype=np.float64)
    denom = np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)
    return float(np.linalg.norm(y.T @ x) ** 2 / denom) if denom > 0 else None


def mean_row_cosine(x: np.ndarray, y: np.ndarray) -> float | None:
    """Mean over rows of cos(x_i, y_i), rows of zero norm left out."""
    x, y = x.astype(np.float64), y.astype(np.float64)
    norms = np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1)
    keep = norms > 0
    return float(((x * y).sum(1)[keep] / norms[keep]).mean()) if keep.any() else None


def alike(run: Run, base: Run) -> dict[str, float | None]:
    """L1's numbers for a run against a same-seed run with two matrices: CKA and mean row cosine of the run's
    input matrix against the base's output and input matrices, over the sampled tokens both have (rows.npz)."""
    keys = ("alike_cka_output", "alike_cka_input", "alike_row_cos_output", "alike_row_cos_input")
    if run.rows is None or base.rows is None or base.rows[3] is None:
        return dict.fromkeys(keys)
    _, ids, x, _ = run.rows
    _, base_ids, base_in, base_out = base.rows
    common, at, base_at = np.intersect1d(ids, base_ids, return_indices=True)
    if len(common) < 2 or x.shape[1] != base_in.shape[1]:
        return dict.fromkeys(keys)
    x, base_in, base_out = x[at], base_in[base_at], base_out[base_at]
    return dict(
        zip(
            keys,
            (
                linear_cka(x, base_out),
                linear_cka(x, base_in),
                mean_row_cosine(x, base_out),
                mean_row_cosine(x, base_in),
            ),
        )
    )


def early_path_ratio(run: Run) -> float | None:
    """|G_out| / |G_in| on the token matrices early on: the geometric mean of grad_norm_out / grad_norm_in over the
    diag steps in the first EARLY_FRACTION of the run; None without them."""
    logs = [math.log(out / inp) for step, inp, out in run.paths if step <= EARLY_FRACTION * run.steps and inp > 0 < out]
    return math.exp(sum(logs) / len(logs)) if logs else None


def alike_claims(pairs: list[Comparison], tied: str, untied: str, margin) -> list[Claim]:
    """L1 (literature): per seed, CKA(tied matrix, untied output matrix) - CKA(tied matrix, untied input matrix)
    over rows.npz's sampled tokens; above zero."""
    rows = []
    for c in pairs:
        measured = [alike(a, b) for a, b in paired(c.group, c.base, lambda r: r)]
        values = [
            out - inp
            for m in measured
            if (out := m["alike_cka_output"]) is not None and (inp := m["alike_cka_input"]) is not None
        ]
        measured = [m for m in measured if m["alike_cka_output"] is not None and m["alike_cka_input"] is not None]
        if not measured:
            continue
        means = {k: mean_text(mean_ci(m[k] for m in measured)) for k in measured[0]}
        early = mean_ci(early_path_ratio(r) for r in c.group.runs)
        shown = (
            f"CKA to {untied}'s output {means['alike_cka_output']}, input {means['alike_cka_input']}; row cos to output "
            f"{means['alike_row_cos_output']}, input {means['alike_row_cos_input']}; {tied}'s early |G_out|/|G_in| "
            f"{mean_text(early)} (first {EARLY_FRACTION:.0%} of steps)"
        )
        rows.append(
            tested(
                ClaimId.L1,
                c.group.label,
                "results.csv (alike_* columns)",
                values,
                +1,
                margin,
                lambda ci, s=shown: f"ΔCKA output - input {ci_text(ci)}; {s}",
            )
        )
    return rows or [
        missing(
            ClaimId.L1,
            f"{tied} and {untied} runs of the same size and seeds with rows.npz (diag.geometry, tiecli since L1)",
        )
    ]
