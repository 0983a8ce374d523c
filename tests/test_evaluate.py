import dataclasses
import math

import pytest
import torch
from conftest import conf, data_config

from tiecli.config.schema import GPTConfig
from tiecli.data.tokens import load_corpus
from tiecli.measure.evaluate import evaluate
from tiecli.model.gpt import GPT


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import os

    os.environ.setdefault("TIECLI_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    return load_corpus(data_config(), conf("tokenizer=bytes").tokenizer)


@pytest.mark.slow
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
    from tiecli.data.batches import eval_windows
    from tiecli.measure.evaluate import TRAIN_EVAL_FACTOR, whole_split_limit

    limit = whole_split_limit(corpus, "train", 64)
    assert limit == TRAIN_EVAL_FACTOR * len(eval_windows(len(corpus.tokens["val"]), 64))
    assert whole_split_limit(corpus, "val", 64) is None and whole_split_limit(corpus, "test", 64) is None
    small = dataclasses.replace(
        corpus, tokens={**corpus.tokens, "train": corpus.tokens["train"][: 3 * len(corpus.tokens["val"])]}
    )
    assert len(eval_windows(len(small.tokens["train"]), 64, whole_split_limit(small, "train", 64))) == len(
        eval_windows(len(small.tokens["train"]), 64)
    )  # at most 4x the validation split: the whole of it


def tiny_model() -> GPT:
    return GPT(GPTConfig(vocab_size=256, block_size=64, n_layer=1, n_head=2, n_embd=16), seed=3)


@pytest.mark.slow
def test_small_splits_stay_whole_and_large_ones_are_a_seeded_subset_with_its_standard_error(corpus):
    """The bundled corpus fits eval.max_tokens whole (no `subset`); a cap of 50 windows keeps 50 full
    windows, the same ones every time, whose loss estimates the whole split's within its standard error."""
    from tiecli.measure.evaluate import final_windows

    default = conf("tokenizer=bytes").eval.max_tokens
    for split in ("val", "test"):
        windows, of = final_windows(corpus, split, 64, default)
        assert len(windows) == of and sum(n for _, n in windows) == len(corpus.tokens[split]) - 1
    model, buckets, cpu = tiny_model(), corpus.buckets([0.5, 0.9]), torch.device("cpu")
    whole = evaluate(model, corpus, "val", buckets, cpu, windows=final_windows(corpus, "val", 64, default))
    assert "subset" not in whole
    capped = final_windows(corpus, "val", 64, 50 * 64)
    assert capped == final_windows(corpus, "val", 64, 50 * 64) and len(capped[0]) == 50 < capped[1]
    part = evaluate(model, corpus, "val", buckets, cpu, windows=capped)
    assert part["n_tokens"] == 50 * 64 and part["subset"]["windows"] == 50 and part["subset"]["of"] == capped[1]
    se = part["subset"]["loss_se"]
    assert 0 < se < 0.1 and abs(part["loss"] - whole["loss"]) < 4 * se


def _rank_evaluates(rank: int, world: int, init: str, out: str, cache: str) -> None:
    """One of `world` gloo ranks: its sharded evaluation of the validation split, and how many windows it read."""
    import json
    import os

    import torch.distributed as dist

    from tiecli.measure import evaluate as ev

    os.environ["TIECLI_CACHE_DIR"] = cache
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    read = []
    summed = ev._summed
    ev._summed = lambda *args: (read.append(len(args[6])), summed(*args))[1]
    corpus = load_corpus(data_config(), conf("tokenizer=bytes").tokenizer)
    windows = ev.final_windows(corpus, "val", 64, 300 * 64)
    m = ev.evaluate(
        tiny_model(), corpus, "val", corpus.buckets([0.5, 0.9]), torch.device("cpu"), windows=windows, shard=True
    )
    with open(f"{out}.{rank}", "w") as f:
        json.dump({"metrics": m, "read": read}, f)
    dist.destroy_process_group()


@pytest.mark.slow
def test_a_sharded_evaluation_gives_one_process_numbers(corpus, tmp_path):
    """2 gloo ranks each evaluate half the windows; the all-reduced loss, bits per byte, bucket losses and
    standard error are one process's (the sums only add in another order)."""
    import json
    import os

    import torch.multiprocessing as mp

    from tiecli.measure.evaluate import final_windows

    windows = final_windows(corpus, "val", 64, 300 * 64)
    one = evaluate(tiny_model(), corpus, "val", corpus.buckets([0.5, 0.9]), torch.device("cpu"), windows=windows)
    args = (2, f"file://{tmp_path / 'pg'}", str(tmp_path / "out"), os.environ["TIECLI_CACHE_DIR"])
    mp.spawn(_rank_evaluates, args=args, nprocs=2)
    ranks = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(2)]
    assert [r["read"] for r in ranks] == [[150], [150]]
    for r in ranks:
        m = r["metrics"]
        assert m["n_tokens"] == one["n_tokens"] and m["n_bytes"] == one["n_bytes"]
        for key in ("loss", "bits_per_byte"):
            assert m[key] == pytest.approx(one[key], rel=1e-9)
        assert m["subset"]["loss_se"] == pytest.approx(one["subset"]["loss_se"], rel=1e-6)
        for name, b in one["by_bucket"].items():
            assert m["by_bucket"][name]["n_tokens"] == b["n_tokens"]
