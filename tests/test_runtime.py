import os
import signal

import pytest
import torch
from conftest import TINY

from tiecli.config.checks import to_config
from tiecli.config.compose import compose, to_yaml
from tiecli.errors import ConfigError, Interrupted
from tiecli.run.layout import CHECKPOINT, CONFIG
from tiecli.run.reader import RunReader
from tiecli.runtime import device as runtime
from tiecli.train import loop as train
from tiecli.train import optim

CPU, CUDA, MPS = torch.device("cpu"), torch.device("cuda"), torch.device("mps")


def test_compile_auto_follows_the_device_and_the_run_length():
    n, n_cuda = runtime.COMPILE_MIN_STEPS_CPU, runtime.COMPILE_MIN_STEPS_CUDA
    assert not runtime.pick_compile("auto", CUDA, 10) and not runtime.pick_compile("auto", MPS, 10**6)
    assert not runtime.pick_compile("auto", CUDA, n_cuda - 1) and runtime.pick_compile("auto", CUDA, n_cuda)
    assert not runtime.pick_compile("auto", CPU, n - 1) and runtime.pick_compile("auto", CPU, n)
    assert runtime.pick_compile("true", CPU, 1) and not runtime.pick_compile("false", CUDA, 10**6)


def test_dtype_auto_follows_the_hardware(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: True)
    assert runtime.pick_dtype("auto", CPU) == "bf16" and runtime.pick_dtype("fp32", CPU) == "fp32"
    assert runtime.pick_dtype("auto", MPS) == "fp32"
    monkeypatch.setattr(runtime, "cpu_has_bf16", lambda: False)
    assert runtime.pick_dtype("auto", CPU) == "fp32" and runtime.pick_dtype("bf16", CPU) == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert runtime.pick_dtype("auto", CUDA) == "bf16"


def test_inductor_cache_lives_under_the_tiecli_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TIECLI_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    runtime.use_compile_cache()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "inductor")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    runtime.use_compile_cache()  # the user's own setting wins
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")


def test_a_bad_compile_value_is_one_line():
    with pytest.raises(ConfigError, match="compile='sometimes' is not valid; choose one of auto, true, false"):
        to_config(compose(["compile=sometimes"])[0])


def weights(run_dir):
    return torch.load(run_dir / CHECKPOINT, weights_only=True)["model"]


@pytest.fixture
def one_thread(monkeypatch):
    """Inductor's CPU kernels split some reductions over threads, and on a busy machine the last bits
    then vary from run to run (seen: 1e-8 in weights after 12 steps, on 2 threads); on one thread a
    compiled run is bit-reproducible, which is what a resume must match. OMP_NUM_THREADS, so that
    tiecli leaves the count alone."""
    threads = torch.get_num_threads()
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_compiled_training_resumes_exactly_and_agrees_with_eager(tmp_path, monkeypatch, one_thread):
    """compile=true: the whole step compiled; Ctrl-C during step 5 and --resume give the uninterrupted
    run's weights bit for bit, and those agree with the eager run's within fp32 rounding."""
    cfg_node, _ = compose([*TINY, "compile=true", "dtype=fp32", "diag.geometry=false", "eval.test=false"])
    cfg, files = to_config(cfg_node), {CONFIG: to_yaml(cfg_node)}
    train.train(cfg, tmp_path / "whole", False, files)
    assert RunReader(tmp_path / "whole").summary().compile is True

    lr_at = optim.lr_at

    def ctrl_c_during_step_5(step, c):  # the loop sets each step's learning rate first
        if step == 4:
            os.kill(os.getpid(), signal.SIGINT)
        return lr_at(step, c)

    monkeypatch.setattr(train, "lr_at", ctrl_c_during_step_5)
    with pytest.raises(Interrupted, match="interrupted at step 5/12"):
        train.train(cfg, tmp_path / "split", False, files)
    monkeypatch.setattr(train, "lr_at", lr_at)
    train.train(cfg, tmp_path / "split", True, files)
    whole, split = weights(tmp_path / "whole"), weights(tmp_path / "split")
    assert all(torch.equal(whole[k], split[k]) for k in whole)

    eager_cfg = to_config(compose([*TINY, "compile=false", "dtype=fp32", "diag.geometry=false"])[0])
    train.train(eager_cfg, tmp_path / "eager", False, files)
    eager = weights(tmp_path / "eager")
    assert all(torch.allclose(whole[k], eager[k], atol=1e-5, rtol=1e-4) for k in whole)


def stat(*cpus):
    """/proc/stat text with per-CPU (user, idle) tick counts, the other columns zero."""
    lines = ["cpu  0 0 0 0 0 0 0 0 0 0"]
    lines += [f"cpu{i} {user} 0 0 {idle} 0 0 0 0 0 0" for i, (user, idle) in enumerate(cpus)]
    return "\n".join([*lines, "intr 1 2 3", "ctxt 5"])


def test_busy_cores_counts_what_other_processes_kept_busy_on_our_cpus():
    texts = iter([stat((100, 900), (500, 500)), stat((200, 900), (550, 550))])  # cpu0 all busy, cpu1 half
    assert runtime.busy_cores({0, 1}, read=lambda: next(texts), sleep=lambda s: None) == pytest.approx(1.5)
    texts = iter([stat((100, 900), (500, 500)), stat((200, 900), (550, 550))])
    assert runtime.busy_cores({1}, read=lambda: next(texts), sleep=lambda s: None) == pytest.approx(0.5)


def test_threads_follow_the_free_cores_and_never_exceed_torchs_default():
    assert runtime.pick_threads(2, 1.0, 2) == 1  # another job holds a core: one thread
    assert runtime.pick_threads(2, 2.0, 2) == 1  # none free: still one
    assert runtime.pick_threads(2, 0.3, 2) == 2  # background noise does not cost a thread
    assert runtime.pick_threads(16, 4.0, 8) == 8 and runtime.pick_threads(16, 10.2, 8) == 6
    assert runtime.pick_threads(2, None, 2) == 2  # not measurable: torch's default


@pytest.fixture
def fresh_threads(monkeypatch):
    """A fresh per-process thread choice, on two CPUs whose load the test sets; torch's count restored after."""
    threads = torch.get_num_threads()
    monkeypatch.setattr(runtime, "_chosen", {"default": runtime.Threads(2, 2, None, "torch")})
    monkeypatch.setattr(runtime, "affinity", lambda: {0, 1})
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    load = {"busy": 0.0}
    monkeypatch.setattr(runtime, "busy_cores", lambda cpus: load["busy"])
    yield load
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_a_busy_machine_trains_on_the_free_cores_and_says_so(isolated, fresh_threads):
    from typer.testing import CliRunner

    from tiecli.cli import app

    fresh_threads["busy"] = 1.0
    result = CliRunner().invoke(app, ["train", *TINY, "--name", "r"])
    assert result.exit_code == 0, result.output
    assert "note: 1.0 of 2 cores are busy with other processes; running on 1 thread" in result.output
    assert RunReader(isolated / "runs" / "r").summary().threads == 1 == torch.get_num_threads()

    fresh_threads["busy"] = 0.0  # the machine is free again, but a resume keeps the run's own count
    result = CliRunner().invoke(app, ["train", "--resume", "runs/r", "train.max_steps=15"])
    assert result.exit_code == 0, result.output
    assert RunReader(isolated / "runs" / "r").summary().threads == 1


def test_omp_num_threads_wins_and_is_warned_about_when_too_many(fresh_threads, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    fresh_threads["busy"] = 1.6
    chosen = runtime.use_threads(CPU)
    assert (chosen.n, chosen.source) == (2, "OMP_NUM_THREADS") and torch.get_num_threads() == 2
    assert chosen.warning() == (
        "warning: 1.6 of 2 cores are busy with other processes, and OMP_NUM_THREADS sets 2 threads; fewer may be faster"
    )
    assert runtime.Threads(1, 2, 1.9, "auto").warning().startswith("warning: the machine is oversubscribed")
    assert runtime.Threads(2, 2, 0.2, "auto").warning() is None
