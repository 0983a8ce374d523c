import dataclasses
import math

import pytest
import torch
from conftest import conf, data_config

from tiecli.data import load_corpus
from tiecli.evaluate import evaluate
from tiecli.model import GPT, GPTConfig


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import os

    os.environ.setdefault("TIECLI_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    return load_corpus(data_config(), conf("tokenizer=bytes").tokenizer)


def test_uniform_model_gives_known_loss_and_bits_per_byte(corpus):
    """A zero output matrix predicts the uniform distribution: loss ln V, bits per byte log2 V."""
    model = GPT(GPTConfig(vocab_size=256, block_size=64, n_layer=1, n_head=2, n_embd=16, tying="untied"))
    with torch.no_grad():
        model.emb.lm_head.zero_()
    buckets = corpus.buckets([0.5, 0.9])
    m = evaluate(model, corpus, "val", buckets, torch.device("cpu"))
    assert m["n_tokens"] == len(corpus.tokens["val"]) - 1  # every target once
    assert m["loss"] == pytest.approx(math.log(256), rel=1e-6)
    assert m["perplexity"] == pytest.approx(256, rel=1e-5)
    assert m["bits_per_byte"] == pytest.approx(8.0, rel=1e-6)  # one byte per token
    assert sum(b["n_tokens"] for b in m["by_bucket"].values()) == m["n_tokens"]
    for b in m["by_bucket"].values():
        if b["n_tokens"]:
            assert b["perplexity"] == pytest.approx(256, rel=1e-5)


def test_bucket_losses_recombine_to_the_total(corpus):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=256, block_size=64, n_layer=1, n_head=2, n_embd=16))
    buckets = corpus.buckets([0.5, 0.9])
    m = evaluate(model, corpus, "val", buckets, torch.device("cpu"), limit=20)
    assert m["n_tokens"] == 20 * 64
    parts = [b for b in m["by_bucket"].values() if b["n_tokens"]]
    assert sum(b["loss"] * b["n_tokens"] for b in parts) / m["n_tokens"] == pytest.approx(m["loss"])


def test_evaluation_runs_in_inference_mode(corpus):
    model = GPT(GPTConfig(vocab_size=256, block_size=64, n_layer=1, n_head=2, n_embd=16))
    seen = []
    model.register_forward_hook(lambda *_: seen.append(torch.is_inference_mode_enabled()))
    evaluate(model, corpus, "val", corpus.buckets([0.5, 0.9]), torch.device("cpu"), limit=4)
    assert seen and all(seen) and not torch.is_inference_mode_enabled()
    assert model.training  # left as it was found


def test_the_training_split_is_evaluated_on_a_fixed_subset_when_large(corpus):
    from tiecli.data import eval_windows
    from tiecli.evaluate import TRAIN_EVAL_FACTOR, whole_split_limit

    limit = whole_split_limit(corpus, "train", 64)
    assert limit == TRAIN_EVAL_FACTOR * len(eval_windows(len(corpus.tokens["val"]), 64))
    assert whole_split_limit(corpus, "val", 64) is None and whole_split_limit(corpus, "test", 64) is None
    small = dataclasses.replace(
        corpus, tokens={**corpus.tokens, "train": corpus.tokens["train"][: 3 * len(corpus.tokens["val"])]}
    )
    assert len(eval_windows(len(small.tokens["train"]), 64, whole_split_limit(small, "train", 64))) == len(
        eval_windows(len(small.tokens["train"]), 64)
    )  # at most 4x the validation split: the whole of it
