"""What keeps a GPU busy, tested on the CPU: device-aware defaults, timing after the device's queue, peak memory."""

import json

import pytest
import torch
from conftest import TINY
from omegaconf import OmegaConf

from tiecli.config.checks import to_config
from tiecli.config.compose import compose, recompose, to_yaml
from tiecli.errors import ConfigError
from tiecli.run.layout import CONFIG, OVERRIDES, SUMMARY
from tiecli.run.reader import RunReader
from tiecli.runtime import device as runtime
from tiecli.runtime import distributed
from tiecli.train import loop as train


def tiny_run(tmp_path, *overrides):
    keys = {o.split("=", 1)[0] for o in overrides}
    cfg, _ = compose([*(o for o in TINY if o.split("=", 1)[0] not in keys), *overrides])
    files = {CONFIG: to_yaml(cfg), OVERRIDES: "overrides: []\n"}
    return train.train(to_config(cfg), tmp_path / "run", False, files)


@pytest.mark.slow
def test_throughput_is_timed_after_the_device_finishes_and_only_at_log_steps(tmp_path, monkeypatch):
    """On CUDA the host queues steps ahead of the GPU: tokens/s read before a sync measures the queue.
    fit waits for the device at each logged step (3, 6, 9, 10: diag.every, 12) and at no other."""
    synced = []
    monkeypatch.setattr(train, "synchronize", lambda device: synced.append(device.type))
    tiny_run(tmp_path, "eval.test=false")
    logged = [r.step for r in RunReader(tmp_path / "run").metrics() if r.tokens_per_s is not None]
    assert logged == [3, 6, 9, 10, 12] and synced == ["cpu"] * len(logged)


@pytest.mark.slow
def test_summary_records_the_peak_memory(tmp_path, monkeypatch):
    summary = tiny_run(tmp_path, "eval.test=false")
    stored = json.loads((tmp_path / "run" / SUMMARY).read_text())
    assert stored["peak_memory"] == summary.peak_memory and summary.peak_memory["of"] == "process peak RSS"
    assert 50 * 2**20 < summary.peak_memory["bytes"] < 64 * 2**30  # torch alone is more than 50 MiB
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 123456789)
    cuda = runtime.peak_memory(torch.device("cuda", 0))
    assert cuda == {"bytes": 123456789, "of": "cuda max_memory_allocated"}


@pytest.mark.slow
def test_hardware_auto_picks_gpu_defaults_where_cuda_is(monkeypatch):
    """With CUDA, hardware=auto is hardware=gpu: 16 x 1024-token micro-batches, 20 evaluations and 4
    checkpoints a run; device=cpu keeps the CPU defaults, and hardware=gpu picks them without a GPU."""
    cpu = to_config(compose([])[0])
    assert (cpu.train.batch_size, cpu.model.block_size, cpu.train.evals, cpu.train.checkpoints) == (16, 128, 5, None)
    assert to_config(compose(["hardware=gpu"])[0]).model.block_size == 1024
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    gpu = to_config(compose([])[0])
    assert (gpu.train.batch_size, gpu.model.block_size, gpu.train.evals, gpu.train.checkpoints) == (16, 1024, 20, 4)
    assert gpu.tokens_per_step == distributed.MIN_GPU_BATCH_TOKENS
    assert compose(["device=cpu"])[0].model.block_size == 128
    assert compose(["hardware=cpu"])[0].train.evals == 5
    own = compose(["model=nano", "model.block_size=256"])[0]  # a given value wins over hardware's
    assert own.model.block_size == 256 and own.train.batch_size == 16


@pytest.mark.slow
def test_explicit_settings_win_over_the_scaled_defaults(monkeypatch):
    """TINY's train.eval_interval, warmup_steps and checkpoint_interval, given alone, replace the defaults
    of train.evals, warmup_fraction and checkpoints, on the GPU defaults too."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    c = to_config(compose(TINY)[0])
    assert (c.train.batch_size, c.model.block_size) == (4, 32)
    assert (c.train.evals, c.train.warmup_fraction, c.train.checkpoints) == (None, None, None)
    assert (c.warmup, c.n_evals, [s for s in range(1, 13) if c.is_checkpoint_step(s)]) == (2, 2, [6, 12])
    both = to_config(compose([*TINY, "train.evals=3", "train.checkpoints=3"])[0])
    assert [s for s in range(1, 13) if both.is_eval_step(s)] == [4, 8, 12]
    assert [s for s in range(1, 13) if both.is_checkpoint_step(s)] == [4, 8, 12]


def test_old_runs_keep_their_checkpoint_interval(monkeypatch):
    """A run written before train.checkpoints existed reads it as null (every checkpoint_interval), even where
    the gpu defaults would give 10."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    stored, choices = compose(TINY)
    old = OmegaConf.to_container(stored)
    del old["train"]["checkpoints"]
    upgraded = to_config(recompose(old, choices))
    assert upgraded.train.checkpoints is None and upgraded.train.checkpoint_interval == 6


def test_unknown_hardware_is_one_line():
    with pytest.raises(ConfigError, match=r"^unknown hardware 'tpu'; valid choices: auto, cpu, gpu$"):
        compose(["hardware=tpu"])


def test_a_small_micro_batch_on_cuda_gets_a_warning():
    t = to_config(compose(TINY)[0]).train
    line = distributed.small_batch_warning(torch.device("cuda"), t, 32)
    assert line is not None and "4 x 32 = 128 tokens" in line and "\n" not in line
    assert distributed.small_batch_warning(torch.device("cpu"), t, 32) is None
    gpu = to_config(compose(["hardware=gpu"])[0])
    assert distributed.small_batch_warning(torch.device("cuda"), gpu.train, gpu.model.block_size) is None


@pytest.mark.slow
def test_the_final_evaluation_is_bounded_and_its_time_told_before_training(tmp_path, capsys):
    """eval.max_tokens=640 keeps 20 windows of 32 tokens a split, with the standard error in eval.json;
    the expected time of the final evaluation is printed before the first step."""
    tiny_run(tmp_path, "eval.max_tokens=640")
    err = " ".join(capsys.readouterr().err.split())
    line = "final evaluation: val, train, test, 1,920 tokens, at most 640 a split (eval.max_tokens); about"
    assert line in err and err.index(line) < err.index("step 3/12")
    for e in RunReader(tmp_path / "run").evals().values():
        assert e.n_tokens == 640 and e.subset["windows"] == 20 and e.subset["loss_se"] > 0


def test_eval_max_tokens_below_a_window_is_one_line():
    with pytest.raises(ConfigError, match=r"^eval.max_tokens=16 must be at least model.block_size=32"):
        to_config(compose([*TINY, "eval.max_tokens=16"])[0])
