# Used by `tiecli report`: a table spec, and the report as markdown (report.md) and html (report.html).
"""Every table of the report is a `TableSpec` of strings, built in tables.py and rule_tables.py;
markdown_table and html_table render one, markdown_page and html_page put the headline, the tables,
the figures and the rules (an appendix) together. The terminal's output is terminal.py's."""

import base64
import html
from collections.abc import Sequence
from dataclasses import dataclass

NO_DATA = "no data"  # the verdict of a row whose runs lack what it measures: "no data: needs ..."
NOT_TESTED = "not tested"  # the verdict of a row the design cannot test: "not tested: one budget ..."
BULLET = "  - "  # a headline line that is an item of the list above it
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


def markdown_table(spec: TableSpec) -> str:
    def cells(values):
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

    lines = [f"## {spec.title}", "", f"_{spec.note}_", "", cells(spec.columns), cells(["---"] * len(spec.columns))]
    return "\n".join(lines + [cells(row) for row in spec.rows]) + "\n"


def html_table(spec: TableSpec) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in spec.columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(v)}</td>" for v in row) + "</tr>" for row in spec.rows)
    return f"<h2>{html.escape(spec.title)}</h2><p class=note>{html.escape(spec.note)}</p><table><tr>{head}</tr>{body}</table>"


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
