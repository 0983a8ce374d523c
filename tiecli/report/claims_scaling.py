# Used by tiecli/report/claims.py: the claims about convergence and scale.
"""Claim rows about how fast and how far training goes: steps to a target loss (R6, and the schedule-dependent
reading), perplexity across model sizes (R5/C6 trend) and across tokens seen (R5)."""

import math
from typing import cast

from tiecli.report.claims_rules import (
    EPOCH_TOLERANCE,
    LADDER,
    TEXTS,
    Claim,
    ClaimId,
    missing,
    tested,
)
from tiecli.report.compare import Comparison, budget_range, budget_target, budget_tokens
from tiecli.report.groups import BUDGET_KEYS, SIZE_KEYS, Baseline, Group
from tiecli.report.stats import (
    ALPHA,
    ci_text,
    clustered_slope,
    final_loss,
    mean_ci,
    means_slope,
    ppl_change,
    slope,
    t_tests,
)


def convergence_claims(pairs: list[Comparison], axis: Baseline, same_size: str, target: float | None) -> list[Claim]:
    """R6 (C3 is derived from it), schedule-free: per ladder of token budgets, the per-unit log ratio of the
    tokens tied and untied need to reach a loss, from each budget's end-of-schedule loss; above zero. A pair at
    one budget is not tested. The steps-to-target reading of one schedule is shown per pair, not judged."""
    budgets = ladders(pairs, axis, BUDGET_KEYS, budget)
    rows = [convergence_row(ladder, target) for ladder in budgets]
    in_ladder = {id(c) for ladder in budgets for c in ladder}
    why = "the rule reads end-of-schedule losses across budgets"
    rows += [
        Claim(ClaimId.R6, TEXTS[ClaimId.R6], c.group.label, "-", "-", ONE_BUDGET, why, direction=+1)
        for c in pairs
        if id(c) not in in_ladder
    ]
    rows += [reading for c in pairs if (reading := schedule_reading(c))]
    return rows or [missing(ClaimId.R6, f"{same_size} at two or more token budgets")]


def schedule_reading(c: Comparison) -> Claim | None:
    """The old R6 reading, steps to the pair's target on one schedule, in % of untied's: shown, never judged."""
    values = [100 * (a / b - 1) for a, b in c.steps_pairs() if b]
    if not values:
        return None
    ci = mean_ci(values)
    why = "schedule-dependent: steps to the pair's target on one decaying schedule, where the slower mode may "
    return Claim(
        ClaimId.R6_SCHEDULE,
        TEXTS[ClaimId.R6_SCHEDULE],
        c.group.label,
        "convergence table, val_loss.png",
        f"Δsteps {ci_text(ci, 3, ' %')}",
        "descriptive",
        why + "cross in the decay tail; not judged, in no family" + (f"; {c.note()}" if c.note() else ""),
        interval=ci,
        direction=+1,
    )


ONE_BUDGET = "not tested: one budget (needs runs at several budgets)"


def budget(group: Group) -> int:
    return group.tokens


RANGE_POINTS = 5  # R6 is read at this many losses evenly inside the common range, the middle one judged


def log_ratios(ladder: list[Comparison], target: float, split: str) -> tuple[list[float], int]:
    """Per unit log(tokens tied / tokens untied) to reach target across the ladder's budgets, and the units in all."""
    tokens = budget_tokens(ladder, target, split)
    values = [
        math.log(t / u)
        for unit, t in tokens["group"].items()
        if t is not None and (u := tokens["base"].get(unit)) is not None
    ]
    return values, len(set(tokens["group"]) | set(tokens["base"]))


def range_readings(ladder: list[Comparison], split: str) -> list[dict]:
    """R6 at RANGE_POINTS losses evenly inside the range both modes' seed-mean curves span (the ends left out: a
    unit's own curve may stop short of them): per target, the interval of the log ratios and the t-test's p."""
    span = budget_range(ladder, split)
    if span is None:
        return []
    out = []
    for k in range(1, RANGE_POINTS + 1):
        target = span[0] + (span[1] - span[0]) * k / (RANGE_POINTS + 1)
        values, _ = log_ratios(ladder, target, split)
        out.append({"target": target, "interval": mean_ci(values), "p": t_tests(values, None)[0]})
    return out


def agreement(readings: list[dict]) -> str:
    """What the readings that have a test differ in: "sign", "significance" (raw p < ALPHA), both, or "" when
    they agree."""
    tested = [r for r in readings if r["p"] is not None]
    differs = [
        what
        for what, key in (("sign", lambda r: r["interval"].mean > 0), ("significance", lambda r: r["p"] < ALPHA))
        if len({key(r) for r in tested}) > 1
    ]
    return " and ".join(differs)


def range_text(readings: list[dict]) -> str:
    return "; ".join(f"at {r['target']:.4g}: {ci_text(ppl_change(r['interval']), 3, ' %')}" for r in readings)


def convergence_row(ladder: list[Comparison], fixed: float | None) -> Claim:
    """R6 on one ladder of budgets: log(tokens_tied / tokens_untied) to the target loss, per unit; without a fixed
    target, judged at the middle of the common range and read across it, with no verdict where the readings
    disagree (claims.verdict)."""
    split = "test" if all(c.split == "test" for c in ladder) else "val"
    comparison = LADDER.join(c.group.label for c in ladder)
    target = fixed if fixed is not None else budget_target(ladder, split)
    figure = f"ppl_vs_tokens.png ({split} split, end of each schedule)"
    if target is None:
        why = "the two modes' seed-mean budget curves span no common loss"
        return Claim(ClaimId.R6, TEXTS[ClaimId.R6], comparison, figure, "-", "inconclusive", why, direction=+1)
    values, units = log_ratios(ladder, target, split)
    note = f"{units - len(values)} of {units} units' curves do not reach loss {target:.4g} inside their budgets"
    if not values:
        return Claim(ClaimId.R6, TEXTS[ClaimId.R6], comparison, figure, "-", "inconclusive", note, direction=+1)
    readings = range_readings(ladder, split) if fixed is None else []
    across = f"; across the common range {range_text(readings)}" if readings else ""
    row = tested(
        ClaimId.R6,
        comparison,
        figure,
        values,
        +1,
        show=lambda ci: (
            f"tokens to loss {target:.4g}: tied {ci_text(ppl_change(ci), 3, ' %')} more than untied "
            f"(log ratio {ci_text(ci)}){across}"
        ),
        note="; ".join(part for part in (note if len(values) < units else "", NOT_INDEPENDENT) if part),
    )
    if readings:
        row.readings = {"range": readings, "range_disagrees": agreement(readings)}
    return row


NOT_INDEPENDENT = (
    "not independent of C6: at a common loss it restates the end-of-schedule loss gap divided by the untied curve's "
    "slope in log tokens"
)


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
    pairs: list[Comparison], axis: Baseline, free: tuple, x_of, claim_id: ClaimId, figure: str, needs: str
) -> list[Claim]:
    """Slope of the per-seed Δloss against log10 of the scale, per ladder; above zero."""
    rows = [trend_row(ladder, x_of, claim_id, figure) for ladder in ladders(pairs, axis, free, x_of)]
    return rows or [missing(claim_id, needs)]


def unit_deltas(c: Comparison, split: str) -> list[tuple[tuple, float]]:
    """(unit, Δloss) per unit both groups of the pair have, on the split."""
    base = {r.unit: final_loss(r, split) for r in c.base.runs}
    return [
        (r.unit, loss - other)
        for r in c.group.runs
        if (loss := final_loss(r, split)) is not None and (other := base.get(r.unit)) is not None
    ]


def trend_row(ladder: list[Comparison], x_of, claim_id: ClaimId, figure: str) -> Claim:
    """The slope of the per-unit Δloss against log10 of the scale, judged on its seed-clustered interval (a unit's
    held-out text and tokenizer are shared across the scales); the plain OLS fit and the fit through the scales'
    means are shown beside it."""
    split = "test" if all(c.split == "test" for c in ladder) else "val"
    by_pair = [(math.log10(x_of(c.group)), unit_deltas(c, split)) for c in ladder]
    points = [(x, d, unit) for x, values in by_pair for unit, d in values]
    fit, p = clustered_slope(points)
    ols, ols_p = slope([(x, d) for x, d, _ in points])
    means = means_slope([(x, d) for x, d, _ in points])
    shown = f"Δloss {ci_text(fit)} per decade, clustered by seed; OLS over every point {ci_text(ols)}; " + (
        f"over the {len(by_pair)} scale means {ci_text(means)}" if means else "scale means: needs 3 scales"
    )
    row = Claim(
        claim_id,
        TEXTS[claim_id],
        LADDER.join(c.group.label for c in ladder),
        f"{figure} ({split} split)",
        shown,
        interval=fit,
        direction=+1,
        p=p,
        readings={"ols": ols, "ols_p": ols_p, "means": means},
    )
    if min(len(values) for _, values in by_pair) < 2:
        row.p, row.verdict, row.why = None, "inconclusive", "one seed at some scale: no spread at that scale"
    return row


def epochs(c: Comparison) -> float | None:
    """Passes over the training split of the pair's runs (the most of any), None when a run lacks the split's size."""
    values = [r.epochs for r in c.group.runs + c.base.runs]
    return None if None in values else max(cast(list[float], values))


def data_claims(pairs: list[Comparison], axis: Baseline, needs: str) -> list[Claim]:
    """R5's data half: the trend against tokens seen, judged only across budgets that see each token at most once
    (epochs <= 1); a ladder with repeated data, or whose epochs are unknown, is shown, not tested."""
    rows = []
    for ladder in ladders(pairs, axis, BUDGET_KEYS, budget):
        passes = [epochs(c) for c in ladder]
        fresh = [c for c, e in zip(ladder, passes) if e is not None and e <= 1 + EPOCH_TOLERANCE]
        if len(fresh) > 1:
            rows.append(trend_row(fresh, budget, ClaimId.R5, "ppl_vs_tokens.png"))
        if len(fresh) == len(ladder):
            continue
        row = trend_row(ladder, budget, ClaimId.R5, "ppl_vs_tokens.png")
        repeated = ", ".join(f"{e:.3g}" for e in passes if e is not None and e > 1 + EPOCH_TOLERANCE)
        row.p, row.why = (
            None,
            "numbers shown descriptively"
            + ("; judged on the fresh-data budgets in the row above" if len(fresh) > 1 else ""),
        )
        row.verdict = (
            "not tested: epochs unknown (summary.json lacks corpus.train_tokens)"
            if None in passes
            else f"not tested: repeated data ({repeated} epochs)"
        )
        rows.append(row)
    return rows or [missing(ClaimId.R5, needs)]


def size_claims(pairs: list[Comparison], axis: Baseline, needs: str) -> list[Claim]:
    """R5/C6's trend part per ladder of sizes; its smallest-size part is that size's C6 row, one test (see derive)."""
    rows = trend_claims(pairs, axis, SIZE_KEYS, non_embedding, ClaimId.R5_C6_TREND, "ppl_vs_params.png", needs)
    return [missing(ClaimId.R5_C6, needs)] if rows[0].verdict.startswith("no data") else rows


def non_embedding(group: Group) -> int:
    return group.params["non_embedding"]
