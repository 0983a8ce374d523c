"""What keeps a GPU busy, tested on the CPU: device-aware defaults, timing after the device's queue, peak memory."""

import json

import torch
from conftest import TINY

from tiecli import config, rundir, train


def tiny_run(tmp_path, *overrides):
    keys = {o.split("=", 1)[0] for o in overrides}
    cfg, _ = config.compose([*(o for o in TINY if o.split("=", 1)[0] not in keys), *overrides])
    files = {rundir.CONFIG: config.to_yaml(cfg), rundir.OVERRIDES: "overrides: []\n"}
    return train.train(config.to_config(cfg), tmp_path / "run", False, files)


def test_throughput_is_timed_after_the_device_finishes_and_only_at_log_steps(tmp_path, monkeypatch):
    """On CUDA the host queues steps ahead of the GPU: tokens/s read before a sync measures the queue.
    fit waits for the device at each logged step (3, 6, 9, 10: diag.every, 12) and at no other."""
    synced = []
    monkeypatch.setattr(train, "synchronize", lambda device: synced.append(device.type))
    tiny_run(tmp_path, "eval.test=false")
    logged = [r.step for r in rundir.RunReader(tmp_path / "run").metrics() if r.tokens_per_s is not None]
    assert logged == [3, 6, 9, 10, 12] and synced == ["cpu"] * len(logged)


def test_summary_records_the_peak_memory(tmp_path, monkeypatch):
    summary = tiny_run(tmp_path, "eval.test=false")
    stored = json.loads((tmp_path / "run" / rundir.SUMMARY).read_text())
    assert stored["peak_memory"] == summary.peak_memory and summary.peak_memory["of"] == "process peak RSS"
    assert 50 * 2**20 < summary.peak_memory["bytes"] < 64 * 2**30  # torch alone is more than 50 MiB
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 123456789)
    cuda = train.peak_memory(torch.device("cuda", 0))
    assert cuda == {"bytes": 123456789, "of": "cuda max_memory_allocated"}
