# Used by `tiecli report`: its tables, built once as specs and rendered for the terminal, markdown and html.
"""Tables and pages. Every table is a `TableSpec` of strings; rich_table, markdown_table and
html_table render it, markdown_page and html_page put the headline, tables, figures and rules (an
appendix) together. The terminal gets the headline, a short claims table and the warnings
(terminal), and points to report.md for the rest; a table wider than the console is split into
narrower ones, each with the first column, so that no column is dropped and no header cut."""

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console, ConsoleOptions, JustifyMethod
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tiecli.display import num as _num
from tiecli.report.claims import VERDICT_RULE, Claim
from tiecli.report.gate import RULE as GATE_RULE
from tiecli.report.groups import Group
from tiecli.report.load import Run, Skipped
from tiecli.report.reference import Reference
from tiecli.report.stats import (
    EARLY_FRACTION,
    SPIKE_FACTOR,
    SPIKE_WINDOW,
    Comparison,
    EqualParams,
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
NO_DATA = "no data"  # the verdict of a row whose runs lack what it measures: "no data: needs ..."
BULLET = "  - "  # a headline line that is an item of the list above it
FOLD_MIN = 8  # on the terminal, a text column is at least this wide (or its header's width) before the table is split
PLOT_TITLES = {
    "val_loss.png": "Validation loss by mode (R6/C3)",
    "ppl_vs_params.png": "Perplexity vs non-embedding parameters (R5/C6)",
    "ppl_vs_tokens.png": "Perplexity vs tokens seen (R5)",
    "grad_cos.png": "Gradient cosine over training (R4)",
    "drift.png": "Drift from initialisation (C2/C7 drift)",
    "spectra.png": "Singular-value spectra of the input and output matrices",
}


@dataclass
class TableSpec:
    title: str
    note: str
    columns: list[str]
    rows: list[list[str]]
    text: bool = False  # every column is text (left-aligned, folded), not numbers


def _stat(ci: Interval | None, key: str = "mean", spec: str = ".4g") -> str:
    return _num(getattr(ci, key) if ci else None, spec)


def build_tables(
    groups: list[Group],
    comparisons: list[Comparison],
    equal: dict[str, EqualParams],
    claim_rows: list[Claim],
    skipped: list[Skipped],
    baseline: str,
    added: list[TableSpec],
    references: Sequence[Reference] = (),
) -> list[TableSpec]:
    """equal: {label: EqualParams} for every non-baseline group; the other groups are baselines.
    added: the tables behind the claims' rules (report.tables), placed before the claims table.
    references: pretrained models, added as rows to the geometry table (report.reference)."""
    by_group = {c.group.label: c for c in comparisons}
    versus = f"vs {baseline}, paired by seed"

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
        *added,
    ]
    tables.append(
        TableSpec(
            "Claims (tied vs untied, equal architecture unless stated)",
            f"verdict rule: {VERDICT_RULE}; labels: {GATE_RULE}; each claim's measure is stated under Rules (appendix)",
            ["claim", "comparison", "figure", "measured [95% CI]", "verdict", "why"],
            [[c.claim, c.comparison, c.figure, c.measured, c.verdict, c.why] for c in claim_rows],
            text=True,
        )
    )
    if skipped:
        tables.append(
            TableSpec(
                "Skipped run directories",
                "not used anywhere in this report",
                ["run directory", "reason"],
                [[s.path, s.reason] for s in skipped],
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
    validation split (tiecli/baselines.py, from summary.json), then each group's epochs and perplexity
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
            compared = [_stat(eq.base_perplexity), ci_text(eq.perplexity, 3, " %"), " and ".join(eq.between)]
        else:
            compared = ["n/a", "n/a", eq.why]
        return [g.label, f"{g.params['total']:,}", _stat(g.stats["perplexity"]), *compared]

    return TableSpec(
        "Validation at equal total parameters (smaller body)",
        "the baseline's log perplexity interpolated linearly in log(total parameters) between the two baseline sizes that "
        "bracket the group's total, seed by seed: an untied model of that total has a smaller body and fewer FLOPs; "
        f"delta ppl = 100 (exp(Δloss) - 1) {versus}; n/a: outside the baseline's sizes, or non-monotone (its loss does not fall "
        "across the bracket)",
        [
            "group",
            "total params",
            "perplexity",
            "baseline ppl at equal params",
            "delta ppl % [95% CI]",
            "interpolated between",
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
            f"jitter: sd of the changes in log grad_norm between logged steps over the first {EARLY_FRACTION:.0%} of steps "
            "(rules: claim C2 stability)",
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
            f"mean over seeds (intervals in results.json); in = input embedding, out = output matrix (the same matrix when tied); {note}"
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


def _drawn_width(widths: list[int]) -> int:
    """A rich table's width: each column, a space either side and a border; and the left edge."""
    return sum(widths) + 3 * len(widths) + 1


def _measure(spec: TableSpec, width: int) -> list[tuple[int, int, int]]:
    """Per column (need, word, natural). need: the least width it is drawn with, never under its header's
    (a column that does not fit at its need goes to the next table); word: its longest word's; natural:
    its longest cell's."""
    out = []
    for i, header in enumerate(spec.columns):
        cells = [row[i] for row in spec.rows]
        natural = max(len(text) for text in (header, *cells))
        word = max((len(w) for text in cells for w in text.split()), default=1)
        if i == 0:  # the group, repeated in every table: folded past a quarter of the width
            need = min(natural, max(len(header), width // 4))
        elif spec.text:  # folded text
            need = max(len(header), min(word, FOLD_MIN))
        else:  # numbers: never broken inside one
            need = max(len(header), word)
        out.append((need, min(max(word, need), natural), natural))
    return out


def split_columns(needs: list[int], width: int) -> list[list[int]]:
    """Column indices of each terminal table: the first column in each and the others in order, in as few
    tables as fit width, with about as many columns in each (else packed in order)."""
    packed = [[0]]
    for i in range(1, len(needs)):
        if len(packed[-1]) > 1 and _drawn_width([needs[c] for c in [*packed[-1], i]]) > width:
            packed.append([0])
        packed[-1].append(i)
    k, rest = len(packed), list(range(1, len(needs)))
    ends = [round(len(rest) * (n + 1) / k) for n in range(k)]
    even = [[0, *rest[start:end]] for start, end in zip([0, *ends], ends)]
    return even if all(_drawn_width([needs[c] for c in chunk]) <= width for chunk in even) else packed


def fit_widths(need: list[int], word: list[int], natural: list[int], width: int, text: bool = False) -> list[int]:
    """Column widths from their needs up to width: first so that words stay whole, then whole cells, the
    columns that lack the least first (numbers: as many whole cells as fit); text: the room left shared
    in proportion to what each column lacks, so that a long text column is not squeezed to a word a line
    by short ones made whole."""
    widths = list(need)
    for target in (word, natural):
        if text and target is natural:
            return share(widths, natural, width)
        for i in sorted(range(len(widths)), key=lambda i: target[i] - widths[i]):
            widths[i] += max(0, min(target[i] - widths[i], width - _drawn_width(widths)))
    return widths


def share(widths: list[int], natural: list[int], width: int) -> list[int]:
    """widths grown toward natural by the room left within width, in proportion to each column's lack."""
    lack = [max(0, n - w) for w, n in zip(widths, natural)]
    room = max(0, width - _drawn_width(widths))
    if sum(lack) <= room:
        return [max(w, n) for w, n in zip(widths, natural)]
    return [w + room * gap // sum(lack) for w, gap in zip(widths, lack)]


def rich_tables(spec: TableSpec, width: int) -> list[Table]:
    """The spec as terminal tables no wider than width: wide specs split, each part with the first column,
    every header whole; the note under the last."""
    measured = _measure(spec, width)
    chunks = split_columns([m[0] for m in measured], width)
    tables = []
    for n, chunk in enumerate(chunks, 1):
        need, word, natural = ([measured[c][k] for c in chunk] for k in range(3))
        widths = fit_widths(need, word, natural, width, spec.text)
        title = spec.title + (f" ({n}/{len(chunks)})" if len(chunks) > 1 else "")
        # escape(): "[95% CI]" and "[low, high]" are text here, not rich markup
        table = Table(
            title=escape(title), caption=escape(spec.note) if n == len(chunks) else None, caption_justify="left"
        )
        for c, w in zip(chunk, widths):
            justify: JustifyMethod = "left" if c == 0 or spec.text else "right"
            table.add_column(escape(spec.columns[c]), width=w, justify=justify, overflow="fold")
        for row in spec.rows:
            table.add_row(*(escape(row[c]) for c in chunk))
        tables.append(table)
    return tables


@dataclass
class TerminalTable:
    """A spec to print: rich_tables at the console's width, decided when it is printed."""

    spec: TableSpec

    def __rich_console__(self, console: Console, options: ConsoleOptions):
        yield from rich_tables(self.spec, options.max_width)


def rich_table(spec: TableSpec) -> TerminalTable:
    return TerminalTable(spec)


def markdown_table(spec: TableSpec) -> str:
    def cells(values):
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

    lines = [f"## {spec.title}", "", f"_{spec.note}_", "", cells(spec.columns), cells(["---"] * len(spec.columns))]
    return "\n".join(lines + [cells(row) for row in spec.rows]) + "\n"


def html_table(spec: TableSpec) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in spec.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in spec.rows)
    return f"<h2>{html.escape(spec.title)}</h2><p class=note>{html.escape(spec.note)}</p><table><tr>{head}</tr>{body}</table>"


def claims_summary(claim_rows: list[Claim]) -> TableSpec:
    """The claims table for the terminal: what each row measured and its verdict, label included."""
    return TableSpec(
        "Claims (tied vs untied, equal architecture unless stated)",
        "pilot and withheld verdicts (see above) show what the rule computed; why, figures and rules: report.md",
        ["claim", "comparison", "verdict", "measured [95% CI]"],
        [[c.claim, c.comparison, *short_verdict(c)] for c in claim_rows],
        text=True,
    )


def short_verdict(row: Claim) -> list[str]:
    """(verdict, measured); a row without data says what it needs where the measurement would be."""
    if row.verdict.startswith(NO_DATA):
        return [NO_DATA, row.verdict.removeprefix(NO_DATA).removeprefix(":").strip()]
    return [row.verdict, row.measured]


def terminal(
    headline: list[str], claim_rows: list[Claim], specs: list[TableSpec], skipped: list[Skipped], header: str, page: str
):
    """What `tiecli report` prints: the headline, the short claims table, the warnings, one line per run
    left out, the header (runs, groups, sources) and where the full tables are (page: report.md's path).
    Yields rich renderables."""
    for line in headline:
        yield Text(line)
    yield Text("")
    yield rich_table(claims_summary(claim_rows))
    yield from (rich_table(s) for s in specs if s.title == "Warnings")
    for s in skipped:
        yield Text(f"skipped {s.path}: {s.reason}")
    yield Text(header)
    yield Text(f"every table, the figures and the rules: {page}")


def markdown_page(
    header: str, rules: dict, specs: list[TableSpec], images: dict, absent: list[str], headline: Sequence[str] = ()
) -> str:
    """report.md: the headline, every table, the figures (linked, as files next to it), then the rules."""
    return "\n".join(
        [
            "# tiecli report",
            "",
            *(line[2:] if line.startswith(BULLET) else f"{line}\n" for line in headline),
            "",
            header,
            "",
            *(markdown_table(s) for s in specs),
            "## Figures",
            "",
            *(f"### {PLOT_TITLES[name]}\n\n![{PLOT_TITLES[name]}]({name})\n" for name, png in images.items() if png),
            *absent,
            "",
            "## Appendix: rules",
            "",
            *(f"- **{k}**: {v}" for k, v in rules.items()),
            "",
        ]
    )


def html_headline(headline: Sequence[str]) -> str:
    """The headline's lines as paragraphs, each run of bullet lines as one list."""

    def bullet(i: int) -> bool:
        return 0 <= i < len(headline) and headline[i].startswith(BULLET)

    parts = [
        ("" if bullet(i - 1) else "<ul>")
        + f"<li>{html.escape(line.removeprefix(BULLET))}</li>"
        + ("" if bullet(i + 1) else "</ul>")
        if bullet(i)
        else f"<p>{html.escape(line)}</p>"
        for i, line in enumerate(headline)
    ]
    return "<div class=headline>" + "".join(parts) + "</div>"


def html_page(
    header: str, rules: dict, specs: list[TableSpec], images: dict, absent: list[str], headline: Sequence[str] = ()
) -> str:
    """One file with everything inside: the figures are base64 data URIs, no external assets."""
    style = (
        "body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em}table{border-collapse:collapse;margin:.5em 0 1.5em}"
        "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}th{background:#f3f3f3}.note{color:#555;font-size:13px}img{max-width:100%}"
    )
    figures = "".join(
        f"<h3>{html.escape(PLOT_TITLES[name])}</h3><img alt='{html.escape(PLOT_TITLES[name])}' src='data:image/png;base64,{base64.b64encode(png).decode()}'>"
        for name, png in images.items()
        if png
    )
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>tiecli report</title><style>{style}</style></head><body>"
        f"<h1>tiecli report</h1>{html_headline(headline)}<p>{html.escape(header)}</p>"
        + "".join(html_table(s) for s in specs)
        + f"<h2>Figures</h2>{figures}"
        + "".join(f"<p class=note>{html.escape(a)}</p>" for a in absent)
        + "<h2>Appendix: rules</h2><ul>"
        + "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in rules.items())
        + "</ul></body></html>\n"
    )
