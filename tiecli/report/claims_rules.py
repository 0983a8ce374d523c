# Used by `tiecli report` (tiecli/report/claims*.py, render, results, gate, headline): what the claims table says.
"""The claims table's vocabulary: each claim's text (TEXTS) and the rule that tests it (CLAIM_RULES), the
verdict rule, the smallest effects of interest (--sesoi), the `Claim` row, and the two ways a row starts:
`tested` (per-seed values, their interval and t-tests) or `missing` (no data).

The rows themselves are made by family in claims_embedding.py (R2, C1, R4, R3, C2/C7), claims_scaling.py
(R6, C3, C6, R5/C6, R5) and claims_stability.py (R5/C2 gap, C2/C7 drift, C2 stability); claims.py puts
them together and judges them."""

import dataclasses
import math
from dataclasses import dataclass

from tiecli.errors import TiecliError
from tiecli.report.stats import (
    EARLY_FRACTION,
    EXCURSION_FACTOR,
    SPIKE_FACTOR,
    SPIKE_WINDOW,
    Interval,
    ci_text,
    mean_ci,
    ppl_change,
    t_tests,
)

# C1's own range for the share tying saves: the hypothesis under test, not an expected result.
C1_CLAIMED_SHARE = (0.15, 0.30)
# Smallest effects of interest (--sesoi KEY=VALUE): ppl in % of perplexity (|Δloss| < log(1 + ppl/100)),
# cos for cosines and their differences (R4 Δcos, R3 contrast), cka for linear CKA (C2/C7); drift and gnorm in % of
# a tied/untied ratio (C2/C7 drift, C2 stability (grad norm)), spikes in loss spikes per run (C2 stability (spikes)).
SESOI_DEFAULTS = {"ppl": 1.0, "cos": 0.05, "cka": 0.05, "drift": 10.0, "gnorm": 10.0, "spikes": 1.0}
# R4 (pairs): the smallest excess share of related pairs in the claimed opposition that matters (see its rule)
R4_PAIRS_SESOI = 0.02
# R4 (cancellation): the smallest excess cancelled fraction of the paths' step along related pairs that matters
R4_CANCEL_SESOI = 0.02
UNTIED_INIT = "untied_init"  # untied, W_out starting as a copy of W_in: its in/out distance is 0 at step 0
EPOCH_TOLERANCE = 0.01  # one epoch, up to the last batch's rounding (steps = ceil(tokens / tokens per step))
LADDER = " -> "  # joins the labels of a ladder of scales, smallest first

VERDICT_RULE = (
    "each tested row gets a two-sided t-test of its mean over seeds against 0 (slopes: the t-test on the slope's "
    "seed-clustered standard error) and, where a "
    "SESOI applies, an equivalence test against +-SESOI (two one-sided t-tests, p = 2 max(p_low, p_high): below 0.05 exactly when "
    "the 95% interval lies inside +-SESOI); Holm-Bonferroni correction is on, within each family of rows (see families: by "
    "default one family per claim and study, across the study's sizes, budgets and vocabularies; a study may declare "
    "others), once "
    "over the tests against 0 and once over the equivalence tests, so a row's verdict never depends on rows of other "
    "families or of another study. supported / contradicted: Holm p < 0.05, the mean on the claimed / the "
    "other side of 0 and |mean| >= SESOI; negligible: Holm p < 0.05 but |mean| < SESOI; equivalent: equivalence Holm p < 0.05; "
    "inconclusive: neither, or one seed (no test), or R6's readings across its range disagree; no data: the runs lack what the row measures, named; not tested: the "
    "design cannot answer the claim (named: e.g. one budget, repeated data), numbers shown descriptively; descriptive: "
    "a reading shown for reference, never judged and in no family"
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
    "R4 (cancellation)": "the article's own quantity, magnitudes not signs: at each diagnostics step, for each "
    "related-form pair, each path's component s along the pair's difference (as R4 (pairs)), read through Adam's step "
    "size lr / (sqrt(v_hat) + eps) of the matrix it lands on (v_hat: the second moment the coming step uses; tied: "
    "both paths through the shared matrix's, so their sum is the momentum-free step the matrix takes); cancelled "
    "fraction = 1 - sum |s_in + s_out| / sum (|s_in| + |s_out|), summed over pairs and diagnostics steps (a step "
    "counts by how far the paths move the pairs). The null: the frequency-matched random pairs, reweighted at each "
    "step to the related pairs' distribution of cos(w[a], w[b]) (8 quantile bins; a bin with under 8 null pairs "
    "is left out, with its related pairs). Per run the excess = related - null; per seed the tied run's excess "
    "minus the untied run's (same size and seed: the control, where nothing is shared and nothing cancels in "
    f"fact); t-interval over seeds, claimed above 0, SESOI {R4_CANCEL_SESOI:g}. Shown, not judged: each mode's "
    "excess, on Adam's step and on the raw gradients. Cannot say: how Adam's momentum, which spreads each step's "
    "gradient over later steps, moves the weights.",
    "R3": "untied runs, last geometry entry: related-form contrast of the input matrix minus that of the output matrix "
    "(contrast = pair cosine - the cosine of frequency-matched random pairs); claimed above 0, SESOI cos.",
    "C2/C7": "untied and untied_init runs (tied: one matrix, close by construction): per seed ΔCKA = linear CKA(W_in, W_out) "
    "at the last geometry entry - at step 0. If the tie is what keeps the spaces close, without it they move apart: "
    "claimed below 0, SESOI cka. untied_init starts at CKA 1 and distance |W_in - W_out|/|W_in| 0, so its row says "
    "whether identical spaces stay close with no tie. Drift from each matrix's own init is judged in its own row, "
    "C2/C7 drift.",
    "R6/C3": "schedule-free tokens-to-loss, from runs of one config at several token budgets, each ending its own "
    "schedule (not constant-LR or WSD runs): per unit and mode, the end-of-schedule loss (test split when every run of the "
    "ladder has one, else val) as a function of log tokens, linear between budgets, gives the tokens that mode needs to "
    "reach the target loss; the row judges log(tokens tied / tokens untied), t-interval over units, shown as % more "
    "tokens 100 (exp(x) - 1). Target: the loss midway through the range both modes' seed-mean budget curves span (from "
    "the higher of their losses at the largest budget to the lower at the smallest), so both reach it inside their "
    "budgets by interpolation and neither at an end, the same loss for every unit (--target-loss fixes it instead); a "
    "unit whose curve does not reach it is left out, noted. Also read at 5 losses evenly inside that range (the middle "
    "one the target; raw t-tests): no verdict (inconclusive) where those readings disagree in sign or in significance "
    "(raw p < 0.05 at some, not at others). Not independent of C6: at a common loss the log token ratio restates the "
    "end-of-schedule loss gap divided by the untied curve's slope in log tokens. No SESOI. R6 claims above 0 (untied faster), C3 below 0 "
    "(tied faster): one test, counted once, read both ways. A pair at one budget is not tested. Shown per pair, not "
    "judged and in no family: R6 (schedule-dependent), steps to the pair's in-training target (the higher of the two "
    "groups' best validation losses) on one decaying schedule, in % of the untied steps, where the slower mode can "
    "reach the target only in the decay tail.",
    "C6": "per seed Δloss = tied - untied final loss (log perplexity; the test split when every run of the pair has one, "
    "else val), t-interval; shown as % perplexity 100 (exp(Δloss) - 1) with the bounds transformed alike; claimed below 0, SESOI ppl.",
    "R5/C6": "two parts, both shown and tested: (smallest size) the C6 row of the ladder's smallest size (the same test, counted "
    "once), claimed below 0 (tying helps the small model), SESOI ppl; (trend) least-squares slope of the per-seed Δloss against log10 non-embedding "
    "parameters, judged on its seed-clustered 95% interval (CR1 sandwich over units, t(G-1) with G units: a seed shares "
    "its held-out text and tokenizer across sizes), the plain t(n-2) interval and the fit through the sizes' means shown "
    "beside it, claimed above 0 (the help shrinks as models grow). The claim is supported "
    "when both parts are; contradicted when either is; else negligible or equivalent when a part is; else inconclusive.",
    "R5": "the slope of the per-seed Δloss against log10 tokens seen, across token budgets, judged as R5/C6 (trend): on its "
    "seed-clustered interval; claimed above 0 (with more data "
    f"untying gains). Judged only across the budgets that see each token at most once: epochs = tokens trained on / the "
    f"corpus's training-split tokens (summary.json) <= 1 (+{EPOCH_TOLERANCE:.0%} for the last batch's rounding; batches "
    "are random windows, so 1 epoch means each token once on average). Repeating a corpus adds overfitting, where "
    "tying's regularisation is predicted to help, so a ladder with repeats is shown descriptively, \"not tested: "
    'repeated data (N epochs)" (and "not tested: epochs unknown" without the split\'s size).',
    "R5/C2 gap": "per seed, tied gap - untied gap, gap = val loss - train loss (eval.json's val and train when present, else "
    "the last metrics.jsonl row with val_loss and train_eval_loss); claimed below 0 (tying regularises), SESOI ppl.",
    "R5/C2 gap (equal fit)": "the same difference read where both runs of a seed fitted the training split equally well, to "
    "break the confound that a model which learned less has less to overfit: per seed, each run's in-training val - train "
    "loss (metrics.jsonl's fixed windows) where its train_eval_loss first falls to the higher of the two runs' final "
    "train_eval_loss, linear between evaluations; claimed below 0, SESOI ppl.",
    "C2/C7 drift": "per seed, log(drift of the tied run's shared matrix / drift of the untied run's input matrix wte), same "
    "size and seed; drift = the scale-free drift_unit = |U - U0|_F / |U0|_F of the row-normalised matrix (U: each row "
    "w / |w|) over the rows of tokens seen in training, at the last geometry entry (norm growth alone does not move it; "
    "the norm-based |W - W0|_F / |W0|_F is shown); "
    "t-interval, shown as the ratio exp(.) with the bounds transformed alike. Article C says tying reduces drift: claimed "
    "below 0, SESOI drift (10% by default: under Adam a matrix's drift grows roughly in proportion to its learning rate, "
    "so a smaller difference is less than a tenth of what one step of a learning-rate grid, a factor of 2-3, makes). "
    "Mechanism to read it by: the tied matrix gets the output path's gradient at every row every step, the untied input "
    "matrix only at the rows of tokens in the batch; untied's output matrix's drift is shown alongside.",
    "L1": "from the literature (arXiv 2603.26663), not from the two articles: tied and untied runs of one size and "
    "seed (same init, same batches); rows.npz's fixed sample of the final matrices (the most frequent training tokens' "
    "rows, float16); per seed ΔCKA = linear CKA(tied matrix, untied output matrix) - CKA(tied matrix, untied input "
    "matrix) over the sampled rows; claimed above 0 (the tied matrix resembles the output matrix more), SESOI cka. "
    "At step 0 the tied matrix IS the untied input matrix (one draw per seed), so the claim must overcome the shared "
    "init. Shown, not judged: the mean row cosines to either matrix and the tied run's early |G_out| / |G_in| "
    "(geometric mean over the first 20% of steps: the study's mechanism, output-side gradients dominating early).",
    "C2 stability (spikes)": f"per seed, tied - untied number of loss spikes over the run; a spike: a logged train loss "
    f"(metrics.jsonl, the mean since the previous log line) above {SPIKE_FACTOR:g} x the median of the up to "
    f"{SPIKE_WINDOW} logged losses before it, from the fourth logged loss on. Article C says tying stabilises training: "
    "claimed below 0, SESOI spikes (1 per run by default: a smaller mean difference is less than one rare event a run). "
    f"Shown beside it, not judged: each mode's gradient-norm excursions per run, logged grad_norm above "
    f"{EXCURSION_FACTOR:g} x the median of the up to {SPIKE_WINDOW} logged before it, from the fourth on.",
    "C2 stability (grad norm)": "per seed, log(tied / untied gradient-norm jitter); jitter = the sd of the changes in log "
    "grad_norm (metrics.jsonl: the global norm before clipping, at each logged step) between consecutive logged steps over "
    f"the first {EARLY_FRACTION:.0%} of the run's steps, where article C places the instability. Scale-free and blind to "
    "the norm's smooth early trend, which a variance or coefficient of variation over the falling curve would measure "
    "instead. Claimed below 0, SESOI gnorm (10% by default, the same relative margin as drift: no published scale exists).",
    "C2 stability (divergence)": "across a learning-rate grid: every tied and untied run of the report, --select's "
    "unselected ones included, paired by every other setting and the seed. Diverged: the run stopped on a non-finite "
    "training loss (status failed, train's Diverged error) or ended with a validation loss at or above the unigram loss "
    "of the validation split (log of the count model's perplexity; without it, the step-0 validation loss). Per pair "
    "d = diverged tied - diverged untied, so the mean is the difference of the divergence rates; exact McNemar test "
    "(two-sided binomial test on the discordant pairs); claimed below 0 (tied diverges less); no SESOI. Needs pairs at "
    "two or more train.lr values; with fewer than 6 discordant pairs no result can reach 0.05: inconclusive.",
}
TEXTS = {
    "R2": "the vocabulary matrix is the largest single tensor, so tying saves a large share of parameters",
    "C1": "tying cuts parameters from 2Vd to Vd, 15-30% of the total",
    "R4": "global figure: the two paths' gradients anti-aligned over the whole matrix (more than two unrelated paths)",
    "R4 (pairs)": "with tying, along related-form differences the output path pushes apart and the input path pulls "
    "together, more than along matched random pairs",
    "R4 (cancellation)": "with tying, the two paths' updates cancel along related-form differences, more than along "
    "matched random pairs and more than in the untied control",
    "R3": "input embeddings pull related forms together, the output matrix pushes them apart",
    "C2/C7": "tying keeps the input and output spaces close: without the tie they move apart",
    "R6": "untie and the loss converges faster",
    "C3": "tying gives a more direct gradient path: faster convergence",
    "R6 (schedule-dependent)": "untie and the loss converges faster (steps to a target on one learning-rate schedule)",
    "C6": "tying lowers perplexity",
    "R5/C6 (smallest size)": "tying helps the smallest model",
    "R5/C6 (trend)": "the help from tying shrinks as models grow",
    "R5/C6": "tying helps small models, less so large ones",
    "R5": "with lots of data untying wins: the tied-vs-untied gap rises with tokens seen",
    "R5/C2 gap": "tying regularises: a smaller generalisation gap (val - train loss) than untied",
    "R5/C2 gap (equal fit)": "tying regularises: a smaller gap than untied at the same training loss",
    "C2/C7 drift": "tying reduces embedding drift: the input token matrix's rows turn less from their initialisation",
    "L1": "(literature, arXiv 2603.26663) a tied matrix ends up resembling the untied model's output matrix more "
    "than its input matrix",
    "C2 stability (spikes)": "tying stabilises training: fewer loss spikes",
    "C2 stability (grad norm)": "tying stabilises early training: a steadier gradient norm",
    "C2 stability (divergence)": "tying stabilises training: fewer runs diverge at high learning rates",
}
ORDER = tuple(TEXTS)  # the rows' order in the table
DERIVED = ("C3", "R5/C6 (smallest size)", "R5/C6")  # rows that re-read other rows' tests (derive)
DESCRIPTIVE = ("R6 (schedule-dependent)",)  # rows shown, never judged, in no family
FAMILY_CLAIMS = tuple(c for c in ORDER if c not in DERIVED + DESCRIPTIVE)  # what a declared family may hold


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
    family: str = ""  # the Holm family of a tested row (judge)
    values: list[float] = dataclasses.field(default_factory=list)  # the per-unit values a t-tested row is judged on
    # other readings of the same data, shown beside the judged one: a slope's OLS and scale-means fits, R6 per target
    readings: dict = dataclasses.field(default_factory=dict)


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
        **{
            key: (
                math.log1p(sesoi[key] / 100),
                f"{sesoi[key]:g}% {what} (|log ratio| {math.log1p(sesoi[key] / 100):.3g})",
            )
            for key, what in (("drift", "drift"), ("gnorm", "gradient-norm jitter"))
        },
        "spikes": (sesoi["spikes"], f"{sesoi['spikes']:g} loss spikes per run"),
    }


def loss_text(ci: Interval | None) -> str:
    return f"{ci_text(ppl_change(ci), 3, ' %')} ppl (Δloss {ci_text(ci)})"


def mean_text(ci: Interval | None) -> str:
    """The mean of an interval as a row shows it, "-" when there is none."""
    return f"{ci.mean:.3g}" if ci else "-"


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
        values=[v for v in values if v is not None],
    )


def missing(claim_id: str, needs: str) -> Claim:
    return Claim(claim_id, TEXTS[claim_id], "-", "-", "-", f"no data: needs {needs}", "nothing to test")
