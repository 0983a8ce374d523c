"""Data-parallel training (tiecli/runtime/distributed.py): 2 processes over gloo against one process.

The ranks are started as torchrun starts them (RANK, WORLD_SIZE, MASTER_ADDR/PORT), one
subprocess each, so a test can signal or kill one rank; the resume goes through the real torchrun
(`tiecli train --nproc 2`). A 2-process run costs 20-30 s here, so the assertions are combined.
"""

import dataclasses
import importlib.util
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers import rows
from typer.testing import CliRunner

from tiecli.cli import app
from tiecli.config.checks import to_config
from tiecli.config.compose import compose
from tiecli.config.schema import TrainConfig
from tiecli.errors import ConfigError, Interrupted, TiecliError
from tiecli.runtime import distributed, launcher

RUN = [
    "data=textfile",  # data.path: conftest's tiny.txt, by its absolute path (rank 1 runs in another folder)
    "model=nano",
    "model.block_size=32",
    "tokenizer=bytes",
    "train.batch_size=4",
    "train.grad_accum=2",  # a global batch of 8 sequences: 4 per rank in one micro-batch under 2 ranks
    "train.warmup_steps=2",
    "train.eval_interval=6",
    "train.eval_batches=2",
    "train.log_interval=3",
    "train.checkpoint_interval=6",
    "diag.every=3",
    "eval.test=false",
    "compile=false",  # compile=auto would compile the 5000-step run on CPU but not its shorter reference
]
WAIT_S = 240  # for a step, a stop or an exit; the machine running the tests may be busy


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_ranks(args: list[str], cwds: list[Path], tmp_path: Path) -> list[tuple[subprocess.Popen, Path]]:
    """`tiecli train ARGS` as torchrun would start it on len(cwds) ranks; each rank's stderr goes to a file."""
    port, world = free_port(), len(cwds)
    procs = []
    for rank, cwd in enumerate(cwds):
        cwd.mkdir(exist_ok=True)
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), OMP_NUM_THREADS="1")
        log = tmp_path / f"rank{rank}.err"
        with open(log, "w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tiecli", "train", *args, "--runs-dir", str(tmp_path / "runs")],
                cwd=cwd,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        procs.append((proc, log))
    return procs


def wait_for_step(run: Path, step: int, procs) -> None:
    """Until metrics.jsonl has a row at `step` (training is under way on every rank)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        metrics = run / "metrics.jsonl"
        if metrics.is_file() and any(json.loads(line).get("step") == step for line in metrics.read_text().splitlines()):
            return
        assert all(p.poll() is None for p, _ in procs), [log.read_text()[-2000:] for _, log in procs]
        time.sleep(0.2)
    pytest.fail(f"no step {step} in {run} after {WAIT_S} s")


@pytest.mark.slow
def test_two_ranks_train_as_one_stop_together_and_resume_exactly(tmp_path):
    """2 ranks against one process on the same global batch: the same losses and gradient statistics
    at every logged step, only rank 0 writing; SIGUSR2 to rank 1 stops both after the same step with
    one checkpoint; resuming with 1 process is refused naming both sizes; resuming under torchrun
    (`--nproc 2`) continues exactly. A constant learning rate (min_lr = lr) keeps the schedule
    independent of max_steps, so the reference can be planned to end where the resumed run ends."""
    args = [*RUN, f"data.path={tmp_path / 'tiny.txt'}", "train.lr=3e-3", "train.min_lr=3e-3"]
    procs = start_ranks([*args, "train.max_steps=5000", "--name", "two"], [tmp_path, tmp_path / "rank1"], tmp_path)
    run = tmp_path / "runs" / "two"
    wait_for_step(run, 9, procs)
    procs[1][0].send_signal(signal.SIGUSR2)  # SLURM's time-limit warning, to one rank only
    codes = [p.wait(timeout=WAIT_S) for p, _ in procs]
    assert codes == [130, 130], [log.read_text()[-2000:] for _, log in procs]
    summary = json.loads((run / "summary.json").read_text())
    stopped = summary["step"]
    assert summary["status"] == "interrupted" and 9 <= stopped < 5000
    ckpt = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["state"]["step"] == stopped and len(ckpt["rank_rng"]) == 1  # rank 1's own RNG streams
    assert list((tmp_path / "rank1").iterdir()) == []  # rank 1 wrote nothing
    assert procs[1][1].read_text().strip() == ""  # and said nothing: rank 0 speaks for all
    progress = " ".join(procs[0][1].read_text().split())
    assert "global batch 8 sequences (256 tokens) a step = 4 x 1 micro-steps x 2 processes" in progress
    assert summary["world_size"] == 2 and summary["batch"]["global"] == 8 and summary["tokens_per_step"] == 256

    refused = CliRunner().invoke(app, ["train", "--resume", str(run)])
    assert refused.exit_code == 2
    assert "trained with world size 2 and cannot resume with world size 1" in refused.output

    end = f"train.max_steps={stopped + 9}"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as the ranks: another thread count sums in another order
    for command in (["--nproc", "2", "--resume", str(run), end], [*args, end, "--name", "one"]):
        done = subprocess.run(
            [sys.executable, "-m", "tiecli", "train", *command, "--runs-dir", str(tmp_path / "runs")],
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads((run / "summary.json").read_text())["status"] == "completed"

    single, double = rows(tmp_path / "runs" / "one"), rows(run)
    assert single.keys() == double.keys() and max(single) == stopped + 9
    for step, row in single.items():
        assert row.keys() - {"tokens_per_s"} == double[step].keys() - {"tokens_per_s"}, step
        for key in ("loss", "val_loss", "train_eval_loss", "grad_cos", "grad_cos_present", "grad_norm_in"):
            if key in row:
                assert double[step][key] == pytest.approx(row[key], rel=1e-6), (step, key)
    assert sum("grad_cos" in row for row in single.values()) == (stopped + 9) // 3
    final_one = json.loads((tmp_path / "runs" / "one" / "summary.json").read_text())["final_val"]["loss"]
    assert json.loads((run / "summary.json").read_text())["final_val"]["loss"] == pytest.approx(final_one, rel=1e-6)


@pytest.mark.slow
def test_tied_then_untied_trains_under_two_ranks_as_in_one_process(tmp_path):
    """Before the switch lm_head gets no gradient, which DDP must be told to look for (else the second step
    waits forever for it); after it both matrices are reduced. Two ranks match one process at every row."""
    args = [*RUN, f"data.path={tmp_path / 'tiny.txt'}", "train.max_steps=12", "tying=tied_then_untied"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # as the ranks: another thread count sums in another order
    for name, nproc in (("two", ["--nproc", "2"]), ("one", [])):
        done = subprocess.run(
            [sys.executable, "-m", "tiecli", "train", *nproc, *args, "tying.untie_at=0.5", "--name", name],
            capture_output=True,
            text=True,
            timeout=WAIT_S,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    single, double = rows(tmp_path / "runs" / "one"), rows(tmp_path / "runs" / "two")
    assert single.keys() == double.keys() and max(single) == 12
    for step, row in single.items():
        for key in ("loss", "val_loss", "grad_cos", "grad_norm_in", "grad_norm_out"):
            if key in row:
                assert double[step][key] == pytest.approx(row[key], rel=1e-6), (step, key)
    one, two = (
        torch.load(tmp_path / "runs" / n / "checkpoints" / "last.pt", weights_only=True)["model"]
        for n in ("one", "two")
    )
    assert one["emb.untied"] and two["emb.untied"]
    assert torch.allclose(one["emb.lm_head"], two["emb.lm_head"], atol=1e-6) and not torch.equal(
        two["emb.lm_head"], two["emb.wte"]
    )


@pytest.mark.slow
def test_a_dead_rank_makes_the_others_fail_not_hang(tmp_path):
    args = [*RUN, f"data.path={tmp_path / 'tiny.txt'}", "train.max_steps=500"]
    procs = start_ranks([*args, "--name", "dead"], [tmp_path, tmp_path], tmp_path)
    run = tmp_path / "runs" / "dead"
    wait_for_step(run, 9, procs)  # logged after the checkpoint of step 6
    procs[1][0].kill()
    start = time.monotonic()
    assert procs[0][0].wait(timeout=WAIT_S) == 1
    assert time.monotonic() - start < 60
    err = procs[0][1].read_text()
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("error: rank 0 of 2: another rank stopped or cannot be reached")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["step"] >= 9
    assert torch.load(run / "checkpoints" / "last.pt", weights_only=True)["state"]["step"] >= 6


def test_world_size_must_divide_the_global_batch(tmp_path):
    result = CliRunner().invoke(app, ["train", "--nproc", "3", "train.batch_size=4", "model=nano"])
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: world size 3 does not divide the global batch train.batch_size x train.grad_accum = 4 x 1 = 4 "
        "sequences; use a number of processes that divides 4, or change train.batch_size / train.grad_accum"
    )
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "batch_size, grad_accum, world, shape",
    [(4, 2, 2, (4, 1)), (16, 1, 2, (8, 1)), (4, 8, 2, (4, 4)), (6, 2, 4, (3, 1)), (8, 3, 3, (8, 1)), (4, 1, 1, (4, 1))],
)
def test_rank_shape_splits_the_global_batch_evenly(batch_size, grad_accum, world, shape):
    t = TrainConfig(
        **{f: 1 for f in TrainConfig.__dataclass_fields__} | {"batch_size": batch_size, "grad_accum": grad_accum}
    )
    micro, steps = distributed.rank_shape(t, world)
    assert (micro, steps) == shape
    assert micro * steps * world == batch_size * grad_accum and micro <= batch_size


@pytest.mark.slow
def test_gpu_check_skips_cleanly_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine runs the check itself")
    script = Path(__file__).parent.parent / "benchmarks" / "gpu_check.py"
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().startswith("gpu_check: skipped, no CUDA device")


def test_the_batch_line_says_how_the_batch_is_made_only_when_it_is_more_than_one_micro_batch():
    one, accum = (
        to_config(compose([])[0]).train,
        to_config(compose(["train.grad_accum=2"])[0]).train,
    )
    assert distributed.batch_line(one, 128) == "batch 16 sequences (2,048 tokens) a step"
    assert distributed.batch_line(accum, 128) == "batch 32 sequences (4,096 tokens) a step = 16 x 2 micro-steps"


@dataclasses.dataclass
class LaunchConfig24:
    """torch 2.4's LaunchConfig fields: none of signals_to_handle, shutdown_timeout, numa_options, ..."""

    min_nodes: int
    max_nodes: int
    nproc_per_node: int
    logs_specs: object = None
    run_id: str = ""
    role: str = "default_role"
    rdzv_endpoint: str = ""
    rdzv_backend: str = "etcd"
    rdzv_configs: dict = dataclasses.field(default_factory=dict)
    rdzv_timeout: int = -1
    max_restarts: int = 3
    monitor_interval: float = 0.1
    start_method: str = "spawn"
    log_line_prefix_template: str | None = None
    metrics_cfg: dict = dataclasses.field(default_factory=dict)
    local_addr: str | None = None


def test_torchrun_passes_only_the_launch_config_fields_the_installed_torch_has(monkeypatch):
    """`tiecli train --nproc` on an older torch (2.4-2.8) whose LaunchConfig lacks the newer fields:
    it builds the config from what that version takes instead of dying with a TypeError."""
    import torch.distributed.launcher.api as api

    launched: list = []
    real_config = api.LaunchConfig

    def elastic_launch(config, entrypoint):
        return lambda *args: launched.append((config, entrypoint, args))

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # torchrun sets it when unset
    monkeypatch.setattr(api, "LaunchConfig", LaunchConfig24)
    monkeypatch.setattr(api, "elastic_launch", elastic_launch)
    assert launcher.torchrun(2, ["train", "seed=1"]) == 0
    config, entrypoint, args = launched[0]
    assert isinstance(config, LaunchConfig24) and entrypoint == sys.executable
    assert (config.nproc_per_node, config.max_nodes, config.rdzv_backend, config.max_restarts) == (2, 1, "c10d", 0)
    assert args == ("-m", "tiecli", "train", "seed=1")

    # the installed torch's own LaunchConfig keeps every field it has
    real = launcher.launch_config(real_config, min_nodes=1, max_nodes=1, nproc_per_node=2, nonsense=1)
    fields = {f.name for f in dataclasses.fields(real_config)}
    assert isinstance(real, real_config) and real.nproc_per_node == 2
    if "shutdown_timeout" in fields:
        assert (
            launcher.launch_config(
                real_config, min_nodes=1, max_nodes=1, nproc_per_node=1, shutdown_timeout=7
            ).shutdown_timeout
            == 7
        )


def gpu_check():
    """benchmarks/gpu_check.py as a module (benchmarks/ is not a package)."""
    path = Path(__file__).parent.parent / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_gpu_check_names_runs_uniquely_and_computes_mfu_from_steady_steps(tmp_path):
    g = gpu_check()
    checks = ["gpt2 bf16 compile", "gpt2 bf16 compile, diagnostics off", "torchrun --nproc 1 resume 20+20 vs 40"]
    names = g.run_names(checks)
    assert names == [
        "00-gpt2-bf16-compile",
        "01-gpt2-bf16-compile-diagnostics-off",
        "02-torchrun-nproc-1-resume-20-20-vs-40",
    ]
    assert len(set(g.run_names(["train model=small", "torchrun model=small"]))) == 2  # the old names collided

    # GPT-2 small: 85,056,000 non-embedding parameters, 855 MFLOP a token (6 x 123.7M + 12 L C T)
    fpt = g.flops_per_token(12, 768, 1024, 50257, 124_439_808 - 50257 * 768 - 1024 * 768)
    assert fpt == 6 * (85_056_000 + 50257 * 768) + 12 * 12 * 768 * 1024 == 855_166_464
    assert g.mfu(fpt, 400_000, 989.0) == pytest.approx(0.3459, abs=1e-4)

    # intervals up to WARM_STEPS hold the compile; the steady rate is the median of the rest
    metrics = tmp_path / "metrics.jsonl"
    rates = {10: 300.0, 20: 9000.0, 30: 10_000.0, 40: 10_400.0, 50: 9_800.0}
    lines = [{"format": 1}, {"step": 0, "tokens": 0}] + [{"step": s, "tokens_per_s": r} for s, r in rates.items()]
    metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert g.steady_tokens_per_s(metrics) == 10_000.0
    with pytest.raises(ValueError, match="no tokens/s after step 50"):
        g.steady_tokens_per_s(metrics, warm_steps=50)
    # 50 steps of 1,000 tokens took 25 s; at 10,000 tokens/s they would take 5 s: 20 s of compile
    assert g.compile_seconds(25.0, 50, 1000, 10_000.0) == pytest.approx(20.0)
    log = "V1201 Recompiling function forward in model/gpt.py:600\n    triggered by ...\nRecompiling function step"
    assert g.recompiles(log) == 2 and g.recompiles("training run\n") == 0
    assert g.peak_memory_gib({"peak_memory_bytes": 3 * 2**30}) == 3.0
    assert g.peak_memory_gib({"peak_memory_gib": 2.5}) == 2.5 and g.peak_memory_gib({"step": 1}) is None
    assert "H100 PCIe" in list(g.PEAK_TFLOPS)[: list(g.PEAK_TFLOPS).index("H100")]  # matched before plain H100


@pytest.mark.slow
def test_gpu_check_reads_its_figures_from_a_real_run(tmp_path):
    """throughput_row on a CPU run that gpu_check's own tiecli() started: every figure from its files."""
    g = gpu_check()
    args = [o for o in RUN if not o.startswith(("train.log_interval", "train.eval_interval", "diag.every"))]
    args += [f"data.path={tmp_path / 'tiny.txt'}", "train.max_steps=30", "train.log_interval=5", "diag.every=0"]
    g.tiecli(tmp_path, "00-run", "train", *args, "train.eval_interval=30")
    row = g.throughput_row("cpu run", tmp_path, "00-run", peak_tflops=1.0)
    run = tmp_path / "00-run"
    logged = [r["tokens_per_s"] for r in rows(run).values() if r["step"] > g.WARM_STEPS and "tokens_per_s" in r]
    assert row["steady_tokens_per_s"] == round(statistics.median(logged)) and len(logged) == 2  # steps 25 and 30
    assert row["ok"] is False  # not compiled in bf16: the GPU check would fail it
    assert row["steps"] == 30 and row["recompiles"] == 0 and (tmp_path / "00-run.log").is_file()
    summary = json.loads((run / "summary.json").read_text())
    assert row["compile_s"] == pytest.approx(
        max(0.0, summary["train_time"] - 30 * summary["tokens_per_step"] / row["steady_tokens_per_s"]), abs=0.1
    )


@pytest.mark.slow
def test_gpu_check_in_process_checks_pass_on_cpu(monkeypatch):
    """The fused-head and tying-mode checks of gpu_check.py at a small shape on CPU (bf16 autocast, compiled):
    6 rows a chunk, so 48 rows are traced into the graph (8 chunks) and 96 go through the operator (16)."""
    g = gpu_check()
    monkeypatch.setattr("tiecli.model.head.HEAD_CHUNK_ELEMENTS", 6 * 97)
    monkeypatch.setattr("tiecli.model.head.HEAD_CHUNK_MIN_ROWS", 1)
    head = g.head_rows("cpu", V=97, C=32, sizes={"traced": 48, "operator": 96})
    assert [r["check"] for r in head] == [
        "fused head 48 rows: eager vs F.cross_entropy",
        "fused head 48 rows: compiled vs eager (traced)",
        "fused head 96 rows: eager vs F.cross_entropy",
        "fused head 96 rows: compiled vs eager (operator)",
    ]
    assert all(r["ok"] for r in head), head
    modes = g.mode_rows("cpu", ("model=nano", "tokenizer=bytes", "model.block_size=32"), modes=("hybrid",))
    assert [r["check"] for r in modes] == ["tying=hybrid compiled step"]
    assert all(r["ok"] for r in modes), modes


# A micro-batch of 130 windows of 32 tokens at GPT-2's 50,257 tokens: 4,160 rows in chunks of 512,
# 9 chunks > head.HEAD_GRAPH_MAX_CHUNKS, so the compiled step calls the tiecli::fused_head operator.
OPERATOR = ["tokenizer=gpt2", "train.batch_size=130", "train.max_steps=2", "train.log_interval=1", "diag.every=1"]


@pytest.mark.slow
@pytest.mark.parametrize("head", ["graph", "operator"])
def test_ddp_with_compile_trains_as_one_process(tmp_path, head):
    """`tiecli train --nproc 2 compile=true` (gloo, dynamo's DDPOptimizer splitting the compiled graph at
    bucket boundaries) against one compiled process on the same global batch: the same losses and gradient
    statistics, with the head traced into the graph (bytes) and as the fused-head operator (GPT-2's
    vocabulary). Measured here on the 2-core CPU at a load average of 11: 293 s for the graph case, 619 s for the operator."""
    args = [o for o in RUN if o != "compile=false"] + ["compile=true", f"data.path={tmp_path / 'tiny.txt'}"]
    args += ["train.lr=3e-3", "train.min_lr=3e-3"]
    if head == "operator":
        drop = ("tokenizer=", "train.batch_size=", "train.log_interval=", "diag.every=")
        args = [o for o in args if not o.startswith(drop)] + OPERATOR + ["train.eval_batches=1"]
        args = [o for o in args if o != "train.eval_batches=2"]
    else:
        args += ["train.max_steps=6"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for command in (["--nproc", "2", *args, "--name", "two"], [*args, "--name", "one"]):
        done = subprocess.run(
            [sys.executable, "-m", "tiecli", "train", *command, "--runs-dir", str(tmp_path / "runs")],
            capture_output=True,
            text=True,
            timeout=900,
            env=env,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    one, two = tmp_path / "runs" / "one", tmp_path / "runs" / "two"
    summaries = [json.loads((run / "summary.json").read_text()) for run in (one, two)]
    assert [(s["compile"], s["world_size"]) for s in summaries] == [(True, 1), (True, 2)]
    single, double = rows(one), rows(two)
    assert single.keys() == double.keys() and sum("grad_cos" in row for row in single.values()) >= 2
    for step, row in single.items():
        for key in ("loss", "val_loss", "grad_cos", "grad_cos_present", "grad_norm_in"):
            if key in row:
                assert double[step][key] == pytest.approx(row[key], rel=1e-5), (step, key)
    assert summaries[1]["final_val"]["loss"] == pytest.approx(summaries[0]["final_val"]["loss"], rel=1e-5)


def test_cuda_devices_past_the_gpus_or_shared_by_all_ranks_are_refused_in_one_line(monkeypatch, isolated):
    """On a (pretended) 2-GPU machine: cuda:2, cuda:1 under a 2-rank torchrun and a third rank are refused;
    `cuda` becomes each rank's own GPU. A refusal in `tiecli train` is one line, exit 2, nothing written."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(ConfigError, match=r"^device=cuda:2 but this machine has 2 GPU\(s\) \(cuda:0 to cuda:1\)"):
        distributed.device(torch.device("cuda", 2))
    assert distributed.device(torch.device("cuda", 1)) == torch.device("cuda", 1)  # one process: any GPU it has

    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)  # as under torchrun
    monkeypatch.setattr(distributed.dist, "get_world_size", lambda: 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.device(torch.device("cuda")) == torch.device("cuda", 1)
    with pytest.raises(
        ConfigError, match=r"^device=cuda:1 under torchrun would put all 2 ranks on GPU 1; use device=cuda"
    ):
        distributed.device(torch.device("cuda", 1))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    with pytest.raises(ConfigError, match=r"^--nproc 3 but this machine has 2 GPU\(s\); use at most --nproc 2"):
        distributed.device(torch.device("cuda"))
    assert distributed.device(torch.device("cpu")) == torch.device("cpu")
    monkeypatch.undo()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    result = CliRunner().invoke(app, ["train", "device=cuda:2", "model=nano", "tokenizer=bytes"])
    assert result.exit_code == 2 and result.output.strip().count("\n") == 0, result.output
    assert result.output.startswith("error: device=cuda:2 but this machine has 2 GPU(s)")
    assert not (isolated / "runs").exists()


def test_checkpoints_keep_the_cuda_rng_of_the_runs_device_not_the_current_one(monkeypatch):
    """device=cuda:1 while cuda:0 is current: the state saved and restored is cuda:1's."""
    from tiecli.model import checkpoint

    calls: list = []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device="cuda": calls.append(("get", device)) or b"s1")
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device="cuda": calls.append(("set", state, device)))
    rng = checkpoint.device_rng(torch.device("cuda", 1))
    checkpoint.restore_device_rng(rng, torch.device("cuda", 1))
    assert rng == {"cuda": b"s1"} and calls == [
        ("get", torch.device("cuda", 1)),
        ("set", b"s1", torch.device("cuda", 1)),
    ]
    assert checkpoint.device_rng(torch.device("cpu")) == {}


@pytest.mark.slow
def test_gpu_check_resume_row_passes_under_torchrun_on_cpu(tmp_path, monkeypatch):
    """gpu_check's --nproc 1 resume check end to end, on CPU (gloo) at a small shape, compile off."""
    g = gpu_check()
    given = ("train.checkpoint_interval", "train.warmup_steps", "train.eval", "eval.test", "diag.snapshots")
    small = [o for o in RUN if not o.startswith(given)]  # RUN's shape, compile=false; the rest as the check has it
    check = [o for o in g.RESUME if not o.startswith(("model=", "compile="))]
    monkeypatch.setattr(g, "RESUME", [*small, f"data.path={tmp_path / 'tiny.txt'}", *check])
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    row = g.resume_row(tmp_path, {"resume": "02-resume"}, "resume")
    assert row["ok"] and row["world_size"] == 1, row
    assert row["max_weight_diff"] == 0.0 and row["bitwise_equal"]  # on CPU the resume is exact
    assert (tmp_path / "02-resume-resumed.log").read_text().count("resuming 02-resume-resumed from step 20") == 1


def test_a_rank_ended_by_a_stop_signal_is_interrupted_and_one_killed_is_not():
    with pytest.raises(Interrupted) as stopped:
        launcher.failed_ranks({1: -signal.SIGTERM}, 2)
    assert stopped.value.exit_code == 130 and "rank 1 of 2 was ended by SIGTERM" in str(stopped.value)
    with pytest.raises(TiecliError) as killed:
        launcher.failed_ranks({0: -signal.SIGTERM, 1: -signal.SIGKILL}, 2)
    assert not isinstance(killed.value, Interrupted) and killed.value.exit_code == 128 + signal.SIGKILL


@pytest.mark.parametrize(("ends", "code"), [("pass", 0), ("sys.exit(130)", 130), ("sys.exit()", 0)])
def test_a_rank_ends_with_its_commands_exit_code_and_its_output_flushed(ends, code):
    """launcher.run_rank ends a rank with os._exit, skipping interpreter shutdown: the command's exit code
    must survive it, and what it printed to a pipe (block-buffered, so lost without a flush) must arrive."""
    script = (
        "import sys\nfrom tiecli.runtime import launcher\n"
        f"def command():\n    print('out'); print('err', file=sys.stderr); {ends}\nlauncher.run_rank(command)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout block-buffered, as in CI
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    assert (done.returncode, done.stdout, done.stderr) == (code, "out\n", "err\n")
