# Used by `tiecli report` (tiecli/report/claims*.py, render, results, gate, headline): what the claims table says.
"""The claims table's vocabulary: each row's name (ClaimId), each claim's text (TEXTS) and the rule that tests it
(CLAIM_RULES), the verdict rule, the smallest effects of interest (--sesoi), the `Claim` row, and the two ways a row
starts: `tested` (per-seed values, their interval and t-tests) or `missing` (no data). The words are data,
claims_rules.yaml, which docs/CLAIMS.md also prints (claims_doc.py), so the two say the same.

The rows themselves are made by family in claims_embedding.py (R2, C1, R4, R3, C2/C7), claims_scaling.py
(R6, C3, C6, R5/C6, R5) and claims_stability.py (R5/C2 gap, C2/C7 drift, C2 stability); claims.py puts
them together and judges them."""

import dataclasses
import math
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import yaml

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
# how far past one epoch a budget may train and still count as seeing each token once (R5): the last batch's
# rounding, as steps = ceil(tokens / tokens per step)
EPOCH_TOLERANCE = 0.01
LADDER = " -> "  # joins the labels of a ladder of scales, smallest first


class ClaimId(str, Enum):
    """A row of the claims table, in the table's order: the one spelling of each claim's name in the code, the
    report and docs/CLAIMS.md (claims_rules.yaml's `says` has one entry per member, in this order)."""

    R2 = "R2"
    C1 = "C1"
    R4 = "R4"
    R4_PAIRS = "R4 (pairs)"
    R4_CANCELLATION = "R4 (cancellation)"
    R3 = "R3"
    C2_C7 = "C2/C7"
    R6 = "R6"
    C3 = "C3"
    R6_SCHEDULE = "R6 (schedule-dependent)"
    C6 = "C6"
    R5_C6_SMALLEST = "R5/C6 (smallest size)"
    R5_C6_TREND = "R5/C6 (trend)"
    R5_C6 = "R5/C6"
    R5 = "R5"
    R5_C2_GAP = "R5/C2 gap"
    R5_C2_GAP_EQUAL_FIT = "R5/C2 gap (equal fit)"
    C2_C7_DRIFT = "C2/C7 drift"
    L1 = "L1"
    C2_SPIKES = "C2 stability (spikes)"
    C2_GRAD_NORM = "C2 stability (grad norm)"
    C2_DIVERGENCE = "C2 stability (divergence)"

    # the name as written, in f-strings, str() and csv alike (an Enum would write ClaimId.R2)
    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


# The rules' words are data (claims_rules.yaml, shipped in the package); these are the numbers they quote.
RULE_VALUES = {
    "c1_low": C1_CLAIMED_SHARE[0],
    "c1_high": C1_CLAIMED_SHARE[1],
    "r4_pairs_sesoi": R4_PAIRS_SESOI,
    "r4_cancel_sesoi": R4_CANCEL_SESOI,
    "epoch_tolerance": EPOCH_TOLERANCE,
    "spike_factor": SPIKE_FACTOR,
    "spike_window": SPIKE_WINDOW,
    "excursion_factor": EXCURSION_FACTOR,
    "early_fraction": EARLY_FRACTION,
}
RULES_FILE = Path(__file__).with_name("claims_rules.yaml")
WORDS = yaml.safe_load(RULES_FILE.read_text(encoding="utf-8"))
VERDICT_RULE: str = WORDS["verdict"].format(**RULE_VALUES)
# each claim's measure, printed under the report's Rules as "claim KEY" (R6/C3: R6's and C3's one test)
CLAIM_RULES: dict[str, str] = {k: v.format(**RULE_VALUES) for k, v in WORDS["rules"].items()}
TEXTS: dict[ClaimId, str] = {ClaimId(k): v.format(**RULE_VALUES) for k, v in WORDS["says"].items()}
ORDER = tuple(ClaimId)  # the rows' order in the table
DERIVED = (ClaimId.C3, ClaimId.R5_C6_SMALLEST, ClaimId.R5_C6)  # rows that re-read other rows' tests (derive)
DESCRIPTIVE = (ClaimId.R6_SCHEDULE,)  # rows shown, never judged, in no family
FAMILY_CLAIMS = tuple(c for c in ORDER if c not in DERIVED + DESCRIPTIVE)  # what a declared family may hold


@dataclass
class Claim:
    """One row of the claims table. A tested row has an interval, a claimed direction and p-values."""

    claim: ClaimId
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
    claim_id: ClaimId,
    comparison: str,
    figure: str,
    values: list[float],
    direction: int,
    margin=None,
    show=ci_text,
    note="",
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


def missing(claim_id: ClaimId, needs: str) -> Claim:
    return Claim(claim_id, TEXTS[claim_id], "-", "-", "-", f"no data: needs {needs}", "nothing to test")
