"""Article C's own claims, judged on synthetic run directories whose answer is known by construction: tying
reduces the input matrix's drift (C2/C7 drift), stabilises training (C2 stability: loss spikes, early
gradient-norm jitter, divergence across a learning-rate grid); and what each run is, on record: precision and
threads in every report, and every per-seed number a verdict reads in results.csv, recomputed from it alone."""

import csv
import dataclasses
import json
import math
import statistics

import numpy as np
import pytest
import torch
from helpers import V, expected_verdict, interval, make_run, params, results, tiecli, tost
from scipy import stats

from tiecli.report.results import later
from tiecli.run.files import write_json
from tiecli.run.layout import SUMMARY
from tiecli.run.reader import RunReader
from tiecli.run.records import GeometryEntry, MetricsRow

STEPS, LOG_EVERY = 100, 5  # 20 logged rows; the first 20% of steps: the rows at steps 5, 10, 15, 20
SHAPE = {"nano": {"n_layer": 2, "n_head": 4, "n_embd": 64}, "micro": {"n_layer": 4, "n_head": 4, "n_embd": 128}}
LOG_1P1 = math.log(1.1)  # the default drift and gnorm SESOI, 10%, as a log ratio


def smooth_losses():
    """A train loss falling smoothly from 6 to about 3.5: no logged value is above 1.1 x the median of those before."""
    return [6.0 - 2.5 * (1 - math.exp(-i / 5)) for i in range(STEPS // LOG_EVERY)]


def with_spikes(losses, at, factor=1.5):
    return [x * factor if i in at else x for i, x in enumerate(losses)]


def run_dir(
    root,
    size,
    mode,
    seed,
    loss,
    *,
    lr=0.003,
    losses=None,
    norms=None,
    drift=None,
    fit=None,
    status="completed",
    error=None,
    unigram=None,
    dtype="fp32",
    threads=None,
    requested_dtype=None,
    log_every=LOG_EVERY,
):
    """A run as `tiecli train` writes one: logged train losses and grad norms every LOG_EVERY steps, evaluations at
    0, 50 and 100 (val curve 5.0, loss + 1, loss; train_eval_loss from fit = (at 50, at 100)), geometry at 0 and
    STEPS with drift = (input, output), summary.json with dtype, threads and the unigram perplexity of its corpus;
    requested_dtype is config.yaml's dtype (absent without it, as in a tiecli older than the key); log_every: the
    steps between logged rows."""
    losses, norms = losses or smooth_losses(), norms or [1.0] * (STEPS // LOG_EVERY)
    val = {0: 5.0, 50: loss + 1, STEPS: loss}
    rows = [MetricsRow(step=0, tokens=0, lr=0.0, val_loss=5.0)]
    for i, step in enumerate(range(log_every, STEPS + 1, log_every)):
        row = MetricsRow(step, step * 1000, lr, loss=losses[i], grad_norm=norms[i], val_loss=val.get(step))
        row.train_eval_loss = dict(zip((50, STEPS), fit or (None, None))).get(step)
        rows.append(row)
    side = {"singular_values": [2.0, 1.0]}
    entries = (
        [
            GeometryEntry(
                step,
                mode == "tied",
                V,
                {**side, "drift": d_in, "drift_unit": d_in},
                {**side, "drift": d_out, "drift_unit": d_out},
            )
            for step, (d_in, d_out) in ((0, (0.0, 0.0)), (STEPS, drift or (0.0, 0.0)))
        ]
        if drift
        else []
    )
    config = {
        "compile": False,
        "model": {"block_size": 128, "dropout": 0.0, "bias": True, **SHAPE[size]},
        "train": {"max_steps": STEPS, "max_tokens": None, "lr": lr, "min_lr": lr / 10},
        "diag": {"every": 0},
        "tying": {"mode": mode},
        "tokenizer": {"name": "bytes", "vocab_size": V},
        **({"dtype": requested_dtype} if requested_dtype else {}),
    }
    name = f"{size}-{mode}-lr{lr:g}-s{seed}" + (f"-{requested_dtype}-{dtype}" if requested_dtype else "")
    writer = make_run(
        root / name,
        config,
        seed,
        loss,
        rows,
        entries,
        params=params(size, mode),
        choices={"model": size, "tying": mode, "data": "shakespeare", "tokenizer": "bytes"},
        status=status,
        error=error,
        keep_open=True,
    )
    counts = {
        "unigram": {"perplexity": unigram, "bits_per_byte": 3.0},
        "bigram": {"perplexity": 40.0, "bits_per_byte": 2.5, "k": 0.1},
    }
    corpus = {"key": "test", "baselines": counts} if unigram else {"key": "test"}
    writer.summary(dataclasses.replace(writer.reader.summary(), corpus=corpus, dtype=dtype))
    writer.close()
    if threads:  # without: summary.json as a tiecli older than the threads field wrote it
        summary = json.loads((root / name / SUMMARY).read_text())
        write_json(root / name / SUMMARY, {**summary, "threads": threads})


def report(root, *args):
    result = tiecli("report", root, "--out", root.parent / "out", *args)
    assert result.exit_code == 0, result.output
    return (*results(root.parent / "out"), result.output)


def jitter(norms):
    """The sd of the changes in log grad norm over the rows at steps <= 20% of STEPS, written out here."""
    early = [math.log(g) for g in norms[: int(0.2 * STEPS) // LOG_EVERY]]
    changes = [b - a for a, b in zip(early, early[1:])]
    return statistics.stdev(changes)


# per size, mode and seed: (final loss, drift (input, output), spikes at these logged rows, early grad norms, fit)
DRIFT = {
    ("nano", "tied"): lambda s: (2.2 + 0.01 * s, 2.2 + 0.01 * s),
    ("nano", "untied"): lambda s: (0.95 + 0.005 * s, 2.3),
    ("micro", "tied"): lambda s: (1.0 * (1 + 0.01 * (s - 1)), 1.0 * (1 + 0.01 * (s - 1))),
    ("micro", "untied"): lambda s: (1.0, 2.0),
}
SPIKES = {("nano", "tied"): [], ("nano", "untied"): [6, 11, 15], ("micro", "tied"): [8], ("micro", "untied"): [8]}
NORMS = {  # the first four are the early window; afterwards the tied ones swing wildly, which the rule must ignore
    "tied": lambda s: [2.0, 1.9, 1.85, 1.8 - 0.01 * s] + [10.0, 0.1] * 8,
    "untied": lambda s: [2.0, 3.0 + 0.1 * s, 1.2, 2.6] + [1.0] * 16,
}
FIT = {"tied": lambda s: (4.2 + 0.01 * s, 3.6), "untied": lambda s: (4.0, 3.3 - 0.02 * s)}
LOSS = {("nano", "tied"): 3.2, ("nano", "untied"): 3.0, ("micro", "tied"): 2.9, ("micro", "untied"): 2.8}


@pytest.fixture
def pairs(tmp_path):
    """nano and micro, tied and untied, seeds 0-2, every per-seed number known in advance."""
    root = tmp_path / "runs"
    for size, mode in LOSS:
        for seed in range(3):
            run_dir(
                root,
                size,
                mode,
                seed,
                LOSS[(size, mode)] + 0.05 * seed,
                losses=with_spikes(smooth_losses(), SPIKES[(size, mode)]),
                norms=NORMS[mode](seed),
                drift=DRIFT[(size, mode)](seed),
                fit=FIT[mode](seed),
                dtype="bf16",
                threads=2,
            )
    return root


def check_row(row, values, direction, sesoi):
    """The row's interval, tests and verdict, against the per-seed values computed here."""
    assert (row["interval"]["mean"], row["interval"]["low"], row["interval"]["high"]) == pytest.approx(interval(values))
    assert row["direction"] == direction and row["sesoi"] == pytest.approx(sesoi)
    spread = statistics.stdev(values) > 0
    if spread:
        assert row["p"] == pytest.approx(stats.ttest_1samp(values, 0).pvalue)
        assert row["p_equiv"] == pytest.approx(tost(values, sesoi))
    assert row["verdict"] == expected_verdict(row), row


@pytest.mark.slow
def test_drift_is_judged_tied_against_the_untied_input_matrix(pairs):
    """nano: the tied matrix drifts 2.3x as far as untied's input matrix (as the CPU studies found): contradicted,
    whatever untied's output matrix does; micro: ratios 0.99, 1.00, 1.01: within the 10% SESOI, equivalent."""
    data, _, claims, _ = report(pairs)
    for size, verdict in (("nano", "contradicted"), ("micro", "equivalent")):
        values = [math.log(DRIFT[(size, "tied")](s)[0] / DRIFT[(size, "untied")](s)[0]) for s in range(3)]
        row = claims[("C2/C7 drift", f"{size} tied")]
        check_row(row, values, -1, LOG_1P1)
        assert row["verdict"] == verdict, row
    nano = claims[("C2/C7 drift", "nano tied")]
    assert f"drift ratio tied/untied {math.exp(nano['interval']['mean']):.3g} [" in nano["measured"]
    assert "untied input 0.955 (output 2.3)" in nano["measured"]
    assert "not judged" not in data["rules"]["claim C2/C7"] and "C2/C7 drift" in data["rules"]["claim C2/C7"]
    assert "10% drift" in data["rules"]["smallest effect of interest (SESOI)"]


@pytest.mark.slow
def test_stability_rows_count_spikes_and_read_early_grad_norm_jitter(pairs):
    """nano: untied has 3 spikes a seed, tied none (supported, no spread); micro: one each (equivalent). Jitter: untied's
    early norms swing, tied's fall smoothly (supported); tied's late wild swings are outside the first 20% and ignored."""
    data, groups, claims, output = report(pairs)
    for size, verdict in (("nano", "supported"), ("micro", "equivalent")):
        spikes = [len(SPIKES[(size, "tied")]) - len(SPIKES[(size, "untied")])] * 3
        row = claims[("C2 stability (spikes)", f"{size} tied")]
        check_row(row, spikes, -1, 1.0)
        assert row["verdict"] == verdict and row["p"] == pytest.approx(1.0 if verdict == "equivalent" else 0.0)
        ratios = [math.log(jitter(NORMS["tied"](s)) / jitter(NORMS["untied"](s))) for s in range(3)]
        check_row(claims[("C2 stability (grad norm)", f"{size} tied")], ratios, -1, LOG_1P1)
    assert groups["nano untied"]["loss_spikes_mean"] == 3 and groups["nano tied"]["loss_spikes_mean"] == 0
    assert groups["nano tied"]["grad_norm_jitter_mean"] == pytest.approx(
        statistics.fmean(jitter(NORMS["tied"](s)) for s in range(3))
    )
    for size in ("nano", "micro"):  # gradient-norm excursions counted beside the spikes, per run
        counts = {mode: [excursions(NORMS[mode](s)) for s in range(3)] for mode in ("tied", "untied")}
        assert counts["tied"][0] > 0 == counts["untied"][0]  # tied's late swings: excursions, though no loss spike
        assert groups[f"{size} tied"]["grad_norm_excursions_mean"] == pytest.approx(statistics.fmean(counts["tied"]))
        assert (
            f"grad-norm excursions (> 5x the running median) per run: tied {statistics.fmean(counts['tied']):.3g}, "
            "untied 0" in claims[("C2 stability (spikes)", f"{size} tied")]["measured"]
        )
    runs, _ = csv_rows(pairs.parent / "out")
    header = next(csv.reader((pairs.parent / "out" / "results.csv").open()))
    assert [number(runs[("nano tied", s)]["grad_norm_excursions"]) for s in range(3)] == [
        excursions(NORMS["tied"](s)) for s in range(3)
    ]
    first = header.index("grad_norm_excursions")  # the first of the columns added after findings were committed
    assert header[first : first + 5] == [
        "grad_norm_excursions",
        *(f"grad_norm_excursions_{k}" for k in ("mean", "sd", "low", "high")),
    ]
    assert all(later(name) is not None for name in header[first:])  # every later column after every earlier one
    assert "1.1 x the median" in data["rules"]["claim C2 stability (spikes)"]
    assert "first 20%" in data["rules"]["claim C2 stability (grad norm)"]
    page = (pairs.parent / "out" / "report.md").read_text()  # the terminal shows the short claims table only
    assert "C2 stability (spikes)" in page and "loss spikes" in page and "grad-norm jitter" in page


def excursions(norms):
    """Logged grad norms above 5 x the median of the up to 10 before them, from the fourth on, written out here."""
    return sum(norms[i] > 5 * statistics.median(norms[max(0, i - 10) : i]) for i in range(3, len(norms)))


def test_a_grad_norm_excursion_is_above_5_times_the_running_median(tmp_path):
    """5.5 x the median of the norms before counts, 4.5 x does not, nor a jump whose window is under 3 norms."""
    from tiecli.report import load
    from tiecli.report.stats import grad_norm_excursions

    norms = [1.0, 9.0, *[1.0] * 6, 5.5, *[1.0] * 4, 4.5, *[1.0] * 6]
    run_dir(tmp_path, "nano", "tied", 0, 3.0, norms=norms)
    assert grad_norm_excursions(load.load_run(tmp_path / "nano-tied-lr0.003-s0")) == 1 == excursions(norms)


@pytest.mark.slow
def test_a_grad_norm_row_without_enough_early_points_says_so(tmp_path):
    """Runs that log grad_norm every 10 of 100 steps have 2 points in the first 20%, too few for a jitter: the row
    says so instead of asking for grad_norm the runs have."""
    for mode in ("tied", "untied"):
        for seed in range(3):
            run_dir(tmp_path / "runs", "nano", mode, seed, 3.0 + 0.01 * seed, log_every=10)
    _, _, claims, _ = report(tmp_path / "runs")
    why = (
        "no data: the runs log grad_norm, but 2 points in the first 20% of steps (the jitter needs 3; log more "
        "often: train.log_interval)"
    )
    assert claims[("C2 stability (grad norm)", "-")]["verdict"] == why
    assert why in (tmp_path / "out" / "report.md").read_text()


def test_a_spike_is_above_1_1_times_the_running_median(tmp_path):
    """The threshold itself: a logged loss 1.15 x the median of those before counts, 1.05 x does not; nor does the
    fall at the start of training, nor a value whose window is under 3 logged losses."""
    from tiecli.report import load
    from tiecli.report.stats import loss_spikes

    flat = [4.0] * 20
    run_dir(tmp_path, "nano", "tied", 0, 3.0, losses=[9.0, 4.0, *flat[2:10], 4.6, *flat[11:15], 4.2, *flat[16:]])
    assert loss_spikes(load.load_run(tmp_path / "nano-tied-lr0.003-s0")) == 1  # 4.6 = 1.15 x 4.0; 4.2 = 1.05 x 4.0
    run_dir(tmp_path, "nano", "tied", 1, 3.0, losses=[4.0, 8.0, 4.0, *flat[3:]])
    assert loss_spikes(load.load_run(tmp_path / "nano-tied-lr0.003-s1")) == 0  # the second row has one loss before


def grid(root, seeds=4, tied_diverges=()):
    """Tied and untied at four peak learning rates, seeds 0..seeds-1. Untied diverges at the top two: at 0.01 it stops
    on a NaN loss (failed), at 0.03 it ends above its corpus's unigram loss (4.0); tied only at (lr, seed) in
    tied_diverges. Tied runs are bf16 on 2 threads; untied fp32 with threads unrecorded (an older tiecli)."""
    for seed in range(seeds):
        for lr in (0.001, 0.003, 0.01, 0.03):
            tied_bad = (lr, seed) in tied_diverges
            loss = 4.5 if tied_bad else 3.0 + lr
            run_dir(root, "nano", "tied", seed, loss, lr=lr, unigram=math.exp(4.0), dtype="bf16", threads=2)
            failed = {"status": "failed", "error": "Diverged: the training loss became nan by step 40"}
            run_dir(
                root,
                "nano",
                "untied",
                seed,
                4.5 if lr == 0.03 else 3.0 + lr,
                lr=lr,
                unigram=math.exp(4.0),
                dtype="fp32",
                **(failed if lr == 0.01 else {}),
            )
    # one old run without a unigram baseline: its threshold is its step-0 validation loss (5.0)
    for mode in ("tied", "untied"):
        run_dir(root, "micro", mode, 0, 5.5 if mode == "untied" else 3.0, lr=0.001)
        run_dir(root, "micro", mode, 0, 3.0, lr=0.003)


@pytest.mark.slow
def test_divergence_is_judged_across_the_lr_grid_with_an_exact_test(tmp_path):
    """9 pairs diverge untied only (4 seeds x 2 top rates at nano, one micro pair above its step-0 loss), none tied
    only: exact McNemar p = 2 / 2^9, supported. --select keeps one learning rate per group, yet the row reads every
    run of the grid, the failed ones too."""
    grid(tmp_path / "runs")
    data, _, claims, _ = report(tmp_path / "runs", "--select", "train.lr")
    (row,) = [c for c in data["claims"] if c["claim"] == "C2 stability (divergence)"]
    assert row["comparison"] == "18 tied/untied pairs over train.lr 0.001-0.03"
    assert row["p"] == pytest.approx(stats.binomtest(0, 9).pvalue) == pytest.approx(2 / 2**9)
    assert row["interval"]["mean"] == pytest.approx(-9 / 18) and row["direction"] == -1
    assert row["verdict"] == "supported", row
    assert "lr 0.01: tied 0/4, untied 4/4" in row["measured"] and "lr 0.001: tied 0/5, untied 1/5" in row["measured"]
    assert len(data["divergence"]) == 36 and sum(r["diverged"] for r in data["divergence"]) == 9


@pytest.mark.slow
def test_divergence_with_discordance_both_ways_or_one_rate_is_not_supported(tmp_path):
    """Tied diverges too, at 0.003 for every seed: 9 pairs untied only, 4 tied only: inconclusive; one rate: no data."""
    grid(tmp_path / "runs", tied_diverges={(0.003, s) for s in range(4)})
    data, _, claims, _ = report(tmp_path / "runs")
    (row,) = [c for c in data["claims"] if c["claim"] == "C2 stability (divergence)"]
    assert row["p"] == pytest.approx(stats.binomtest(4, 13).pvalue) and row["verdict"] == "inconclusive"
    assert "lr 0.003: tied 4/5, untied 0/5" in row["measured"]
    one = tmp_path / "one"
    for mode in ("tied", "untied"):
        run_dir(one, "nano", mode, 0, 3.0)
        run_dir(one, "nano", mode, 1, 3.1)
    data, _, claims, _ = report(one)
    (row,) = [c for c in data["claims"] if c["claim"] == "C2 stability (divergence)"]
    assert row["verdict"].startswith("no data: needs tied and untied runs at two or more train.lr values")
    assert "divergence" not in {r["kind"] for r in csv.DictReader((tmp_path / "out" / "results.csv").open())}


def test_every_report_states_precision_and_threads(tmp_path):
    grid(tmp_path / "runs", seeds=1)
    data, _, _, output = report(tmp_path / "runs")
    # the used runs: 4 tied (bf16, 2 threads) and 3 untied (fp32, unrecorded) at nano, 4 micro (fp32, unrecorded)
    assert data["scope"] == {
        "precision": {"bf16 on cpu": 4, "fp32 on cpu": 7},
        "threads": {"2": 4, "not recorded": 7},
    }
    line = (
        "precision: bf16 autocast on cpu (4 runs), fp32 on cpu (7 runs); CPU threads: 2 (4 runs), not recorded (7 runs)"
    )
    assert line in " ".join(output.split())
    for page in ("report.md", "report.html"):
        assert line in (tmp_path / "out" / page).read_text()
    rows = [r for r in csv.DictReader((tmp_path / "out" / "results.csv").open()) if r["kind"] == "run"]
    assert {(r["dtype"], r["threads"]) for r in rows} == {("bf16", "2"), ("fp32", "")}


@pytest.mark.slow
def test_train_records_its_threads(tmp_path):
    from conftest import TINY

    result = tiecli("train", *TINY, "diag.every=0", "diag.geometry=false", "--name", "t")
    assert result.exit_code == 0, result.output
    summary = RunReader(tmp_path / "runs" / "t").summary()
    assert summary.threads == torch.get_num_threads()


# --- every per-seed number that enters a verdict is in results.csv ----------------------------------------------


def csv_rows(out):
    rows = list(csv.DictReader((out / "results.csv").open()))
    runs = {(r["group"], int(r["seed"])): r for r in rows if r["kind"] == "run"}
    return runs, {r["group"]: r for r in rows if r["kind"] == "group"}


def number(text):
    return float(text) if text not in ("", None) else None


@pytest.mark.slow
def test_claim_rows_are_recomputed_from_results_csv_alone(pairs):
    """C6, R6, R5/C2 gap (equal fit), R5/C6 (trend), C2/C7 drift and both stability rows, from results.csv's columns
    and nothing else: the per-seed values, paired through each group row's baseline, give each row's interval."""
    _, _, claims, _ = report(pairs)
    runs, groups = csv_rows(pairs.parent / "out")
    for size in ("nano", "micro"):
        label, base = f"{size} tied", groups[f"{size} tied"]["baseline"]
        seeds = [s for g, s in runs if g == label]
        tied, untied = [runs[(label, s)] for s in seeds], [runs[(base, s)] for s in seeds]
        assert [r["name"] for r in untied] == [r["baseline_run"] for r in tied]
        by_hand = {
            "C6": [number(t["claims_delta_loss"]) for t in tied],
            # one budget: R6's schedule-free row is not tested, its schedule-dependent reading is shown
            "R6 (schedule-dependent)": [
                100 * (number(t["steps_to_target"]) / number(t["baseline_steps_to_target"]) - 1) for t in tied
            ],
            "R5/C2 gap (equal fit)": [number(t["equal_fit_gap"]) - number(t["baseline_equal_fit_gap"]) for t in tied],
            "C2/C7 drift": [
                math.log(number(t["drift_input"]) / number(u["drift_input"])) for t, u in zip(tied, untied)
            ],
            "C2 stability (spikes)": [
                number(t["loss_spikes"]) - number(u["loss_spikes"]) for t, u in zip(tied, untied)
            ],
            "C2 stability (grad norm)": [
                math.log(number(t["grad_norm_jitter"]) / number(u["grad_norm_jitter"])) for t, u in zip(tied, untied)
            ],
        }
        assert by_hand["C6"] == pytest.approx([number(t["loss"]) - number(u["loss"]) for t, u in zip(tied, untied)])
        for claim, values in by_hand.items():
            row = claims[(claim, label)]
            assert (row["interval"]["mean"], row["interval"]["low"], row["interval"]["high"]) == pytest.approx(
                interval(values)
            ), claim
    # the slope's inputs: each tied run's Δloss against log10 of its non-embedding parameters
    points = [
        (math.log10(number(r["params_non_embedding"])), number(r["claims_delta_loss"]))
        for (g, _), r in runs.items()
        if g.endswith(" tied")
    ]
    fit = stats.linregress(*zip(*points))
    assert claims[("R5/C6 (trend)", "nano tied -> micro tied")]["interval"]["mean"] == pytest.approx(fit.slope)
    assert claims[("R5/C6 (trend)", "nano tied -> micro tied")]["p"] == pytest.approx(fit.pvalue)


@pytest.mark.slow
def test_the_divergence_row_is_recomputed_from_results_csv_alone(tmp_path):
    grid(tmp_path / "runs")
    _, _, claims, _ = report(tmp_path / "runs", "--select", "train.lr")
    rows = [r for r in csv.DictReader((tmp_path / "out" / "results.csv").open()) if r["kind"] == "divergence"]
    by_unit: dict[str, dict[str, int]] = {}
    for r in rows:
        by_unit.setdefault(r["unit"], {})[r["tying"]] = int(r["diverged"])
    d = np.array([u["tied"] - u["untied"] for u in by_unit.values()])
    row = next(c for (name, _), c in claims.items() if name == "C2 stability (divergence)")
    assert row["interval"]["mean"] == pytest.approx(d.mean())
    assert row["p"] == pytest.approx(stats.binomtest(int((d == 1).sum()), int((d != 0).sum())).pvalue)


def test_dtype_auto_groups_by_the_precision_the_run_trained_in(tmp_path):
    """Tied asked for bf16; untied asked for auto on two machines, one with bf16 (trained in bf16) and one without
    (fp32). The auto runs that trained in bf16 are tied's baseline; the fp32 ones are a group of their own."""
    root = tmp_path / "runs"
    for seed in range(3):
        run_dir(root, "nano", "tied", seed, 3.2 + seed / 100, requested_dtype="bf16", dtype="bf16")
        run_dir(root, "nano", "untied", seed, 3.0 + seed / 50, requested_dtype="auto", dtype="bf16")
        run_dir(root, "nano", "untied", seed, 2.0, requested_dtype="auto", dtype="fp32")
    data, _, _, _ = report(root)
    rows = list(csv.DictReader((tmp_path / "out" / "results.csv").open()))
    groups = {r["group"] for r in rows if r["kind"] == "group"}
    assert groups == {"nano tied dtype=bf16", "nano untied dtype=bf16", "nano untied dtype=fp32"}, groups
    tied = [r for r in rows if r["kind"] == "run" and r["group"] == "nano tied dtype=bf16"]
    assert sorted(r["baseline_run"].rsplit("/", 1)[-1] for r in tied) == [
        f"nano-untied-lr0.003-s{seed}-auto-bf16" for seed in range(3)
    ]
    (c6,) = [c for c in data["claims"] if c["claim"] == "C6"]
    assert c6["interval"]["mean"] == pytest.approx(statistics.mean(0.2 + s / 100 - s / 50 for s in range(3)))
