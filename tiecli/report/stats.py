# Used by `tiecli report`: every number over seeds, and each run's own values.
"""Statistics over seeds: intervals and tests, paired differences, each run's values and its
convergence; the comparisons with the baseline built on them are compare.py's.

Perplexity is compared through its logarithm, the loss: per seed Δloss = loss_group - loss_base, a
t-interval over seeds, then the % change in perplexity 100 (exp(Δloss) - 1) with its bounds
transformed the same way (so a bound never falls below -100%)."""

import math
import statistics
import warnings
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from tiecli.report.groups import Group
from tiecli.report.load import Run

CONFIDENCE = 0.95
ALPHA = 1 - CONFIDENCE  # the family-wise error rate of the Holm-adjusted tests
METRICS = ("loss", "perplexity", "bits_per_byte", "tokens_per_s")  # per-run numbers of every Run
MIN_EVALS = 8  # fewer evaluations than this before the convergence target: the crossing is poorly resolved
# Stability early in training (claim C2): a logged train loss (the mean since the previous log line) above
# SPIKE_FACTOR x the median of the SPIKE_WINDOW logged losses before it is a spike, counted from the fourth
# logged loss on; gradient-norm jitter is read over the first EARLY_FRACTION of the run's steps.
SPIKE_FACTOR = 1.1
SPIKE_WINDOW = 10
EARLY_FRACTION = 0.2
# A logged gradient norm (before clipping) above EXCURSION_FACTOR x the median of the SPIKE_WINDOW logged norms before
# it is a gradient-norm excursion, counted from the fourth logged norm on, as the loss spikes.
EXCURSION_FACTOR = 5.0


@dataclass
class Interval:
    """Mean over seeds with sample sd and 95% interval (sd, low, high None with one value)."""

    n: int
    mean: float
    sd: float | None
    low: float | None
    high: float | None


def mean_ci(values) -> Interval | None:
    """Mean, sample sd and 95% t-interval over seeds (None fields with one value; None with none)."""
    values = [v for v in values if v is not None]
    if not values:
        return None
    n, mean = len(values), statistics.fmean(values)
    if n < 2:
        return Interval(1, mean, None, None, None)
    sd = statistics.stdev(values)
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * sd / math.sqrt(n)
    return Interval(n, mean, sd, mean - half, mean + half)


def _zero_spread_p(value: float, null: float, alternative: str) -> float:
    """The t-test's p for identical values, the limit as the spread goes to 0: t is +-inf, or 0 at the null.

    scipy's t is 0/0 (nan) there, or a rounding artefact when the mean is not exactly the value."""
    t = math.copysign(math.inf, value - null) if value != null else 0.0
    if alternative == "greater":
        return float(stats.t.sf(t, 1))
    if alternative == "less":
        return float(stats.t.cdf(t, 1))
    return float(2 * stats.t.sf(abs(t), 1))


def _ttest_p(values: list[float], null: float, alternative: str = "two-sided") -> float:
    """p of the one-sample t-test of the mean of values against null (scipy.stats.ttest_1samp)."""
    if len(set(values)) == 1:
        return _zero_spread_p(values[0], null, alternative)
    with warnings.catch_warnings():
        # scipy warns of precision loss when the values are nearly identical; the t it computes is still the
        # test's, and a report prints nothing of the kind (it never did, with the t written out by hand).
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(stats.ttest_1samp(values, null, alternative=alternative).pvalue)


def t_tests(values, sesoi: float | None) -> tuple[float | None, float | None]:
    """(p, p_equiv) of the mean over seeds: p, the two-sided one-sample t-test against 0; p_equiv, two
    one-sided t-tests against -sesoi and +sesoi, p_equiv = min(1, 2 max(p_low, p_high)), which is below
    0.05 exactly when the 95% interval lies inside +-sesoi. None with fewer than two values (or no sesoi)."""
    values = [v for v in values if v is not None]
    if len(values) < 2:
        return None, None
    p = _ttest_p(values, 0.0)
    if not sesoi:
        return p, None
    low_side, high_side = _ttest_p(values, -sesoi, "greater"), _ttest_p(values, sesoi, "less")
    return p, float(min(1.0, 2 * max(low_side, high_side)))


def slope(points: list[tuple[float, float]]) -> tuple[Interval | None, float | None]:
    """Least-squares slope of y on x with its 95% t-interval (n - 2 degrees of freedom) and the
    two-sided p-value of slope = 0: every point independent."""
    if len(points) < 3 or len({x for x, _ in points}) < 2:
        return None, None
    fit = stats.linregress(*zip(*points))
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, len(points) - 2) * fit.stderr
    return Interval(len(points), fit.slope, None, fit.slope - half, fit.slope + half), float(fit.pvalue)


def clustered_slope(points: Sequence[tuple[float, float, Hashable]]) -> tuple[Interval | None, float | None]:
    """The least-squares slope of y on x over (x, y, cluster) points, its standard error robust to points of one
    cluster (a seed: its held-out text and tokenizer shared across scales) being correlated: the sandwich
    (X'X)^-1 (sum over clusters of X_g' e_g e_g' X_g) (X'X)^-1 with the small-sample factor G/(G-1) (n-1)/(n-2)
    (CR1), 95% t-interval and two-sided p with G - 1 degrees of freedom (G clusters). Interval.n is G. None with
    fewer than 3 points, 2 values of x or 2 clusters."""
    clusters = list(dict.fromkeys(c for _, _, c in points))
    if len(points) < 3 or len({x for x, _, _ in points}) < 2 or len(clusters) < 2:
        return None, None
    x = np.array([p[0] for p in points], dtype=float)
    y = np.array([p[1] for p in points], dtype=float)
    design = np.column_stack([np.ones_like(x), x])  # (n, 2): intercept, x
    bread = np.linalg.inv(design.T @ design)
    coef = bread @ design.T @ y
    residual = y - design @ coef
    meat = np.zeros((2, 2))
    for c in clusters:
        mine = np.array([cluster == c for _, _, cluster in points])
        score = design[mine].T @ residual[mine]  # (2,): the cluster's summed score
        meat += np.outer(score, score)
    n, g = len(points), len(clusters)
    se = math.sqrt(max(0.0, (g / (g - 1) * (n - 1) / (n - 2) * bread @ meat @ bread)[1, 1]))  # >= 0 up to rounding
    b = float(coef[1])
    if se == 0:
        return Interval(g, b, None, b, b), _zero_spread_p(b, 0.0, "two-sided")
    half = stats.t.ppf(0.5 + CONFIDENCE / 2, g - 1) * se
    return Interval(g, b, None, b - half, b + half), float(2 * stats.t.sf(abs(b) / se, g - 1))


def means_slope(points: list[tuple[float, float]]) -> Interval | None:
    """slope() through the mean y at each x: one point per scale, n - 2 degrees of freedom over the scales
    (None with fewer than 3 scales)."""
    by_x: dict[float, list[float]] = {}
    for x, y in points:
        by_x.setdefault(x, []).append(y)
    return slope([(x, statistics.fmean(ys)) for x, ys in by_x.items()])[0]


def holm(p: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values: the k-th smallest of m gets max over j <= k of (m - j + 1) p_(j), at most 1."""
    adjusted, running = [1.0] * len(p), 0.0
    for rank, i in enumerate(sorted(range(len(p)), key=p.__getitem__)):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def ppl_change(loss: Interval | None) -> Interval | None:
    """A Δloss interval as % change in perplexity, 100 (exp(x) - 1), every bound transformed the same way."""
    if loss is None:
        return None

    def pct(x):
        return None if x is None else 100 * math.expm1(x)

    return Interval(loss.n, pct(loss.mean), None, pct(loss.low), pct(loss.high))


def ci_text(ci: Interval | None, digits: int = 3, unit: str = "") -> str:
    if ci is None:
        return "-"
    if ci.low is None:
        return f"{ci.mean:.{digits}g}{unit} (1 seed)"
    return f"{ci.mean:.{digits}g}{unit} [{ci.low:.{digits}g}, {ci.high:.{digits}g}]"


def paired(group: Group, base: Group, value, base_value=None) -> list[tuple]:
    """(value in group, value in base) per unit (seed, held-out split) that both have and both measured; base_value, when
    given, reads the base's runs (e.g. the untied output matrix against the tied shared matrix)."""
    by_unit = {r.unit: (base_value or value)(r) for r in base.runs}
    pairs = [(value(r), by_unit[r.unit]) for r in group.runs if r.unit in by_unit]
    return [(a, b) for a, b in pairs if a is not None and b is not None]


def percent(pairs) -> Interval | None:
    return mean_ci([100 * (a / b - 1) for a, b in pairs if b])


def embedding_share(params: dict) -> float:
    """Token embedding and output matrices (not positions) as a share of all parameters."""
    return (params["input_embedding"] + params["output_matrix"] + params["shared"]) / params["total"]


def judged_split(runs: Sequence[Run]) -> str:
    """The split final numbers are judged on: test when every run has it, else val."""
    return "test" if all(r.test for r in runs) else "val"


def final_loss(run: Run, split: str) -> float | None:
    """The run's loss on the whole val or test split (None when it has no test evaluation)."""
    return run.loss if split == "val" else (run.test or {}).get("loss")


def gap(run: Run) -> float | None:
    """Generalisation gap: val loss - train loss (load.generalisation_gap says from where)."""
    return run.gap[0] - run.gap[1] if run.gap else None


def gap_at(fit: list[tuple[float, float]], level: float) -> float | None:
    """val - train loss where the in-training train loss first falls to `level`, linear between evaluations."""
    for (train0, val0), (train1, val1) in zip(fit, fit[1:]):
        if train1 <= level <= train0 and train1 < train0:
            f = (train0 - level) / (train0 - train1)
            return val0 + f * (val1 - val0) - level
    return None


def matched_gap(a: Run, b: Run) -> float | None:
    """gap(a) - gap(b) at equal fit: both read at the training loss both reach (the higher of their final
    in-training train losses), so the run that fitted the training split better is read earlier, where it
    fitted it as well as the other. None without a train_eval_loss curve in both."""
    if len(a.fit) < 2 or len(b.fit) < 2:
        return None
    level = max(a.fit[-1][0], b.fit[-1][0])
    gap_a, gap_b = gap_at(a.fit, level), gap_at(b.fit, level)
    return None if gap_a is None or gap_b is None else gap_a - gap_b


def pair_excess(run: Run, key: str) -> float | None:
    """R4 at the pairs: a share's mean over training for the related pairs minus that for their matched
    random pairs (pair_KEY - pair_KEY_null, both from metrics.jsonl); None without pair statistics."""
    forms, null = run.diag.get(f"pair_{key}"), run.diag.get(f"pair_{key}_null")
    return None if forms is None or null is None else forms - null


def above_running_median(values: list[float], factor: float) -> int | None:
    """How many values are above factor x the median of the SPIKE_WINDOW before them (counted from the fourth
    on, so at least 3 before); None with fewer than 4 values."""
    if len(values) < 4:
        return None
    return sum(
        values[i] > factor * statistics.median(values[max(0, i - SPIKE_WINDOW) : i]) for i in range(3, len(values))
    )


def loss_spikes(run: Run) -> int | None:
    """Logged train losses above SPIKE_FACTOR x the median of the SPIKE_WINDOW before them."""
    return above_running_median([loss for _, loss in run.train_losses], SPIKE_FACTOR)


def grad_norm_excursions(run: Run) -> int | None:
    """Logged gradient norms above EXCURSION_FACTOR x the median of the SPIKE_WINDOW before them, whole run."""
    return above_running_median([g for _, g in run.grad_norms], EXCURSION_FACTOR)


def early_grad_norms(run: Run) -> int:
    """The logged gradient norms in the first EARLY_FRACTION of the run's steps, which grad_norm_jitter reads."""
    return sum(step <= EARLY_FRACTION * run.steps and g > 0 for step, g in run.grad_norms)


def grad_norm_jitter(run: Run) -> float | None:
    """The sd of the changes in log gradient norm between consecutive logged steps over the first EARLY_FRACTION
    of the run: step-to-step instability, scale-free and blind to the norm's smooth trend. None with under 3 norms."""
    early = [math.log(g) for step, g in run.grad_norms if step <= EARLY_FRACTION * run.steps and g > 0]
    if len(early) < 3:
        return None
    return statistics.stdev(np.diff(early).tolist())


def divergence_threshold(run: Run) -> float | None:
    """The loss a run must end below not to count as diverged: the validation split's unigram loss (log of the
    count model's perplexity, summary.json), else the step-0 validation loss; None without either."""
    unigram = ((run.corpus or {}).get("baselines") or {}).get("unigram", {}).get("perplexity")
    if unigram:
        return math.log(unigram)
    return run.curve[0][2] if run.curve and run.curve[0][0] == 0 else None


def diverged(run: Run) -> float | None:
    """1.0 when a completed run's final validation loss is not finite or not below divergence_threshold, else 0.0."""
    threshold = divergence_threshold(run)
    if not math.isfinite(run.loss):
        return 1.0
    return None if threshold is None else float(run.loss >= threshold)


def run_values(run: Run) -> dict[str, float | None]:
    """The per-run numbers beyond METRICS and the diagnostics: test split, generalisation gap, FLOPs,
    epochs, and the validation split's count-model perplexities (its corpus's, the same for every run on it)."""
    test = run.test or {}
    counts = (run.corpus or {}).get("baselines") or {}
    return {
        "test_loss": test.get("loss"),
        "test_perplexity": test.get("perplexity"),
        "test_bits_per_byte": test.get("bits_per_byte"),
        "train_loss": run.gap[1] if run.gap else None,
        "gap": gap(run),
        "flops": run.flops,
        "epochs": run.epochs,
        "unigram_perplexity": counts.get("unigram", {}).get("perplexity"),
        "bigram_perplexity": counts.get("bigram", {}).get("perplexity"),
        **{f"pair_{key}_excess": pair_excess(run, key) for key in ("claimed", "pull_in", "push_out")},
        "loss_spikes": loss_spikes(run),
        "grad_norm_jitter": grad_norm_jitter(run),
        "diverged": diverged(run),
        "divergence_threshold": divergence_threshold(run),
        "grad_norm_excursions": grad_norm_excursions(run),  # results.csv: after every earlier column (LATER_COLUMNS)
    }


# --- convergence ------------------------------------------------------------------------------------


def target_loss(runs: Sequence[Run]) -> float | None:
    """The highest of the runs' lowest validation losses: every run's curve reaches it."""
    lows = [min(loss for _, _, loss in r.curve) for r in runs if r.curve]
    return max(lows) if lows else None


def time_to(curve: list[tuple], target: float) -> tuple[float, float, int] | None:
    """(steps, tokens, evaluations before) where the val-loss curve first reaches target, linear
    between evaluations; evaluations before: those above the target ahead of the first at or below it."""
    previous = None
    for i, (step, tokens, loss) in enumerate(curve):
        if loss <= target:
            if previous is None:
                return step, tokens, i
            step0, tokens0, loss0 = previous
            f = (loss0 - target) / (loss0 - loss)
            return step0 + f * (step - step0), tokens0 + f * (tokens - tokens0), i
        previous = (step, tokens, loss)
    return None


def reach(run: Run, target: float | None) -> tuple:
    """(steps, tokens, evaluations before) to the target, Nones when there is none or the run never gets there."""
    return (time_to(run.curve, target) if target is not None else None) or (None, None, None)


def aggregate(group: Group) -> dict[str, Interval | None]:
    """mean_ci over the group's seeds of every per-run number the tables show (steps to group.target)."""
    out = {m: mean_ci(getattr(r, m) for r in group.runs) for m in METRICS}
    out |= {key: mean_ci(r.diag.get(key) for r in group.runs) for key in group.runs[0].diag}
    out |= {key: mean_ci(run_values(r)[key] for r in group.runs) for key in run_values(group.runs[0])}
    out["steps_to_target"] = mean_ci(reach(r, group.target)[0] for r in group.runs)
    out["tokens_to_target"] = mean_ci(reach(r, group.target)[1] for r in group.runs)
    return out
