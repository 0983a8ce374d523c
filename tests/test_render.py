"""The report's tables on an 80-column terminal (split, never cut), the files keeping every column in
one table, and the warning for related forms measured on no pair."""

import dataclasses

import pytest
from helpers import write_run
from rich.console import Console
from typer.testing import CliRunner

from tiecli.cli import app
from tiecli.report import claims_rules, load
from tiecli.report.groups import group_runs
from tiecli.report.render import TableSpec
from tiecli.report.tables import GEOMETRY_COLUMNS, pairs_warnings
from tiecli.report.terminal import claims_summary, rich_table, rich_tables

runner = CliRunner()


def header_cells(text: str) -> set[str]:
    """Every header cell of the rich tables in text: header rows are drawn between heavy bars."""
    return {cell.strip() for line in text.splitlines() if line.startswith("┃") for cell in line.split("┃")[1:-1]}


def markdown_tables(md: str) -> dict[str, list[str]]:
    """report.md's tables as {title: column headers}."""
    tables, title, lines = {}, None, md.splitlines()
    for line, below in zip(lines, lines[1:]):
        if line.startswith("## "):
            title = line[3:]
        elif line.startswith("| ") and below.startswith("| ---"):
            tables[title] = [cell.strip() for cell in line.strip("|").split(" | ")]
    return tables


def printed(renderables, width: int = 80) -> str:
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    for r in renderables:
        console.print(r)
    return console.export_text()


def table_cells(text: str) -> list[list[str]]:
    """Every body cell of the rich tables in text, each cell as its lines: a row's first line has its
    first cell filled, the lines below with an empty first cell continue it."""
    rows: list[list[list[str]]] = []
    for line in text.splitlines():
        if not line.startswith("│"):
            continue
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells[0] or not rows:
            rows.append([[c] if c else [] for c in cells])
        else:
            for held, c in zip(rows[-1], cells):
                held += [c] if c else []
    return [cell for row in rows for cell in row]


def crowded(lines: list[str]) -> bool:
    """A cell folded to about a word a line: more than two lines, and fewer than two words on each."""
    return len(lines) > max(2, (len(" ".join(lines).split()) + 1) // 2)


@pytest.mark.slow
def test_the_terminal_report_fits_80_columns_with_no_word_per_line_column(sweep):
    result = runner.invoke(app, ["report", str(sweep)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert max(map(len, result.output.splitlines())) <= 80 and "…" not in result.output
    assert result.output.startswith("Compared: tied vs untied; model nano, micro")  # the headline first
    assert header_cells(result.output) == {"claim", "comparison", "verdict", "measured [95% CI]"}
    # rich folds a path longer than a line wherever it must: compare with every line break and space taken out
    assert f"therules:{sweep / 'report' / 'report.md'}" in "".join(result.output.split())
    cells = table_cells(result.output)
    assert len(cells) > 40
    assert not [lines for lines in cells if crowded(lines)]
    # the files keep every table, every column in one table, and the rules after them
    md = (sweep / "report" / "report.md").read_text()
    tables = markdown_tables(md)
    geometry = next(headers for title, headers in tables.items() if title.startswith("Geometry"))
    assert [name for _, name in GEOMETRY_COLUMNS] == geometry[1:]
    assert tables["Claims (tied vs untied, equal architecture unless stated)"] == [
        "claim",
        "comparison",
        "figure",
        "measured [95% CI]",
        "verdict",
        "why",
    ]
    assert md.index("Compared:") < md.index("## Parameters") < md.index("## Appendix: rules")
    html = (sweep / "report" / "report.html").read_text()
    assert "<th>forms contrast out</th>" in html
    assert html.index("<div class=headline><p>Compared:") < html.index("<h2>Parameters") < html.index("Appendix: rules")


def test_the_terminal_claims_table_keeps_long_cells_readable_at_80_columns():
    """claim, comparison, verdict and measured in one table at 80 columns, no cell at a word a line; a row
    without data says what it needs where the measurement would be."""
    long = claims_rules.Claim(
        "R5/C2 gap (equal fit)",
        "says",
        "nano tied train.lr=0.001 -> micro tied train.lr=0.001",
        "generalisation gap table",
        "Δgap -0.0225 [-0.0593, 0.0144] nats at equal train loss (metrics.jsonl)",
        "withheld: inconclusive",
        "why",
    )
    empty = claims_rules.missing("R5", "tied and untied runs at two or more values of tokens seen")
    spec = claims_summary([long, empty])
    assert spec.rows[1][2:] == ["no data", "needs tied and untied runs at two or more values of tokens seen"]
    (table,) = rich_tables(spec, 80)
    text = printed([table])
    assert max(map(len, text.splitlines())) <= 80
    assert [lines for lines in table_cells(text) if crowded(lines)] == []
    assert spec.rows[0][2] == "withheld, no verdict (rule alone: inconclusive)"  # not "withheld: inconclusive"
    assert "withheld, no" in text and "(metrics.jsonl)" in text
    assert spec.rows[0][0] == "R5/C2 gap (equal fit): tying regularises: gap at equal fit"


def wide_spec(n_columns: int = 10) -> TableSpec:
    columns = ["group", *(f"measure number {i}" for i in range(n_columns))]
    return TableSpec(
        "A wide table",
        "the note",
        columns,
        [[f"group {r}", *(f"{r * 1000 * i:,}" for i in range(n_columns))] for r in range(3)],
    )


def test_a_wide_table_is_split_in_balanced_parts_each_with_the_group_column():
    spec = wide_spec()
    tables = rich_tables(spec, 80)  # "group" and 3 measures of 16 characters fit: 1 + (7 + 3) + 3 * (16 + 3) = 68
    assert len(tables) == 4
    headers = [[column.header for column in t.columns] for t in tables]
    assert all(h[0] == "group" for h in headers) and [c for h in headers for c in h[1:]] == spec.columns[1:]
    assert max(map(len, headers)) - min(map(len, headers)) <= 1
    assert [t.title for t in tables] == [f"A wide table ({n}/4)" for n in (1, 2, 3, 4)]
    assert [t.caption for t in tables] == [None, None, None, "the note"]
    text = printed(tables)
    assert max(map(len, text.splitlines())) <= 80 and header_cells(text) == set(spec.columns)
    for row in spec.rows:  # no cell is folded or lost: each number on one line
        assert all(cell in text for cell in row)


def test_the_printed_table_follows_the_console_width():
    spec = wide_spec()
    for width in (80, 120, 200):
        text = printed([rich_table(spec)], width)
        assert text == printed(rich_tables(spec, width), width)
        assert max(map(len, text.splitlines())) <= width and header_cells(text) == set(spec.columns)
    assert len(rich_tables(spec, 250)) == 1 and rich_tables(spec, 250)[0].title == "A wide table"


def test_a_text_table_folds_its_cells_and_keeps_its_headers():
    why = "95% interval excludes 0 (below) after Holm-Bonferroni correction over every row of the report"
    spec = TableSpec(
        "Claims",
        "note",
        ["claim", "comparison", "figure", "measured [95% CI]", "verdict", "why"],
        [
            [
                "R4",
                "micro tied vs untied input",
                "ppl_vs_params.png",
                "-0.00525 [-0.00668, -0.00381]",
                "inconclusive",
                why,
            ]
        ],
        text=True,
    )
    tables = rich_tables(spec, 80)
    assert len(tables) == 1
    text = printed(tables)
    assert max(map(len, text.splitlines())) <= 80 and header_cells(text) == set(spec.columns)
    assert "inconclusive" in text and "R4" in text  # short words stay whole


def with_pairs(root, size, mode, seed, pairs: dict, used: int):
    """A run of the grid whose geometry entries measured related forms on `used` pairs, from `pairs`."""
    writer = write_run(root, size, mode, seed, keep_open=True)
    for entry in writer.reader.geometry():
        sides = {
            side: {**getattr(entry, side), "forms_n_pairs": used} | ({"forms_contrast": None} if not used else {})
            for side in ("input", "output")
        }
        writer.geometry(dataclasses.replace(entry, pairs=pairs, **sides))
    writer.close()


def test_related_forms_on_no_pair_print_a_warning(tmp_path):
    none_found = {"source": "conf/pairs/en.tsv", "found": 0, "skipped_lines": 12}
    for mode in ("tied", "untied"):
        for seed in (0, 1):
            with_pairs(tmp_path / "runs", "nano", mode, seed, none_found, 0)
    result = runner.invoke(
        app, ["report", str(tmp_path / "runs"), "--out", str(tmp_path / "out")], env={"COLUMNS": "120"}
    )
    assert result.exit_code == 0, result.output
    warning = "related forms: found 0 pairs (skipped 12 lines of conf/pairs/en.tsv); forms contrast not measured"
    assert warning in result.output
    md = (tmp_path / "out" / "report.md").read_text()
    assert markdown_tables(md)["Warnings"] == ["group", "warning"] and f"| nano tied | {warning} |" in md


@pytest.mark.slow
def test_the_warning_says_which_seeds_and_why_no_pair_was_usable(tmp_path):
    found = {"source": "english suffix rules", "found": 40}
    with_pairs(tmp_path, "nano", "untied", 0, found, 0)
    with_pairs(tmp_path, "nano", "untied", 1, found, 25)
    write_run(tmp_path, "nano", "tied", 0)  # geometry without pairs information: nothing to warn about
    groups, _ = group_runs(load.load_runs([tmp_path])[0])
    (spec,) = pairs_warnings(groups)
    assert spec.rows == [
        [
            "nano untied",
            "related forms: 0 of 40 pairs from english suffix rules usable (their tokens do not occur "
            "in the training data); forms contrast not measured (1 of 2 seeds)",
        ]
    ]
    with_pairs(tmp_path / "fine", "nano", "untied", 0, found, 25)
    assert pairs_warnings(group_runs(load.load_runs([tmp_path / "fine"])[0])[0]) == []
