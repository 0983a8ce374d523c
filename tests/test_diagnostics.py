import json

import pytest
import torch

from conftest import TINY
from tiecli import config, diagnostics, rundir, train
from tiecli.cli import app
from tiecli.model import GPT, GPTConfig
from typer.testing import CliRunner

SHARED_MODES = ["tied", "tied_bias", "scaled", "partial", "hybrid"]


def backward(mode: str, micro_batches: int = 2):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16, tying=mode, rank=4))
    model.emb.record_grads = True
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
    assert g_in is emb.wte.grad and g_out is emb.lm_head.grad and not emb.grads


def test_no_hooks_without_recording():
    model = GPT(GPTConfig(vocab_size=64, block_size=8, n_layer=1, n_head=2, n_embd=16))
    idx = torch.randint(0, 64, (2, 9))
    model(idx[:, :-1], idx[:, 1:]).backward()
    assert model.emb.grads == {}


def test_interference_on_known_gradients():
    g = torch.zeros(6, 4)
    g[:3] = torch.randn(3, 4)
    present = torch.tensor([True, True, True, False, False, False])
    buckets = torch.tensor([0, 1, 2, 0, 1, 2])
    aligned = diagnostics.interference(g, 2 * g, present, buckets)
    assert aligned["grad_cos"] == pytest.approx(1) and aligned["grad_cancel"] == pytest.approx(0, abs=1e-6)
    assert aligned["grad_norm_ratio"] == pytest.approx(0.5) and aligned["grad_neg_rows"] == 0
    opposed = diagnostics.interference(g, -g, present, buckets)
    assert opposed["grad_cos"] == pytest.approx(-1) and opposed["grad_cancel"] == pytest.approx(1)
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


def run(tmp_path, name, *overrides):
    cfg, _ = config.compose([*TINY, *overrides])
    train.train(config.to_config(cfg), tmp_path / name, False, {rundir.CONFIG: config.to_yaml(cfg)})
    return rundir.read_jsonl(tmp_path / name / rundir.METRICS)


@pytest.mark.parametrize("mode", ["tied", "untied", "partial"])
def test_diagnostics_do_not_change_training(tmp_path, mode):
    on = run(tmp_path, "on", f"tying={mode}", "diag.every=1")
    off = run(tmp_path, "off", f"tying={mode}", "diag.every=0", "diag.geometry=false")
    # "loss" is averaged since the previous line, and diag.every=1 writes a line every step: compare
    # validation losses and the final weights instead.
    val = lambda rows: [(r["step"], r["val_loss"]) for r in rows if "val_loss" in r]  # noqa: E731
    assert val(on) == val(off)
    a, b = (torch.load(tmp_path / n / rundir.CHECKPOINT, weights_only=True)["model"] for n in ("on", "off"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert all("grad_cos" in r for r in on if r["step"] > 0) and not any("grad_cos" in r for r in off)
    assert (tmp_path / "on" / rundir.GEOMETRY).exists() and not (tmp_path / "off" / rundir.GEOMETRY).exists()


def test_geometry_is_recorded_at_init_and_every_evaluation(tmp_path):
    run(tmp_path, "r", "tying=untied")
    entries = rundir.read_json(tmp_path / "r" / rundir.GEOMETRY)
    assert [e["step"] for e in entries] == [0, 6, 12]
    assert entries[0]["input"]["drift"] == 0 and entries[0]["output"]["drift"] == 0
    assert entries[-1]["input"]["drift"] > 0 and entries[-1]["agreement"]["cka"] is not None
    assert entries[0]["n_tokens"] > 50 and entries[0]["pairs"]["source"] == "english suffix rules"
    assert sorted(p.name for p in (tmp_path / "r" / rundir.SNAPSHOTS).iterdir()) == ["step_0.pt", "step_12.pt", "step_6.pt"]


def test_geometry_command(isolated):
    runner = CliRunner()
    assert runner.invoke(app, ["train", *TINY, "tying=untied", "tokenizer=bpe", "tokenizer.vocab_size=1024", "--name", "r"]).exit_code == 0
    run_dir = isolated / "runs" / "r"
    recorded = {e["step"]: e for e in rundir.read_json(run_dir / rundir.GEOMETRY)}

    latest = json.loads(runner.invoke(app, ["geometry", str(run_dir), "--json"]).output)
    assert latest["step"] == 12 and latest["input"] == recorded[12]["input"]
    init = json.loads(runner.invoke(app, ["geometry", str(run_dir), "--step", "init", "--json"]).output)
    assert init["input"]["drift"] == 0 and init["input"]["anisotropy"] == recorded[0]["input"]["anisotropy"]
    assert json.loads(runner.invoke(app, ["geometry", str(run_dir), "--step", "6", "--json"]).output)["output"] == recorded[6]["output"]

    result = runner.invoke(app, ["geometry", str(run_dir), "--step", "7"])
    assert result.exit_code == 1 and "choose one of latest, init, 0, 6, 12" in result.output

    # A pairs file: "the"/"The" are single tokens of this BPE (bare and after a space); a pair it cannot
    # encode as single tokens is skipped and counted.
    (isolated / "pairs.tsv").write_text("# forms\nthe\tThe\nzzzqqq\tzzzqqqs\n")
    result = runner.invoke(app, ["geometry", str(run_dir), "--pairs", "pairs.tsv", "--write"])
    assert result.exit_code == 0, result.output
    written = rundir.read_json(run_dir / rundir.GEOMETRY)
    assert [e["step"] for e in written] == [0, 6, 12]
    assert written[-1]["pairs"] == {"source": "pairs.tsv", "found": 2, "skipped_lines": 1}
    assert written[-1]["input"]["forms_n_pairs"] == 2

    assert runner.invoke(app, ["geometry", str(isolated)]).exit_code == 1
    (run_dir / rundir.CHECKPOINT).unlink()
    result = runner.invoke(app, ["geometry", str(run_dir)])
    assert result.exit_code == 1 and "no checkpoint at" in result.output and "Traceback" not in result.output
