"""tiecli export: every tying mode reloads in transformers with tiecli's logits, and bad input writes nothing."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import train_process
from typer.testing import CliRunner

from tests.conftest import TINY
from tiecli.cli import app
from tiecli.config.checks import to_config
from tiecli.config.compose import compose, to_yaml
from tiecli.config.schema import TYING_MODES
from tiecli.data import tokenizer
from tiecli.model import checkpoint
from tiecli.model.gpt import GPT
from tiecli.run.files import atomic_write
from tiecli.run.layout import CHECKPOINT, CONFIG, OVERRIDES
from tiecli.run.reader import RunReader

transformers = pytest.importorskip("transformers", reason="tiecli[hf] (transformers) is not installed")
safetensors = pytest.importorskip("safetensors", reason="tiecli[hf] (safetensors) is not installed")

runner = CliRunner()


# GPT-2 shaped but tiny; bias=false checks that absent biases export as zeros
SHAPE = ["model=nano", "model.n_embd=32", "model.n_head=4", "model.block_size=16", "tokenizer=bytes"]
MODE_OVERRIDES = {
    "scaled": ["tying=scaled", "tying.scale_inputs=true", "tying.scale_logits=true"],
    "partial": ["tying=partial", "tying.shared_fraction=0.25"],
    "hybrid": ["tying=hybrid", "tying.rank=4"],
}


def fake_run(path, mode, *extra, untie=False):
    """A run directory holding config.yaml and a last.pt with random weights: every parameter, lm_u and
    lm_bias included (zero at init), is non-trivial, so a wrong mapping cannot hide behind a zero.
    untie: tied_then_untied past its switch."""
    cfg, _ = compose([*SHAPE, *MODE_OVERRIDES.get(mode, [f"tying={mode}"]), *extra])
    run_config = to_config(cfg)
    model = GPT(run_config.model, seed=3)
    if untie:
        model.emb.untie()
    with torch.no_grad():
        g = torch.Generator().manual_seed(7)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    atomic_write(path / CONFIG, to_yaml(cfg))
    atomic_write(path / OVERRIDES, "overrides: []\nchoices: {}\n")
    state = {"model": model.state_dict(), "optimizer": {}, "rng": {}, "state": {"step": 5}}
    atomic_write(path / CHECKPOINT, checkpoint.to_bytes(state))
    return model.eval()


def export(*args):
    return runner.invoke(app, ["export", *map(str, args)])


def tiecli_greedy(model, idx, n):
    """Greedy decoding with tiecli's own forward pass."""
    for _ in range(n):
        idx = torch.cat([idx, model(idx)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


@pytest.mark.slow
@pytest.mark.parametrize("mode", [m for m in TYING_MODES if m != "tied_bias"])
def test_every_mode_reloads_with_the_same_logits(tmp_path, mode):
    model = fake_run(tmp_path / "run", mode, "model.bias=false" if mode == "partial" else "model.bias=true")
    result = export(tmp_path / "run", "--to", "hf", tmp_path / "out")
    assert result.exit_code == 0, result.output
    assert "logits match tiecli's" in result.output

    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert type(hf).__name__ == "GPT2LMHeadModel"
    idx = torch.randint(256, (3, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert (hf(idx).logits - model(idx)).abs().max().item() < 1e-5
    one_matrix = mode in ("tied", "scaled", "tied_then_untied")  # fake_run's tied_then_untied is before its switch
    assert hf.config.tie_word_embeddings is one_matrix
    # the tie survives saving and loading: one tensor, not two equal copies
    assert (hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()) is one_matrix
    if not one_matrix:  # the effective output matrix, not wte
        with torch.no_grad():
            assert torch.allclose(hf.lm_head.weight, model.emb.output_matrix() * model.emb.logit_scale, atol=1e-7)

    # generate() agrees with greedy decoding by tiecli's model
    prompt = idx[:1, :4]
    out = hf.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=0)
    assert torch.equal(out, tiecli_greedy(model, prompt, 8))


@pytest.mark.slow
def test_tied_then_untied_after_its_switch_exports_its_two_matrices(tmp_path):
    model = fake_run(tmp_path / "run", "tied_then_untied", untie=True)
    result = export(tmp_path / "run", "--to", "hf", tmp_path / "out")
    assert result.exit_code == 0 and "logits match tiecli's" in result.output, result.output
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert not hf.config.tie_word_embeddings
    with torch.no_grad():
        assert torch.equal(hf.lm_head.weight, model.emb.lm_head) and torch.equal(
            hf.transformer.wte.weight, model.emb.wte
        )


def test_embedding_norm_is_refused_for_hf_in_one_line(tmp_path):
    fake_run(tmp_path / "run", "untied", "model.embedding_norm=true")
    result = export(tmp_path / "run", "--to", "hf", tmp_path / "out")
    assert result.exit_code == 1 and "model.embedding_norm=true cannot be exported" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_scaled_folds_its_scales_and_stays_tied(tmp_path):
    model = fake_run(tmp_path / "run", "scaled")
    assert model.emb.input_scale == math.sqrt(32) and model.emb.logit_scale == 1 / math.sqrt(32)
    assert export(tmp_path / "run", tmp_path / "out").exit_code == 0  # --to hf is the default
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    with torch.no_grad():
        assert torch.allclose(hf.transformer.wte.weight, model.emb.wte * math.sqrt(32))
        # logit_scale / input_scale = 1/32 moved into the final LayerNorm
        assert torch.allclose(hf.transformer.ln_f.weight, model.ln_f.weight / 32)


@pytest.mark.slow
def test_tied_bias_is_refused_for_hf_and_exported_as_safetensors(tmp_path):
    model = fake_run(tmp_path / "run", "tied_bias")
    result = export(tmp_path / "run", "--to", "hf", tmp_path / "out")
    assert result.exit_code == 1
    assert "tied_bias cannot be exported to GPT2LMHeadModel" in result.output and "--to safetensors" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not (tmp_path / "out").exists()

    result = export(tmp_path / "run", "--to", "safetensors", tmp_path / "st")
    assert result.exit_code == 0, result.output
    from safetensors import safe_open

    with safe_open(tmp_path / "st" / "model.safetensors", framework="pt") as f:
        meta = f.metadata()
        state = {k: f.get_tensor(k) for k in f.keys()}
    assert meta["tying"] == "tied_bias" and meta["step"] == "5"
    assert json.loads(meta["config"]) == RunReader(tmp_path / "run").config()
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


@pytest.mark.slow
def test_gpt2_tokenizer_json_has_gpt2s_ids(tmp_path):
    from tiecli.commands.export import hf_tokenizer

    enc = tokenizer.gpt2()
    hf_tokenizer(enc).save_pretrained(tmp_path)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "Hello world! It's 2024, naïve café — Привет, 世界.\n\n  indented   spaces<|endoftext|>"
    assert tok("Hello world")["input_ids"] == [15496, 995]
    assert tok(text)["input_ids"] == enc.encode(text, allowed_special="all")
    assert tok.eos_token_id == 50256 and tok.decode(enc.encode_ordinary(text)) == text


@pytest.mark.slow
def test_trained_bpe_tokenizer_json_has_the_same_ids(tmp_path):
    from tiecli.commands.export import hf_tokenizer

    text = Path("tiny.txt").read_text()  # TINY's corpus
    enc = tokenizer.bpe(text, 400, tmp_path / "cache")
    hf_tokenizer(enc).save_pretrained(tmp_path / "tok")
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "tok")
    sample = text[:5000] + " naïve café, Привет 世界\n\n\t  x"
    ids = enc.encode_ordinary(sample)
    assert tok(sample)["input_ids"] == ids and len(ids) < len(sample.encode()) / 1.5  # merges used, same ids
    assert tok.decode(ids) == sample and tok.eos_token is None


@pytest.mark.slow
def test_trained_bpe_run_exports_its_tokenizer(tmp_path):
    """End to end, as a user: train a tiny run on the trained BPE, export, load both halves with Auto*."""
    overrides = [o for o in TINY if not o.startswith(("tokenizer=", "train.max_steps="))]
    overrides += ["tokenizer=bpe", "tokenizer.vocab_size=300", "train.max_steps=3"]
    train_process(*overrides, "--name", "b")
    result = export("runs/b", "--to", "hf", tmp_path / "out")
    assert result.exit_code == 0, result.output
    from tiecli.data.tokens import load_corpus

    run_config = to_config(compose(overrides)[0])
    corpus = load_corpus(run_config.data, run_config.tokenizer)
    tok = transformers.AutoTokenizer.from_pretrained(tmp_path / "out")
    text = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer"
    ids = corpus.encoding.encode_ordinary(text)
    assert tok(text)["input_ids"] == ids and len(ids) < len(text.encode())  # merges used, same ids
    model, _ = checkpoint.load_model(tmp_path / "runs/b" / CHECKPOINT, run_config.model, "b")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    with torch.no_grad():
        x = torch.tensor([ids[:32]])
        assert (hf(x).logits - model.eval()(x)).abs().max().item() < 1e-5

    # greedy generate() continues a prompt exactly as `tiecli sample --temperature 0` does
    done = subprocess.run(
        [sys.executable, "-m", "tiecli", "sample", "runs/b", "--prompt", "To be", "--temperature", "0"]
        + ["--max-new-tokens", "12", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    sampled = json.loads(done.stdout)
    prompt = tok("To be", return_tensors="pt").input_ids
    assert prompt[0].tolist() == sampled["prompt_ids"]
    generated = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)[0, prompt.shape[1] :]
    assert generated.tolist() == sampled["samples"][0]["ids"]


def test_run_without_a_checkpoint_writes_nothing(tmp_path):
    fake_run(tmp_path / "run", "tied")
    (tmp_path / "run" / CHECKPOINT).unlink()
    result = export(tmp_path / "run", "--to", "hf", tmp_path / "out")
    assert result.exit_code == 1 and "no checkpoint" in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_existing_folder_needs_force(tmp_path):
    fake_run(tmp_path / "run", "untied")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    result = export(tmp_path / "run", "--to", "safetensors", tmp_path / "out")
    assert result.exit_code == 1 and "--force" in result.output
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
    assert export(tmp_path / "run", "--to", "safetensors", tmp_path / "out", "--force").exit_code == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["model.safetensors"]


def test_not_a_run_and_bad_target(tmp_path):
    result = export(tmp_path, "--to", "hf", tmp_path / "out")
    assert result.exit_code == 1 and "is not a run directory" in result.output
    result = export(tmp_path, "--to", "onnx", tmp_path / "out")
    assert result.exit_code == 2 and "onnx" in result.output
    assert not (tmp_path / "out").exists()
