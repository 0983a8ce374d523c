# Used by tiecli/report/claims.py: the claims about the token matrices themselves.
"""Claim rows about the embedding matrices: their size (R2, C1), the two gradient paths of a tied matrix
(R4, R4 (pairs)), related word forms in the untied spaces (R3) and how alike the two spaces stay (C2/C7)."""

from typing import cast

from tiecli.report.claims_rules import (
    C1_CLAIMED_SHARE,
    R4_PAIRS_SESOI,
    TEXTS,
    UNTIED_INIT,
    Claim,
    mean_text,
    missing,
    tested,
)
from tiecli.report.compare import Comparison
from tiecli.report.groups import Group
from tiecli.report.stats import ci_text, mean_ci, pair_excess


def parameter_claims(pairs: list[Comparison], same_size: str) -> list[Claim]:
    """R2 and C1 from the exact parameter counts: no seeds, so a plain verdict and no test."""
    if not pairs:
        return [missing("R2", same_size), missing("C1", same_size)]
    rows = []
    for c in pairs:
        total = c.base.params["total"]
        share = c.saved_params / total
        n_embd = c.group.setting["model.n_embd"]
        matrix, mlp = c.saved_params, 4 * n_embd * n_embd  # V x C against the largest other tensors, the MLP's 4C x C
        rows.append(
            Claim(
                "R2",
                TEXTS["R2"],
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
                "C1",
                TEXTS["C1"],
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
    Then R4 (pairs): pair_claims."""
    return global_gradient_claims(pairs, tied_groups, tied, untied, margin) + pair_claims(tied_groups, tied)


def global_gradient_claims(
    pairs: list[Comparison], tied_groups: list[Group], tied: str, untied: str, margin
) -> list[Claim]:
    if not any(r.diag.get("grad_cos") is not None for g in tied_groups for r in g.runs):
        return [missing("R4", f"{tied} runs with gradient statistics (diag.every > 0)")]
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
                    "R4",
                    c.group.label,
                    "gradient table, grad_cos.png",
                    values,
                    -1,
                    margin,
                    lambda ci, s=shown: f"Δcos {ci_text(ci)}; {s}",
                )
            )
    return rows or [missing("R4", f"{untied} runs with gradient statistics at the same size as the {tied} ones")]


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
                "R4 (pairs)",
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
            "R4 (pairs)", f"{tied} runs with pair gradient statistics (diag.every > 0, related pairs in the vocabulary)"
        )
    ]


def forms_claims(untied_groups: list[Group], untied: str, margin) -> list[Claim]:
    """R3: the input matrix's related-form contrast minus the output matrix's, above zero."""
    rows = []
    for g in untied_groups:
        contrast = [(r.diag.get("forms_contrast_input"), r.diag.get("forms_contrast_output")) for r in g.runs]
        values = [a - b for a, b in contrast if a is not None and b is not None]
        if values:
            rows.append(tested("R3", g.label, "geometry table", values, +1, margin))
    return rows or [missing("R3", f"{untied} runs with geometry and related-form pairs found")]


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
                    "C2/C7",
                    g.label,
                    "agreement table",
                    values,
                    -1,
                    margin,
                    lambda ci, s=shown: f"ΔCKA {ci_text(ci)}; {s}",
                )
            )
    return rows or [
        missing("C2/C7", f"{untied} or {UNTIED_INIT} runs with geometry at step 0 and later (diag.geometry)")
    ]
