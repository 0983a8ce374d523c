# Used by `tiecli report`: the few lines the report opens with, ahead of every table and rule.
"""What was compared, the main difference with its interval, how far the runs got, and whether the
verdicts below can be read as results (report.gate). Every number is one the tables show too."""

import tiecli.report.gate as gate
from tiecli.report.claims_rules import Claim, ClaimId
from tiecli.report.compare import Comparison, compare
from tiecli.report.groups import GROUPS, Baseline, Group
from tiecli.report.render import BULLET
from tiecli.report.stats import Interval, mean_ci, ppl_change
from tiecli.report.tables import corpus_label

MAX_PAIRS = 4  # pairs named in the main difference; the rest are in the tables


def lines(
    groups: list[Group],
    rows: list[Claim],
    found: dict[str, list[gate.Condition]],
    comparisons: list[Comparison],
    free: tuple[str, ...] = (),
) -> list[str]:
    """rows: the claims table, labelled (gate.label_rows); comparisons: against the report's --baseline,
    the main difference when there is no tied vs untied pair."""
    return [
        compared(groups, free),
        *difference(groups, rows, comparisons, free),
        reached(groups),
        *verdicts(found),
    ]


def _listed(values) -> str:
    return ", ".join(map(str, dict.fromkeys(values)))


def compared(groups: list[Group], free: tuple[str, ...] = ()) -> str:
    """Modes, sizes, budgets, corpus and seeds, any other key the groups differ in, and what --select chose."""
    budgets = []
    for g in groups:
        epochs = g.stats.get("epochs")
        budgets.append(
            f"{g.runs[0].steps:,} steps ({g.tokens:,} tokens" + (f", {epochs.mean:.2g} epochs)" if epochs else ")")
        )
    seeds = sorted({r.seed for g in groups for r in g.runs})
    counts = sorted({len(g.runs) for g in groups})
    per_group = f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}-{counts[-1]}"
    other = [k for g in groups for k in g.parts if k not in GROUPS]
    return (
        f"Compared: {' vs '.join(dict.fromkeys(g.mode for g in groups))}; model {_listed(g.choices.get('model') for g in groups)}; "
        f"{_listed(budgets)}; {_listed(corpus_label(g.runs[0]) for g in groups)}; seeds {_listed(seeds)} ({per_group} per group)"
        + (f"; also differing: {_listed(other)}" if other else "")
        + "".join(
            f"; {key} chosen by --select: " + ", ".join(f"{g.setting.get(key)} ({g.label})" for g in groups)
            for key in free
        )
        + f"; {len(groups)} groups."
    )


def difference(
    groups: list[Group], rows: list[Claim], comparisons: list[Comparison], free: tuple[str, ...]
) -> list[str]:
    """Tied vs untied perplexity per pair, on the test split when every run of the pair has it, with its C6 verdict;
    the report's --baseline comparisons when no tied vs untied pair exists."""
    tied = [c for c in compare(groups, Baseline("tying", "untied", free)) if c.group.mode == "tied"]
    pairs = tied or comparisons
    if not pairs:
        return ["Main difference: none measured (no two groups differ only in the tying mode or the --baseline key)."]
    c6 = {r.comparison: r.verdict for r in rows if r.claim == ClaimId.C6} if tied else {}
    out = []
    for c in pairs[:MAX_PAIRS]:
        seeds = len(c.delta_loss(c.split))
        verdict = f"; C6 {c6[c.group.label]}" if c.group.label in c6 else ""
        where = (
            " ".join(v for k, v in c.group.parts.items() if k != "tying")
            if tied
            else f"{c.group.label} vs {c.base.label}"
        )
        out.append(
            f"{'Tied vs untied' if tied else 'Against the baseline'}, {c.split} perplexity, paired by seed, {where}: "
            f"{signed(ppl_change(mean_ci(c.delta_loss(c.split))))} ({seeds} seed{'s' if seeds != 1 else ''}{verdict})"
            f"{no_test(c)}."
        )
    if len(pairs) > MAX_PAIRS:
        out.append(f"... and {len(pairs) - MAX_PAIRS} more pairs in the validation and test tables.")
    return out


def no_test(c: Comparison) -> str:
    """Why a pair is read on val though some of its runs have a test evaluation: the runs whose eval.json has none
    (nothing when the pair is on test, or when none of its runs has one)."""
    runs = (*c.group.runs, *c.base.runs)
    missing = [r.name for r in runs if not r.test]
    if c.split == "test" or len(missing) == len(runs):
        return ""
    return f"; on val, not test: {len(missing)} run{'s' if len(missing) != 1 else ''} without a test evaluation, e.g. {missing[0]}"


def signed(ci: Interval | None) -> str:
    """A % change with its sign and its 95% interval (none with one seed)."""
    if ci is None:
        return "n/a"
    bounds = f" [{ci.low:+.3g}, {ci.high:+.3g}]" if ci.low is not None and ci.high is not None else ""
    return f"{ci.mean:+.3g} %{bounds}"


def reached(groups: list[Group]) -> str:
    """Each mode's validation perplexity as a multiple of the count models' (a range over its groups)."""

    def multiple(mode: str, key: str) -> str:
        ratios = [
            g.stats["perplexity"].mean / g.stats[key].mean
            for g in groups
            if g.mode == mode and g.stats.get(key) and g.stats.get("perplexity")
        ]
        if not ratios:
            return "n/a"
        low, high = min(ratios), max(ratios)
        return f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}x"

    modes = dict.fromkeys(g.mode for g in groups)
    if not any(g.stats.get("unigram_perplexity") for g in groups):
        return "How far the runs got: unknown (no count-model baselines in summary.json: runs made before tiecli 0.1)."
    parts = [
        f"{m} {multiple(m, 'unigram_perplexity')} unigram, {multiple(m, 'bigram_perplexity')} bigram" for m in modes
    ]
    return f"How far the runs got (validation perplexity over the count models', Context tables): {'; '.join(parts)}."


def verdicts(found: dict[str, list[gate.Condition]]) -> list[str]:
    """Whether the verdicts can be read: each condition that fired, with its fix; or that none did."""
    kind = gate.strongest(found)
    if kind is None:
        return [
            f"Verdicts: every group off the unigram plateau (at most {gate.PLATEAU_FRACTION:g}x), {gate.MIN_SEEDS}+ seeds, "
            f"each learning rate selected with --select inside its grid, on {gate.MIN_SEEDS}+ seeds."
        ]
    shown = (
        "withheld: each shows what its rule computed, and decides nothing"
        if kind == gate.WITHHELD
        else "pilot only: each shows what its rule computed, to be confirmed"
    )
    return [f"Verdicts {shown}, because:", *(f"{BULLET}{found}: {fix}." for found, fix in gate.summary(found))]
