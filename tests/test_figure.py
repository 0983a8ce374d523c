"""`tiecli figure`: the findings figure drawn from reports' results.csv files, its points the report's own numbers."""

import csv
import math

import pytest
from helpers import interval, one_line_error, tiecli, write_run

from tiecli.report.figure import read_points

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    """A report of nano and micro, tied and untied, 3 seeds each: its results.csv."""
    root = tmp_path_factory.mktemp("figure")
    for size in ("nano", "micro"):
        for mode in ("tied", "untied"):
            for seed in range(3):
                write_run(root / "runs", size, mode, seed)
    result = tiecli("report", root / "runs", "--out", root / "report")
    assert result.exit_code == 0, result.output
    return root / "report" / "results.csv"


def test_each_point_is_the_reports_own_interval(reported):
    groups = {row["group"]: row for row in csv.DictReader(reported.open()) if row["kind"] == "group"}
    compared = {label: row for label, row in groups.items() if row.get("baseline")}
    assert len(compared) == 2  # nano tied and micro tied, each against its untied
    points = read_points("fixture", reported)
    assert {p.panel for p in points} == {"size"} and len(points) == 2
    for point in points:
        (row,) = [r for r in compared.values() if float(r["params_non_embedding"]) == point.x]
        split = "test_" if row["claims_split"] == "test" else ""
        ci = point.interval
        assert ci is not None and ci.n == 3
        assert ci.mean == pytest.approx(float(row[f"{split}delta_ppl_pct_mean"]), rel=1e-9)
        assert ci.low == pytest.approx(float(row[f"{split}delta_ppl_pct_low"]), rel=1e-9)
        assert ci.high == pytest.approx(float(row[f"{split}delta_ppl_pct_high"]), rel=1e-9)


def test_a_size_at_several_budgets_goes_to_the_tokens_panel(tmp_path):
    deltas = {
        (100_000, 1_000): [0.2, 0.25, 0.3],
        (100_000, 4_000): [0.1, 0.12, 0.08],
        (800_000, 1_000): [0.05, 0.0, 0.1],
    }
    path = tmp_path / "results.csv"
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow(["kind", "group", "params_non_embedding", "tokens", "claims_delta_loss"])
        for (params, tokens), values in deltas.items():
            size = "nano" if params == 100_000 else "micro"
            out.writerows(["run", f"{size} tied t={tokens}", params, tokens, d] for d in values)
            out.writerow(["run", f"{size} untied t={tokens}", params, tokens, ""])  # the baseline: no Δ of its own
    points = {(p.panel, p.x): p for p in read_points("mine", path)}
    assert set(points) == {("tokens", 1_000), ("tokens", 4_000), ("size", 800_000)}
    assert points["tokens", 1_000].series == "mine, tied, nano"
    ci = points["tokens", 4_000].interval
    loss = interval([0.1, 0.12, 0.08])  # (mean, low, high) of the Δloss, computed independently of tiecli
    assert ci.mean == pytest.approx(100 * math.expm1(loss[0]))
    assert (ci.low, ci.high) == pytest.approx((100 * math.expm1(loss[1]), 100 * math.expm1(loss[2])))
    assert points["tokens", 4_000].seeds_pct == pytest.approx([100 * math.expm1(d) for d in [0.1, 0.12, 0.08]])


def test_the_command_writes_a_png_and_an_svg(reported, tmp_path):
    result = tiecli("figure", f"English={reported}", "--out", tmp_path / "f.png")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "f.png").read_bytes().startswith(PNG_SIGNATURE)
    result = tiecli("figure", reported, "--out", tmp_path / "f.svg")
    assert result.exit_code == 0, result.output
    assert "<svg" in (tmp_path / "f.svg").read_text()[:2000]
    assert not list(tmp_path.glob("*.partial"))
    odd = tmp_path / "train.lr=1e-3" / "results.csv"  # a folder named for an override: the path is not split
    odd.parent.mkdir()
    odd.write_bytes(reported.read_bytes())
    for source in (odd, f"Mine={odd}"):
        result = tiecli("figure", source, "--out", tmp_path / "g.png")
        assert result.exit_code == 0, result.output


def test_bad_input_is_one_line(reported, tmp_path):
    one_line_error(tiecli("figure", tmp_path / "none.csv", "--out", tmp_path / "f.png"), 1, "no such results.csv")
    one_line_error(tiecli("figure", reported, "--out", tmp_path / "f.jpg"), 1, ".png or .svg")
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    one_line_error(tiecli("figure", other, "--out", tmp_path / "f.png"), 1, "no claims_delta_loss column")
    assert not (tmp_path / "f.png").exists()
