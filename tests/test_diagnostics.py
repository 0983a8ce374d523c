import json
import math

import numpy as np
import pytest
import torch
from conftest import TINY
from typer.testing import CliRunner

from tiecli.cli import app
from tiecli.config.checks import to_config
from tiecli.config.compose import compose, default_config_dir, to_yaml
from tiecli.config.schema import GPTConfig
from tiecli.data import tokenizer
from tiecli.data.pairs import form_pairs, pairs_file, read_pairs_file
from tiecli.errors import TiecliError
from tiecli.measure import diagnostics
from tiecli.model.gpt import GPT
from tiecli.run.layout import CHECKPOINT, CONFIG, GEOMETRY, SNAPSHOTS
from tiecli.run.reader import RunReader
from tiecli.train import loop as train

SHARED_MODES = ["tied", "tied_bias", "scaled", "partial", "hybrid"]


def backward(mode: str, micro_batches: int = 2):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16, tying=mode, rank=4))
    for _ in range(micro_batches):  # grad accumulation: both parts must accumulate like wte.grad
        idx = torch.randint(0, 32, (3, 9))  # tokens 32..63 never appear in the inputs
        model(idx[:, :-1], idx[:, 1:]).backward()
    return model


@pytest.mark.parametrize("mode", SHARED_MODES)
def test_gradient_split_sums_to_the_true_gradient(mode):
    emb = backward(mode).emb
    g_in, g_out = diagnostics.gradient_paths(emb)
    assert torch.allclose(g_in + g_out, emb.wte.grad, atol=1e-7, rtol=1e-5)
    assert g_in[32:].abs().sum() == 0 and g_in[:32].abs().sum() > 0  # input path: only present tokens
    assert g_out[32:].abs().sum() > 0  # output path: every row


@pytest.mark.parametrize("mode", ["untied", "untied_init"])
def test_untied_modes_compare_the_two_matrices(mode):
    emb = backward(mode).emb
    g_in, g_out = diagnostics.gradient_paths(emb)
    assert g_in is emb.wte.grad and g_out is emb.lm_head.grad and emb.split_grads() is None


def test_interference_on_known_gradients():
    g = torch.zeros(6, 4)
    g[:3] = torch.randn(3, 4)
    present = torch.tensor([True, True, True, False, False, False])
    buckets = torch.tensor([0, 1, 2, 0, 1, 2])
    aligned = diagnostics.interference(g, 2 * g, present, buckets)
    assert aligned["grad_cos"] == pytest.approx(1) and aligned["grad_cancel"] == pytest.approx(-0.8)
    assert aligned["grad_norm_ratio"] == pytest.approx(0.5) and aligned["grad_neg_rows"] == 0
    opposed = diagnostics.interference(g, -g, present, buckets)
    assert opposed["grad_cos"] == pytest.approx(-1) and opposed["grad_cancel"] == pytest.approx(1)
    # computed from the dot product, where sqrt(1 - grad_cancel) magnifies float32 rounding at
    # full cancellation (and only there) to a few hundredths of a percent
    assert opposed["grad_norm_lost_pct"] == pytest.approx(100, abs=0.1)
    assert opposed["grad_neg_rows"] == 1 and opposed["grad_cos_rare"] == pytest.approx(-1)
    # Orthogonal halves: rows 0-1 aligned, row 2 opposed, row 3 (absent) only on the output side.
    g_out = g.clone()
    g_out[2] = -g[2]
    g_out[3] = torch.tensor([1.0, 0, 0, 0])
    mixed = diagnostics.interference(g, g_out, present, buckets)
    assert mixed["grad_neg_rows"] == pytest.approx(1 / 3) and mixed["grad_present_rows"] == 3
    rows = g[:3]
    expected_present = ((rows * g_out[:3]).sum() / (rows.norm() * g_out[:3].norm())).item()
    assert mixed["grad_cos_present"] == pytest.approx(expected_present)
    assert mixed["grad_cos"] == pytest.approx(((g * g_out).sum() / (g.norm() * g_out.norm())).item())
    assert mixed["grad_cos_frequent"] == pytest.approx(1) and mixed["grad_cos_rare"] == pytest.approx(-1)


def two_paths(relation: str) -> tuple[torch.Tensor, torch.Tensor]:
    """G_in and G_out with norms 1 and 2 (squares summing to 5), in the given relation."""
    a = torch.randn(40, 8, generator=torch.Generator().manual_seed(0))
    a /= a.norm()
    if relation == "orthogonal":
        b = torch.randn(40, 8, generator=torch.Generator().manual_seed(1))
        b -= (b * a).sum() * a  # Gram-Schmidt: <a, b> = 0
        return a, 2 * b / b.norm()
    return a, 2 * a if relation == "aligned" else -2 * a


@pytest.mark.parametrize(
    "relation, cancel, lost_pct",
    [
        # |a + b|^2 = 5 + 2<a, b>: against orthogonal paths (5) it shrinks by -2<a, b> / 5
        ("orthogonal", 0.0, 0.0),  # the old 1 - |a + b| / (|a| + |b|) read 1 - sqrt(5) / 3 = 0.25 here
        ("opposed", 0.8, 100 * (1 - 1 / math.sqrt(5))),  # <a, b> = -2: |a + b| = 1
        ("aligned", -0.8, 100 * (1 - 3 / math.sqrt(5))),  # <a, b> = 2: |a + b| = 3, a gain
    ],
)
def test_cancellation_against_orthogonal_paths(relation, cancel, lost_pct):
    g_in, g_out = two_paths(relation)
    present = torch.ones(40, dtype=torch.bool)
    stats = diagnostics.interference(g_in, g_out, present, torch.zeros(40, dtype=torch.long))
    assert stats["grad_cancel"] == pytest.approx(cancel, abs=1e-6)
    assert stats["grad_norm_lost_pct"] == pytest.approx(lost_pct, abs=1e-4)


def test_cancellation_of_zero_gradients_is_undefined():
    zeros = torch.zeros(4, 3)
    stats = diagnostics.interference(zeros, zeros, torch.ones(4, dtype=torch.bool), torch.zeros(4, dtype=torch.long))
    assert stats["grad_cancel"] is None and stats["grad_norm_lost_pct"] is None
    assert stats["grad_cos_null_mean"] is None and stats["grad_cos_z"] is None


def null_stats(g_in, g_out, **kwargs):
    n = len(g_in)
    present = torch.arange(n) < n - 10  # the last 10 rows are absent and must not enter the null
    return diagnostics.interference(g_in, g_out, present, torch.zeros(n, dtype=torch.long), **kwargs)


def test_permutation_null_sees_token_level_agreement():
    g = torch.Generator().manual_seed(2)
    g_in = torch.randn(500, 16, generator=g)
    g_out = g_in + 0.5 * torch.randn(500, 16, generator=g)  # each token's two gradients agree
    g_out[-10:] = g_in[-10:] = 0
    stats = null_stats(g_in, g_out, seed=0, step=10)
    assert stats["grad_cos_present"] == pytest.approx(1 / math.sqrt(1.25), abs=0.02)
    # shuffled rows are independent: mean 0, sd 1 / sqrt(P C) = 0.011
    assert abs(stats["grad_cos_null_mean"]) < 0.02 and 0.005 < stats["grad_cos_null_sd"] < 0.02
    assert stats["grad_cos_z"] > 30


def test_permutation_null_discounts_a_direction_every_row_shares():
    g = torch.Generator().manual_seed(3)
    shared = torch.randn(16, generator=g)
    # both paths carry the same direction in every row, plus unrelated noise of the same norm:
    # cos ~ 0.5 although no token's two gradients agree beyond what all tokens share
    g_in = shared + shared.norm() * torch.randn(500, 16, generator=g) / 4
    g_out = shared + shared.norm() * torch.randn(500, 16, generator=g) / 4
    stats = null_stats(g_in, g_out, seed=0, step=10)
    assert stats["grad_cos_present"] == pytest.approx(0.5, abs=0.05)
    assert stats["grad_cos_null_mean"] == pytest.approx(stats["grad_cos_present"], abs=0.02)
    assert abs(stats["grad_cos_z"]) < 3


def test_permutation_null_is_seeded_and_leaves_the_global_rng_alone():
    g = torch.Generator().manual_seed(4)
    g_in, g_out = torch.randn(200, 8, generator=g), torch.randn(200, 8, generator=g)
    torch.manual_seed(0)
    state = torch.get_rng_state()
    first = null_stats(g_in, g_out, seed=1, step=20)
    assert torch.equal(torch.get_rng_state(), state)
    assert null_stats(g_in, g_out, seed=1, step=20) == first
    assert null_stats(g_in, g_out, seed=1, step=30)["grad_cos_null_mean"] != first["grad_cos_null_mean"]
    assert null_stats(g_in, g_out, seed=2, step=20)["grad_cos_null_mean"] != first["grad_cos_null_mean"]


def test_permutation_null_needs_two_present_rows():
    g_in, g_out = torch.randn(12, 4), torch.randn(12, 4)
    stats = null_stats(g_in, g_out)  # 12 - 10 = 2 present rows: defined
    assert stats["grad_cos_null_sd"] is not None
    present = torch.zeros(12, dtype=torch.bool)
    present[0] = True
    one = diagnostics.interference(g_in, g_out, present, torch.zeros(12, dtype=torch.long))
    assert one["grad_cos_null_mean"] is None and one["grad_cos_null_sd"] is None and one["grad_cos_z"] is None


def test_shipped_pairs_by_name():
    enc = tokenizer.gpt2()
    pairs, info = form_pairs(enc, "en")
    assert info["source"] == "en" and info["found"] == len(pairs) > 500
    assert info["skipped_lines"] < 50  # a few words GPT-2 splits in two
    words = {enc.decode([t]).strip() for pair in pairs for t in pair}
    assert {"walk", "walked", "king", "kings", "run", "ran", "good", "better", "happy", "happiness"} <= words
    assert pairs_file("en") == default_config_dir() / "pairs" / "en.tsv"
    with pytest.raises(TiecliError, match=r"no shipped pairs file 'xx' \(shipped: en, ru\); give a path such as ./xx"):
        form_pairs(enc, "xx")


def test_shipped_english_pairs_file_is_well_formed():
    path = pairs_file("en")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    assert len(lines) > 500
    assert all(len(line.split("\t")) == 2 and line == line.strip() for line in lines)
    assert len(set(lines)) == len(lines)
    vocab = {}  # every word its own token: nothing may be skipped
    pairs, skipped = read_pairs_file(path, lambda w: [vocab.setdefault(w, len(vocab))])
    assert skipped == 0 and len(pairs) == 2 * len(lines)  # bare and with a leading space


def test_pairs_default_to_the_shipped_english_file():
    cfg, _ = compose([])
    assert cfg.diag.pairs == "en"


def run(tmp_path, name, *overrides):
    cfg, _ = compose([*TINY, *overrides])
    train.train(to_config(cfg), tmp_path / name, False, {CONFIG: to_yaml(cfg)})
    return [r.to_dict() for r in RunReader(tmp_path / name).metrics()]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["tied", "untied", "partial"])
def test_diagnostics_do_not_change_training(tmp_path, mode):
    on = run(tmp_path, "on", f"tying={mode}", "diag.every=1")
    off = run(tmp_path, "off", f"tying={mode}", "diag.every=0", "diag.geometry=false")
    # "loss" is averaged since the previous line, and diag.every=1 writes a line every step: compare
    # validation losses and the final weights instead.
    val = lambda rows: [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]  # noqa: E731
    assert val(on) == val(off)
    a, b = (torch.load(tmp_path / n / CHECKPOINT, weights_only=True)["model"] for n in ("on", "off"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all("grad_cos" in r for r in on if r["step"] > 0) and not any("grad_cos" in r for r in off)
    assert (tmp_path / "on" / GEOMETRY).exists() and not (tmp_path / "off" / GEOMETRY).exists()


@pytest.mark.slow
def test_geometry_is_recorded_at_init_and_every_evaluation(tmp_path):
    run(tmp_path, "r", "tying=untied")
    entries = [e.to_dict() for e in RunReader(tmp_path / "r").geometry()]
    assert [e["step"] for e in entries] == [0, 6, 12]
    assert entries[0]["input"]["drift"] == 0 and entries[0]["output"]["drift"] == 0
    assert entries[-1]["input"]["drift"] > 0 and entries[-1]["agreement"]["cka"] is not None
    # byte tokens: no English word of the shipped pairs is a single token, and that is no error
    assert entries[0]["n_tokens"] > 50 and entries[0]["pairs"]["source"] == "en" and entries[0]["pairs"]["found"] == 0
    assert entries[0]["input"]["forms_n_pairs"] == 0 and entries[0]["input"]["forms_contrast"] is None
    assert sorted(p.name for p in (tmp_path / "r" / SNAPSHOTS).iterdir()) == [
        "step_0.pt",
        "step_12.pt",
        "step_6.pt",
    ]


def test_geometry_command(isolated):
    runner = CliRunner()
    tiny = [o for o in TINY if not o.startswith("tokenizer=")]  # a key may be given once
    assert (
        runner.invoke(
            app, ["train", *tiny, "tying=untied", "tokenizer=bpe", "tokenizer.vocab_size=1024", "--name", "r"]
        ).exit_code
        == 0
    )
    run_dir = isolated / "runs" / "r"
    recorded = {e.step: e.to_dict() for e in RunReader(run_dir).geometry()}

    latest = json.loads(runner.invoke(app, ["geometry", str(run_dir), "--json"]).output)
    assert latest["step"] == 12 and latest["input"] == recorded[12]["input"]
    init = json.loads(runner.invoke(app, ["geometry", str(run_dir), "--step", "init", "--json"]).output)
    assert init["input"]["drift"] == 0 and init["input"]["anisotropy"] == recorded[0]["input"]["anisotropy"]
    assert (
        json.loads(runner.invoke(app, ["geometry", str(run_dir), "--step", "6", "--json"]).output)["output"]
        == recorded[6]["output"]
    )

    result = runner.invoke(app, ["geometry", str(run_dir), "--step", "7"])
    assert result.exit_code == 1 and "choose one of latest, init, 0, 6, 12" in result.output

    # A pairs file: "the" and "her" are single tokens of this BPE (bare and after a space); a pair it
    # cannot encode as single tokens is skipped and counted.
    (isolated / "pairs.tsv").write_text("# forms\nthe\ther\nzzzqqq\tzzzqqqs\n")
    result = runner.invoke(app, ["geometry", str(run_dir), "--pairs", "pairs.tsv", "--write"])
    assert result.exit_code == 0, result.output
    written = [e.to_dict() for e in RunReader(run_dir).geometry()]
    assert [e["step"] for e in written] == [0, 6, 12]
    assert written[-1]["pairs"] == {"source": "pairs.tsv", "found": 2, "skipped_lines": 1}
    assert written[-1]["input"]["forms_n_pairs"] == 2

    assert runner.invoke(app, ["geometry", str(isolated)]).exit_code == 1
    (run_dir / CHECKPOINT).unlink()
    result = runner.invoke(app, ["geometry", str(run_dir)])
    assert result.exit_code == 1 and "no checkpoint at" in result.output and "Traceback" not in result.output


# --- R4 at the pairs: each path's gradient difference along the pair's difference ---------------------------


def pair_case(n_pairs=30, vocab=4000, width=16, seed=0):
    """A matrix w, related pairs (2k, 2k + 1) and, per pair, its unit difference (w[a] - w[b]) / |w[a] - w[b]|."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(vocab, width, generator=g)
    forms = torch.tensor([(2 * k, 2 * k + 1) for k in range(n_pairs)])
    index = diagnostics.PairIndex(forms, diagnostics.pair_index(forms.tolist(), np.ones(vocab), seed).null)
    return w, index, g


def along_pairs(w, forms, sign, noise, g):
    """Noise in every row, plus sign * the pair's difference added to a's row and taken from b's: then
    g[a] - g[b] = 2 sign (w[a] - w[b]) + noise, so under SGD (-lr g) sign > 0 pulls each pair together."""
    grad = noise * torch.randn(w.shape, generator=g)
    diff = w[forms[:, 0]] - w[forms[:, 1]]
    grad[forms[:, 0]] += sign * diff
    grad[forms[:, 1]] -= sign * diff
    return grad


def test_pair_null_is_frequency_matched_and_seeded():
    counts = np.r_[np.full(100, 1000), np.ones(300)]  # tokens 0..99 frequent, the rest seen once
    pairs = [(0, 1), (2, 3), (200, 201)]  # two frequent pairs, one rare
    index = diagnostics.pair_index(pairs, counts, seed=3)
    assert index.forms.tolist() == [[0, 1], [2, 3], [200, 201]]
    assert len(index.null) == 3 * math.ceil(diagnostics.N_NULL_PAIRS / 3)
    null = index.null.numpy()
    frequent = null < 100
    # matched_random_pairs repeats each related pair's deciles: 2/3 of the null pairs are frequent-frequent
    assert frequent.all(1).mean() == pytest.approx(2 / 3) and (~frequent).all(1).mean() == pytest.approx(1 / 3)
    assert (null[:, 0] != null[:, 1]).all()
    assert torch.equal(diagnostics.pair_index(pairs, counts, seed=3).null, index.null)
    assert not torch.equal(diagnostics.pair_index(pairs, counts, seed=4).null, index.null)
    missing = diagnostics.pair_index([(0, 1), (20, 2), (3, 3)], np.r_[np.ones(10), np.zeros(490)], seed=0)
    assert missing.forms.tolist() == [[0, 1]]  # token 20 never occurs in the training split; a self-pair


def test_pair_gradients_see_the_claimed_opposition():
    """Input path pulls each related pair together, output path pushes it apart: every related pair is
    in the claimed opposition, the matched random pairs (noise alone) about a quarter."""
    w, index, g = pair_case()
    forms = index.forms
    g_in, g_out = along_pairs(w, forms, +1, 0.3, g), along_pairs(w, forms, -1, 0.3, g)
    stats = diagnostics.pair_gradients(g_in, g_out, w, w, index)
    assert stats["pair_n"] == 30 and stats["pair_null_n"] == len(index.null)
    assert stats["pair_pull_in"] == 1 and stats["pair_push_out"] == 1
    assert stats["pair_claimed"] == 1 and stats["pair_opposed"] == 1
    assert stats["pair_cos_in"] > 0.9 and stats["pair_cos_out"] < -0.9
    # without noise s_in is exactly 2 |w[a] - w[b]|
    exact = diagnostics.pair_gradients(along_pairs(w, forms, +1, 0, g), along_pairs(w, forms, -1, 0, g), w, w, index)
    distance = (w[forms[:, 0]] - w[forms[:, 1]]).norm(dim=1)
    assert exact["pair_s_in"] == pytest.approx(2 * distance.mean().item(), rel=1e-5)
    assert exact["pair_s_out"] == pytest.approx(-2 * distance.mean().item(), rel=1e-5)
    assert exact["pair_cos_in"] == pytest.approx(1, abs=1e-5)
    # the null: random signs, each path half pull half push, a quarter in the claimed opposition
    assert stats["pair_pull_in_null"] == pytest.approx(0.5, abs=0.05)
    assert stats["pair_push_out_null"] == pytest.approx(0.5, abs=0.05)
    assert stats["pair_claimed_null"] == pytest.approx(0.25, abs=0.05)
    assert stats["pair_opposed_null"] == pytest.approx(0.5, abs=0.05)
    assert abs(stats["pair_cos_in_null"]) < 0.05
    q = stats["pair_claimed_null"]
    assert stats["pair_claimed_null_sd"] == pytest.approx(math.sqrt(q * (1 - q) * (1 / 30 + 1 / len(index.null))))


@pytest.mark.parametrize("relation", ["aligned", "random"])
def test_pair_gradients_without_the_opposition(relation):
    w, index, g = pair_case(n_pairs=100)
    if relation == "aligned":  # both paths pull the pairs together: no pair in opposition
        g_in = g_out = along_pairs(w, index.forms, +1, 0.3, g)
        expected_claimed, expected_opposed = 0.0, 0.0
    else:  # unrelated noise: the related pairs look like the random ones
        g_in, g_out = torch.randn(w.shape, generator=g), torch.randn(w.shape, generator=g)
        expected_claimed, expected_opposed = 0.25, 0.5
    stats = diagnostics.pair_gradients(g_in, g_out, w, w, index)
    assert stats["pair_claimed"] == pytest.approx(expected_claimed, abs=0.12)
    assert stats["pair_opposed"] == pytest.approx(expected_opposed, abs=0.12)
    # the same paths everywhere: the null pairs never oppose either; unrelated paths oppose half the time
    assert stats["pair_claimed_null"] == pytest.approx(expected_claimed, abs=0.05)
    assert stats["pair_claimed"] - stats["pair_claimed_null"] == pytest.approx(0, abs=0.12)
    if relation == "aligned":
        assert stats["pair_pull_in"] == 1 and stats["pair_pull_out"] == 1


def test_untied_pair_gradients_use_each_paths_own_matrix():
    """The input path pulls pairs together in W_in's space, the output path pushes them apart in W_out's:
    measured each on its own matrix, every pair is in the opposition; the output gradient measured on the
    (unrelated) W_in would show no push."""
    w_in, index, g = pair_case()
    w_out = torch.randn(w_in.shape, generator=g)
    g_in, g_out = along_pairs(w_in, index.forms, +1, 0.1, g), along_pairs(w_out, index.forms, -1, 0.1, g)
    stats = diagnostics.pair_gradients(g_in, g_out, w_in, w_out, index)
    assert stats["pair_claimed"] == 1 and stats["pair_push_out"] == 1
    wrong = diagnostics.pair_gradients(g_in, g_out, w_in, w_in, index)
    assert wrong["pair_push_out"] < 0.8 and wrong["pair_claimed"] < 0.8


def test_pair_gradients_absent_inputs_and_no_pairs():
    """A pair whose tokens are absent from the inputs has no input-path gradient: s_in = 0, neither pull nor push."""
    w, index, g = pair_case()
    g_in = torch.zeros_like(w)
    stats = diagnostics.pair_gradients(g_in, along_pairs(w, index.forms, -1, 0.1, g), w, w, index)
    assert stats["pair_pull_in"] == 0 and stats["pair_push_in"] == 0 and stats["pair_s_in"] == 0
    assert stats["pair_claimed"] == 0 and stats["pair_opposed"] == 0 and stats["pair_push_out"] == 1
    empty = diagnostics.pair_index([], np.ones(10), seed=0)
    none = diagnostics.pair_gradients(g_in, g_in, w, w, empty)
    assert none["pair_n"] == 0 and none["pair_claimed"] is None and none["pair_claimed_null_sd"] is None


@pytest.mark.parametrize("mode", [*SHARED_MODES, "untied"])
def test_pair_gradients_of_every_mode(mode):
    """On a real backward pass: the matrices path_matrices pairs with each path (the shared columns in
    partial mode); related pairs drawn among present tokens, so both paths carry gradient."""
    emb = backward(mode).emb
    w_in, w_out = diagnostics.path_matrices(emb)
    g_in, g_out = diagnostics.gradient_paths(emb)
    assert w_in.shape == g_in.shape and w_out.shape == g_out.shape
    assert (w_in is w_out) == emb.shared
    counts = np.r_[np.ones(32), np.zeros(32)]
    index = diagnostics.pair_index([(i, i + 1) for i in range(0, 30, 2)], counts, seed=0)
    stats = diagnostics.pair_gradients(g_in, g_out, w_in, w_out, index)
    assert stats["pair_n"] == 15 and all(stats[k] is not None for k in diagnostics.PAIR_KEYS)
    for path, g, w in (("in", g_in, w_in), ("out", g_out, w_out)):  # one pair at a time, as the formula reads
        s = [torch.dot(g[a] - g[b], w[a] - w[b]).item() / (w[a] - w[b]).norm().item() for a, b in index.forms]
        assert stats[f"pair_s_{path}"] == pytest.approx(np.mean(s), rel=1e-4, abs=1e-9)
        assert stats[f"pair_pull_{path}"] == pytest.approx(np.mean(np.array(s) > 0))
    assert stats["pair_pull_out"] + stats["pair_push_out"] == pytest.approx(1)  # every row has an output gradient


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["tied", "untied"])
def test_training_records_the_pair_gradients(tmp_path, mode):
    # byte tokens: single letters are single tokens, so these are pairs of the vocabulary
    (tmp_path / "pairs.tsv").write_text("a\te\ni\to\nt\th\ns\tn\n")
    rows = run(tmp_path, "r", f"tying={mode}", "diag.every=3", f"diag.pairs={tmp_path / 'pairs.tsv'}")
    diag_rows = [r for r in rows if "grad_cos" in r]
    assert [r["step"] for r in diag_rows] == [3, 6, 9, 12]
    for r in diag_rows:
        assert r["pair_n"] == 4 and r["pair_null_n"] == 4 * math.ceil(diagnostics.N_NULL_PAIRS / 4)
        assert all(isinstance(r[k + s], float) for k in diagnostics.PAIR_KEYS for s in ("", "_null"))
        assert 0 <= r["pair_claimed"] <= 1 and r["pair_claimed_null_sd"] > 0
    if mode == "tied":  # the null's draw touches no RNG of training: the same weights with the statistics off
        run(tmp_path, "off", "tying=tied", "diag.every=0", f"diag.pairs={tmp_path / 'pairs.tsv'}")
        a, b = (torch.load(tmp_path / n / CHECKPOINT, weights_only=True)["model"] for n in ("r", "off"))
        assert all(torch.equal(a[k], b[k]) for k in a)
