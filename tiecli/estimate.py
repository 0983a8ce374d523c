# Used by `tiecli sweep --dry-run`: how long the sweep will take, from a few steps timed here per model size.
"""A sweep's wall time, estimated before anything runs.

For each model size of the sweep (its model shape, vocabulary, batch and precision, as configured),
a model is built on the device the jobs would use and a few optimizer steps on random tokens are
timed, after one untimed warm-up step (allocation, torch.compile), as is one forward pass of an
evaluation batch. A job then takes steps x step time + its in-training evaluations (validation and
training subsets, train.eval_batches batches each) x batch time. Data preparation, the gradient
diagnostics and the final full-split evaluations are not counted, so the estimate is a lower bound.
On a CPU the steps run on the threads a job would use (runtime.use_threads: the cores other
processes leave free, or OMP_NUM_THREADS), and the estimate assumes the load measured then lasts.
"""

import dataclasses
import heapq
import time
from collections.abc import Callable

import torch

from tiecli.config.schema import Config
from tiecli.model import GPT
from tiecli.optim import make_optimizer
from tiecli.runtime import autocast_for, compile_step, pick_compile, pick_device, pick_dtype, use_threads

TIMED_STEPS = 3  # optimizer steps timed per size, fewer when they take longer than BUDGET_S
BUDGET_S = 5.0


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


def measure(c: Config, clock: Callable[[], float] = time.perf_counter) -> Pace:
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
