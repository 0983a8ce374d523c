"""tiecli report and tiecli runs on synthetic run directories whose numbers are known in advance."""

import json
import math
import re
import statistics

import matplotlib.image
import pytest
import yaml
from scipy import stats
from typer.testing import CliRunner

from tiecli.cli import app

runner = CliRunner()
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FIGURES = ("val_loss.png", "ppl_vs_params.png", "grad_cos.png", "drift.png", "spectra.png")

V = 256  # vocabulary
SIZES = {"nano": {"n_layer": 2, "n_head": 4, "n_embd": 64, "non_embedding": 40_000},
         "micro": {"n_layer": 4, "n_head": 4, "n_embd": 128, "non_embedding": 800_000}}
# final val loss by (size, mode): one value per seed 0, 1, 2
LOSS = {("nano", "untied"): [3.0, 3.1, 3.2], ("nano", "tied"): [2.9, 3.05, 3.1],
        ("micro", "untied"): [2.5, 2.6, 2.55], ("micro", "tied"): [2.45, 2.58, 2.5]}
TOKENS_PER_STEP = 1000


def params(size, mode):
    vd, positional = V * SIZES[size]["n_embd"], 128 * SIZES[size]["n_embd"]
    split = {"input_embedding": vd, "output_matrix": vd, "shared": 0} if mode == "untied" else {"input_embedding": 0, "output_matrix": 0, "shared": vd}
    body = SIZES[size]["non_embedding"]
    return {**split, "positional": positional, "non_embedding": body, "total": sum(split.values()) + positional + body}


def drifts(size, mode, seed):
    """(input drift, output drift) at the last geometry step."""
    if mode == "tied":
        return (0.5 + 0.02 * seed, 0.5 + 0.02 * seed)
    return (0.3 + 0.01 * seed ** 2, 0.9 - 0.01 * seed)


def grad_cos(mode, seed):
    """The two logged gradient cosines of a run."""
    return [-0.1 - 0.01 * seed, -0.2 - 0.02 * seed] if mode == "tied" else [0.05, 0.05 + 0.01 * seed]


def forms_contrast(mode, seed):
    return (0.05 + 0.01 * seed, -0.1 - 0.02 * seed ** 2) if mode == "untied" else (-0.02, -0.02)


def write_run(root, size, mode, seed, loss=None, status="completed"):
    """A run directory as tiecli train writes one: final loss `loss`, a val curve
    [(0, 5.0), (10, loss + 1), (20, loss)], and gradient statistics and geometry."""
    loss = LOSS[(size, mode)][seed] if loss is None else loss
    run = root / f"{size}-{mode}-s{seed}"
    run.mkdir(parents=True)
    shape = {k: v for k, v in SIZES[size].items() if k != "non_embedding"}
    config = {"seed": seed, "device": "auto", "dtype": "auto", "compile": False,
              "model": {"block_size": 128, "dropout": 0.0, "bias": True, **shape},
              "train": {"max_steps": 20, "max_tokens": None, "batch_size": 8, "lr": 0.003, "eval_interval": 10, "log_interval": 10},
              "eval": {"buckets": [0.5, 0.9]}, "diag": {"every": 10, "geometry": True},
              "tying": {"mode": mode}, "data": {"name": "shakespeare", "split_seed": 1234},
              "tokenizer": {"name": "bytes", "vocab_size": V}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    (run / "overrides.yaml").write_text(yaml.safe_dump({"overrides": [f"model={size}", f"tying={mode}", f"seed={seed}"],
                                                        "choices": {"model": size, "tying": mode, "data": "shakespeare", "tokenizer": "bytes"}}))
    final = {"loss": loss, "perplexity": math.exp(loss), "bits_per_byte": loss / 2, "n_tokens": 5000}
    (run / "summary.json").write_text(json.dumps({
        "name": run.name, "status": status, "error": "RuntimeError: CUDA out of memory" if status == "failed" else None,
        "seed": seed, "params": params(size, mode), "max_steps": 20, "tokens_per_step": TOKENS_PER_STEP, "step": 20,
        "tokens": 20 * TOKENS_PER_STEP, "tokens_per_s": 1000.0 + seed, "final_val": final}))
    (run / "eval.json").write_text(json.dumps({"val": {"split": "val", **final, "n_bytes": 10000, "step": 20, "by_bucket": {}}}))
    cos = grad_cos(mode, seed)
    rows = [{"step": 0, "tokens": 0, "lr": 0.0, "val_loss": 5.0, "val_ppl": math.exp(5.0), "val_bpb": 2.5},
            {"step": 10, "tokens": 10 * TOKENS_PER_STEP, "loss": loss + 1.2, "grad_cos": cos[0], "grad_cancel": 0.1, "val_loss": loss + 1},
            {"step": 20, "tokens": 20 * TOKENS_PER_STEP, "loss": loss + 0.1, "grad_cos": cos[1], "grad_cancel": 0.2, "val_loss": loss}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    d_in, d_out = drifts(size, mode, seed)
    c_in, c_out = forms_contrast(mode, seed)
    n_embd = SIZES[size]["n_embd"]

    def side(drift, contrast):
        return {"drift": drift, "anisotropy": 0.1, "effective_rank": n_embd / 2, "forms_contrast": contrast,
                "singular_values": [float(n_embd - i) for i in range(n_embd)]}

    entry = {"step": 20, "n_tokens": V, "tied": mode == "tied", "input": side(d_in, c_in), "output": side(d_out, c_out),
             "agreement": None if mode == "tied" else {"row_cosine": 0.01, "cka": 0.2, "knn_overlap": 0.0}}
    start = {**entry, "step": 0, "input": side(0.0, 0.0), "output": side(0.0, 0.0)}
    (run / "geometry.json").write_text(json.dumps([start, entry]))
    return run


@pytest.fixture
def sweep(tmp_path):
    """nano and micro, tied and untied, seeds 0-2, as a sweep folder."""
    root = tmp_path / "runs" / "sweeps" / "grid"
    for size, mode in LOSS:
        for seed in range(3):
            write_run(root, size, mode, seed)
    (root / "sweep.json").write_text("{}")
    return root


def tiecli(*args):
    return runner.invoke(app, [str(a) for a in args])


def interval(values):
    """Mean and 95% t-interval, computed here independently of tiecli.report."""
    n, mean = len(values), statistics.fmean(values)
    half = stats.t.ppf(0.975, n - 1) * statistics.stdev(values) / math.sqrt(n)
    return mean, mean - half, mean + half


def expected_verdict(low, high, direction):
    if low > 0 or high < 0:
        return "supported" if (low > 0) == (direction > 0) else "contradicted"
    return "inconclusive"


def pct(a, b):
    return [100 * (x / y - 1) for x, y in zip(a, b)]


def ppl(size, mode):
    return [math.exp(x) for x in LOSS[(size, mode)]]


def steps_to(target, loss):
    """The curve (10, loss + 1) -> (20, loss) crosses target at 10 + 10 * (loss + 1 - target)."""
    return 10 + 10 * (loss + 1 - target)


def results(out):
    data = json.loads((out / "results.json").read_text())
    return data, {g["group"]: g for g in data["groups"]}, {(c["claim"], c["comparison"]): c for c in data["claims"]}


def test_aggregates_differences_and_intervals(sweep):
    result = tiecli("report", sweep)
    assert result.exit_code == 0, result.output
    data, groups, _ = results(sweep / "report")  # one sweep given: report/ inside it
    assert set(groups) == {"nano tied", "nano untied", "micro tied", "micro untied"}
    assert len(data["runs"]) == 12

    g = groups["nano tied"]
    mean, low, high = interval(ppl("nano", "tied"))
    assert g["perplexity_mean"] == pytest.approx(mean) and g["perplexity_low"] == pytest.approx(low) and g["perplexity_high"] == pytest.approx(high)
    assert g["loss_sd"] == pytest.approx(statistics.stdev(LOSS[("nano", "tied")]))
    # t(0.975, df=2) = 4.302653: the interval of the paired perplexity difference, written out by hand
    diffs = pct(ppl("nano", "tied"), ppl("nano", "untied"))
    half = 4.302653 * statistics.stdev(diffs) / math.sqrt(3)
    assert g["delta_ppl_pct_mean"] == pytest.approx(statistics.fmean(diffs))
    assert g["delta_ppl_pct_low"] == pytest.approx(statistics.fmean(diffs) - half, rel=1e-6)
    assert g["delta_ppl_pct_high"] == pytest.approx(statistics.fmean(diffs) + half, rel=1e-6)
    assert g["baseline"] == "nano untied" and groups["nano untied"]["baseline"] is None

    p_tied, p_untied = params("micro", "tied"), params("micro", "untied")
    assert groups["micro tied"]["saved_params"] == p_untied["total"] - p_tied["total"] == V * 128
    assert groups["micro tied"]["embedding_share"] == pytest.approx(V * 128 / p_tied["total"])

    # convergence: target = highest final loss in the set (curves end at their minimum)
    target = max(LOSS[("nano", "untied")] + LOSS[("nano", "tied")])
    assert g["target_loss"] == target
    tied_steps = [steps_to(target, x) for x in LOSS[("nano", "tied")]]
    untied_steps = [steps_to(target, x) for x in LOSS[("nano", "untied")]]
    assert g["steps_to_target_mean"] == pytest.approx(statistics.fmean(tied_steps))
    assert g["tokens_to_target_mean"] == pytest.approx(statistics.fmean(tied_steps) * TOKENS_PER_STEP)
    mean, low, high = interval(pct(tied_steps, untied_steps))
    assert (g["delta_steps_pct_mean"], g["delta_steps_pct_low"], g["delta_steps_pct_high"]) == pytest.approx((mean, low, high))

    mean, low, high = interval([statistics.fmean(grad_cos("tied", s)) for s in range(3)])
    assert (g["grad_cos_mean"], g["grad_cos_low"], g["grad_cos_high"]) == pytest.approx((mean, low, high))


def test_equal_parameter_view(sweep):
    assert tiecli("report", sweep, "--out", sweep / "out").exit_code == 0
    _, groups, _ = results(sweep / "out")
    # micro tied lies between nano untied and micro untied in total parameters: log ppl linear in log params
    x0, x1 = math.log(params("nano", "untied")["total"]), math.log(params("micro", "untied")["total"])
    w = (math.log(params("micro", "tied")["total"]) - x0) / (x1 - x0)
    base = [math.exp((1 - w) * a + w * b) for a, b in zip(LOSS[("nano", "untied")], LOSS[("micro", "untied")])]
    mean, low, high = interval(pct(ppl("micro", "tied"), base))
    g = groups["micro tied"]
    assert (g["equal_params_delta_ppl_pct_mean"], g["equal_params_delta_ppl_pct_low"], g["equal_params_delta_ppl_pct_high"]) == pytest.approx((mean, low, high))
    assert g["equal_params_base_perplexity_mean"] == pytest.approx(statistics.fmean(base))
    # nano tied has fewer parameters than any untied model: nothing to interpolate from
    assert groups["nano tied"]["equal_params_delta_ppl_pct_mean"] is None
    assert "outside" in groups["nano tied"]["equal_params_note"]
    report = (sweep / "out" / "report.md").read_text()
    assert "Validation at equal total parameters" in report and "Validation at equal architecture" in report and "n/a" in report


def test_claim_verdicts_follow_the_stated_rules(sweep):
    assert tiecli("report", sweep).exit_code == 0
    _, _, claims = results(sweep / "report")
    for size in SIZES:
        label = f"{size} tied"
        diffs = pct(ppl(size, "tied"), ppl(size, "untied"))
        _, low, high = interval(diffs)
        assert claims[("C6", label)]["verdict"] == expected_verdict(low, high, -1)
        assert claims[("C6", label)]["interval"]["low"] == pytest.approx(low)

        saved = params(size, "untied")["total"] - params(size, "tied")["total"]
        share = saved / params(size, "untied")["total"]
        assert claims[("C1", label)]["verdict"] == ("supported" if 0.15 <= share <= 0.30 else "contradicted")
        n_embd = SIZES[size]["n_embd"]
        assert claims[("R2", label)]["verdict"] == ("supported" if saved > 4 * n_embd * n_embd else "contradicted")

        _, low, high = interval([statistics.fmean(grad_cos("tied", s)) for s in range(3)])
        assert claims[("R4", label)]["verdict"] == expected_verdict(low, high, -1) == "supported"

        _, low, high = interval([forms_contrast("untied", s)[0] - forms_contrast("untied", s)[1] for s in range(3)])
        assert claims[("R3", f"{size} untied")]["verdict"] == expected_verdict(low, high, +1) == "supported"

        for i, side in enumerate(("input", "output")):
            _, low, high = interval([drifts(size, "tied", s)[0] - drifts(size, "untied", s)[i] for s in range(3)])
            assert claims[("C2", f"{label} vs untied {side}")]["verdict"] == expected_verdict(low, high, -1)
            assert claims[("C2", f"{label} vs untied {side}")]["interval"]["high"] == pytest.approx(high)

        # Steps to target by hand: the target is the highest final loss at this size (every run's lowest
        # point); each curve falls linearly from loss + 1 at step 10 to loss at step 20.
        target = max(LOSS[(size, "tied")] + LOSS[(size, "untied")])
        steps = {mode: [10 + 10 * (loss + 1 - target) for loss in LOSS[(size, mode)]] for mode in ("tied", "untied")}
        mean, low, high = interval([100 * (t / u - 1) for t, u in zip(steps["tied"], steps["untied"])])
        r6, c3 = claims[("R6", label)], claims[("C3", label)]
        assert r6["interval"] == c3["interval"]  # one figure, read in opposite directions
        assert (r6["interval"]["mean"], r6["interval"]["low"], r6["interval"]["high"]) == pytest.approx((mean, low, high))
        assert r6["verdict"] == expected_verdict(low, high, +1) and c3["verdict"] == expected_verdict(low, high, -1)

    # the R5/C6 slope of the per-seed differences against log10 non-embedding parameters, by hand
    points = [(math.log10(SIZES[size]["non_embedding"]), d) for size in SIZES for d in pct(ppl(size, "tied"), ppl(size, "untied"))]
    xs, ys = zip(*points)
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in points) / sxx
    residual = sum((y - my - slope * (x - mx)) ** 2 for x, y in points)
    half = stats.t.ppf(0.975, len(points) - 2) * math.sqrt(residual / (len(points) - 2) / sxx)
    (row,) = [c for (claim, _), c in claims.items() if claim == "R5/C6"]
    assert (row["interval"]["mean"], row["interval"]["low"], row["interval"]["high"]) == pytest.approx((slope, slope - half, slope + half))
    assert row["verdict"] == expected_verdict(slope - half, slope + half, +1)
    (budget,) = [c for (claim, _), c in claims.items() if claim == "R5"]
    assert budget["verdict"] == "inconclusive" and "no data" in budget["why"]


def test_one_seed_verdicts_are_inconclusive_and_say_why(tmp_path):
    for mode in ("tied", "untied"):
        for size in SIZES:
            write_run(tmp_path / "runs", size, mode, 0)
    result = tiecli("report", tmp_path / "runs", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    data, groups, claims = results(tmp_path / "out")
    for (claim, _), row in claims.items():
        if claim not in ("R2", "C1"):  # parameter counts do not depend on the seed
            assert row["verdict"] == "inconclusive", row
            assert "seed" in row["why"] or "no data" in row["why"], row
    assert claims[("C6", "nano tied")]["why"] == "one seed: no spread, so no interval"
    assert groups["nano tied"]["perplexity_low"] is None and groups["nano tied"]["delta_ppl_pct_mean"] == pytest.approx(
        100 * (math.exp(LOSS[("nano", "tied")][0]) / math.exp(LOSS[("nano", "untied")][0]) - 1))


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


def test_broken_runs_are_skipped_with_reasons(sweep):
    broken = sweep.parent / "broken"
    (write_run(broken, "nano", "tied", 0) / "summary.json").unlink()
    (write_run(broken, "nano", "tied", 1) / "summary.json").write_text("{not json")
    write_run(broken, "nano", "tied", 2, status="failed")
    write_run(broken, "micro", "tied", 0, status="running")
    (write_run(broken, "micro", "tied", 1) / "eval.json").write_text("[1, 2")
    result = tiecli("report", sweep, broken, "--out", sweep.parent / "out")
    assert result.exit_code == 0, result.output
    data, groups, _ = results(sweep.parent / "out")
    reasons = {s["path"].split("/")[-1]: s["reason"] for s in data["skipped"]}
    assert reasons == {"nano-tied-s0": "no summary.json", "nano-tied-s1": "summary.json unreadable (JSONDecodeError)",
                       "nano-tied-s2": "status failed: RuntimeError: CUDA out of memory", "micro-tied-s0": "status running",
                       "micro-tied-s1": "eval.json unreadable (JSONDecodeError)"}
    assert len(data["runs"]) == 12 and groups["nano tied"]["n_seeds"] == 3  # the sweep's runs, untouched by the broken ones
    assert "Skipped run directories" in (sweep.parent / "out" / "report.md").read_text()


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


def test_runs_lists_every_run_directory(sweep):
    write_run(sweep, "nano", "untied", 7, loss=4.0, status="failed")
    (sweep / "broken").mkdir()
    (sweep / "broken" / "config.yaml").write_text("seed: 0\n")
    result = tiecli("runs", sweep)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    cells = [c.strip() for c in next(line for line in lines if "nano-tied-s1" in line).split("│")]
    assert cells[1:7] == ["nano-tied-s1", "completed", "nano", "tied", "20/20", f"{math.exp(3.05):.2f}"]
    assert "failed" in next(line for line in lines if "nano-untied-s7" in line)
    assert "unreadable: no" in next(line for line in lines if "broken" in line) and "overrides.yaml" in result.output
    assert sum("-s" in line for line in lines) == 12 + 1  # the sweep, the failed run; "broken" above
    assert tiecli("runs", sweep / "nothing").exit_code == 1


def test_help_gives_an_example():
    for command in ("report", "runs"):
        assert "Example: tiecli" in tiecli(command, "--help").output
