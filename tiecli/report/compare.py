# Used by `tiecli report`: each group against the baseline, at equal architecture, parameters and compute.
"""Comparisons with the baseline: `Comparison` pairs a group's seeds with the baseline group's (Δloss,
% perplexity, steps to a target), `compare` makes one per non-baseline group, and `EqualParams` is a
group against the baseline interpolated at its total parameters (equal_params) or training FLOPs
(equal_compute). Also convergence without the schedule: tokens to a target across token budgets.
The numbers over seeds they rest on are stats.py's."""

import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from tiecli.report.groups import BUDGET_KEYS, SIZE_KEYS, Baseline, Group
from tiecli.report.stats import (
    MIN_EVALS,
    Interval,
    final_loss,
    judged_split,
    matched_gap,
    mean_ci,
    paired,
    percent,
    ppl_change,
    reach,
    target_loss,
)

# --- convergence without the schedule: end-of-schedule losses across token budgets --------------------


def tokens_to_loss(points: list[tuple[float, float]], target: float) -> float | None:
    """Tokens where a (tokens, end-of-schedule loss) curve across budgets, in ascending tokens, first falls to
    `target`, linear in log tokens between budgets; None when the curve does not span the target (no extrapolation)."""
    for (t0, l0), (t1, l1) in zip(points, points[1:]):
        if l1 <= target <= l0 and l1 < l0:
            f = (l0 - target) / (l0 - l1)
            return math.exp(math.log(t0) + f * (math.log(t1) - math.log(t0)))
    return None


def budget_range(ladder: list["Comparison"], split: str) -> tuple[float, float] | None:
    """(bottom, top): the range of losses both modes' seed-mean budget curves span, from the higher of the two
    seed-mean losses at the largest budget to the lower of the two at the smallest; None when they do not overlap."""

    def mean(runs):
        return statistics.fmean(loss for r in runs if (loss := final_loss(r, split)) is not None)

    top = min(mean(ladder[0].group.runs), mean(ladder[0].base.runs))
    bottom = max(mean(ladder[-1].group.runs), mean(ladder[-1].base.runs))
    return (bottom, top) if bottom < top else None


def budget_target(ladder: list["Comparison"], split: str) -> float | None:
    """The loss midway through budget_range: both modes reach it inside their budgets, neither at an end; None when
    the ranges do not overlap."""
    span = budget_range(ladder, split)
    return (span[0] + span[1]) / 2 if span else None


def budget_tokens(ladder: list["Comparison"], target: float, split: str) -> dict[str, dict[tuple, float | None]]:
    """Per mode ("group", "base") and unit, the tokens its runs across the ladder's budgets need to reach target."""
    out: dict[str, dict[tuple, float | None]] = {}
    for side in ("group", "base"):
        curves: dict[tuple, list[tuple[float, float]]] = {}
        for c in ladder:
            for r in getattr(c, side).runs:
                if (loss := final_loss(r, split)) is not None:
                    curves.setdefault(r.unit, []).append((float(r.tokens), loss))
        out[side] = {u: tokens_to_loss(sorted(pts), target) if len(pts) > 1 else None for u, pts in curves.items()}
    return out


# --- against the baseline -----------------------------------------------------------------------------


@dataclass
class Comparison:
    """A group against its baseline at equal architecture, paired by seed. target: the convergence
    target of this pair alone (the higher of the two groups' best losses), or the user's."""

    group: Group
    base: Group
    target: float | None
    saved_params: int = field(init=False)

    def __post_init__(self):
        self.saved_params = self.base.params["total"] - self.group.params["total"]

    def delta(self, value) -> list[float]:
        """value(group run) - value(base run), per seed both have."""
        return [a - b for a, b in paired(self.group, self.base, value)]

    def delta_matched_gap(self) -> list[float]:
        """matched_gap(group run, base run), per seed both have."""
        values = (matched_gap(a, b) for a, b in paired(self.group, self.base, lambda r: r))
        return [v for v in values if v is not None]

    def delta_loss(self, split: str = "val") -> list[float]:
        return self.delta(lambda r: final_loss(r, split))

    @property
    def loss(self) -> Interval | None:  # Δloss in nats, full validation split
        return mean_ci(self.delta_loss())

    @property
    def perplexity(self) -> Interval | None:  # % change in perplexity, from the Δloss interval
        return ppl_change(self.loss)

    @property
    def test_perplexity(self) -> Interval | None:
        return ppl_change(mean_ci(self.delta_loss("test")))

    @property
    def split(self) -> str:
        """The split final numbers are judged on: test when every run of both groups has it, else val."""
        return judged_split(self.group.runs + self.base.runs)

    def steps_pairs(self) -> list[tuple]:
        return paired(self.group, self.base, lambda r: reach(r, self.target)[0])

    @property
    def steps(self) -> Interval | None:  # % difference in steps to the target
        return percent(self.steps_pairs())

    def note(self) -> str:
        """A warning when the target is poorly resolved or not reached by every run."""
        runs = self.group.runs + self.base.runs
        before = [reach(r, self.target)[2] for r in runs]
        notes = [f"{before.count(None)} of {len(runs)} runs never reach the target"] if None in before else []
        reached = [b for b in before if b is not None]
        if reached and min(reached) < MIN_EVALS:
            notes.append(f"only {min(reached)} evaluations before the target (< {MIN_EVALS}): coarse")
        return "; ".join(notes)


def compare(groups: list[Group], baseline: Baseline, target: float | None = None) -> list[Comparison]:
    """Each non-baseline group against its baseline at equal architecture, paired by seed; the
    convergence target per pair, or `target` (--target-loss) for every pair."""
    comparisons = []
    for g in groups:
        base = baseline.base_of(g, groups)
        if base is not None:
            comparisons.append(Comparison(g, base, target if target is not None else target_loss(g.runs + base.runs)))
    return comparisons


# --- the interpolated baseline: equal total parameters, equal compute ---------------------------------


@dataclass
class EqualParams:
    """A group against the baseline interpolated at its total parameters (or training FLOPs); why: the reason when n/a."""

    why: str | None = None
    between: tuple[str, ...] | None = None
    split: str | None = None  # test when every run read has it, else val (as the claims)
    own_perplexity: Interval | None = None  # the group's, on that split, over the paired seeds
    base_perplexity: Interval | None = None
    dloss: list[float] = field(default_factory=list)  # per seed: loss - interpolated baseline loss

    @property
    def loss(self) -> Interval | None:
        return mean_ci(self.dloss)

    @property
    def perplexity(self) -> Interval | None:  # % change in perplexity
        return ppl_change(self.loss)

    def note(self) -> str | None:
        return " and ".join(self.between) if self.between else self.why


# A control that narrows the untied model to the tied one's total (docs_ladder_equal) lands within about 1%: a
# baseline group that close is the comparison itself, read as is rather than extrapolated past the ladder's end.
PARAMS_MATCH = 0.02


def equal_params(g: Group, groups: list[Group], baseline: Baseline) -> EqualParams:
    """g against the baseline at g's total parameter count, across the baseline's sizes; a baseline group
    within PARAMS_MATCH of that count is read as is."""
    ladder = [b for b in groups if baseline.matches(b) and baseline.rest(b, SIZE_KEYS) == baseline.rest(g, SIZE_KEYS)]
    return interpolate(g, ladder, lambda x: x.params["total"], "parameters", PARAMS_MATCH)


def equal_compute(g: Group, groups: list[Group], baseline: Baseline) -> EqualParams:
    """g against the baseline at g's training FLOPs, across the baseline's sizes and token budgets."""
    free = SIZE_KEYS + BUDGET_KEYS
    ladder = [b for b in groups if baseline.matches(b) and baseline.rest(b, free) == baseline.rest(g, free)]
    if g.runs[0].flops is None or any(b.runs[0].flops is None for b in ladder):
        return EqualParams(why="no FLOPs: tokenizer.vocab_size or model.n_embd missing")
    return interpolate(g, ladder, lambda x: statistics.fmean(r.flops for r in x.runs), "FLOPs")


def interpolate(g: Group, ladder: list[Group], x_of, unit: str, match: float = 0.0) -> EqualParams:
    """The baseline's loss at x_of(g), seed by seed, linear in log x between the two ladder groups
    that bracket it (the nearest group itself when its x is within `match`, relative, of g's); n/a
    outside the ladder, with one point, or when the ladder's seed-mean loss does not fall from the
    lower to the upper point."""
    ladder = sorted(ladder, key=x_of)
    xs, x = [x_of(b) for b in ladder], x_of(g)
    split = judged_split([r for b in [g, *ladder] for r in b.runs])

    def loss(r) -> float:  # every run read has the split
        return (r.test or {})["loss"] if split == "test" else r.loss

    near = min(range(len(xs)), key=lambda i: abs(math.log(xs[i] / x)), default=None)
    if near is not None and abs(xs[near] / x - 1) <= match:
        ladder = [ladder[near]] * 2
    elif len(ladder) < 2:
        return EqualParams(why="baseline at one size only")
    elif not xs[0] < x < xs[-1]:
        return EqualParams(why=f"outside the baseline's {xs[0]:,.4g}-{xs[-1]:,.4g} {unit}")
    else:
        i = int(np.searchsorted(xs, x))
        ladder = ladder[i - 1 : i + 1]
        lower, upper = (statistics.fmean(map(loss, b.runs)) for b in ladder)
        if upper >= lower:
            return EqualParams(why="n/a: non-monotone (the baseline's loss does not fall across the bracket)")
    low, high = ({r.unit: loss(r) for r in b.runs} for b in ladder)
    logs = [math.log(x_of(b)) for b in ladder]
    w = 0.0 if logs[0] == logs[1] else (math.log(x) - logs[0]) / (logs[1] - logs[0])
    base = {s: low[s] + w * (high[s] - low[s]) for s in low if s in high}
    pairs = [(loss(r), base[r.unit]) for r in g.runs if r.unit in base]
    if not pairs:
        return EqualParams(why="no seed in common with the bracketing baseline groups")
    offset = f" ({x_of(ladder[0]) / x - 1:+.1%} {unit})" if ladder[0] is ladder[1] and x_of(ladder[0]) != x else ""
    return EqualParams(
        between=tuple(dict.fromkeys(b.label + offset for b in ladder)),
        split=split,
        own_perplexity=mean_ci(math.exp(a) for a, _ in pairs),
        base_perplexity=mean_ci(math.exp(b) for _, b in pairs),
        dloss=[a - b for a, b in pairs],
    )
