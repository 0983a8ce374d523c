"""tiecli report and tiecli runs on synthetic run directories, written through RunWriter, whose numbers are known in advance."""

import json
import math
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pytest
import yaml
from helpers import (
    LOSS,
    SIZES,
    TOKENS_PER_STEP,
    V,
    cka_end,
    clustered_slope,
    drifts,
    expected_verdict,
    forms_contrast,
    grad_cos,
    holm,
    interval,
    params,
    results,
    tiecli,
    tost,
    write_run,
)
from scipy import stats
from typer.testing import CliRunner

from tiecli.cli import app
from tiecli.report import claims as report_claims
from tiecli.report import load
from tiecli.report.groups import group_runs
from tiecli.run.layout import FORMAT

runner = CliRunner()
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURES = ("val_loss.png", "ppl_vs_params.png", "grad_cos.png", "drift.png", "spectra.png")


def delta_loss(size):
    """Per seed tied - untied final val loss at one size of the grid."""
    return [t - u for t, u in zip(LOSS[(size, "tied")], LOSS[(size, "untied")])]


def as_ppl(x):
    """A Δloss as % change in perplexity."""
    return 100 * math.expm1(x)


def pct(a, b):
    return [100 * (x / y - 1) for x, y in zip(a, b)]


def ppl(size, mode):
    return [math.exp(x) for x in LOSS[(size, mode)]]


def steps_to(target, loss):
    """The curve (10, loss + 1) -> (20, loss) crosses target at 10 + 10 * (loss + 1 - target)."""
    return 10 + 10 * (loss + 1 - target)


def test_aggregates_differences_and_intervals(sweep):
    result = tiecli("report", sweep)
    assert result.exit_code == 0, result.output
    data, groups, _ = results(sweep / "report")  # one sweep given: report/ inside it
    assert set(groups) == {"nano tied", "nano untied", "micro tied", "micro untied"}
    assert len(data["runs"]) == 12

    g = groups["nano tied"]
    mean, low, high = interval(ppl("nano", "tied"))
    assert (
        g["perplexity_mean"] == pytest.approx(mean)
        and g["perplexity_low"] == pytest.approx(low)
        and g["perplexity_high"] == pytest.approx(high)
    )
    assert g["loss_sd"] == pytest.approx(statistics.stdev(LOSS[("nano", "tied")]))
    # t(0.975, df=2) = 4.302653: the interval of the paired log-perplexity (loss) difference, written out by hand,
    # then % perplexity 100 (exp(x) - 1) of the mean and of each bound
    diffs = delta_loss("nano")
    half = 4.302653 * statistics.stdev(diffs) / math.sqrt(3)
    assert (g["delta_loss_mean"], g["delta_loss_low"], g["delta_loss_high"]) == pytest.approx(
        (statistics.fmean(diffs), statistics.fmean(diffs) - half, statistics.fmean(diffs) + half), rel=1e-6
    )
    assert g["delta_ppl_pct_mean"] == pytest.approx(as_ppl(statistics.fmean(diffs)))
    assert g["delta_ppl_pct_low"] == pytest.approx(as_ppl(statistics.fmean(diffs) - half), rel=1e-6)
    assert g["delta_ppl_pct_high"] == pytest.approx(as_ppl(statistics.fmean(diffs) + half), rel=1e-6)
    assert g["baseline"] == "nano untied" and groups["nano untied"]["baseline"] is None

    p_tied, p_untied = params("micro", "tied"), params("micro", "untied")
    assert groups["micro tied"]["saved_params"] == p_untied["total"] - p_tied["total"] == V * 128
    assert groups["micro tied"]["embedding_share"] == pytest.approx(V * 128 / p_tied["total"])

    # convergence: the pair's target = the higher of the two groups' best losses (curves end at their minimum)
    target = max(LOSS[("nano", "untied")] + LOSS[("nano", "tied")])
    assert g["target_loss"] == target
    tied_steps = [steps_to(target, x) for x in LOSS[("nano", "tied")]]
    untied_steps = [steps_to(target, x) for x in LOSS[("nano", "untied")]]
    assert g["steps_to_target_mean"] == pytest.approx(statistics.fmean(tied_steps))
    assert g["tokens_to_target_mean"] == pytest.approx(statistics.fmean(tied_steps) * TOKENS_PER_STEP)
    mean, low, high = interval(pct(tied_steps, untied_steps))
    assert (g["delta_steps_pct_mean"], g["delta_steps_pct_low"], g["delta_steps_pct_high"]) == pytest.approx(
        (mean, low, high)
    )
    assert g["baseline_steps_to_target_mean"] == pytest.approx(statistics.fmean(untied_steps))
    assert groups["nano untied"]["target_loss"] is None  # a baseline has a target per pair it is in, not one of its own

    mean, low, high = interval([statistics.fmean(grad_cos("tied", s)) for s in range(3)])
    assert (g["grad_cos_mean"], g["grad_cos_low"], g["grad_cos_high"]) == pytest.approx((mean, low, high))


@pytest.mark.slow
def test_equal_parameter_view(sweep):
    assert tiecli("report", sweep, "--out", sweep / "out").exit_code == 0
    _, groups, _ = results(sweep / "out")
    # micro tied lies between nano untied and micro untied in total parameters: log ppl linear in log params
    x0, x1 = math.log(params("nano", "untied")["total"]), math.log(params("micro", "untied")["total"])
    w = (math.log(params("micro", "tied")["total"]) - x0) / (x1 - x0)
    base = [(1 - w) * a + w * b for a, b in zip(LOSS[("nano", "untied")], LOSS[("micro", "untied")])]
    mean, low, high = interval([t - b for t, b in zip(LOSS[("micro", "tied")], base)])
    g = groups["micro tied"]
    assert (
        g["equal_params_delta_loss_mean"],
        g["equal_params_delta_loss_low"],
        g["equal_params_delta_loss_high"],
    ) == pytest.approx((mean, low, high))
    assert (
        g["equal_params_delta_ppl_pct_mean"],
        g["equal_params_delta_ppl_pct_low"],
        g["equal_params_delta_ppl_pct_high"],
    ) == pytest.approx((as_ppl(mean), as_ppl(low), as_ppl(high)))
    assert g["equal_params_base_perplexity_mean"] == pytest.approx(statistics.fmean(math.exp(b) for b in base))
    assert g["equal_params_split"] == "val"  # these runs have no test evaluation
    # nano tied has fewer parameters than any untied model: nothing to interpolate from
    assert groups["nano tied"]["equal_params_delta_ppl_pct_mean"] is None
    assert "outside" in groups["nano tied"]["equal_params_note"]
    report = (sweep / "out" / "report.md").read_text()
    assert (
        "Perplexity at equal total parameters (smaller body)" in report
        and "Validation at equal architecture" in report
        and "n/a" in report
    )


@pytest.mark.slow
def test_claim_verdicts_follow_the_stated_rules(sweep):
    assert tiecli("report", sweep).exit_code == 0
    data, _, claims = results(sweep / "report")
    margin = {"ppl": math.log(1.01), "cos": 0.05, "cka": 0.05}
    expected = {}  # (claim, comparison): (per-seed values, claimed direction, SESOI), all by hand
    for size in SIZES:
        # the pair's target: the higher of the two groups' best losses; each curve falls linearly from loss + 1 at step 10 to loss at 20
        target = max(LOSS[(size, "tied")] + LOSS[(size, "untied")])
        steps = {mode: [steps_to(target, x) for x in LOSS[(size, mode)]] for mode in ("tied", "untied")}
        expected |= {
            ("C6", f"{size} tied"): (delta_loss(size), -1, margin["ppl"]),
            ("R4", f"{size} tied"): (
                [statistics.fmean(grad_cos("tied", s)) - statistics.fmean(grad_cos("untied", s)) for s in range(3)],
                -1,
                margin["cos"],
            ),
            ("R3", f"{size} untied"): (
                [a - b for a, b in (forms_contrast("untied", s) for s in range(3))],
                +1,
                margin["cos"],
            ),
            ("C2/C7", f"{size} untied"): ([cka_end(s) - 0.2 for s in range(3)], -1, margin["cka"]),
            ("C2/C7 drift", f"{size} tied"): (
                [math.log(drifts(size, "tied", s)[0] / drifts(size, "untied", s)[0]) for s in range(3)],
                -1,
                math.log(1.1),
            ),
        }
        reading = claims[("R6 (schedule-dependent)", f"{size} tied")]  # one budget: shown, not judged
        assert reading["interval"]["mean"] == pytest.approx(statistics.fmean(pct(steps["tied"], steps["untied"])))
        assert claims[("R6", f"{size} tied")]["verdict"].startswith("not tested: one budget")
    for key, (values, direction, sesoi) in expected.items():
        row = claims[key]
        assert (row["interval"]["mean"], row["interval"]["low"], row["interval"]["high"]) == pytest.approx(
            interval(values)
        ), key
        assert row["p"] == pytest.approx(stats.ttest_1samp(values, 0).pvalue) and row["direction"] == direction, key
        assert (row["p_equiv"], row["sesoi"]) == (
            (pytest.approx(tost(values, sesoi)), pytest.approx(sesoi)) if sesoi else (None, None)
        ), key

    # R5/C6 (trend): the slope of the per-seed Δloss against log10 non-embedding parameters, by hand
    points = [(math.log10(SIZES[size]["non_embedding"]), d) for size in SIZES for d in delta_loss(size)]
    xs, ys = zip(*points)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    se = math.sqrt(sum((y - my - slope * (x - mx)) ** 2 for x, y in points) / (len(points) - 2) / sxx)
    half = stats.t.ppf(0.975, len(points) - 2) * se
    trend = claims[("R5/C6 (trend)", "nano tied -> micro tied")]
    ols = trend["readings"]["ols"]  # shown beside the judged interval
    assert (ols["mean"], ols["low"], ols["high"]) == pytest.approx((slope, slope - half, slope + half))
    assert trend["readings"]["ols_p"] == pytest.approx(2 * stats.t.sf(abs(slope / se), len(points) - 2))
    # judged: the same slope, its interval clustered by seed (a seed's held-out text is shared across the sizes)
    seeds = [(math.log10(SIZES[size]["non_embedding"]), d, s) for size in SIZES for s, d in enumerate(delta_loss(size))]
    clustered = clustered_slope(seeds)
    assert (trend["interval"]["mean"], trend["interval"]["low"], trend["interval"]["high"]) == pytest.approx(
        clustered[:3]
    )
    assert trend["p"] == pytest.approx(clustered[3]) and trend["p_equiv"] is None

    # Holm-Bonferroni within each family (by default one per claim), once for the tests against 0 and once for the
    # equivalence tests; C3 and the smallest-size part of R5/C6 re-read a test already counted (R6's, C6's at nano)
    tested = [c for c in data["claims"] if c["p"] is not None and c["claim"] not in ("C3", "R5/C6 (smallest size)")]
    assert len(tested) == len(expected) + 1 and all(c["family"] == c["claim"] for c in tested)
    for name in {c["family"] for c in tested}:
        for kind in ("p", "p_equiv"):
            rows = [c for c in tested if c[kind] is not None and c["family"] == name]
            assert [c[kind + "_holm"] for c in rows] == pytest.approx(holm([c[kind] for c in rows]))
    for row in tested:
        assert row["verdict"] == expected_verdict(row), row
    for size in SIZES:
        r6, c3 = claims[("R6", f"{size} tied")], claims[("C3", f"{size} tied")]
        assert c3["verdict"] == r6["verdict"] and c3["direction"] == -1
    part, c6 = claims[("R5/C6 (smallest size)", "nano tied -> micro tied")], claims[("C6", "nano tied")]
    assert (part["p_holm"], part["verdict"]) == (c6["p_holm"], c6["verdict"])
    combined = claims[("R5/C6", "nano tied -> micro tied")]
    verdicts = {part["verdict"], trend["verdict"]}
    assert combined["verdict"] == (
        "supported"
        if verdicts == {"supported"}
        else next((v for v in ("contradicted", "negligible", "equivalent") if v in verdicts), "inconclusive")
    )
    assert "Holm" in data["rules"]["multiple comparisons"] and "on" in data["rules"]["multiple comparisons"]

    for size in SIZES:
        saved = params(size, "untied")["total"] - params(size, "tied")["total"]
        share = saved / params(size, "untied")["total"]
        assert claims[("C1", f"{size} tied")]["verdict"] == ("supported" if 0.15 <= share <= 0.30 else "contradicted")
        n_embd = SIZES[size]["n_embd"]
        assert claims[("R2", f"{size} tied")]["verdict"] == (
            "supported" if saved > 4 * n_embd * n_embd else "contradicted"
        )
    assert claims[("C1", "micro tied")]["measured"].endswith(": tying saves less than the claimed 15%-30%")
    for claim in ("R5", "R5/C2 gap"):
        (row,) = [c for (name, _), c in claims.items() if name == claim]
        assert row["verdict"].startswith("no data: needs ") and row["p"] is None


@pytest.mark.slow
def test_one_seed_verdicts_are_inconclusive_and_say_why(tmp_path):
    for mode in ("tied", "untied"):
        for size in SIZES:
            write_run(tmp_path / "runs", size, mode, 0)
    result = tiecli("report", tmp_path / "runs", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    _, groups, claims = results(tmp_path / "out")
    for (claim, _), row in claims.items():
        if claim not in ("R2", "C1", "R5/C6") and not row["verdict"].startswith(
            ("no data", "not tested", "descriptive")
        ):  # counts do not depend on the seed; one budget or a reading shown only: no test whatever the seeds
            assert row["verdict"] == "inconclusive" and "seed" in row["why"] and row["p"] is None, row
    assert claims[("R5/C6", "nano tied -> micro tied")]["verdict"] == "inconclusive"
    assert claims[("C6", "nano tied")]["why"] == "one seed: no spread, so no interval and no test"
    assert groups["nano tied"]["perplexity_low"] is None and groups["nano tied"]["delta_ppl_pct_mean"] == pytest.approx(
        100 * (math.exp(LOSS[("nano", "tied")][0]) / math.exp(LOSS[("nano", "untied")][0]) - 1)
    )


@pytest.mark.slow
def test_every_output_file_exists_and_the_figures_are_png(sweep):
    out = sweep / "report"
    result = tiecli("report", sweep)
    assert result.exit_code == 0, result.output
    assert "Claims" in result.output and "equal architecture" in result.output
    for name in ("report.md", "report.html", "results.csv", "results.json", *FIGURES):
        assert (out / name).is_file(), name
    for name in FIGURES:
        assert (out / name).read_bytes()[:8] == PNG_SIGNATURE
        image = matplotlib.image.imread(out / name)
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 300
    page = (out / "report.html").read_text()
    sources = re.findall(r"src='([^']*)'", page)
    assert len(sources) == len(FIGURES) and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "href=" not in page and "<link" not in page  # nothing outside the file
    csv_lines = (out / "results.csv").read_text().splitlines()
    assert len(csv_lines) == 1 + 12 + 4 and csv_lines[0].startswith("kind,group")
    md = (out / "report.md").read_text()
    assert all(f"]({name})" in md for name in FIGURES) and "supported" in md


@pytest.mark.slow
def test_broken_runs_are_skipped_with_reasons(sweep):
    broken = sweep.parent / "broken"
    (write_run(broken, "nano", "tied", 0) / "summary.json").unlink()
    (write_run(broken, "nano", "tied", 1) / "summary.json").write_text("{not json")
    write_run(broken, "nano", "tied", 2, status="failed")
    writing = write_run(broken, "micro", "tied", 0, status="running", keep_open=True)  # its writer is alive
    write_run(broken, "micro", "untied", 0, status="running")  # its writer died: the lock is free
    (write_run(broken, "micro", "tied", 1) / "eval.json").write_text("[1, 2")
    newer = write_run(broken, "micro", "tied", 2) / "summary.json"
    newer.write_text(json.dumps({**json.loads(newer.read_text()), "format": FORMAT + 1}))
    try:
        result = tiecli("report", sweep, broken, "--out", sweep.parent / "out")
    finally:
        writing.close()
    assert result.exit_code == 0, result.output
    data, groups, _ = results(sweep.parent / "out")
    reasons = {s["path"].split("/")[-1]: s["reason"] for s in data["skipped"]}
    assert reasons == {
        "nano-tied-s0": "summary.json does not exist",
        "nano-tied-s1": "summary.json is unreadable (JSONDecodeError)",
        "nano-tied-s2": "status failed: RuntimeError: CUDA out of memory",
        "micro-tied-s0": "status running",
        "micro-untied-s0": "status interrupted",
        "micro-tied-s1": "eval.json is unreadable (JSONDecodeError)",
        "micro-tied-s2": f"summary.json has format {FORMAT + 1}, newer than this tiecli reads "
        f"({FORMAT}); upgrade tiecli to read it",
    }
    assert (
        len(data["runs"]) == 12 and groups["nano tied"]["n_seeds"] == 3
    )  # the sweep's runs, untouched by the broken ones
    assert "Skipped run directories" in (sweep.parent / "out" / "report.md").read_text()


@pytest.mark.slow
def test_completed_runs_with_nan_or_infinite_losses_are_left_out_each_on_one_named_line(sweep):
    diverged = sweep.parent / "diverged"
    write_run(diverged, "nano", "tied", 3, loss=math.nan)
    write_run(diverged, "micro", "untied", 4, loss=math.inf)
    result = runner.invoke(
        app, ["report", str(sweep), str(diverged), "--out", str(sweep.parent / "out")], env={"COLUMNS": "300"}
    )
    assert result.exit_code == 0, result.output
    data, groups, _ = results(sweep.parent / "out")
    assert groups["nano tied"]["n_seeds"] == 3 and groups["micro untied"]["n_seeds"] == 3
    assert all(math.isfinite(g["perplexity_mean"]) for g in groups.values())
    reasons = {s["path"]: s["reason"] for s in data["skipped"]}
    nan, inf = str(diverged / "nano-tied-s3"), str(diverged / "micro-untied-s4")
    assert reasons == {
        nan: "losses are NaN or infinite: val loss nan; loss nan, val_loss nan from step 10 (metrics.jsonl)",
        inf: "losses are NaN or infinite: val loss inf; loss inf, val_loss inf from step 10 (metrics.jsonl)",
    }
    for path, reason in reasons.items():  # one line each on the terminal, naming the run and why
        assert [line for line in result.output.splitlines() if path in line] == [f"skipped {path}: {reason}"]
    listed = table_rows(tiecli("runs", diverged).output)
    assert listed["nano-tied-s3"][1] == "completed, val loss not finite: left out of reports"
    assert listed["nano-tied-s3"][5] == "nan"


@pytest.mark.slow
def test_a_second_run_of_a_seed_is_skipped_not_averaged(sweep):
    write_run(sweep.parent / "again", "nano", "tied", 0, loss=9.0)
    assert tiecli("report", sweep, sweep.parent / "again", "--out", sweep.parent / "out").exit_code == 0
    data, groups, _ = results(sweep.parent / "out")
    assert groups["nano tied"]["n_seeds"] == 3 and max(r["loss"] for r in data["runs"]) < 9
    assert "same settings and seed" in data["skipped"][0]["reason"]


def test_empty_selection_exits_1_with_one_line(tmp_path):
    write_run(tmp_path / "runs", "nano", "tied", 0, status="failed")
    for args in (["report", tmp_path / "runs"], ["report", tmp_path / "nowhere"]):
        result = tiecli(*args)
        assert result.exit_code == 1
        assert result.output.startswith("error:") and result.output.strip().count("\n") == 0, result.output
    assert "no completed run directories" in tiecli("report", tmp_path / "runs").output
    assert tiecli("report", tmp_path / "runs", "--baseline", "untied").exit_code == 1


@pytest.mark.slow
def test_runs_lists_every_run_directory(sweep):
    write_run(sweep, "nano", "untied", 7, loss=4.0, status="failed")
    (sweep / "broken").mkdir()
    (sweep / "broken" / "summary.json").write_text('{"status": "completed"}\n')
    result = tiecli("runs", sweep)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    cells = [c.strip() for c in next(line for line in lines if "nano-tied-s1" in line).split("│")]
    assert cells[1:7] == ["nano-tied-s1", "completed", "nano", "tied", "20/20", f"{math.exp(3.05):.2f}"]
    assert "failed" in next(line for line in lines if "nano-untied-s7" in line)
    assert state_of(result.output, "broken").startswith("unreadable: ")
    assert sum("-s" in line for line in lines) == 12 + 1  # the sweep, the failed run; "broken" above
    assert tiecli("runs", sweep / "nothing").exit_code == 1


def table_rows(output: str) -> dict[str, list[str]]:
    """`tiecli runs` output as {name: cells}, a cell folded over several lines joined with spaces."""
    rows, name = {}, None
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if not cells:
            continue
        if cells[0]:
            name = cells[0]
            rows[name] = cells
        elif name:
            rows[name] = [" ".join(filter(None, (a, b))) for a, b in zip(rows[name], cells)]
    return rows


def state_of(output: str, name: str) -> str:
    return table_rows(output)[name][1]


def test_runs_shows_a_dead_writer_as_interrupted(tmp_path):
    write_run(tmp_path / "runs", "nano", "tied", 0, status="running")  # written, then its writer died
    writer = write_run(tmp_path / "runs", "nano", "tied", 1, status="running", keep_open=True)
    try:
        result = tiecli("runs", tmp_path / "runs")
    finally:
        writer.close()
    assert result.exit_code == 0, result.output
    assert state_of(result.output, "nano-tied-s0") == "interrupted"
    assert state_of(result.output, "nano-tied-s1") == "running"
    assert state_of(tiecli("runs", tmp_path / "runs").output, "nano-tied-s1") == "interrupted"  # its writer is gone now


def test_runs_lists_runs_not_config_folders(tmp_path):
    """A project folder: conf/ of Hydra yaml files (its config.yaml has `defaults:`) is not a run, and neither
    is a hidden folder, such as the temporary folder a killed `tiecli train` leaves while creating a run."""
    project = tmp_path / "project"
    (project / "conf" / "model").mkdir(parents=True)
    (project / "conf" / "config.yaml").write_text("defaults:\n  - _self_\n  - model: nano\nseed: 0\n")
    (project / "conf" / "model" / "nano.yaml").write_text("n_layer: 2\n")
    write_run(project / "runs", "nano", "tied", 0)
    (project / "runs" / ".nano-tied-s1.x1y2.tmp").mkdir()
    (project / "runs" / ".nano-tied-s1.x1y2.tmp" / "config.yaml").write_text("seed: 1\n")
    result = tiecli("runs", project)
    assert result.exit_code == 0, result.output
    assert list(table_rows(result.output)) == ["runs/nano-tied-s0"]
    assert state_of(result.output, "runs/nano-tied-s0") == "completed"
    result = tiecli("report", project, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "out" / "results.json").read_text())["skipped"] == []
    assert tiecli("runs", project / "conf").exit_code == 1  # no run directories there


@pytest.mark.slow
def test_an_unknown_baseline_is_one_line_naming_what_exists(sweep):
    expected = {
        "tying=foo": "no run has tying=foo; tying values present: tied, untied",
        "model=huge": "no run has model=huge; model values present: micro, nano",
        "train.lr=0.1": "no run has train.lr=0.1; train.lr values present: 0.003",
        "foo=bar": "no run has a setting 'foo' (--baseline foo=bar); config groups: model, tying, data, tokenizer; "
        "keys that differ between the runs: model.n_embd, model.n_layer, tying.mode",
        "device=cpu": "--baseline device=cpu: runs are not grouped by device (it does not change what a run learns)",
    }
    for baseline, message in expected.items():
        result = tiecli("report", sweep, "--baseline", baseline, "--out", sweep.parent / "out")
        assert result.exit_code == 1, result.output
        assert result.output.strip() == f"error: {message}", result.output
    assert not (sweep.parent / "out").exists()
    assert (
        tiecli("report", sweep, "--baseline", "train.lr=3e-3", "--out", sweep.parent / "out").exit_code == 0
    )  # numbers compare as numbers


@pytest.mark.slow
def test_a_boolean_baseline_is_typed_as_on_the_command_line(sweep):
    """model.embedding_norm=false on the command line is YAML's False in config.yaml: --baseline takes it as typed,
    and an unknown value lists the values as they would be typed."""
    for seed in range(3):  # micro untied again, without biases
        run = shutil.copytree(sweep / f"micro-untied-s{seed}", sweep / f"micro-untied-nobias-s{seed}")
        setting = yaml.safe_load((run / "config.yaml").read_text())
        setting["model"]["bias"] = False
        (run / "config.yaml").write_text(yaml.safe_dump(setting))
    result = tiecli("report", sweep, "--baseline", "model.bias=maybe", "--out", sweep.parent / "out")
    assert result.output.strip() == "error: no run has model.bias=maybe; model.bias values present: false, true"
    result = tiecli("report", sweep, "--baseline", "model.bias=false", "--out", sweep.parent / "out")
    assert result.exit_code == 0, result.output
    _, groups, _ = results(sweep.parent / "out")
    assert groups["micro untied model.bias=True"]["baseline"] == "micro untied model.bias=False"
    assert groups["micro untied model.bias=False"]["baseline"] is None  # the baseline itself


@pytest.mark.slow
def test_without_untied_runs_the_default_baseline_is_no_error(tmp_path):
    for seed in range(2):
        write_run(tmp_path / "runs", "nano", "tied", seed)
    result = tiecli("report", tmp_path / "runs", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    _, groups, _ = results(tmp_path / "out")
    assert groups["nano tied"]["baseline"] is None and groups["nano tied"]["n_seeds"] == 2


def test_out_must_be_a_folder_before_anything_is_read(sweep, monkeypatch):
    def never(*args):
        raise AssertionError("runs were read before --out was checked")

    (sweep.parent / "taken").write_text("a file")
    monkeypatch.setattr(load, "load_runs", never)
    for out, message in (
        (sweep.parent / "taken", "is a file, not a folder"),
        (sweep.parent / "taken" / "sub", "is a file"),
    ):
        result = tiecli("report", sweep, "--out", out)
        assert result.exit_code == 1, result.output
        assert result.output.startswith("error: --out") and message in result.output, result.output
        assert result.output.strip().count("\n") == 0, result.output
    assert (sweep.parent / "taken").read_text() == "a file"


@pytest.mark.slow
def test_claims_compare_any_two_tying_modes(tmp_path):
    """The same numbers under other mode names: claims(tied=..., untied=...) judges them by the same rules."""
    for size, mode in LOSS:
        for seed in range(3):
            write_run(tmp_path / "runs", size, mode, seed, named={"tied": "scaled", "untied": "untied_init"}[mode])
    runs, skipped = load.load_runs([tmp_path / "runs"])
    groups, twins = group_runs(runs)
    assert not skipped and not twins and len(groups) == 4
    rows = {(c.claim, c.comparison): c for c in report_claims.claims(groups, tied="scaled", untied="untied_init")}
    _, low, high = interval(delta_loss("nano"))
    assert rows[("C6", "nano scaled")].interval.low == pytest.approx(low) and rows[
        ("C6", "nano scaled")
    ].interval.high == pytest.approx(high)
    assert rows[("R4", "micro scaled")].verdict == "supported"
    assert ("C2/C7", "micro untied_init") in rows
    default = report_claims.claims(groups)  # tied vs untied: no such runs here, and the rows say so
    assert all(c.verdict.startswith("no data: needs tied") for c in default if c.claim not in ("R3", "C2/C7"))
    assert {c.verdict for c in default if c.claim == "R3"} == {
        "no data: needs untied runs with geometry and related-form pairs found"
    }
    assert {c.comparison for c in default if c.claim == "C2/C7"} == {
        "nano untied_init",
        "micro untied_init",
    }  # untied_init: no tie either


@pytest.mark.slow
def test_the_report_never_imports_torch(sweep, tmp_path):
    script = (
        "import io, sys; from pathlib import Path; from rich.console import Console; from tiecli.report import report, runs_table; "
        f"report([Path({str(sweep)!r})], 'tying=untied', Path({str(tmp_path / 'out')!r}), Console(file=io.StringIO())); "
        f"Console(file=io.StringIO()).print(runs_table(Path({str(sweep)!r}))); print('torch' in sys.modules)"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=root, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    assert (tmp_path / "out" / "results.json").is_file()


def test_help_gives_an_example():
    for command in ("report", "runs"):
        assert "Example: tiecli" in tiecli(command, "--help").output


def test_t_tests_did_not_move_when_scipy_took_over():
    """report.stats.t_tests against scipy's one-sample t-test and, to the last digits, against the values the
    hand-written t statistic gave before t_tests called scipy.stats.ttest_1samp (computed once with that code
    on these inputs); identical values keep the limit of the test (p 0 off the null, 1 on it)."""
    from tiecli.report.stats import t_tests

    values = [0.031, -0.012, 0.047, 0.022, 0.009]
    p, p_equiv = t_tests(values, 0.02)
    assert p == pytest.approx(0.12418325425066662, rel=1e-12, abs=0) == stats.ttest_1samp(values, 0).pvalue
    assert p_equiv == pytest.approx(0.9550022559108232, rel=1e-12, abs=0)
    assert p_equiv == pytest.approx(tost(values, 0.02), rel=1e-12, abs=0)
    assert t_tests(values, None) == (p, None) and t_tests([0.5], 0.02) == (None, None)
    assert t_tests([0.01, 0.01, 0.01], 0.02) == (0.0, 0.0)  # inside +-sesoi with no spread: equivalent
    assert t_tests([0.0, 0.0], 0.02) == (1.0, 0.0)
    assert t_tests([0.05, 0.05], 0.02) == (0.0, 1.0) and t_tests([0.02, 0.02], 0.02) == (0.0, 1.0)


def test_c1_says_which_way_a_share_misses_the_claimed_range():
    """Saving more than C1's 15-30% contradicts the claim's number, which is no mark against tying: the row says so."""
    from tiecli.report.claims_embedding import c1_side

    assert (
        c1_side(0.4) == ": tying saves more than the claimed 15%-30% (the claim's number, not tying, is contradicted)"
    )
    assert c1_side(0.05) == ": tying saves less than the claimed 15%-30%" and c1_side(0.2) == ""
