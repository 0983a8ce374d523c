# Used by `tiecli report`: a verdict on each claim of CLAIMS.md the data can speak to.
"""The claims table: one tying mode (the "tied" role) against another (the "untied" role) at equal
architecture, whatever --baseline the other tables use. The modes are parameters of `claims`, so
any two tying modes can be compared by the same rules.

Every tested row has a p-value against 0 and, where a smallest effect size of interest (SESOI)
applies, an equivalence p-value against +-SESOI; both are Holm-adjusted within the row's family
(judge: a study's declared families, by default one per claim), and the verdict reads the adjusted values."""

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from scipy import stats as scipy_stats

from tiecli.errors import TiecliError
from tiecli.report.groups import BUDGET_KEYS, SIZE_KEYS, Baseline, Group, ignored
from tiecli.report.load import DivergedRun
from tiecli.report.stats import (
    ALPHA,
    EARLY_FRACTION,
    SPIKE_FACTOR,
    SPIKE_WINDOW,
    Comparison,
    Interval,
    budget_target,
    budget_tokens,
    ci_text,
    compare,
    diverged,
    divergence_threshold,
    gap,
    grad_norm_jitter,
    holm,
    loss_spikes,
    mean_ci,
    pair_excess,
    paired,
    ppl_change,
    slope,
    t_tests,
)
from tiecli.run.files import read_json

# C1's own range for the share tying saves: the hypothesis under test, not an expected result.
C1_CLAIMED_SHARE = (0.15, 0.30)
# Smallest effects of interest (--sesoi KEY=VALUE): ppl in % of perplexity (|Δloss| < log(1 + ppl/100)),
# cos for cosines and their differences (R4 Δcos, R3 contrast), cka for linear CKA (C2/C7); drift and gnorm in % of
# a tied/untied ratio (C2/C7 drift, C2 stability (grad norm)), spikes in loss spikes per run (C2 stability (spikes)).
SESOI_DEFAULTS = {"ppl": 1.0, "cos": 0.05, "cka": 0.05, "drift": 10.0, "gnorm": 10.0, "spikes": 1.0}
# R4 (pairs): the smallest excess share of related pairs in the claimed opposition that matters (see its rule)
R4_PAIRS_SESOI = 0.02
UNTIED_INIT = "untied_init"
EPOCH_TOLERANCE = 0.01  # one epoch, up to the last batch's rounding (steps = ceil(tokens / tokens per step))
LADDER = " -> "  # joins the labels of a ladder of scales, smallest first  # untied, W_out starting as a copy of W_in: its in/out distance is 0 at step 0

VERDICT_RULE = (
    "each tested row gets a two-sided t-test of its mean over seeds against 0 (slopes: the regression's t-test) and, where a "
    "SESOI applies, an equivalence test against +-SESOI (two one-sided t-tests, p = 2 max(p_low, p_high): below 0.05 exactly when "
    "the 95% interval lies inside +-SESOI); Holm-Bonferroni correction is on, within each family of rows (see families: by "
    "default one family per claim, across the report's sizes, budgets and vocabularies; a study may declare others), once "
    "over the tests against 0 and once over the equivalence tests, so a row's verdict never depends on rows of other "
    "families. supported / contradicted: Holm p < 0.05, the mean on the claimed / the "
    "other side of 0 and |mean| >= SESOI; negligible: Holm p < 0.05 but |mean| < SESOI; equivalent: equivalence Holm p < 0.05; "
    "inconclusive: neither, or one seed (no test); no data: the runs lack what the row measures, named; not tested: the "
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
    "unit whose curve does not reach it is left out, noted. No SESOI. R6 claims above 0 (untied faster), C3 below 0 "
    "(tied faster): one test, counted once, read both ways. A pair at one budget is not tested. Shown per pair, not "
    "judged and in no family: R6 (schedule-dependent), steps to the pair's in-training target (the higher of the two "
    "groups' best validation losses) on one decaying schedule, in % of the untied steps, where the slower mode can "
    "reach the target only in the decay tail.",
    "C6": "per seed Δloss = tied - untied final loss (log perplexity; the test split when every run of the pair has one, "
    "else val), t-interval; shown as % perplexity 100 (exp(Δloss) - 1) with the bounds transformed alike; claimed below 0, SESOI ppl.",
    "R5/C6": "two parts, both shown and tested: (smallest size) the C6 row of the ladder's smallest size (the same test, counted "
    "once), claimed below 0 (tying helps the small model), SESOI ppl; (trend) least-squares slope of the per-seed Δloss against log10 non-embedding "
    "parameters, 95% interval from t(n-2), claimed above 0 (the help shrinks as models grow). The claim is supported "
    "when both parts are; contradicted when either is; else negligible or equivalent when a part is; else inconclusive.",
    "R5": "the slope of the per-seed Δloss against log10 tokens seen, across token budgets; claimed above 0 (with more data "
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
    "size and seed; drift = |W - W0|_F / |W0|_F over the rows of tokens seen in training, at the last geometry entry; "
    "t-interval, shown as the ratio exp(.) with the bounds transformed alike. Article C says tying reduces drift: claimed "
    "below 0, SESOI drift (10% by default: under Adam a matrix's drift grows roughly in proportion to its learning rate, "
    "so a smaller difference is less than a tenth of what one step of a learning-rate grid, a factor of 2-3, makes). "
    "Mechanism to read it by: the tied matrix gets the output path's gradient at every row every step, the untied input "
    "matrix only at the rows of tokens in the batch; untied's output matrix's drift is shown alongside.",
    "C2 stability (spikes)": f"per seed, tied - untied number of loss spikes over the run; a spike: a logged train loss "
    f"(metrics.jsonl, the mean since the previous log line) above {SPIKE_FACTOR:g} x the median of the up to "
    f"{SPIKE_WINDOW} logged losses before it, from the fourth logged loss on. Article C says tying stabilises training: "
    "claimed below 0, SESOI spikes (1 per run by default: a smaller mean difference is less than one rare event a run).",
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
    "C2/C7 drift": "tying reduces embedding drift: the input token matrix moves less from its initialisation",
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


def claims(
    groups: list[Group],
    tied: str = "tied",
    untied: str = "untied",
    sesoi: dict[str, float] | None = None,
    target: float | None = None,
    free: tuple[str, ...] = (),
    grid: Sequence["Outcome"] = (),
    families: dict[str, tuple[str, ...]] | None = None,
) -> list[Claim]:
    """The claims table, judged: groups with tying=`tied` against those with tying=`untied` (free: the
    keys --select chose per group); target: a fixed convergence target (--target-loss); grid: every run's
    divergence outcome, --select's unselected runs and diverged runs included (outcomes()); families: the
    Holm families declared (parse_families), the others one per claim."""
    margin = margins(sesoi or SESOI_DEFAULTS)
    axis = Baseline("tying", untied, free)
    pairs = [c for c in compare(groups, axis, target) if c.group.mode == tied]
    same_size = f"{tied} and {untied} runs of the same size"
    rows = parameter_claims(pairs, same_size)
    rows += gradient_claims(pairs, [g for g in groups if g.mode == tied], tied, untied, margin["cos"])
    rows += forms_claims([g for g in groups if g.mode == untied], untied, margin["cos"])
    rows += agreement_claims([g for g in groups if g.mode in (untied, UNTIED_INIT)], untied, margin["cka"])
    rows += convergence_claims(pairs, axis, same_size, target)
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
    rows += data_claims(pairs, axis, f"{tied} and {untied} runs at two or more values of tokens seen")
    rows += gap_claims(pairs, margin["ppl"], tied, untied)
    rows += drift_claims(pairs, margin["drift"], tied, untied)
    rows += stability_claims(pairs, margin, tied, untied)
    rows += divergence_claims(grid, tied, untied)
    return derive(judge(rows, families))


def parse_families(spec, where: str) -> dict[str, tuple[str, ...]]:
    """A study's `families` (or --family's): {name: [claim, ...]}, each claim in one family at most; one line
    naming the bad entry and the valid claims otherwise."""
    valid = ", ".join(FAMILY_CLAIMS)
    if not isinstance(spec, dict) or not all(isinstance(v, list) and v for v in spec.values()):
        raise TiecliError(f"{where}: families are {{name: [claim, ...]}}, e.g. {{outcome: [C6, R6]}}; claims: {valid}")
    families: dict[str, tuple[str, ...]] = {}
    seen: dict[str, str] = {}
    for name, members in spec.items():
        for claim in map(str, members):
            if claim not in FAMILY_CLAIMS:
                raise TiecliError(
                    f"{where}: family {name!r} names {claim!r}, not a judged claim; valid claims: {valid}"
                )
            if claim in seen:
                raise TiecliError(
                    f"{where}: {claim} is in two families, {seen[claim]!r} and {name!r}; a claim is in one"
                )
            seen[claim] = str(name)
        families[str(name)] = tuple(map(str, members))
    return families


def family_option(items: list[str]) -> dict[str, tuple[str, ...]] | None:
    """--family NAME=CLAIM,CLAIM (repeatable): the families for this report, replacing any a sweep declared."""
    if not items:
        return None
    spec: dict[str, list[str]] = {}
    for item in items:
        name, sep, members = (part.strip() for part in item.partition("="))
        if not sep or not name or not members:
            raise TiecliError(f"--family {item!r} must be NAME=CLAIM[,CLAIM...], e.g. outcome=C6,R6")
        spec[name] = [m.strip() for m in members.split(",") if m.strip()]
    return parse_families(spec, "--family")


def declared_families(run_paths: list[str]) -> tuple[dict[str, tuple[str, ...]], str]:
    """The families the sweeps holding these runs declared (each run's folder's parent sweep.json, written by
    `tiecli sweep` from the study's `families`), and where they come from. Sweeps that declare none follow the
    others; two that declare different ones are a one-line error (--family chooses)."""
    specs: dict[str, list[str]] = {}
    for sweep in sorted({Path(p).parent / "sweep.json" for p in run_paths}):
        if not sweep.is_file():
            continue
        manifest = read_json(sweep, f"sweep {sweep.parent.name}")
        study = (manifest.get("study") if isinstance(manifest, dict) else None) or {}
        if study.get("families") is not None:
            specs.setdefault(json.dumps(study["families"], sort_keys=True), []).append(str(sweep.parent))
    if len(specs) > 1:
        where = "; ".join(f"{', '.join(folders)}: {spec}" for spec, folders in specs.items())
        raise TiecliError(f"the sweeps declare different families ({where}); choose with --family NAME=CLAIM,...")
    if not specs:
        return {}, "default"
    spec, folders = next(iter(specs.items()))
    return parse_families(json.loads(spec), f"{folders[0]}/sweep.json"), f"declared in {', '.join(folders)}/sweep.json"


def family_of(claim: str, families: dict[str, tuple[str, ...]]) -> str:
    """The declared family holding the claim, else the claim's own (the default: one family per claim)."""
    return next((name for name, members in families.items() if claim in members), claim)


def judge(rows: list[Claim], families: dict[str, tuple[str, ...]] | None = None) -> list[Claim]:
    """Holm-adjust the tests against 0 within each family, then the equivalence tests; then each row's verdict.
    A row's family: the declared one holding its claim, else its claim's own."""
    for row in rows:
        if row.p is not None or row.p_equiv is not None:
            row.family = family_of(row.claim, families or {})
    for family in dict.fromkeys(r.family for r in rows if r.family):
        members = [r for r in rows if r.family == family]
        for name in ("p", "p_equiv"):
            tested_rows = [r for r in members if getattr(r, name) is not None]
            for row, adjusted in zip(tested_rows, holm([getattr(r, name) for r in tested_rows])):
                setattr(row, name + "_holm", adjusted)
    for row in rows:
        if not row.verdict:
            settle(row)
    return rows


def family_rows(rows: list[Claim]) -> dict[str, list[str]]:
    """Each family and its tests, "CLAIM: comparison", as the report prints them (re-read tests, C3 and the
    smallest-size part of R5/C6, are counted once, in the family of the test they re-read)."""
    out: dict[str, list[str]] = {}
    for r in rows:
        if r.family and r.claim not in DERIVED:
            out.setdefault(r.family, []).append(f"{r.claim}: {r.comparison}")
    return out


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


def convergence_claims(pairs: list[Comparison], axis: Baseline, same_size: str, target: float | None) -> list[Claim]:
    """R6 (C3 is derived from it), schedule-free: per ladder of token budgets, the per-unit log ratio of the
    tokens tied and untied need to reach a loss, from each budget's end-of-schedule loss; above zero. A pair at
    one budget is not tested. The steps-to-target reading of one schedule is shown per pair, not judged."""
    budgets = ladders(pairs, axis, BUDGET_KEYS, budget)
    rows = [convergence_row(ladder, target) for ladder in budgets]
    in_ladder = {id(c) for ladder in budgets for c in ladder}
    why = "the rule reads end-of-schedule losses across budgets"
    rows += [
        Claim("R6", TEXTS["R6"], c.group.label, "-", "-", ONE_BUDGET, why, direction=+1)
        for c in pairs
        if id(c) not in in_ladder
    ]
    rows += [reading for c in pairs if (reading := schedule_reading(c))]
    return rows or [missing("R6", f"{same_size} at two or more token budgets")]


def schedule_reading(c: Comparison) -> Claim | None:
    """The old R6 reading, steps to the pair's target on one schedule, in % of untied's: shown, never judged."""
    values = [100 * (a / b - 1) for a, b in c.steps_pairs() if b]
    if not values:
        return None
    ci = mean_ci(values)
    why = "schedule-dependent: steps to the pair's target on one decaying schedule, where the slower mode may "
    return Claim(
        "R6 (schedule-dependent)",
        TEXTS["R6 (schedule-dependent)"],
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


def convergence_row(ladder: list[Comparison], fixed: float | None) -> Claim:
    """R6 on one ladder of budgets: log(tokens_tied / tokens_untied) to the target loss, per unit."""
    split = "test" if all(c.split == "test" for c in ladder) else "val"
    comparison = LADDER.join(c.group.label for c in ladder)
    target = fixed if fixed is not None else budget_target(ladder, split)
    figure = f"ppl_vs_tokens.png ({split} split, end of each schedule)"
    if target is None:
        why = "the two modes' seed-mean budget curves span no common loss"
        return Claim("R6", TEXTS["R6"], comparison, figure, "-", "inconclusive", why, direction=+1)
    tokens = budget_tokens(ladder, target, split)
    values = [
        math.log(t / u)
        for unit, t in tokens["group"].items()
        if t is not None and (u := tokens["base"].get(unit)) is not None
    ]
    units = len(set(tokens["group"]) | set(tokens["base"]))
    note = f"{units - len(values)} of {units} units' curves do not reach loss {target:.4g} inside their budgets"
    if not values:
        return Claim("R6", TEXTS["R6"], comparison, figure, "-", "inconclusive", note, direction=+1)
    return tested(
        "R6",
        comparison,
        figure,
        values,
        +1,
        show=lambda ci: (
            f"tokens to loss {target:.4g}: tied {ci_text(ppl_change(ci), 3, ' %')} more than untied "
            f"(log ratio {ci_text(ci)})"
        ),
        note=note if len(values) < units else "",
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
    pairs: list[Comparison], axis: Baseline, free: tuple, x_of, claim_id: str, figure: str, needs: str
) -> list[Claim]:
    """Slope of the per-seed Δloss against log10 of the scale, per ladder; above zero."""
    rows = [trend_row(ladder, x_of, claim_id, figure) for ladder in ladders(pairs, axis, free, x_of)]
    return rows or [missing(claim_id, needs)]


def trend_row(ladder: list[Comparison], x_of, claim_id: str, figure: str) -> Claim:
    split = "test" if all(c.split == "test" for c in ladder) else "val"
    by_pair = [(math.log10(x_of(c.group)), c.delta_loss(split)) for c in ladder]
    fit, p = slope([(x, d) for x, values in by_pair for d in values])
    row = Claim(
        claim_id,
        TEXTS[claim_id],
        LADDER.join(c.group.label for c in ladder),
        f"{figure} ({split} split)",
        f"Δloss {ci_text(fit)} per decade",
        interval=fit,
        direction=+1,
        p=p,
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
            rows.append(trend_row(fresh, budget, "R5", "ppl_vs_tokens.png"))
        if len(fresh) == len(ladder):
            continue
        row = trend_row(ladder, budget, "R5", "ppl_vs_tokens.png")
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
    return rows or [missing("R5", needs)]


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
    """C2/C7 drift: the input-side token matrix's relative drift, tied (the shared matrix) over untied (wte)."""
    rows = []
    for c in pairs:
        values = log_ratios(c, lambda r: r.diag.get("drift_input"))
        if values:
            tied_in, untied_in, untied_out = (
                _mean(mean_ci(r.diag.get(key) for r in runs))
                for runs, key in (
                    (c.group.runs, "drift_input"),
                    (c.base.runs, "drift_input"),
                    (c.base.runs, "drift_output"),
                )
            )
            shown = f"drift {tied} {tied_in}, {untied} input {untied_in} (output {untied_out})"
            rows.append(
                tested(
                    "C2/C7 drift",
                    c.group.label,
                    "dynamics table, drift.png",
                    values,
                    -1,
                    margin,
                    lambda ci, s=shown: f"drift ratio {tied}/{untied} {ratio_text(ci)}; {s}",
                )
            )
    return rows or [
        missing("C2/C7 drift", f"{tied} and {untied} runs with geometry at step 0 and later (diag.geometry)")
    ]


def stability_claims(pairs: list[Comparison], margin: dict, tied: str, untied: str) -> list[Claim]:
    """C2 stability: loss spikes (tied - untied count) and early gradient-norm jitter (log ratio), paired by seed."""
    rows = []
    for c in pairs:
        spikes = c.delta(loss_spikes)
        if spikes:
            counts = f"{tied} {_mean(mean_ci(map(loss_spikes, c.group.runs)))}, {untied} {_mean(mean_ci(map(loss_spikes, c.base.runs)))}"
            rows.append(
                tested(
                    "C2 stability (spikes)",
                    c.group.label,
                    "dynamics table",
                    spikes,
                    -1,
                    margin["spikes"],
                    lambda ci, s=counts: f"Δspikes {ci_text(ci)} per run (mean {s})",
                )
            )
        if jitter := log_ratios(c, grad_norm_jitter):
            rows.append(
                tested(
                    "C2 stability (grad norm)",
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
    return rows + [missing(k, needs) for k in ("C2 stability (spikes)", "C2 stability (grad norm)") if k not in found]


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
        return [
            missing(
                "C2 stability (divergence)", f"{tied} and {untied} runs at two or more train.lr values (an LR grid)"
            )
        ]
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
            "C2 stability (divergence)",
            TEXTS["C2 stability (divergence)"],
            f"{len(units)} {tied}/{untied} pairs over train.lr {rates[0]:g}-{rates[-1]:g}",
            "results.csv divergence rows",
            f"Δ divergence rate {ci_text(ci)}; diverged {shares}; discordant pairs: {tied} only {tied_only}, "
            f"{untied} only {untied_only} (exact McNemar)",
            interval=ci,
            direction=-1,
            p=p,
        )
    ]
