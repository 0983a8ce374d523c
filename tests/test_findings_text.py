"""Every number in the findings tables of README.md and docs/FINDINGS.md is found, at the precision it is written,
in the committed results of a study its row cites: the study's report.md and results.csv under docs/findings/, or a
per-seed perplexity change computed from its results.csv (100 (exp(Δloss) - 1), `claims_delta_loss`).

A row cites a study by naming its folder in backticks (`docs_ladder`). Numbers written without a decimal point
(seed counts, sizes, years) and multipliers (`8x the epoch`, `0.85x`) are not checked; interval bounds, means,
p-values and percentages are."""

import bisect
import csv
import math
import re
from decimal import Decimal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FINDINGS = ROOT / "docs" / "findings"
STUDIES = {p.parent.name: p.parent for p in [*FINDINGS.glob("*/report.md"), ROOT / "docs/tying_vs_size/report.md"]}
NUMBER = re.compile(
    r"(?<![\w.\[])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.]|x\b)|(?<=\[)[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?![\w.])"
)
CITED = re.compile(r"`([a-z0-9_]+)`")


def table_rows(text: str, header_start: str) -> list[list[str]]:
    """The body rows of the first markdown table whose header line starts with header_start, split into cells."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def source_values(study: Path) -> list[float]:
    """Every number printed in the study's report.md and results.csv, and each run's perplexity change."""
    values = [float(m.group()) for m in NUMBER.finditer((study / "report.md").read_text())]
    with (study / "results.csv").open(newline="") as f:
        for row in csv.DictReader(f):
            for cell in row.values():
                try:
                    values.append(float(cell))
                except (TypeError, ValueError):
                    pass
            delta = row.get("claims_delta_loss")
            if delta:
                values.append(100 * math.expm1(float(delta)))
    return sorted(values)


def written_precision(text: str) -> float:
    """Half a unit of the last digit written: 7.7 -> 0.05, 6.3e-06 -> 5e-08."""
    number = Decimal(text.lstrip("+"))
    return 0.5 * 10.0 ** number.as_tuple().exponent


def found(text: str, values: list[float]) -> bool:
    x, tolerance = float(text), written_precision(text) * (1 + 1e-9)
    i = bisect.bisect_left(values, x - tolerance)
    return i < len(values) and values[i] <= x + tolerance


def checked_numbers(cells: list[str]) -> list[str]:
    return [m.group() for cell in cells for m in NUMBER.finditer(cell) if "." in m.group() or "e" in m.group()]


def summary_rows():
    readme = table_rows((ROOT / "README.md").read_text(), "| question (claim)")
    findings = table_rows((ROOT / "docs" / "FINDINGS.md").read_text(), "| claim | measured")
    return [("README.md", row) for row in readme] + [("FINDINGS.md", row) for row in findings]


@pytest.mark.parametrize("page, row", summary_rows(), ids=lambda v: v if isinstance(v, str) else v[0][:40])
def test_every_summary_number_is_in_the_results_it_cites(page, row):
    cited = [name for name in CITED.findall(" ".join(row)) if name in STUDIES]
    assert cited, f"{page}: the row {row[0]!r} cites no committed study (name its folder in backticks)"
    values = sorted(v for name in cited for v in source_values(STUDIES[name]))
    measured_and_verdict = row[1:3]
    missing = [n for n in checked_numbers(measured_and_verdict) if not found(n, values)]
    assert not missing, f"{page}: {row[0]!r}: {missing} not found in {cited}"


def test_the_check_catches_a_wrong_number():
    values = source_values(STUDIES["docs_ladder"])
    assert found("+20.6", values) and found("-0.0529", values) and found("6.3e-06", values)
    assert not found("+21.3", values)  # nano's C6 is +20.6% [19.2, 22.1]
    assert checked_numbers(["+7.7% [6.1, 9.4] at 8x, 0.85x [0.83, 0.87], 5 seeds"]) == [
        "+7.7",
        "6.1",
        "9.4",
        "0.83",
        "0.87",
    ]
