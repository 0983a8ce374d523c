# Used by `tiecli report`: the tables behind the claims' rules, built as render.TableSpec and placed before the claims table.
"""Per-pair convergence, equal compute, gradients against the baseline (R4), input/output agreement
(C2/C7), generalisation gap, the test split, and the groups --select left out. Each table is built
only when some group has its data."""

from tiecli.formats import num as _num
from tiecli.report.compare import Comparison, EqualParams
from tiecli.report.groups import Group, NotSelected
from tiecli.report.render import TableSpec
from tiecli.report.stats import MIN_EVALS, Interval, ci_text, gap, mean_ci, reach


def _mean(ci: Interval | None, spec: str = ".3g") -> str:
    return _num(ci.mean if ci else None, spec)


def added_tables(
    groups: list[Group],
    comparisons: list[Comparison],
    compute: dict[str, EqualParams],
    dropped: list[NotSelected],
    baseline: str,
) -> list[TableSpec]:
    by_group = {c.group.label: c for c in comparisons}
    versus = f"vs {baseline}, paired by seed"
    tables = [
        convergence_table(comparisons, versus),
        compute_table(groups, compute, versus),
        gradient_table(groups, by_group, versus),
        agreement_table(groups),
        gap_table(groups, by_group, versus),
        test_table(groups, by_group, versus),
        selection_table(dropped),
    ]
    return [t for t in tables if t.rows]


def convergence_table(comparisons: list[Comparison], versus: str) -> TableSpec:
    def row(c):
        steps = [mean_ci(reach(r, c.target)[0] for r in g.runs) for g in (c.group, c.base)]
        return [
            c.group.label,
            c.base.label,
            _num(c.target),
            *(ci_text(s, 4) for s in steps),
            ci_text(c.steps, 3, " %"),
            c.note() or "-",
        ]

    return TableSpec(
        "Convergence at equal architecture (claims R6/C3)",
        "target per pair: the higher of the two groups' best in-training validation losses (every run of the pair reaches it), or "
        f"--target-loss; steps interpolated linearly between evaluations; delta steps {versus}, in % (negative: faster); note: "
        f"runs that never reach the target, or fewer than {MIN_EVALS} evaluations before it",
        ["group", "baseline", "target loss", "steps [95% CI]", "baseline steps", "delta steps % [95% CI]", "note"],
        [row(c) for c in comparisons],
    )


def compute_table(groups: list[Group], compute: dict[str, EqualParams], versus: str) -> TableSpec:
    def row(g):
        eq = compute[g.label]
        compared = (
            [
                eq.split,
                _mean(eq.own_perplexity, ".4g"),
                _mean(eq.base_perplexity, ".4g"),
                ci_text(eq.perplexity, 3, " %"),
                eq.note(),
            ]
            if eq.between
            else ["val", _mean(g.stats["perplexity"], ".4g"), "n/a", "n/a", eq.why]
        )
        return [g.label, _mean(g.stats["flops"], ".3g"), *compared]

    return TableSpec(
        "Perplexity at equal training compute",
        "on the test split when every run read has one, else the validation split, as the claims; "
        "FLOPs = 6 x (non-embedding parameters + V x C) x tokens: the output head is a V x C matmul tied or not, the input "
        "embedding a lookup; the baseline's loss interpolated linearly in log FLOPs between the two baseline groups (any size or "
        "token budget) that bracket the group's FLOPs, seed by seed; n/a outside them or when the baseline's loss does not fall "
        f"across the bracket (non-monotone); delta ppl = 100 (exp(Δloss) - 1) {versus}",
        [
            "group",
            "FLOPs",
            "split",
            "perplexity",
            "baseline ppl at equal FLOPs",
            "delta ppl % [95% CI]",
            "baseline point(s)",
        ],
        [row(g) for g in groups if g.label in compute],
    )


def gradient_table(groups: list[Group], by_group: dict[str, Comparison], versus: str) -> TableSpec:
    def row(g):
        c = by_group.get(g.label)
        delta = ci_text(mean_ci(c.delta(lambda r: r.diag.get("grad_cos"))), 3) if c else "baseline"
        return [
            g.label,
            _mean(g.stats["grad_cos"]),
            delta,
            _mean(g.stats["grad_cos_z"]),
            _mean(g.stats["grad_norm_lost_pct"]),
        ]

    return TableSpec(
        "Gradient paths of the token matrices (claim R4)",
        "means over training, then over seeds: grad cos = cos(G_in, G_out); delta cos "
        f"{versus} (in untied modes G_in and G_out are the gradients of two different matrices at different weights: a reference "
        "for two unrelated paths, not what a tied model would see); z: grad_cos_present against its row-permutation null; "
        "norm lost: % of the summed gradient's norm lost to cancellation",
        ["group", "grad cos", "delta cos [95% CI]", "z vs null", "norm lost %"],
        [row(g) for g in groups if g.stats["grad_cos"]],
    )


def agreement_table(groups: list[Group]) -> TableSpec:
    def row(g):
        s = g.stats
        return [
            g.label,
            f"{_mean(s['cka_init'])} -> {_mean(s['cka'])}",
            _mean(s["knn_overlap"]),
            _mean(s["row_cosine"]),
            f"{_mean(s['distance_init'])} -> {_mean(s['distance'])}",
        ]

    return TableSpec(
        "Input/output agreement without a tie (claim C2/C7)",
        "mean over seeds, step 0 -> last geometry entry, over tokens seen in training: linear CKA(W_in, W_out); kNN: overlap of "
        "the 10 nearest neighbours; row cos: per-token cos(W_in[i], W_out[i]); distance |W_in - W_out|_F / |W_in|_F "
        "(untied_init starts at CKA 1, distance 0; tied modes are one matrix)",
        ["group", "CKA", "kNN overlap", "row cos", "distance"],
        [row(g) for g in groups if g.stats["cka"]],
    )


def gap_table(groups: list[Group], by_group: dict[str, Comparison], versus: str) -> TableSpec:
    def row(g):
        c = by_group.get(g.label)
        delta = ci_text(mean_ci(c.delta(gap)), 3) if c else "baseline"
        matched = ci_text(mean_ci(c.delta_matched_gap()), 3) if c else "baseline"
        sources = ", ".join(sorted({r.gap[2] for r in g.runs if r.gap}))
        return [g.label, _mean(g.stats["train_loss"], ".4g"), ci_text(g.stats["gap"], 3), delta, matched, sources]

    return TableSpec(
        "Generalisation gap (claim R5/C2 gap)",
        "gap = val loss - train loss, per run: eval.json's whole val and train splits when present, else the last metrics.jsonl "
        f"row with val_loss and train_eval_loss (fixed windows of each split); delta gap {versus} (negative: tied generalises better); "
        "at equal fit: the same delta with both runs of a seed read where their in-training train loss (metrics.jsonl) first falls "
        "to the higher of their final ones, so neither gap is smaller only because that run learned less",
        ["group", "train loss", "gap [95% CI]", "delta gap [95% CI]", "delta gap at equal fit [95% CI]", "from"],
        [row(g) for g in groups if g.stats["gap"]],
    )


def test_table(groups: list[Group], by_group: dict[str, Comparison], versus: str) -> TableSpec:
    def row(g):
        c = by_group.get(g.label)
        delta = ci_text(c.test_perplexity, 3, " %") if c else "baseline"
        return [
            g.label,
            str(g.stats["test_loss"].n),
            _mean(g.stats["test_loss"], ".4g"),
            ci_text(g.stats["test_perplexity"], 4),
            delta,
        ]

    return TableSpec(
        "Test split (final numbers; any selection was made on val)",
        f"eval.json test: the whole test split; delta ppl = 100 (exp(Δloss) - 1) {versus}, over the seeds both have on test",
        ["group", "seeds", "test loss", "test perplexity [95% CI]", "delta ppl % [95% CI]"],
        [row(g) for g in groups if g.stats["test_loss"]],
    )


def selection_table(dropped: list[NotSelected]) -> TableSpec:
    return TableSpec(
        "Not selected (--select)",
        "left out of every other table: among the groups equal but for the selected keys, the one with the lowest seed-mean final "
        "validation loss was kept, the means taken over the seeds every one of those groups has (seeds compared; all of each "
        "group's seeds when none is shared; a group screened on fewer seeds than the others share is compared with the selected "
        "one on the seeds both have)",
        ["group", "its value", "val loss", "selected instead", "selected val loss", "seeds compared"],
        [
            [
                d.group,
                d.values,
                _num(d.loss, ".4g"),
                d.chosen,
                _num(d.chosen_loss, ".4g"),
                f"{d.seeds} (screened)" if d.screened else str(d.seeds or "none shared"),
            ]
            for d in dropped
        ],
        text=True,
    )
