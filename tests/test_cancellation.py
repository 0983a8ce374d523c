"""R4 (cancellation) at the source: the cancelled fraction of the two paths' components along related pairs
(tiecli/measure/cancellation.py), its frequency- and cosine-matched null, Adam's step split by path; the scale-free
drift (geometry.drift's drift_unit); and what a training run records for them (metrics.jsonl, rows.npz)."""

import numpy as np
import pytest
import torch
from conftest import TINY
from helpers import tiecli

from tiecli.config.checks import to_config
from tiecli.config.compose import compose, to_yaml
from tiecli.config.schema import GPTConfig
from tiecli.measure import cancellation, diagnostics, geometry
from tiecli.model.gpt import GPT
from tiecli.run.layout import CONFIG, ROW_SAMPLE
from tiecli.run.reader import RunReader
from tiecli.train import loop as train


def pairs_of(w, n_pairs=60, seed=0):
    """Related pairs (2k, 2k + 1) and 4096 random pairs of the other tokens as their null (a null pair sharing a token
    with a related one would carry that pair's movement)."""
    forms = torch.tensor([(2 * k, 2 * k + 1) for k in range(n_pairs)])
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(2 * n_pairs, len(w), (4096,), generator=g)
    b = torch.randint(2 * n_pairs, len(w) - 1, (4096,), generator=g)
    return diagnostics.PairIndex(forms, torch.stack([a, b + (b >= a)], 1))


def along_pairs(w, forms, sign, g, noise=0.0):
    """noise in every row plus sign * (w[a] - w[b]) on a's row and minus it on b's: s = 2 sign |w[a] - w[b]| + noise."""
    grad = noise * torch.randn(w.shape, generator=g)
    diff = w[forms[:, 0]] - w[forms[:, 1]]
    grad[forms[:, 0]] += sign * diff
    grad[forms[:, 1]] -= sign * diff
    return grad


def test_opposed_paths_at_the_pairs_cancel_and_independent_ones_do_not():
    """Related pairs: the input path pulls by 2|d|, the output path pushes by 2|d|, plus independent noise in each
    path: nearly all of it cancels. The null pairs see the noise alone: two independent normal components cancel
    1 - E|x + y| / E(|x| + |y|) = 1 - 1/sqrt(2) of their sum."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(4000, 16, generator=g)
    index = pairs_of(w)
    g_in = along_pairs(w, index.forms, +1, g, noise=0.05)
    g_out = along_pairs(w, index.forms, -1, g, noise=0.05)
    stats = cancellation.pair_cancellation(g_in, g_out, w, w, index)
    assert stats["pair_cancel_grad"] > 0.95
    assert stats["pair_cancel_grad_null"] == pytest.approx(1 - 2**-0.5, abs=0.03)
    assert stats["pair_cancel_grad"] == pytest.approx(1 - stats["pair_cancel_grad_num"] / stats["pair_cancel_grad_den"])
    assert stats["pair_cancel_adam"] is None  # no optimizer given
    # both paths pulling: nothing cancels at the related pairs
    same = cancellation.pair_cancellation(g_in, g_in, w, w, index)
    assert same["pair_cancel_grad"] == pytest.approx(0, abs=1e-6)


def test_one_path_alone_cancels_nothing():
    """A pair with no input-path gradient (its tokens absent from the inputs) adds its output movement, uncancelled."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(4000, 16, generator=g)
    index = pairs_of(w)
    stats = cancellation.pair_cancellation(torch.zeros_like(w), torch.randn(w.shape, generator=g), w, w, index)
    assert stats["pair_cancel_grad"] == 0 and stats["pair_cancel_grad_null"] == 0
    empty = diagnostics.pair_index([], np.ones(10), seed=0)
    assert all(v is None for v in cancellation.pair_cancellation(w, w, w, w, empty).values())


def test_the_null_is_matched_on_the_pairs_cosine():
    """Each row's output gradient is minus the row itself plus noise, the input gradient the row: a pair whose rows
    are close (high cosine, small difference) is moved mostly by the noise and cancels less. Related pairs are close
    pairs; frequency-matched random pairs are not. Unmatched, the null would cancel far more than the related pairs
    (a spurious deficit); matched on cosine, the related pairs read as the null does."""
    g = torch.Generator().manual_seed(2)
    unit = lambda x: torch.nn.functional.normalize(x, dim=1)  # noqa: E731 unit rows: |w[a] - w[b]| follows the cosine
    w = unit(torch.randn(4000, 4, generator=g))
    index = pairs_of(w, n_pairs=200)
    a, b = index.forms[:, 0], index.forms[:, 1]
    # related rows: b a noisy copy of a, at cosines spread over the null's upper range
    w[b] = unit(w[a] + torch.rand(len(a), 1, generator=g) * torch.randn(len(a), 4, generator=g))
    g_in, g_out = w.clone(), -w + 0.3 * torch.randn(w.shape, generator=g)
    stats = cancellation.pair_cancellation(g_in, g_out, w, w, index)
    assert stats["pair_row_cos"] > stats["pair_row_cos_null"] + 0.3
    assert 0.5 < stats["pair_cancel_cover"] < 1  # the closest related pairs have too few null pairs that close
    # the unweighted null (every null pair counts once) against the related pairs: a large gap
    s_in = diagnostics.projections(g_in, *diagnostics.differences(w, *index.null.T), *index.null.T)[0]
    s_out = diagnostics.projections(g_out, *diagnostics.differences(w, *index.null.T), *index.null.T)[0]
    unmatched = 1 - (s_in + s_out).abs().sum().item() / (s_in.abs() + s_out.abs()).sum().item()
    assert unmatched - stats["pair_cancel_grad"] > 0.08
    assert stats["pair_cancel_grad"] - stats["pair_cancel_grad_null"] == pytest.approx(0, abs=0.04)


def test_cosine_weights_give_each_bin_the_related_count():
    forms = torch.linspace(0, 1, 80)
    null = torch.cat([torch.linspace(0, 0.5, 400), torch.tensor([0.99])])  # the upper bins hold one null pair or none
    kept, weights = cancellation.cosine_weights(forms, null)
    assert kept.sum() == 40 and not kept[forms > 0.51].any()
    assert weights.sum().item() == pytest.approx(40) and weights[-1] == 0


@pytest.mark.parametrize("mode", ["tied", "untied"])
def test_adam_reading_is_the_step_adamw_takes(mode):
    """With beta1 = 0 and no weight decay AdamW's step is exactly lr g / (sqrt(v_hat) + eps): the adam figures' sum
    s_in + s_out along each pair must be the real step's component (tied: one matrix, both paths through its v;
    untied: each matrix its own), after a first step has filled the second moment."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16, tying=mode))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.0, 0.95), weight_decay=0.0)
    idx = torch.randint(0, 64, (4, 9), generator=torch.Generator().manual_seed(1))
    counts = np.ones(64)
    index = diagnostics.pair_index([(i, i + 1) for i in range(0, 40, 2)], counts, seed=0)
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        model.emb.clear_split_grads()
        model(idx[:, :-1], idx[:, 1:]).backward()
        g_in, g_out = diagnostics.gradient_paths(model.emb)
        w_in, w_out = diagnostics.path_matrices(model.emb)
        stats = cancellation.pair_cancellation(g_in, g_out, w_in, w_out, index, opt)
        s = {}
        for path, g, w in (("in", g_in, w_in), ("out", g_out, w_out)):
            full = (g_in + g_out,) if model.emb.shared else (g,)
            rows = torch.arange(64)
            step = g * cancellation.adam_step_size(opt, w, full, rows)
            s[path] = diagnostics.projections(
                step, *diagnostics.differences(w.detach(), *index.forms.T), *index.forms.T
            )[0]
        before = {p: w.detach().clone() for p, w in (("in", w_in), ("out", w_out))}
        opt.step()
        moved = {p: before[p] - w.detach() for p, w in (("in", w_in), ("out", w_out))}  # -lr g / (sqrt(v) + eps)
    if mode == "tied":  # the shared matrix's actual step along each pair is the sum of the two paths' parts
        real = diagnostics.projections(
            moved["in"], *diagnostics.differences(before["in"], *index.forms.T), *index.forms.T
        )[0]
        assert torch.allclose(s["in"] + s["out"], real, rtol=1e-4, atol=1e-7)
    else:  # each matrix's actual step is its own path's part
        for p in ("in", "out"):
            real = diagnostics.projections(
                moved[p], *diagnostics.differences(before[p], *index.forms.T), *index.forms.T
            )[0]
            assert torch.allclose(s[p], real, rtol=1e-4, atol=1e-7)
    # the figure reads the related pairs in cosine bins the null covers
    ids = torch.cat([index.forms, index.null])
    cos = torch.nn.functional.cosine_similarity(before["in"][ids[:, 0]], before["in"][ids[:, 1]], dim=1)
    kept = cancellation.cosine_weights(cos[: len(index.forms)], cos[len(index.forms) :])[0]
    assert stats["pair_cancel_cover"] == pytest.approx(kept.float().mean().item()) and kept.any()
    total, parts = (s["in"] + s["out"]).abs()[kept].sum(), (s["in"].abs() + s["out"].abs())[kept].sum()
    assert stats["pair_cancel_adam"] == pytest.approx(1 - (total / parts).item(), rel=1e-4)


def test_scale_free_drift_ignores_norm_growth():
    """Rows grown 5x without turning: |W - W0| / |W0| reads 4, drift_unit 0; rows turned to unrelated directions at the
    same norm: drift_unit ~ sqrt(2), whatever the scale."""
    g = torch.Generator().manual_seed(3)
    w0 = torch.randn(500, 32, generator=g)
    grown = geometry.drift(5 * w0, w0, np.ones(500), np.zeros(500))
    assert grown["drift"] == pytest.approx(4) and grown["drift_unit"] == pytest.approx(0, abs=1e-6)
    turned = geometry.drift(10 * torch.randn(500, 32, generator=g), w0, np.ones(500), np.zeros(500))
    assert turned["drift_unit"] == pytest.approx(2**0.5, abs=0.05)
    entry = geometry.measure(w0 * 3, w0 * 3, np.ones(500), np.zeros(500), w0, w0)
    assert entry["input"]["drift_unit"] == pytest.approx(0, abs=1e-6) and entry["input"]["drift"] == pytest.approx(2)


@pytest.mark.parametrize("mode", ["tied", "untied"])
def test_training_records_cancellation_and_a_row_sample(tmp_path, mode):
    """A tiny run with single-letter pairs (byte tokens): every diag step has both readings of the cancelled fraction
    and its matched null; rows.npz holds the last geometry step's rows of the most frequent tokens, float16."""
    (tmp_path / "pairs.tsv").write_text("a\te\ni\to\nt\th\ns\tn\nr\tl\nd\tu\n")
    cfg, _ = compose([*TINY, f"tying={mode}", "diag.every=3", f"diag.pairs={tmp_path / 'pairs.tsv'}"])
    train.train(to_config(cfg), tmp_path / "r", False, {CONFIG: to_yaml(cfg)})
    reader = RunReader(tmp_path / "r")
    diag_rows = [r.diag for r in reader.metrics() if "grad_cos" in r.diag]
    assert len(diag_rows) == 4
    for d in diag_rows:
        assert all(d[k] is not None for k in ("pair_cancel_grad_num", "pair_cancel_adam_den", "pair_cancel_cover"))
        assert 0 <= d["pair_cancel_adam"] <= 1 and 0 <= d["pair_cancel_grad_null"] <= 1
    step, ids, rows_in, rows_out = reader.row_sample()
    assert step == 12 and rows_in.dtype == np.float16 and len(ids) == rows_in.shape[0] <= diagnostics.N_SAMPLE_ROWS
    assert (rows_out is None) == (mode == "tied")
    assert (tmp_path / "r" / ROW_SAMPLE).stat().st_size < 200_000
    assert reader.geometry()[-1].input["drift_unit"] > 0


def test_geometry_write_adds_the_row_sample_of_the_latest_step_only(tiny_run):
    """A run from before rows.npz gains it from `tiecli geometry RUN --write` (its last checkpoint's rows); writing an
    earlier step's entry leaves rows.npz at the last step."""
    (tiny_run / ROW_SAMPLE).unlink()
    assert tiecli("geometry", tiny_run, "--step", "6", "--write").exit_code == 0
    assert RunReader(tiny_run).row_sample() is None
    assert tiecli("geometry", tiny_run, "--write").exit_code == 0
    step, ids, rows_in, _ = RunReader(tiny_run).row_sample()
    assert step == 12 and len(ids) == len(rows_in) > 0
    assert RunReader(tiny_run).geometry()[-1].input["drift_unit"] is not None
