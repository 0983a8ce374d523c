"""`tiecli sweep --dry-run`'s wall-time estimate: steps timed here per model size, then the jobs scheduled."""

import math
import re
from pathlib import Path

import pytest
from conftest import TINY, conf
from helpers import tiecli

from tiecli.sweep import dryrun

ANY_MODEL = [o for o in TINY if o != "model=nano"]


@pytest.mark.slow
def test_a_job_takes_its_steps_and_evaluations_at_the_measured_pace():
    c = conf(*TINY)  # 12 steps, an evaluation every 6 steps: at steps 6 and 12, and one at step 0
    pace = dryrun.Pace(step_s=0.5, eval_batch_s=0.1, steps=3, device="cpu", dtype="fp32")
    eval_s = 2 * c.train.eval_batches * 0.1  # the validation and training subsets, eval_batches each
    assert math.isclose(dryrun.job_seconds(c, pace), 12 * 0.5 + 3 * eval_s)
    assert math.isclose(dryrun.job_seconds(c, pace, done_steps=6), 6 * 0.5 + 1 * eval_s)  # resumed at 6
    assert dryrun.job_seconds(c, pace, done_steps=12) == 0
    assert dryrun.wall_time([3, 1, 1, 1], 2) == 3  # the first job on one slot, the three short ones on the other
    assert dryrun.wall_time([2, 2, 2], 2) == 4 and dryrun.wall_time([2, 2, 2], 1) == 6
    assert dryrun.wall_time([2, 2, 2], 8) == 2


@pytest.mark.slow
def test_sizes_that_share_a_model_batch_and_precision_are_timed_once():
    c = conf(*TINY)
    assert dryrun.size_key(conf(*TINY, "seed=3", "train.evals=1")) == dryrun.size_key(c)
    assert dryrun.size_key(conf(*ANY_MODEL, "model=micro")) != dryrun.size_key(c)
    assert dryrun.size_key(conf(*[o for o in TINY if "batch_size" not in o], "train.batch_size=8")) != dryrun.size_key(
        c
    )


@pytest.mark.slow
def test_the_dry_run_times_each_size_here_and_prints_the_estimate(isolated):
    result = tiecli("sweep", *ANY_MODEL, "model=nano,micro", "seed=0,1", "--name", "est", "--dry-run")
    assert result.exit_code == 0, result.output
    timed = [line for line in result.output.splitlines() if line.startswith("timed on cpu")]
    assert len(timed) == 2 and "like nano-" in timed[0] and "like micro-" in timed[1], result.output
    for line in timed:
        step_s, steps, eval_s = re.search(
            r": (\S+) s a step \((\d+) step\(s\) of 128 tokens\), (\S+) s an eval", line
        ).groups()
        assert float(step_s) > 0 and 1 <= int(steps) <= dryrun.TIMED_STEPS and float(eval_s) > 0
    assert re.search(
        r"^estimated wall time: \d+m\d\ds for 4 job\(s\), \d+m\d\ds of job time \(one at a time", result.output, re.M
    )
    assert not Path("runs").exists()


def test_the_dry_run_times_on_the_free_cores_and_states_the_load(isolated, monkeypatch):
    import torch

    from tiecli.runtime import device as runtime

    threads = torch.get_num_threads()
    monkeypatch.setattr(runtime, "_chosen", {"default": runtime.Threads(2, 2, None, "torch")})
    monkeypatch.setattr(runtime, "affinity", lambda: {0, 1})
    monkeypatch.setattr(runtime, "busy_cores", lambda cpus: 1.2)  # another job holds a core
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    try:
        result = tiecli("sweep", *TINY, "seed=0,1", "--name", "est", "--dry-run")
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert result.exit_code == 0, result.output
    (timed,) = [line for line in result.output.splitlines() if line.startswith("timed on cpu")]
    assert "1 thread, with 1.2 of 2 cores busy with other processes (assumed to last)" in timed


def test_the_dry_run_lists_the_jobs_then_says_what_it_times_while_it_does(isolated, monkeypatch):
    """Timing a size can take minutes (torch.compile, a large model): the jobs are on screen by then, and a
    line says what is being timed, rather than nothing until the end."""
    import io

    from rich.console import Console

    from tiecli.sweep import sweep

    out, err = (Console(file=io.StringIO(), record=True, width=300) for _ in range(2))
    seen = []

    def measure(c):  # what the user sees when a size's timing starts
        seen.append((out.export_text(clear=False), err.export_text(clear=False)))
        return dryrun.Pace(step_s=0.5, eval_batch_s=0.1, steps=3, device="cpu", dtype="fp32")

    monkeypatch.setattr(dryrun, "measure_pace", measure)
    options = dict(status=None, launcher="basic", jobs=None, gpus_per_job=None, config_dir=None)
    args = [*ANY_MODEL, "model=nano,micro", "seed=0,1"]
    sweep(args, name="est", runs_dir=Path("runs"), dry_run=True, estimate=True, console=out, err_console=err, **options)
    assert len(seen) == 2
    shown, said = seen[0]
    assert shown.count(" [new]: ") == 4 and "total: 4 job(s)" in shown
    assert re.fullmatch(
        r"timing model size 1 of 2 on cpu \(like nano-tied-bytes-textfile_tiny-\w+-s0\): a warm-up step, then up to "
        r"3 optimizer steps and evaluation batches on random tokens, 5 s at most each \(--no-estimate skips this\) \.\.\.",
        said.strip(),
    ), said
    assert "timing model size 2 of 2 on cpu (like micro-" in seen[1][1] and "timed on cpu" in seen[1][0]
    assert "estimated wall time" in out.export_text()


def test_a_large_sweep_says_how_far_composing_its_jobs_has_come(isolated, monkeypatch):
    """Every job is composed and checked before anything runs: a 6,000-job sweep takes minutes at that."""
    from tiecli.sweep import status

    monkeypatch.setattr(status, "PROGRESS_EVERY_S", 0.0)  # as if each job took longer than the interval
    result = tiecli("sweep", *TINY, "seed=0,1,2", "--dry-run", "--no-estimate")
    assert result.exit_code == 0, result.output
    said = [line for line in result.output.splitlines() if line.startswith("composing")]
    assert said == [f"composing and checking the jobs' configs: {i} of 3 ..." for i in (1, 2)]
