# Used by `tiecli report`: a verdict on each claim of CLAIMS.md the data can speak to.
"""The claims table: one tying mode (the "tied" role) against another (the "untied" role) at equal
architecture, whatever --baseline the other tables use. The modes are parameters of `claims`, so
any two tying modes can be compared by the same rules.

Every tested row has a p-value against 0 and, where a smallest effect size of interest (SESOI)
applies, an equivalence p-value against +-SESOI; both are Holm-adjusted across the report's rows
(judge), and the verdict reads the adjusted values."""

import dataclasses
import math
from dataclasses import dataclass
from typing import cast

from tiecli.errors import TiecliError
from tiecli.report.groups import BUDGET_KEYS, SIZE_KEYS, Baseline, Group
from tiecli.report.stats import (
    ALPHA,
    Comparison,
    Interval,
    ci_text,
    compare,
    gap,
    holm,
    mean_ci,
    pair_excess,
    ppl_change,
    slope,
    t_tests,
)

# C1's own range for the share tying saves: the hypothesis under test, not an expected result.
C1_CLAIMED_SHARE = (0.15, 0.30)
# Smallest effects of interest (--sesoi KEY=VALUE): ppl in % of perplexity (|Δloss| < log(1 + ppl/100)),
# cos for cosines and their differences (R4 Δcos, R3 contrast), cka for linear CKA (C2/C7).
SESOI_DEFAULTS = {"ppl": 1.0, "cos": 0.05, "cka": 0.05}
# R4 (pairs): the smallest excess share of related pairs in the claimed opposition that matters (see its rule)
R4_PAIRS_SESOI = 0.02
UNTIED_INIT = "untied_init"
LADDER = " -> "  # joins the labels of a ladder of scales, smallest first  # untied, W_out starting as a copy of W_in: its in/out distance is 0 at step 0

VERDICT_RULE = (
    "each tested row gets a two-sided t-test of its mean over seeds against 0 (slopes: the regression's t-test) and, where a "
    "SESOI applies, an equivalence test against +-SESOI (two one-sided t-tests, p = 2 max(p_low, p_high): below 0.05 exactly when "
    "the 95% interval lies inside +-SESOI); Holm-Bonferroni correction is on, across the report's rows, once over the tests "
    "against 0 and once over the equivalence tests. supported / contradicted: Holm p < 0.05, the mean on the claimed / the "
    "other side of 0 and |mean| >= SESOI; negligible: Holm p < 0.05 but |mean| < SESOI; equivalent: equivalence Holm p < 0.05; "
    "inconclusive: neither, or one seed (no test); no data: the runs lack what the row measures, named"
)
CLAIM_RULES = {
    "R2": "the tied-away V x C matrix (untied total - tied total, from summary.json) against the largest other tensors, "
    "the MLP's 4C x C; deterministic (no seeds, no test). Supported when the token matrix is larger, contradicted otherwise.",
    "C1": "parameter share saved by tying = (untied total - tied total) / untied total, from summary.json at equal "
    f"architecture; deterministic (no seeds, no test). Supported inside C1's claimed {C1_CLAIMED_SHARE[0]:.0%}-"
    f"{C1_CLAIMED_SHARE[1]:.0%}, contradicted outside.",
    "R4": "descriptive of the whole matrix, NOT a test of the article's mechanism (that is R4 (pairs)): per seed, Δcos = "
    "(tied run's mean over training of cos(G_in, G_out), one cosine over all V x C entries, dominated by frequent rows) - "
    "(untied run's, same size and seed); claimed below 0, SESOI cos. What it can say is whether the two paths are "
    "anti-aligned globally ('equivalent': no global anti-alignment); it cannot see opposition along the few related-form "
    "directions. The untied figure is the cosine between the gradients of two different matrices at different "
    "weights, NOT the cosine a tied model would see at the same weights: a reference for two unrelated paths of this "
    "model, not a counterfactual. Also shown, not judged: the tied runs' mean grad_cos_z (grad_cos_present against its "
    "row-permutation null) and grad_norm_lost_pct (% of the summed gradient's norm lost to cancellation, mean over training).",
    "R4 (pairs)": "the article's mechanism, in tied runs: at each diagnostics step, for each related-form pair (a, b) of diag.pairs "
    "in the vocabulary, each path's s = <g[a] - g[b], w[a] - w[b]> / |w[a] - w[b]| on the shared matrix (s > 0: an SGD step "
    "pulls the pair together, s < 0 pushes it apart); claimed share = share of pairs with the input path pulling and the "
    "output path pushing. Per seed, the effect = the claimed share's mean over training minus that of frequency-matched "
    f"random pairs (the null, drawn once per run from diag.seed); t-interval over seeds, claimed above 0, SESOI "
    f"{R4_PAIRS_SESOI:g} (share). The SESOI against the null's spread: the binomial sd of one step's difference under the "
    "null, sqrt(q (1 - q) (1/P + 1/N)) (q: the null's claimed share, P related and N null pairs), is printed beside it; "
    "an effect under 2 points of pairs is below what one step resolves at the shipped pairs' P, and equivalence needs the "
    "whole interval over seeds inside +-2 points, which a real opposition of that size would not give. Shown, not "
    "judged: the input path's pull share and the output path's push share, each minus the null's (which path carries an "
    "effect: the claimed share can rise with one path alone).",
    "R3": "untied runs, last geometry entry: related-form contrast of the input matrix minus that of the output matrix "
    "(contrast = pair cosine - the cosine of frequency-matched random pairs); claimed above 0, SESOI cos.",
    "C2/C7": "untied and untied_init runs (tied: one matrix, close by construction): per seed ΔCKA = linear CKA(W_in, W_out) "
    "at the last geometry entry - at step 0. If the tie is what keeps the spaces close, without it they move apart: "
    "claimed below 0, SESOI cka. untied_init starts at CKA 1 and distance |W_in - W_out|/|W_in| 0, so its row says "
    "whether identical spaces stay close with no tie. Drift from each matrix's own init is shown (dynamics "
    "table, drift.png) but not judged: under Adam every matrix with a gradient each step drifts about as far.",
    "R6/C3": "steps to the pair's convergence target, tied vs untied, paired by seed, in % of the untied steps; no SESOI. "
    "R6 claims above 0 (untied faster), C3 below 0 (tied faster): one test, counted once, read both ways.",
    "C6": "per seed Δloss = tied - untied final loss (log perplexity; the test split when every run of the pair has one, "
    "else val), t-interval; shown as % perplexity 100 (exp(Δloss) - 1) with the bounds transformed alike; claimed below 0, SESOI ppl.",
    "R5/C6": "two parts, both shown and tested: (smallest size) the C6 row of the ladder's smallest size (the same test, counted "
    "once), claimed below 0 (tying helps the small model), SESOI ppl; (trend) least-squares slope of the per-seed Δloss against log10 non-embedding "
    "parameters, 95% interval from t(n-2), claimed above 0 (the help shrinks as models grow). The claim is supported "
    "when both parts are; contradicted when either is; else negligible or equivalent when a part is; else inconclusive.",
    "R5": "the slope of the per-seed Δloss against log10 tokens seen, across token budgets; claimed above 0 (with more data "
    "untying gains).",
    "R5/C2 gap": "per seed, tied gap - untied gap, gap = val loss - train loss (eval.json's val and train when present, else "
    "the last metrics.jsonl row with val_loss and train_eval_loss); claimed below 0 (tying regularises), SESOI ppl.",
    "R5/C2 gap (equal fit)": "the same difference read where both runs of a seed fitted the training split equally well, to "
    "break the confound that a model which learned less has less to overfit: per seed, each run's in-training val - train "
    "loss (metrics.jsonl's fixed windows) where its train_eval_loss first falls to the higher of the two runs' final "
    "train_eval_loss, linear between evaluations; claimed below 0, SESOI ppl.",
}
TEXTS = {
    "R2": "the vocabulary matrix is the largest single tensor, so tying saves a large share of parameters",
    "C1": "tying cuts parameters from 2Vd to Vd, 15-30% of the total",
    "R4": "global figure: the two paths' gradients anti-aligned over the whole matrix (more than two unrelated paths)",
    "R4 (pairs)": "with tying, along related-form differences the output path pushes apart and the input path pulls "
    "together, more than along matched random pairs",
    "R3": "input embeddings pull related forms together, the output matrix pushes them apart",
    "C2/C7": "tying keeps the input and output spaces close: without the tie they move apart",
    "R6": "untie and the loss converges faster",
    "C3": "tying gives a more direct gradient path: faster convergence",
    "C6": "tying lowers perplexity",
    "R5/C6 (smallest size)": "tying helps the smallest model",
    "R5/C6 (trend)": "the help from tying shrinks as models grow",
    "R5/C6": "tying helps small models, less so large ones",
    "R5": "with lots of data untying wins: the tied-vs-untied gap rises with tokens seen",
    "R5/C2 gap": "tying regularises: a smaller generalisation gap (val - train loss) than untied",
    "R5/C2 gap (equal fit)": "tying regularises: a smaller gap than untied at the same training loss",
}
ORDER = tuple(TEXTS)  # the rows' order in the table


@dataclass
class Claim:
    """One row of the claims table. A tested row has an interval, a claimed direction and p-values."""

    claim: str
    says: str
    comparison: str
    figure: str
    measured: str
    verdict: str = ""
    why: str = ""
    interval: Interval | None = None
    direction: int = 0  # the claimed side of 0: +1 above, -1 below
    sesoi: float | None = None  # in the quantity's own units (Δloss for ppl)
    sesoi_text: str = ""
    p: float | None = None  # two-sided, against 0
    p_holm: float | None = None
    p_equiv: float | None = None  # equivalence against +-sesoi
    p_equiv_holm: float | None = None
    note: str = ""


def parse_sesoi(items: list[str]) -> dict[str, float]:
    """--sesoi KEY=VALUE (repeatable) over SESOI_DEFAULTS; an unknown key or a bad value is one line."""
    sesoi = dict(SESOI_DEFAULTS)
    for item in items:
        key, _, value = (part.strip() for part in item.partition("="))
        if key not in SESOI_DEFAULTS:
            raise TiecliError(f"--sesoi {item!r}: unknown key {key!r}; valid keys: {', '.join(SESOI_DEFAULTS)}")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number) or number < 0:
            raise TiecliError(f"--sesoi {item!r} must be KEY=NUMBER with a number >= 0, e.g. ppl=1")
        sesoi[key] = number
    return sesoi


def margins(sesoi: dict[str, float]) -> dict[str, tuple[float, str]]:
    """Each SESOI in its quantity's units, with its text: ppl becomes a Δloss margin."""
    loss = math.log1p(sesoi["ppl"] / 100)
    return {
        "ppl": (loss, f"{sesoi['ppl']:g}% ppl (|Δloss| {loss:.3g})"),
        "cos": (sesoi["cos"], f"{sesoi['cos']:g} cos"),
        "cka": (sesoi["cka"], f"{sesoi['cka']:g} CKA"),
    }


def loss_text(ci: Interval | None) -> str:
    return f"{ci_text(ppl_change(ci), 3, ' %')} ppl (Δloss {ci_text(ci)})"


def tested(
    claim_id: str, comparison: str, figure: str, values: list[float], direction: int, margin=None, show=ci_text, note=""
) -> Claim:
    """A row judged on per-seed values: their 95% interval, the t-test against 0 and, with a margin, the equivalence test."""
    sesoi, sesoi_text = margin or (None, "")
    ci = mean_ci(values)
    p, p_equiv = t_tests(values, sesoi)
    return Claim(
        claim_id,
        TEXTS[claim_id],
        comparison,
        figure,
        show(ci),
        interval=ci,
        direction=direction,
        sesoi=sesoi,
        sesoi_text=sesoi_text,
        p=p,
        p_equiv=p_equiv,
        note=note,
    )


def missing(claim_id: str, needs: str) -> Claim:
    return Claim(claim_id, TEXTS[claim_id], "-", "-", "-", f"no data: needs {needs}", "nothing to test")


def claims(
    groups: list[Group],
    tied: str = "tied",
    untied: str = "untied",
    sesoi: dict[str, float] | None = None,
    target: float | None = None,
    free: tuple[str, ...] = (),
) -> list[Claim]:
    """The claims table, judged: groups with tying=`tied` against those with tying=`untied` (free: the
    keys --select chose per group); target: a fixed convergence target (--target-loss)."""
    margin = margins(sesoi or SESOI_DEFAULTS)
    axis = Baseline("tying", untied, free)
    pairs = [c for c in compare(groups, axis, target) if c.group.mode == tied]
    same_size = f"{tied} and {untied} runs of the same size"
    rows = parameter_claims(pairs, same_size)
    rows += gradient_claims(pairs, [g for g in groups if g.mode == tied], tied, untied, margin["cos"])
    rows += forms_claims([g for g in groups if g.mode == untied], untied, margin["cos"])
    rows += agreement_claims([g for g in groups if g.mode in (untied, UNTIED_INIT)], untied, margin["cka"])
    rows += convergence_claims(pairs, same_size)
    rows += [
        tested(
            "C6",
            c.group.label,
            f"validation table ({c.split} split)",
            c.delta_loss(c.split),
            -1,
            margin["ppl"],
            loss_text,
        )
        for c in pairs
    ] or [missing("C6", same_size)]
    rows += size_claims(pairs, axis, f"{tied} and {untied} runs at two or more model sizes")
    rows += trend_claims(
        pairs,
        axis,
        BUDGET_KEYS,
        lambda g: g.tokens,
        "R5",
        "ppl_vs_tokens.png",
        f"{tied} and {untied} runs at two or more values of tokens seen",
    )
    rows += gap_claims(pairs, margin["ppl"], tied, untied)
    return derive(judge(rows))


def judge(rows: list[Claim]) -> list[Claim]:
    """Holm-adjust the tests against 0 across the rows, then the equivalence tests; then each row's verdict."""
    for name in ("p", "p_equiv"):
        tested_rows = [r for r in rows if getattr(r, name) is not None]
        for row, adjusted in zip(tested_rows, holm([getattr(r, name) for r in tested_rows])):
            setattr(row, name + "_holm", adjusted)
    for row in rows:
        if not row.verdict:
            settle(row)
    return rows


def settle(row: Claim) -> None:
    row.verdict, row.why = verdict(row)
    row.why += f"; {row.note}" if row.note else ""


def verdict(row: Claim) -> tuple[str, str]:
    ci = row.interval
    if ci is None or row.p is None:
        return "inconclusive", "one seed: no spread, so no interval and no test"
    assert row.p_holm is not None  # judge() Holm-adjusts every row that has a p
    tested_p = f"Holm p {row.p_holm:.2g} (raw {row.p:.2g})"
    if row.p_holm < ALPHA:
        side = "above" if ci.mean > 0 else "below"
        if row.sesoi and abs(ci.mean) < row.sesoi:
            return (
                "negligible",
                f"{tested_p} < {ALPHA:g}, {side} 0, but |mean| {abs(ci.mean):.3g} < SESOI {row.sesoi_text}",
            )
        result = "supported" if (ci.mean > 0) == (row.direction > 0) else "contradicted"
        return result, f"{tested_p} < {ALPHA:g}, {side} 0" + (
            f", |mean| >= SESOI {row.sesoi_text}" if row.sesoi else ""
        )
    if row.p_equiv_holm is not None and row.p_equiv_holm < ALPHA:
        return "equivalent", f"equivalence Holm p {row.p_equiv_holm:.2g} < {ALPHA:g}: within +-{row.sesoi_text}"
    equiv = f"; equivalence Holm p {row.p_equiv_holm:.2g}" if row.p_equiv_holm is not None else ""
    return "inconclusive", f"{tested_p} >= {ALPHA:g}{equiv}"


def derive(rows: list[Claim]) -> list[Claim]:
    """Rows read off judged ones, outside the Holm family: C3 (R6's test the other way) and R5/C6 (both parts)."""
    out = list(rows)
    for r6 in (r for r in rows if r.claim == "R6"):
        c3 = dataclasses.replace(r6, claim="C3", says=TEXTS["C3"], direction=-r6.direction)
        if c3.p is not None:
            settle(c3)
        out.append(c3)
    for trend in (r for r in rows if r.claim == "R5/C6 (trend)"):
        c6 = next(r for r in rows if r.claim == "C6" and r.comparison == trend.comparison.split(LADDER)[0])
        part = dataclasses.replace(
            c6,
            claim="R5/C6 (smallest size)",
            says=TEXTS["R5/C6 (smallest size)"],
            comparison=trend.comparison,
            measured=f"{c6.comparison}: {c6.measured} (the C6 row)",
        )
        out += [
            part,
            Claim(
                "R5/C6",
                TEXTS["R5/C6"],
                trend.comparison,
                trend.figure,
                f"smallest size: {part.verdict}; trend: {trend.verdict}",
                both(part.verdict, trend.verdict),
                "the claim needs both parts: tied better at the smallest size, the gap rising with size",
            ),
        ]
    return sorted(out, key=lambda r: ORDER.index(r.claim))


def both(smallest: str, trend: str) -> str:
    verdicts = (smallest, trend)
    if verdicts == ("supported", "supported"):
        return "supported"
    return next(
        (result for result in ("contradicted", "negligible", "equivalent") if result in verdicts), "inconclusive"
    )


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
                f"{c.saved_params:,} saved = {share:.1%} of {total:,}",
                "supported" if inside else "contradicted",
                f"{'inside' if inside else 'outside'} the claimed range (exact counts: no test)",
            )
        )
    return rows


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
            f"input pull share {_mean(paths['pull_in'])}, output push share {_mean(paths['push_out'])} beyond the null"
            f"; null sd {_mean(null_sd)} (one step), SESOI {R4_PAIRS_SESOI:g}{in_sds}"
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
            shown = f"CKA {_mean(at['cka_init'])} -> {_mean(at['cka'])}, distance {_mean(at['distance_init'])} -> {_mean(at['distance'])}"
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


def _mean(ci: Interval | None) -> str:
    return f"{ci.mean:.3g}" if ci else "-"


def convergence_claims(pairs: list[Comparison], same_size: str) -> list[Claim]:
    """R6 (C3 is derived from it): per-seed % difference in steps to the pair's target, above zero."""
    rows = []
    for c in pairs:
        values = [100 * (a / b - 1) for a, b in c.steps_pairs() if b]
        if values:
            rows.append(
                tested(
                    "R6",
                    c.group.label,
                    "convergence table, val_loss.png",
                    values,
                    +1,
                    show=lambda ci: ci_text(ci, 3, " %"),
                    note=c.note(),
                )
            )
    return rows or [missing("R6", f"{same_size} whose validation curves reach a common target")]


def ladders(pairs: list[Comparison], axis: Baseline, free: tuple, x_of) -> list[list[Comparison]]:
    """Comparisons that differ only in the free keys (and on the tying axis), at two or more scales, by scale."""
    out: dict[str, list[Comparison]] = {}
    for c in pairs:
        out.setdefault(axis.rest(c.group, free), []).append(c)
    return [
        sorted(ladder, key=lambda c: x_of(c.group))
        for ladder in out.values()
        if len({x_of(c.group) for c in ladder}) > 1
    ]


def trend_claims(
    pairs: list[Comparison], axis: Baseline, free: tuple, x_of, claim_id: str, figure: str, needs: str
) -> list[Claim]:
    """Slope of the per-seed Δloss against log10 of the scale, per ladder; above zero."""
    rows = []
    for ladder in ladders(pairs, axis, free, x_of):
        split = "test" if all(c.split == "test" for c in ladder) else "val"
        by_pair = [(math.log10(x_of(c.group)), c.delta_loss(split)) for c in ladder]
        fit, p = slope([(x, d) for x, values in by_pair for d in values])
        comparison = LADDER.join(c.group.label for c in ladder)
        row = Claim(
            claim_id,
            TEXTS[claim_id],
            comparison,
            f"{figure} ({split} split)",
            f"Δloss {ci_text(fit)} per decade",
            interval=fit,
            direction=+1,
            p=p,
        )
        if min(len(values) for _, values in by_pair) < 2:
            row.p, row.verdict, row.why = None, "inconclusive", "one seed at some scale: no spread at that scale"
        rows.append(row)
    return rows or [missing(claim_id, needs)]


def size_claims(pairs: list[Comparison], axis: Baseline, needs: str) -> list[Claim]:
    """R5/C6's trend part per ladder of sizes; its smallest-size part is that size's C6 row, one test (see derive)."""
    rows = trend_claims(pairs, axis, SIZE_KEYS, non_embedding, "R5/C6 (trend)", "ppl_vs_params.png", needs)
    return [missing("R5/C6", needs)] if rows[0].verdict.startswith("no data") else rows


def non_embedding(group: Group) -> int:
    return group.params["non_embedding"]


def gap_claims(pairs: list[Comparison], margin, tied: str, untied: str) -> list[Claim]:
    """Generalisation gap (val - train loss), tied minus untied, paired by seed, at the end of training and
    at equal fit (Comparison.delta_matched_gap); below zero."""
    rows = []
    for c in pairs:
        values = c.delta(gap)
        sources = ", ".join(sorted({r.gap[2] for r in c.group.runs + c.base.runs if r.gap}))
        if values:
            rows.append(
                tested(
                    "R5/C2 gap",
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
                    "R5/C2 gap (equal fit)",
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
            "R5/C2 gap",
            f"{tied} and {untied} runs with a train-split evaluation (eval.json train or "
            "metrics.jsonl train_eval_loss)",
        )
    ]
