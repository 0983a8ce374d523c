# Used by `tiecli sweep --dry-run`: what each job would do and fill, and how long the sweep will take.
"""A sweep's dry run: each job's run directory, action (new, resume, skip), steps, tokens and disk use.

The wall time is estimated before anything runs. For each model size of the sweep (its model
shape, vocabulary, batch and precision, as configured), a model is built on the device the jobs
would use and a few optimizer steps on random tokens are timed, after one untimed warm-up step
(allocation, torch.compile), as is one forward pass of an evaluation batch. A job then takes steps x
step time + its in-training evaluations (validation and training subsets, train.eval_batches
batches each) x batch time. Data preparation, the gradient diagnostics and the final full-split
evaluations are not counted, so the estimate is a lower bound. On a CPU the steps run on the threads
a job would use (runtime.use_threads: the cores other processes leave free, or OMP_NUM_THREADS), and
the estimate assumes the load measured then lasts. The jobs are then scheduled on the slots the
launcher runs at once (GPUs here, the SLURM array's parallelism; on a CPU the jobs share its cores).
"""

import dataclasses
import heapq
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from rich.console import Console

from tiecli.config.schema import Config, LauncherConfig
from tiecli.formats import duration
from tiecli.model.gpt import GPT, count_params
from tiecli.run.layout import is_run_dir
from tiecli.run.records import SweepManifest
from tiecli.runtime.device import autocast_for, compile_step, pick_compile, pick_device, pick_dtype, use_threads
from tiecli.sweep.launchers import SUBMITIT_FOLDER, sbatch_lines, slurm_parameters
from tiecli.sweep.scheduler import Launch
from tiecli.sweep.states import run_status
from tiecli.sweep.status import progress, shown
from tiecli.train.optim import make_optimizer

BYTES_PER_PARAM = 4  # fp32 weights, also under bf16 autocast
TIMED_STEPS = 3  # optimizer steps timed per size, fewer when they take longer than BUDGET_S
BUDGET_S = 5.0


def dry_run_lines(
    sweep_dir: Path,
    manifest: SweepManifest,
    configs: dict[str, Config],
    launch: Launch | None = None,
    timed: bool = False,
    console: Console | None = None,
) -> Iterator[str]:
    """What `--dry-run` prints, line by line as it is known: each job's run directory, what running it would do,
    overrides and size; the total; for SLURM the #SBATCH lines of the job array; with `timed`, the wall time from
    steps timed here, while `console` says what is being timed."""
    axes = " x ".join(f"{k} ({len(v)})" for k, v in manifest.axes.items()) or "no axes"
    if (manifest.study or {}).get("add"):
        axes += f" + {len(manifest.jobs) - math.prod(len(v) for v in manifest.axes.values())} from add rules"
    about = f" ({manifest.study['description']})" if manifest.study and manifest.study["description"] else ""
    yield f"sweep {manifest.name!r}: {len(manifest.jobs)} job(s), {axes}, in {shown(sweep_dir)}{about}"
    sizes, left = [], {}
    counted: dict[str, dict[str, int]] = {}
    for job in manifest.jobs:
        run_dir = sweep_dir / job.run_dir
        action = "completed, skip" if run_status(run_dir) == "completed" else "resume" if is_run_dir(run_dir) else "new"
        if action != "completed, skip":
            left[job.name] = progress(run_dir)["step"] if action == "resume" else 0
        s = job_size(configs[job.name], counted)
        sizes.append(s)
        yield f"{shown(run_dir)} [{action}]: {' '.join(job.overrides)}"
        yield (
            f"  {s['steps']:,} steps, {s['tokens']:,} tokens, {s['evals']} evaluations, "
            f"{s['warmup']} warmup steps; {s['params']:,} parameters; disk {size_text(s['disk'])} "
            f"(checkpoint {size_text(s['checkpoint'])}, "
            f"{s['snapshots']} snapshots {size_text(s['snapshot_bytes'])})"
        )
    steps, tokens, disk = (sum(s[key] for s in sizes) for key in ("steps", "tokens", "disk"))
    yield f"total: {len(sizes)} job(s), {steps:,} steps, {tokens:,} tokens, disk {size_text(disk)}"
    if launch and launch.settings.kind == "submitit_slurm":
        params = slurm_parameters(launch.settings, manifest.name, launch.gpus_per_job)
        folder = sweep_dir.resolve() / SUBMITIT_FOLDER
        yield f"submitit_slurm: the {len(left)} job(s) to run go to SLURM as one array with"
        yield from (f"  {line}" for line in sbatch_lines(params, max(1, len(left)), folder))
    if timed:
        yield from estimate_lines({name: configs[name] for name in left}, left, launch, console)


def job_size(cfg: Config, counted: dict[str, dict[str, int]] | None = None) -> dict:
    """What one job does and the disk it fills: steps, tokens, evaluations, warmup steps, parameters and bytes.

    The checkpoint holds the weights and AdamW's two moments; each snapshot (diag.snapshots, at step 0 and
    every evaluation, at most diag.max_snapshots) the token matrices. Metrics and geometry files are small.
    counted: parameter counts by model, kept across a sweep's jobs (each count builds the model on the meta device).
    """
    counted = {} if counted is None else counted
    model = repr(dataclasses.asdict(cfg.model))
    if model not in counted:
        counted[model] = count_params(cfg.model)
    counts = counted[model]
    snapshots = min(cfg.n_evals + 1, cfg.diag.max_snapshots) if cfg.diag.geometry and cfg.diag.snapshots else 0
    matrices = counts["input_embedding"] + counts["output_matrix"] + counts["shared"]
    checkpoint, snapshot_bytes = counts["total"] * BYTES_PER_PARAM * 3, snapshots * matrices * BYTES_PER_PARAM
    return {
        "steps": cfg.max_steps,
        "tokens": cfg.max_steps * cfg.tokens_per_step,
        "evals": cfg.n_evals,
        "warmup": cfg.warmup,
        "params": counts["total"],
        "checkpoint": checkpoint,
        "snapshots": snapshots,
        "snapshot_bytes": snapshot_bytes,
        "disk": checkpoint + snapshot_bytes,
    }


def size_text(n: int) -> str:
    """Bytes in binary units, as du -h counts them: 1.5 MiB."""
    if n < 1024:
        return f"{n} B"
    exponent = min(4, (n.bit_length() - 1) // 10)
    if exponent < 4 and round(n / 1024**exponent, 1) >= 1024:  # 1023.97 KiB reads 1.0 MiB, not 1024.0 KiB
        exponent += 1
    return f"{n / 1024**exponent:.1f} {('KiB', 'MiB', 'GiB', 'TiB')[exponent - 1]}"


def estimate_lines(
    configs: dict[str, Config], done_steps: dict[str, int], launch: Launch | None, console: Console | None
) -> Iterator[str]:
    """The sweep's wall time: a few steps of each model size timed here, then the jobs scheduled on the slots
    the launcher runs at once (GPUs here, the SLURM array's parallelism; on a CPU the jobs share its cores)."""
    if not configs:
        yield "estimated wall time: 0s (every job is completed)"
        return
    paces: dict[tuple, Pace] = {}
    like: dict[tuple, str] = {}  # each size's first job
    for name, c in configs.items():
        like.setdefault(size_key(c), name)
    for i, (key, name) in enumerate(like.items(), 1):
        if console:
            console.print(timing_line(configs[name], name, i, len(like)), highlight=False, markup=False, soft_wrap=True)
        paces[key] = p = measure_pace(configs[name])
        c = configs[name]
        yield (
            f"timed on {p.device} ({p.dtype}, {p.load()}), like {name}: {p.step_s:.3g} s a step "
            f"({p.steps} step(s) of {c.tokens_per_step:,} tokens), {p.eval_batch_s:.3g} s an evaluation batch"
        )
    seconds = [job_seconds(c, paces[size_key(c)], done_steps[n]) for n, c in configs.items()]
    launch = launch or Launch("basic", LauncherConfig("basic"), 1)
    if launch.settings.kind == "submitit_slurm":
        assert launch.settings.slurm is not None
        slots, how = (
            launch.settings.slurm.array_parallelism,
            "launcher.slurm.array_parallelism; timed on this machine, not the cluster's nodes",
        )
    else:
        gpus = launch.gpus
        slots = max(1, min(launch.parallel, len(gpus) // (launch.gpus_per_job or 1))) if gpus else 1
        how = f"{slots} at a time on this machine's GPUs" if gpus else "one at a time: jobs at once share the CPU cores"
    wall = wall_time(seconds, slots)
    yield (
        f"estimated wall time: {duration(wall)} for {len(seconds)} job(s), {duration(sum(seconds))} of job time "
        f"({how}); training steps and in-training evaluations only: data preparation, gradient diagnostics "
        "and the final evaluations add to it"
    )


def timing_line(c: Config, name: str, i: int, n: int) -> str:
    """What the dry run is doing while it times model size i of n, which takes seconds to minutes."""
    device = pick_device(c.device)
    compiled = (
        "torch.compile of the step (about 20 s on a CPU), " if pick_compile(c.compile, device, c.max_steps) else ""
    )
    return (
        f"timing model size {i} of {n} on {device} (like {name}): {compiled}a warm-up step, then up to "
        f"{TIMED_STEPS} optimizer steps and evaluation batches on random tokens, {BUDGET_S:g} s at most each "
        "(--no-estimate skips this) ..."
    )


@dataclasses.dataclass
class Pace:
    step_s: float  # one optimizer step: grad_accum micro-batches forward and backward, then AdamW
    eval_batch_s: float  # one evaluation batch, forward only
    steps: int  # optimizer steps timed
    device: str
    dtype: str
    threads: int = 1  # torch threads the steps ran on
    busy: float | None = None  # cores other processes kept busy meanwhile (CPU; None: not measured)
    cpus: int = 1

    def load(self) -> str:
        """What the timing assumed of the machine, for the dry run's line."""
        where = f"{self.threads} thread{'s' if self.threads > 1 else ''}"
        if self.device != "cpu" or self.busy is None:
            return where
        return f"{where}, with {self.busy:.1f} of {self.cpus} cores busy with other processes (assumed to last)"


def size_key(c: Config) -> tuple:
    """What sets a step's time: the model (shape, vocabulary, tying), the batch, device, precision and compile."""
    return (repr(dataclasses.asdict(c.model)), c.train.batch_size, c.train.grad_accum, c.device, c.dtype, c.compile)


def measure_pace(c: Config, clock: Callable[[], float] = time.perf_counter) -> Pace:
    """Time a few optimizer steps and an evaluation batch of this config's model here, on random tokens."""
    device = pick_device(c.device)
    threads = use_threads(device)
    dtype = pick_dtype(c.dtype, device)
    autocast = autocast_for(device, dtype)
    model = GPT(c.model, seed=c.seed).to(device)
    forward = compile_step(model) if pick_compile(c.compile, device, c.max_steps) else model
    optimizer = make_optimizer(model, c.train, device)
    tokens = torch.randint(
        c.model.vocab_size, (c.train.batch_size, c.model.block_size + 1), generator=torch.Generator()
    )
    x, y = tokens[:, :-1].to(device), tokens[:, 1:].to(device)  # (B, T) each

    def step() -> None:
        for _ in range(c.train.grad_accum):
            with autocast():
                loss = forward(x, y) / c.train.grad_accum
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def timed(work: Callable[[], None], n: int) -> tuple[float, int]:
        work()  # warm-up
        _sync(device)
        start, done = clock(), 0
        while done < n and (done == 0 or clock() - start < BUDGET_S):
            work()
            _sync(device)
            done += 1
        return (clock() - start) / done, done

    step_s, steps = timed(step, TIMED_STEPS)
    model.eval()
    with torch.no_grad():
        eval_s, _ = timed(lambda: _forward(model, x, y, autocast), TIMED_STEPS)
    return Pace(step_s, eval_s, steps, str(device), dtype, threads.n, threads.busy, threads.cpus)


def _forward(model: GPT, x: torch.Tensor, y: torch.Tensor, autocast) -> None:
    with autocast():
        model(x, y)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def job_seconds(c: Config, pace: Pace, done_steps: int = 0) -> float:
    """The time left for a job at this pace: its remaining steps and in-training evaluations (two subsets each)."""
    steps_left = max(0, c.max_steps - done_steps)
    evals_left = c.n_evals - c.evals_by(done_steps) + (1 if done_steps == 0 else 0)  # step 0's evaluation too
    return steps_left * pace.step_s + evals_left * 2 * c.train.eval_batches * pace.eval_batch_s


def wall_time(durations: list[float], slots: int) -> float:
    """The sweep's wall time when jobs start in order as soon as one of `slots` is free."""
    ends = [0.0] * max(1, slots)
    for d in durations:
        heapq.heapreplace(ends, ends[0] + d)
    return max(ends)
