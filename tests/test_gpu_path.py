"""What a GPU run depends on that the CPU can check (issue 45): the throughput clock, the final evaluation's
time budget, TF32 kept out of the geometry, collective errors named as they are, evaluation without host syncs."""

import time
from pathlib import Path

import pytest
import torch
from conftest import TINY
from helpers import one_line_error, tiecli
from test_train import setup

from tiecli.measure import evaluate
from tiecli.measure.evaluate import MIN_BUDGET_WINDOWS, budget_tokens
from tiecli.run.layout import CHECKPOINT
from tiecli.run.reader import RunReader
from tiecli.runtime import device as runtime
from tiecli.runtime import distributed
from tiecli.train import loop as train

SAVE_S = 1000.0  # each save and evaluation moves the clock on this far; the clock of tokens/s must not see it


@pytest.mark.slow
def test_tokens_per_s_leaves_out_checkpoint_saves_and_evaluations(tmp_path, monkeypatch):
    """A save at every step and evaluations that each take SAVE_S on the clock the loop reads (the clock is moved
    on, not slept through, so a loaded machine cannot blur it): each logged interval of 3 steps of a nano model
    still reads as the steps' own time, and the run's wall time holds the rest."""
    save, subset, real = train.save_checkpoint, train.subset_evals, time.perf_counter
    skipped = [0.0]

    def slow(work):
        def wrapped(*args, **kwargs):
            skipped[0] += SAVE_S
            return work(*args, **kwargs)

        return wrapped

    monkeypatch.setattr(train, "save_checkpoint", slow(save))
    monkeypatch.setattr(train, "subset_evals", slow(subset))
    monkeypatch.setattr(train.time, "perf_counter", lambda: real() + skipped[0])
    cfg, files = setup("train.max_steps=6", "train.checkpoint_interval=1", "train.eval_interval=3")
    summary = train.train(cfg, tmp_path / "run", False, files)
    rows = [r for r in RunReader(tmp_path / "run").metrics() if r.step > 0]
    assert [r.step for r in rows] == [3, 6]
    for row in rows:  # 3 steps of 128 tokens; with one save or evaluation inside, the interval would be >= SAVE_S
        assert 3 * cfg.tokens_per_step / row.tokens_per_s < SAVE_S / 2, row
    assert summary.train_time < SAVE_S / 2 and summary.wall_time > summary.train_time + 6 * SAVE_S


def test_the_time_budget_bounds_each_split_in_whole_powers_of_two_windows():
    # 60 s for 3 splits at 10,000 tokens/s: 200,000 tokens a split, 1,562 windows of 128: 1,024 kept
    assert budget_tokens(2_097_152, 60, 3, 10_000, 128) == (1024 * 128, "eval.max_seconds")
    assert budget_tokens(65_536, 60, 3, 10_000, 128) == (65_536, "eval.max_tokens")  # the token bound is tighter
    assert budget_tokens(None, 60, 3, 1e9, 128)[1] == "eval.max_seconds"  # fast: still a bound, never whole
    assert budget_tokens(2_097_152, 1e-6, 3, 10, 128) == (MIN_BUDGET_WINDOWS * 128, "eval.max_seconds")
    assert budget_tokens(2_097_152, None, 3, 10, 128) == (2_097_152, "eval.max_tokens")
    assert budget_tokens(None, None, 3, 10, 128) == (None, "")


def test_a_run_states_its_time_budget_before_step_1_and_keeps_it_in_the_checkpoint(tmp_path, capsys):
    """eval.max_seconds so small that the budget is MIN_BUDGET_WINDOWS windows a split: the line before
    step 1 says so, eval.json holds that subset with its standard error, the checkpoint keeps the budget."""
    cfg, files = setup("train.max_steps=3", "eval.max_seconds=1e-6")
    train.train(cfg, tmp_path / "run", False, files)
    assert "(eval.max_seconds)" in capsys.readouterr().err
    evals = RunReader(tmp_path / "run").evals()
    for split in ("val", "train", "test"):
        assert evals[split].n_tokens == MIN_BUDGET_WINDOWS * cfg.model.block_size
        assert evals[split].subset["windows"] == MIN_BUDGET_WINDOWS and evals[split].subset["loss_se"] > 0
    state = torch.load(tmp_path / "run" / CHECKPOINT, weights_only=True)["state"]
    assert state["eval_tokens"] == MIN_BUDGET_WINDOWS * cfg.model.block_size
    assert state["eval_bound"] == "eval.max_seconds"


def test_a_time_budget_of_zero_is_refused_in_one_line():
    result = tiecli("train", *TINY, "eval.max_seconds=0")
    one_line_error(result, 2, "eval.max_seconds=0")
    assert "must be above 0 (or null: no time bound)" in result.output and not (Path("runs")).exists()


def test_geometry_runs_without_tf32_even_when_training_enabled_it():
    torch.backends.cuda.matmul.allow_tf32 = True  # what set_up() sets on CUDA
    try:
        assert torch.get_float32_matmul_precision() == "high"
        with runtime.full_fp32():
            assert torch.get_float32_matmul_precision() == "highest" and not torch.backends.cuda.matmul.allow_tf32
        assert torch.get_float32_matmul_precision() == "high"  # still readable: inductor reads it when compiling
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    assert torch.get_float32_matmul_precision() == "highest"


def test_a_collective_error_is_named_as_a_lost_peer_only_when_it_is_one():
    lost = distributed.collective_error(RuntimeError("[pair.cc:534] Connection closed by peer [127.0.0.1]:1234"))
    assert "another rank stopped or cannot be reached (Connection closed by peer" in str(lost)
    timeout = distributed.collective_error(RuntimeError("NCCL watchdog: Timed out waiting 1800000ms for ALLREDUCE"))
    assert "another rank stopped" in str(timeout)
    broken = distributed.collective_error(RuntimeError("NCCL error: unhandled cuda error, illegal memory access"))
    assert "a collective operation failed (NCCL error: unhandled cuda error" in str(broken)
    assert "another rank" not in str(broken) and "last checkpoint is kept" in str(broken)


def test_evaluation_sums_by_bucket_without_bincount(monkeypatch):
    """The per-bucket sums come from index_add_: bincount sizes its output on the host, a GPU sync a batch."""
    from tiecli.config.schema import GPTConfig
    from tiecli.data.tokens import load_corpus
    from tiecli.model.gpt import GPT

    def no_bincount(*args, **kwargs):
        raise AssertionError("torch.bincount called during evaluation")

    cfg, _ = setup()
    corpus = load_corpus(cfg.data, cfg.tokenizer)
    monkeypatch.setattr(torch, "bincount", no_bincount)
    model = GPT(GPTConfig(vocab_size=256, block_size=32, n_layer=1, n_head=2, n_embd=16), seed=0)
    m = evaluate.evaluate(model, corpus, "val", corpus.buckets([0.5, 0.9]), torch.device("cpu"), limit=8)
    parts = [b for b in m["by_bucket"].values() if b["n_tokens"]]
    assert sum(b["n_tokens"] for b in m["by_bucket"].values()) == m["n_tokens"] == 8 * 32
    assert sum(b["loss"] * b["n_tokens"] for b in parts) / m["n_tokens"] == pytest.approx(m["loss"])


def test_a_numbered_cuda_device_becomes_the_current_one(monkeypatch):
    """device=cuda:N: set_up() makes it the current device too (kernels and NCCL that use the current one)."""
    set_to = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: set_to.append(d))
    from tiecli.train import prepare as preparing

    monkeypatch.setattr(preparing, "pick_device", lambda name: torch.device(name))
    monkeypatch.setattr(distributed, "device", lambda d: d)
    monkeypatch.setattr(preparing, "load_corpus", lambda *a: (_ for _ in ()).throw(RuntimeError("stop here")))
    cfg, _ = setup("device=cuda:1", "dtype=fp32")
    tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        with pytest.raises(RuntimeError, match="stop here"):
            preparing.set_up(cfg)
    finally:  # set_up() turns TF32 on for CUDA: not for the tests that follow
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32
    assert set_to == [torch.device("cuda", 1)]
