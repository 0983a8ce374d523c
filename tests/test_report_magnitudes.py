"""The report's magnitude rules on synthetic run directories whose answer is known by construction: R4 (cancellation)
(the tied excess cancelled fraction over the untied control's), C2/C7 drift on the scale-free drift_unit, and L1 (from
the literature: the tied matrix resembles the untied output matrix), each recomputed here from the runs' numbers."""

import csv
import math

import numpy as np
import pytest
from helpers import V, interval, make_run, params, results, tiecli, tost
from scipy import stats

from tiecli.report.results import later
from tiecli.run.layout import ROW_SAMPLE
from tiecli.run.records import GeometryEntry, MetricsRow
from tiecli.run.writer import RunWriter

STEPS = 100
SHAPE = {"n_layer": 2, "n_head": 4, "n_embd": 64}


def synth(root, mode, seed, *, diag=None, drift=(0.5, 0.5), drift_unit=(0.3, 0.3), rows=None, paths=None):
    """A nano run: diag(step) -> the gradient statistics of the rows at steps 10, 20, ..., 100; geometry at 0 and STEPS
    with (input, output) drift and drift_unit; rows: rows.npz's (ids, input, output or None); paths(step) -> (grad_norm_in,
    grad_norm_out) merged into each diag row."""
    rows_out = [MetricsRow(step=0, tokens=0, lr=0.0, val_loss=5.0)]
    for step in range(10, STEPS + 1, 10):
        d = dict(diag(step) if diag else {})
        if paths:
            d |= dict(zip(("grad_norm_in", "grad_norm_out"), paths(step)))
        rows_out.append(MetricsRow(step, step * 1000, 0.003, loss=4.0, val_loss=3.5 if step == STEPS else None, diag=d))
    side = {"singular_values": [2.0, 1.0]}
    entries = [
        GeometryEntry(
            step,
            mode == "tied",
            V,
            {**side, "drift": d[0], "drift_unit": u[0]},
            {**side, "drift": d[1], "drift_unit": u[1]},
        )
        for step, d, u in ((0, (0.0, 0.0), (0.0, 0.0)), (STEPS, drift, drift_unit))
    ]
    config = {
        "compile": False,
        "model": {"block_size": 128, "dropout": 0.0, "bias": True, **SHAPE},
        "train": {"max_steps": STEPS, "max_tokens": None, "lr": 0.003},
        "diag": {"every": 10},
        "tying": {"mode": mode},
        "tokenizer": {"name": "bytes", "vocab_size": V},
    }
    path = make_run(
        root / f"nano-{mode}-s{seed}",
        config,
        seed,
        3.5 + 0.01 * seed,
        rows_out,
        entries,
        params=params("nano", mode),
        choices={"model": "nano", "tying": mode, "data": "shakespeare", "tokenizer": "bytes"},
    )
    if rows is not None:
        writer = RunWriter.open(path)
        writer.row_sample(STEPS, *rows)
        writer.close()


def report(root):
    result = tiecli("report", root, "--out", root.parent / "out")
    assert result.exit_code == 0, result.output
    return results(root.parent / "out")


def check(row, values, direction, sesoi, verdict):
    assert (row["interval"]["mean"], row["interval"]["low"], row["interval"]["high"]) == pytest.approx(interval(values))
    assert row["p"] == pytest.approx(stats.ttest_1samp(values, 0).pvalue) and row["direction"] == direction
    assert row["p_equiv"] == pytest.approx(tost(values, sesoi)) and row["sesoi"] == pytest.approx(sesoi)
    assert row["verdict"] == verdict, row


# --- R4 (cancellation) -------------------------------------------------------------------------------------------


def cancel_diag(related, null, scale):
    """A diag step whose related pairs cancel `related` and null pairs `null` of the paths' movement (both readings),
    at a magnitude `scale` (how far the paths move the pairs at this step)."""
    out = {"grad_cos": -0.1, "pair_cancel_cover": 0.9}
    for kind in ("grad", "adam"):
        for suffix, fraction in (("", related), ("_null", null)):
            out[f"pair_cancel_{kind}{suffix}_den"] = scale
            out[f"pair_cancel_{kind}{suffix}_num"] = scale * (1 - fraction)
    return out


def cancelled(related, null, scales):
    """The accumulated excess: 1 - sum num / sum den for the related pairs minus the same for the null."""
    den = sum(scales)
    forms = 1 - sum(s * (1 - r) for s, r in zip(scales, related)) / den
    return forms - (1 - sum(s * (1 - n) for s, n in zip(scales, null)) / den)


@pytest.mark.slow
def test_r4_cancellation_weighs_steps_by_magnitude_against_the_untied_control(tmp_path):
    """Tied: early steps (large magnitude) cancel 0.5 at the related pairs against 0.3 in the null, late steps (tiny
    magnitude) none beyond it; untied: nothing beyond the null at any step. The magnitude-weighted excess is about 0.2
    (a per-step mean would read 0.02): supported. The per-step fractions are never read by the rule."""
    scales = [10.0 / step for step in range(10, STEPS + 1, 10)]  # the paths' movement shrinks as training goes
    expected = []
    for seed in range(3):
        early = 0.5 + 0.01 * seed

        def tied(step, early=early):
            return cancel_diag(early if step <= 20 else 0.3, 0.3, 10.0 / step)

        def untied(step, seed=seed):
            return cancel_diag(0.3 + 0.002 * seed, 0.3, 10.0 / step)

        synth(tmp_path / "runs", "tied", seed, diag=tied)
        synth(tmp_path / "runs", "untied", seed, diag=untied)
        related_tied = [early if s <= 20 else 0.3 for s in range(10, STEPS + 1, 10)]
        excess_tied = cancelled(related_tied, [0.3] * 10, scales)
        excess_untied = cancelled([0.3 + 0.002 * seed] * 10, [0.3] * 10, scales)
        expected.append(excess_tied - excess_untied)
    data, groups, claims = report(tmp_path / "runs")
    row = claims[("R4 (cancellation)", "nano tied")]
    check(row, expected, +1, 0.02, "supported")
    assert 0.1 < expected[0] < 0.3
    runs = {(r["group"], r["seed"]): r for r in data["runs"]}
    assert runs[("nano tied", 0)]["pair_cancel_adam_excess"] - runs[("nano untied", 0)][
        "pair_cancel_adam_excess"
    ] == pytest.approx(expected[0])
    assert groups["nano untied"]["pair_cancel_grad_excess_mean"] == pytest.approx(0.002, abs=1e-9)
    assert "untied 0.002" in row["measured"] and "pairs matched 0.9" in row["measured"]
    header = next(csv.reader((tmp_path / "out" / "results.csv").open()))
    new = [i for i, name in enumerate(header) if later(name) is not None]
    assert new == list(range(len(header) - len(new), len(header)))  # appended after every older column
    assert {"pair_cancel_adam_excess", "drift_unit_input", "early_out_in"} <= {header[i] for i in new}
    assert "SESOI 0.02" in data["rules"]["claim R4 (cancellation)"]


@pytest.mark.slow
def test_r4_cancellation_without_its_statistics_has_no_data(tmp_path):
    for seed in range(2):
        for mode in ("tied", "untied"):
            synth(tmp_path / "runs", mode, seed, diag=lambda step: {"grad_cos": -0.1})
    _, _, claims = report(tmp_path / "runs")
    assert claims[("R4 (cancellation)", "-")]["verdict"].startswith("no data: needs tied and untied runs")


# --- C2/C7 drift on the row-normalised matrix ------------------------------------------------------------------


@pytest.mark.slow
def test_drift_is_judged_without_norm_growth(tmp_path):
    """The tied matrix's |W - W0| / |W0| is 2.3x untied's input matrix's (its rows grew), but its rows turned as far
    as untied's (drift_unit ratio 0.99-1.01): equivalent, not contradicted as the norm-based rule read it."""
    for seed in range(3):
        synth(tmp_path / "runs", "tied", seed, drift=(2.2, 2.2), drift_unit=(0.6 * (1 + 0.01 * (seed - 1)),) * 2)
        synth(tmp_path / "runs", "untied", seed, drift=(0.95, 2.3), drift_unit=(0.6, 0.9))
    data, _, claims = report(tmp_path / "runs")
    values = [math.log(1 + 0.01 * (seed - 1)) for seed in range(3)]
    row = claims[("C2/C7 drift", "nano tied")]
    check(row, values, -1, math.log(1.1), "equivalent")
    assert "row-normalised drift tied 0.6, untied input 0.6 (output 0.9); |W - W0|/|W0| tied 2.2" in row["measured"]
    assert "row-normalised" in data["rules"]["claim C2/C7 drift"]


# --- L1: the tied matrix against the untied input and output matrices (rows.npz) -----------------------------------


def rotation(seed, width=SHAPE["n_embd"]):
    q, _ = np.linalg.qr(np.random.default_rng(100 + seed).normal(size=(width, width)))
    return q


def linear_cka(x, y):
    """Linear CKA written out from Kornblith et al.: the centred Gram matrices' normalised inner product."""
    x, y = x - x.mean(0), y - y.mean(0)
    kx, ky = x @ x.T, y @ y.T
    return float((kx * ky).sum() / (np.linalg.norm(kx) * np.linalg.norm(ky)))


@pytest.mark.slow
def test_l1_reads_which_untied_matrix_the_tied_one_resembles(tmp_path):
    """Per seed the untied output matrix is the tied matrix rotated plus noise (CKA near 1, row cosine near 0 after
    rotation), the untied input matrix an unrelated one: ΔCKA output - input ~ 0.9, supported. Early on the tied matrix's
    output-path gradient is 3x its input path's."""
    ids = np.arange(0, 200, 2)
    expected, cos_out = [], []
    for seed in range(3):
        g = np.random.default_rng(seed)
        tied = g.normal(size=(len(ids), SHAPE["n_embd"])).astype(np.float16)
        out = (tied.astype(np.float64) @ rotation(seed) + 0.1 * g.normal(size=tied.shape)).astype(np.float16)
        inp = g.normal(size=tied.shape).astype(np.float16)
        synth(
            tmp_path / "runs",
            "tied",
            seed,
            rows=(ids, tied, None),
            paths=lambda step: (1.0, 3.0 if step <= 20 else 1.0),
        )
        # the untied run sampled a few more tokens: rows pair by token id
        extra = np.r_[ids, 201]
        pad = lambda m: np.vstack([m, np.ones((1, m.shape[1]), dtype=m.dtype)])  # noqa: E731
        synth(tmp_path / "runs", "untied", seed, rows=(extra, pad(inp), pad(out)), paths=lambda step: (1.0, 1.0))
        x = tied.astype(np.float64)
        expected.append(linear_cka(x, out.astype(np.float64)) - linear_cka(x, inp.astype(np.float64)))
        cos_out.append(
            np.mean((x * out).sum(1) / np.linalg.norm(x, axis=1) / np.linalg.norm(out.astype(float), axis=1))
        )
    data, _, claims = report(tmp_path / "runs")
    row = claims[("L1", "nano tied")]
    check(row, expected, +1, 0.05, "supported")
    assert "early |G_out|/|G_in| 3 (first 20% of steps)" in row["measured"]
    runs = {(r["group"], r["seed"]): r for r in data["runs"]}
    assert runs[("nano tied", 1)]["alike_row_cos_output"] == pytest.approx(cos_out[1], abs=1e-6)
    assert runs[("nano tied", 1)]["alike_cka_output"] - runs[("nano tied", 1)]["alike_cka_input"] == pytest.approx(
        expected[1]
    )
    assert "arXiv 2603.26663" in data["rules"]["claim L1"]


@pytest.mark.slow
def test_l1_without_row_samples_has_no_data(tmp_path):
    for seed in range(2):
        for mode in ("tied", "untied"):
            synth(tmp_path / "runs", mode, seed)
    _, _, claims = report(tmp_path / "runs")
    assert claims[("L1", "-")]["verdict"].startswith("no data: needs tied and untied runs of the same size and seeds")


def test_row_sample_is_forgotten_past_a_resume_point_and_a_bad_one_skips_the_run(tmp_path):
    """rows.npz belongs to a step: a resume to before it forgets it, to after keeps it; a file that is not a row
    sample leaves the run out of the report with a one-line reason, nothing else."""
    ids, rows = np.arange(4), np.ones((4, SHAPE["n_embd"]), dtype=np.float32)
    synth(tmp_path / "runs", "untied", 0, rows=(ids, rows, rows))
    path = tmp_path / "runs" / "nano-untied-s0"
    writer = RunWriter.open(path)
    writer.truncate_after(STEPS)
    assert writer.reader.row_sample()[0] == STEPS
    writer.truncate_after(STEPS - 10)
    assert writer.reader.row_sample() is None
    writer.close()
    (path / ROW_SAMPLE).write_bytes(b"not an npz")
    synth(tmp_path / "runs", "tied", 0)
    data, _, _ = report(tmp_path / "runs")
    (skipped,) = data["skipped"]
    assert skipped["path"].endswith("nano-untied-s0") and "rows.npz is not a readable row sample" in skipped["reason"]
