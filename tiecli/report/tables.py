# Used by `tiecli report`: the tables every report has, built as render.TableSpec.
"""Parameters, validation perplexity, the data each group trained on, the equal-parameter view, the
training-dynamics and geometry diagnostics, the warnings about related-form pairs, the claims table and
the skipped runs; `build_tables` puts them in the report's order, with the tables behind the claims'
rules (rule_tables.py) before the claims table."""

from collections.abc import Sequence
from dataclasses import dataclass

from tiecli.formats import num as _num
from tiecli.report.claims_rules import VERDICT_RULE, Claim
from tiecli.report.compare import PARAMS_MATCH, Comparison, EqualParams
from tiecli.report.gate import RULE as GATE_RULE
from tiecli.report.groups import Group
from tiecli.report.load import Run, Skipped
from tiecli.report.reference import Reference
from tiecli.report.render import TableSpec
from tiecli.report.stats import (
    EARLY_FRACTION,
    EXCURSION_FACTOR,
    SPIKE_FACTOR,
    SPIKE_WINDOW,
    Interval,
    ci_text,
    embedding_share,
)

# Two diagnostics tables, so that each fits a terminal: training dynamics, then end-of-training geometry.
DYNAMICS_COLUMNS = (
    ("grad_cos", "grad cos"),
    ("grad_cancel", "grad cancel"),
    ("drift_input", "drift in"),
    ("drift_output", "drift out"),
    ("loss_spikes", "loss spikes"),
    ("grad_norm_jitter", "grad-norm jitter"),
    ("grad_norm_excursions", "grad-norm excursions"),
)
GEOMETRY_COLUMNS = (
    ("anisotropy_input", "anisotropy in"),
    ("anisotropy_output", "anisotropy out"),
    ("effective_rank_input", "eff. rank in"),
    ("effective_rank_output", "eff. rank out"),
    ("cka", "CKA in/out"),
    ("row_cosine", "row cos in/out"),
    ("forms_contrast_input", "forms contrast in"),
    ("forms_contrast_output", "forms contrast out"),
)


def _stat(ci: Interval | None, key: str = "mean", spec: str = ".4g") -> str:
    return _num(getattr(ci, key) if ci else None, spec)


@dataclass(frozen=True)
class TableInputs:
    """What the report's tables read. equal: {label: EqualParams} for every non-baseline group (the other groups
    are baselines); claims: the claims table's rows as shown (gate); added: the tables behind the claims' rules
    (rule_tables), placed before the claims table; references: pretrained models, added as rows to the geometry
    table (report.reference)."""

    groups: list[Group]
    comparisons: list[Comparison]
    equal: dict[str, EqualParams]
    claims: list[Claim]
    skipped: list[Skipped]
    baseline: str
    added: list[TableSpec]
    references: Sequence[Reference] = ()


def build_tables(inputs: TableInputs) -> list[TableSpec]:
    """Every table of the report, in its order."""
    groups, equal, references = inputs.groups, inputs.equal, inputs.references
    by_group = {c.group.label: c for c in inputs.comparisons}
    versus = f"vs {inputs.baseline}, paired by seed"

    def delta(label, key):
        c = by_group.get(label)
        return ci_text(getattr(c, key), 3, " %") if c else "-" if label in equal else "baseline"

    tables = [
        parameter_table(groups, by_group),
        validation_table(groups, delta, versus),
        *context_tables(groups),
        equal_table(groups, equal, versus),
        *diagnostics_tables(groups, references),
        *pairs_warnings(groups),
        *inputs.added,
    ]
    tables.append(
        TableSpec(
            "Claims (tied vs untied, equal architecture unless stated)",
            f"verdict rule: {VERDICT_RULE}; labels: {GATE_RULE}; each claim's measure is stated under Rules (appendix)",
            ["claim", "comparison", "figure", "measured [95% CI]", "verdict", "why"],
            [[c.claim, c.comparison, c.figure, c.measured, c.verdict, c.why] for c in inputs.claims],
            text=True,
        )
    )
    if inputs.skipped:
        tables.append(
            TableSpec(
                "Skipped run directories",
                "not used anywhere in this report",
                ["run directory", "reason"],
                [[s.path, s.reason] for s in inputs.skipped],
                text=True,
            )
        )
    return tables


def parameter_table(groups: list[Group], by_group: dict[str, Comparison]) -> TableSpec:
    def row(g):
        p = g.params
        saved = f"{by_group[g.label].saved_params:,}" if g.label in by_group else "-"
        return [
            g.label,
            f"{p['total']:,}",
            f"{p['input_embedding']:,}",
            f"{p['output_matrix']:,}",
            f"{p['shared']:,}",
            f"{p['non_embedding']:,}",
            f"{embedding_share(p):.1%}",
            saved,
        ]

    return TableSpec(
        "Parameters (equal architecture: each group at its own model size)",
        "embedding share: input embedding + output matrix (+ shared) over the total; saved: the baseline's total minus the group's",
        [
            "group",
            "total",
            "input embedding",
            "output matrix",
            "shared",
            "non-embedding",
            "embedding share",
            "saved vs baseline",
        ],
        [row(g) for g in groups],
    )


def validation_table(groups: list[Group], delta, versus: str) -> TableSpec:
    return TableSpec(
        "Validation at equal architecture (same model size)",
        f"full validation split; mean over seeds, sd and 95% t-interval [low, high]; delta ppl: {versus}, 100 (exp(Δloss) - 1) "
        "with the Δloss interval's bounds transformed alike, in % (negative: lower perplexity than the baseline)",
        [
            "group",
            "seeds",
            "val loss (sd)",
            "perplexity [95% CI]",
            "bits/byte [95% CI]",
            "delta ppl % [95% CI]",
            "tokens/s",
        ],
        [
            [
                g.label,
                str(len(g.runs)),
                f"{_stat(g.stats['loss'])} ({_stat(g.stats['loss'], 'sd', '.2g')})",
                ci_text(g.stats["perplexity"], 4),
                ci_text(g.stats["bits_per_byte"], 4),
                delta(g.label, "perplexity"),
                _stat(g.stats["tokens_per_s"], spec=",.0f"),
            ]
            for g in groups
        ],
    )


def corpus_label(run: Run) -> str:
    vocab = (run.corpus or {}).get("vocab_size")
    return f"{run.choices.get('data', '?')} / {run.choices.get('tokenizer', '?')}" + (f" {vocab:,}" if vocab else "")


def context_tables(groups: list[Group]) -> list[TableSpec]:
    """How far past count models the runs got: each corpus's unigram and bigram scores on the
    validation split (tiecli/measure/baselines.py, from summary.json), then each group's epochs and perplexity
    against them."""
    corpora: dict[str, dict | None] = {}
    for g in groups:
        for r in g.runs:
            corpora.setdefault(corpus_label(r), (r.corpus or {}).get("baselines"))

    def scores(b: dict | None) -> list[str]:
        if not b:
            return ["n/a: run predates baselines"] + ["-"] * 4
        uni, bi = b["unigram"], b["bigram"]
        return [
            _num(uni["perplexity"], ".4g"),
            f"{uni['bits_per_byte']:.3f}",
            _num(bi["perplexity"], ".4g"),
            f"{bi['bits_per_byte']:.3f}",
            f"{bi['k']:g}",
        ]

    def against(g: Group, key: str) -> str:
        base = g.stats.get(key)
        return f"{g.stats['perplexity'].mean / base.mean:.2f}x" if base and g.stats["perplexity"] else "n/a"

    return [
        TableSpec(
            "Context: count-model baselines of the validation split",
            "unigram: add-one counts of the training split; bigram: add-k pair counts, k tuned on the validation split "
            "itself (which can only flatter it); scored on the same tokens as the runs",
            ["data / tokenizer", "unigram ppl", "unigram bits/byte", "bigram ppl", "bigram bits/byte", "bigram k"],
            [[label, *scores(b)] for label, b in corpora.items()],
        ),
        TableSpec(
            "Context: training reached per group",
            "epochs: training tokens seen / tokens in the training split; ppl vs unigram, bigram: the group's mean "
            "validation perplexity divided by the count model's (below 1.00x: better than that model)",
            ["group", "data / tokenizer", "epochs", "val perplexity", "ppl vs unigram", "ppl vs bigram"],
            [
                [
                    g.label,
                    corpus_label(g.runs[0]),
                    _stat(g.stats.get("epochs"), spec=".3g"),
                    _stat(g.stats["perplexity"]),
                    against(g, "unigram_perplexity"),
                    against(g, "bigram_perplexity"),
                ]
                for g in groups
            ],
        ),
    ]


def equal_table(groups: list[Group], equal: dict[str, EqualParams], versus: str) -> TableSpec:
    def row(g):
        eq = equal[g.label]
        if eq.between:
            own = [str(eq.split), _stat(eq.own_perplexity)]
            compared = [_stat(eq.base_perplexity), ci_text(eq.perplexity, 3, " %"), " and ".join(eq.between)]
        else:  # why is set whenever between is not
            own, compared = ["val", _stat(g.stats["perplexity"])], ["n/a", "n/a", str(eq.why)]
        return [g.label, f"{g.params['total']:,}", *own, *compared]

    return TableSpec(
        "Perplexity at equal total parameters (smaller body)",
        "on the test split when every run read has one, else the validation split, as the claims; "
        "the baseline's log perplexity interpolated linearly in log(total parameters) between the two baseline sizes that "
        "bracket the group's total, seed by seed: an untied model of that total has a smaller body and fewer FLOPs; a "
        f"baseline group within {PARAMS_MATCH:.0%} of the group's total (one narrowed to match it) is read as is, "
        f"its offset shown; delta ppl = 100 (exp(Δloss) - 1) {versus}; n/a: outside the baseline's sizes, or non-monotone "
        "(its loss does not fall across the bracket)",
        [
            "group",
            "total params",
            "split",
            "perplexity",
            "baseline ppl at equal params",
            "delta ppl % [95% CI]",
            "baseline group(s)",
        ],
        [row(g) for g in groups if g.label in equal],
    )


def diagnostics_tables(groups: list[Group], references: Sequence[Reference] = ()) -> list[TableSpec]:
    """The two diagnostics tables, each only when some group has its data; the geometry table ends with
    the reference rows of pretrained models."""
    diagnostics = (
        (
            "Training dynamics at equal architecture (claims R4, C2/C7 drift, C2 stability)",
            DYNAMICS_COLUMNS,
            "grad cos, grad cancel: mean over training (metrics.jsonl); drift |W - W0|_F / |W0|_F at the last geometry.json entry; "
            f"loss spikes: logged train losses above {SPIKE_FACTOR:g} x the median of the {SPIKE_WINDOW} before; grad-norm "
            f"jitter: sd of the changes in log grad_norm between logged steps over the first {EARLY_FRACTION:.0%} of steps; "
            f"grad-norm excursions: logged grad_norm above {EXCURSION_FACTOR:g} x the median of the {SPIKE_WINDOW} before, "
            "per run (rules: claim C2 stability)",
        ),
        (
            "Geometry at the last geometry entry, equal architecture (claim R3)",
            GEOMETRY_COLUMNS,
            "forms contrast = related-form pair cosine - the cosine of frequency-matched random pairs; CKA and row cosine compare the input and output matrices (untied only)",
        ),
    )
    ref_note = (
        "; reference rows: one pretrained model each, every ordinary token counted once (tiecli geometry --model; "
        + ", ".join(r.path for r in references)
        + ")"
        if references
        else ""
    )
    return [
        TableSpec(
            title,
            f"mean over seeds (intervals in results.csv); in = input embedding, out = output matrix (the same matrix when tied); {note}"
            + (ref_note if columns is GEOMETRY_COLUMNS else ""),
            ["group", *(name for _, name in columns)],
            [[g.label, *(_stat(g.stats[key], spec=".3g") for key, _ in columns)] for g in groups]
            + [
                [r.label, *(_num(r.values.get(key), ".3g") for key, _ in columns)]
                for r in (references if columns is GEOMETRY_COLUMNS else ())
            ],
        )
        for title, columns, note in diagnostics
        if any(g.stats[key] for g in groups for key, _ in columns) or (references and columns is GEOMETRY_COLUMNS)
    ]


def pairs_warnings(groups: list[Group]) -> list[TableSpec]:
    """A warning for each group with runs that measured related forms on no pair: forms contrast and
    claim R3 then have no data, and the table says why instead of showing an empty cell."""
    rows = []
    for g in groups:
        warnings = [w for w in map(pairs_warning, g.runs) if w]
        rows += [
            [g.label, w + (f" ({warnings.count(w)} of {len(g.runs)} seeds)" if warnings.count(w) < len(g.runs) else "")]
            for w in dict.fromkeys(warnings)
        ]
    return (
        [
            TableSpec(
                "Warnings",
                "related-form contrast (claim R3) is measured on the pairs of diag.pairs, else on English suffix rules",
                ["group", "warning"],
                rows,
                text=True,
            )
        ]
        if rows
        else []
    )


def pairs_warning(run: Run) -> str | None:
    """Why a run's related-form contrast has no pair, from its last geometry entry; None when it has pairs."""
    pairs = run.pairs or {}
    found, source = pairs.get("found"), pairs.get("source", "the pairs file")
    if found == 0:
        skipped = pairs.get("skipped_lines")
        where = f"skipped {skipped} lines of {source}" if skipped is not None else source
        return f"related forms: found 0 pairs ({where}); forms contrast not measured"
    if pairs.get("used") == 0:
        return (
            f"related forms: 0 of {found if found is not None else 'the'} pairs from {source} usable (their tokens do not "
            "occur in the training data); forms contrast not measured"
        )
    return None


# --- renderers ----------------------------------------------------------------------------------------
