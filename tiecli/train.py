# Used by `tiecli train`: set up, train, evaluate; every file of the run goes through its RunWriter.
"""The training recipe: data -> model -> AdamW with warmup + cosine -> checkpoints -> final evaluation.

A run can be stopped (Ctrl-C or SIGTERM: the current step finishes, a checkpoint is saved, the run
is marked interrupted) and resumed with `--resume`, which restores model, optimizer, every RNG and
the data sampler, so on CPU the resumed run reproduces the uninterrupted one exactly.
"""

import math
import platform
import resource
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from rich.console import Console

import tiecli
from tiecli import baselines, checkpoint, diagnostics, distributed, rundir
from tiecli import resume as resuming
from tiecli.config.schema import Config, TrainConfig
from tiecli.data import Corpus, StepBatches, get_batch, load_corpus
from tiecli.display import TrainProgress
from tiecli.errors import TiecliError
from tiecli.evaluate import evaluate, expected_line, final_windows
from tiecli.model import GPT, Embeddings
from tiecli.rundir import EvalResult, GeometryEntry, MetricsRow, RunWriter, Summary
from tiecli.runtime import (
    Threads,
    autocast_for,
    compile_step,
    grad_scaler,
    pick_compile,
    pick_device,
    pick_dtype,
    use_threads,
)


class Interrupted(TiecliError):
    """The run stopped on Ctrl-C/SIGTERM after saving a checkpoint."""

    exit_code = 130


class Diverged(TiecliError):
    """The training loss became NaN or infinite; the last checkpoint from before it stays."""


@dataclass
class TrainState:
    """Everything a checkpoint carries besides weights, optimizer and RNG, to resume exactly."""

    step: int = 0
    tokens: int = 0
    train_time: float = 0.0
    wall_time: float = 0.0
    best_val_loss: float | None = None
    best_val_step: int | None = None
    loss_sum: float = 0.0  # train loss summed since the last log line
    loss_n: int = 0
    run_id: str | None = None  # summary.json's: a resume refuses a checkpoint of another run
    logged_step: int | None = None  # the step of the last metrics.jsonl row: a resume checks the file still has it


@dataclass
class Setup:
    """What the loop works with, built before the run directory exists (so a bad input leaves nothing)."""

    config: Config
    device: torch.device
    dtype: str
    autocast: Callable
    corpus: Corpus
    buckets: np.ndarray
    model: GPT
    optimizer: torch.optim.AdamW
    sampler: torch.Generator
    pairs: list
    pairs_info: dict
    compiled: bool  # whether `forward` is torch.compile'd (compile: auto resolved)
    forward: Callable  # model(x, y) -> loss for the training step: the model itself, or its compiled graph
    batches: StepBatches  # this rank's micro-batches, drawn from `sampler`
    scaler: torch.amp.GradScaler | None = None  # fp16's loss scaling; None under bf16 and fp32


def make_optimizer(model: GPT, t: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; matrices decay, biases and LayerNorm gains never do, embeddings as train.decay_embeddings says.

    A group per (decay, lr_scale), decayed groups first; lr_scale is the group's learning rate over
    train.lr (see lr_scale), which the loop multiplies into the schedule. With the defaults: two groups.
    """
    groups: dict[tuple[bool, float], list] = {}
    for name, p in model.named_parameters():  # a tied matrix appears once: no duplicate in the groups
        is_embedding = name.startswith(("emb.", "wpe."))
        decay = p.dim() >= 2 and (t.decay_embeddings or not is_embedding)
        groups.setdefault((decay, lr_scale(model, name, t)), []).append(p)
    ordered = sorted(groups.items(), key=lambda item: (not item[0][0], item[0][1]))
    param_groups = [
        {"params": params, "weight_decay": t.weight_decay if decay else 0.0, "lr_scale": scale}
        for (decay, scale), params in ordered
    ]
    return torch.optim.AdamW(param_groups, lr=t.lr, betas=(t.beta1, t.beta2), fused=device.type in ("cuda", "cpu"))


def lr_scale(model: GPT, name: str, t: TrainConfig) -> float:
    """A parameter's peak learning rate over train.lr, as nanochat gives its token matrices their own.

    The input embedding trains at train.lr_embedding, and so does a matrix shared by both sides
    (it is the input embedding too); the output side's own parameters at train.lr_output; the rest,
    positions included, at train.lr.
    """
    if not name.startswith("emb."):
        return 1.0
    role = model.emb.roles[name.removeprefix("emb.")]
    lr = t.lr_output if role == "output" else t.lr_embedding
    return 1.0 if lr is None else lr / t.lr


def lr_at(step: int, c: Config) -> float:
    """Linear warmup to train.lr over Config.warmup steps, then cosine decay to min_lr at max_steps."""
    t, warmup = c.train, c.warmup
    if step < warmup:
        return t.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, c.max_steps - warmup)
    return t.min_lr + 0.5 * (1 + math.cos(math.pi * min(1.0, progress))) * (t.lr - t.min_lr)


def prepare(config: Config) -> Setup:
    """Data, model and optimizer; checks the data fits the model before any file is written."""
    device = distributed.device(pick_device(config.device))
    dtype = pick_dtype(config.dtype, device)
    distributed.rank_shape(config.train, distributed.world_size())  # the world size must divide the global batch
    compiled = pick_compile(config.compile, device, config.max_steps)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    corpus = distributed.local_first(lambda: load_corpus(config.data, config.tokenizer))  # one rank builds the cache
    for split, tokens in corpus.tokens.items():
        if len(tokens) < config.model.block_size + 1:
            raise TiecliError(
                f"the {split} split has {len(tokens)} tokens, fewer than model.block_size + 1 = "
                f"{config.model.block_size + 1}; use a smaller model.block_size or more data"
            )
    model = GPT(config.model, seed=config.seed).to(device)
    # dropout's RNG, from the start of training: the weights have their own generators; each rank its own stream
    torch.manual_seed(config.seed + distributed.rank())
    # The whole forward, fused head and loss included, as one graph, whose backward AOTAutograd
    # compiles too. The gradient split is part of that graph (model.py: _Fork), so diagnostics
    # neither break it nor recompile it. Evaluation stays eager: its shapes vary.
    forward = distributed.wrap(compile_step(model) if compiled else model, device)  # DDP under torchrun
    wants_pairs = config.diag.geometry or config.diag.every > 0  # R3's geometry and R4's pair gradients
    pairs, pairs_info = diagnostics.form_pairs(corpus.encoding, config.diag.pairs) if wants_pairs else ([], {})
    t, world, sampler = config.train, distributed.world_size(), torch.Generator().manual_seed(config.seed)
    micro, _ = distributed.rank_shape(t, world)
    batches = StepBatches(
        corpus.tokens["train"], t.batch_size, t.grad_accum, config.model.block_size, micro, distributed.rank(), world,
        sampler, device, draw=lambda *args: get_batch(*args),
    )  # fmt: skip
    return Setup(
        config,
        device,
        dtype,
        autocast_for(device, dtype),
        corpus,
        corpus.buckets(config.eval.buckets),
        model,
        make_optimizer(model, config.train, device),
        sampler,
        pairs,
        pairs_info,
        compiled,
        forward,
        batches,
        grad_scaler(device, dtype),
    )


def new_summary(s: Setup, name: str) -> Summary:
    c = s.config
    return Summary(
        name=name,
        status="running",
        seed=c.seed,
        params=s.model.param_counts(),
        max_steps=c.max_steps,
        tokens_per_step=c.tokens_per_step,
        step=0,
        tokens=0,
        device=str(s.device),
        dtype=s.dtype,
        compile=s.compiled,
        world_size=distributed.world_size(),
        batch=distributed.batch_info(c.train, c.model.block_size),
        versions={"tiecli": tiecli.__version__, "torch": torch.__version__, "python": platform.python_version()},
        corpus={
            "key": s.corpus.key,
            "key_scheme": 2,  # 2: the input files' bytes and split settings (data.py); before: the split texts
            "train_tokens": len(s.corpus.tokens["train"]),
            "vocab_size": s.corpus.encoding.n_vocab,
            "baselines": baselines.of_corpus(s.corpus),
        },
        started=now(),
        run_id=rundir.new_run_id(),
    )


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def open_run(s: Setup, run_dir: Path, resume: bool, files: dict[str, str]) -> tuple[RunWriter, TrainState, bool]:
    """The run's writer and where training stands: a new run at step 0, or a resumed one at its checkpoint."""
    if not resume:
        init, summary = checkpoint.to_bytes({"emb": s.model.emb.state_dict()}), new_summary(s, run_dir.name)
        return RunWriter.create(run_dir, files, summary, init), TrainState(run_id=summary.run_id), False
    run = RunWriter.open(run_dir)
    try:
        run.reader.check_corpus(s.corpus.key)
        resuming.check_files(run.reader, s.config.model)  # nothing is changed until all of them have been read
        run_id = run.reader.summary().run_id or rundir.new_run_id()  # a run from before run ids gets one now
        if not (run_dir / rundir.CHECKPOINT).is_file():
            if run.reader.summary().step > 0:  # never replace trained steps with a fresh start
                raise TiecliError(
                    f"run {run_dir.name} has no checkpoint ({rundir.CHECKPOINT}) to resume from; "
                    "its recorded steps are kept: start a new run with another --name"
                )
            run.truncate_after(-1)
            run.rewrite(files)
            return run, TrainState(run_id=run_id), False
        ckpt = run.reader.checkpoint()
        distributed.check_world_size(ckpt, run_dir.name)
        stored = run.reader.config().get("train", {}).get("log_interval", 1)  # what the checkpoint was written with
        resuming.check_checkpoint(run.reader, ckpt, max(stored, s.config.train.log_interval))
        state = restore(s, ckpt, run_dir.name)
        state.run_id = run_id
        run.truncate_after(state.step)
        run.rewrite(files)  # config.yaml with what the overrides extend (train.max_steps=...)
        return run, state, True
    except BaseException:
        run.close()
        raise


def restore(s: Setup, ckpt: dict, name: str) -> TrainState:
    """Weights, optimizer, this rank's RNG streams and the loop's state from a checkpoint."""
    checkpoint.load_weights(s.model, ckpt["model"], name, "the model weights")
    try:  # a checkpoint whose optimizer, RNG or loop state is not this run's: one line, not a traceback
        state = TrainState(**ckpt["state"])
        s.optimizer.load_state_dict(ckpt["optimizer"])
        if s.scaler and "scaler" in ckpt:
            s.scaler.load_state_dict(ckpt["scaler"])
        rng = distributed.rng_of_rank(ckpt)
        torch.set_rng_state(rng["torch"])
        s.sampler.set_state(rng["sampler"])
        checkpoint.restore_device_rng(rng, s.device)
        state.loss_sum = rng.get("loss_sum", state.loss_sum)  # a rank's own train loss since the last log line
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as e:
        reason = (str(e).strip().splitlines() or [""])[0][:160]
        raise TiecliError(
            f"run {name}: checkpoint {rundir.CHECKPOINT.name} does not match this run ({type(e).__name__}: {reason})"
        ) from None
    return state


def open_on_ranks(
    s: Setup, run_dir: Path, resume: bool, files: dict[str, str]
) -> tuple[RunWriter | None, TrainState, bool]:
    """open_run on rank 0, which alone writes the run; the other ranks get no writer, and on a resume
    load the checkpoint rank 0 has checked. Rank 0's refusal (a bad checkpoint) is every rank's."""
    opened: tuple[RunWriter, TrainState, bool] | None = None

    def plan() -> bool:
        nonlocal opened
        opened = open_run(s, run_dir, resume, files)
        return opened[2]

    resumed = distributed.from_rank0(plan)
    if opened is not None:
        return opened
    if not resumed:
        return None, TrainState(), False
    return None, restore(s, checkpoint.load(run_dir / rundir.CHECKPOINT, run_dir.name), run_dir.name), True


class StopFlag:
    """Ctrl-C and SIGTERM (SIGUSR2: a cluster's time limit) ask the loop to stop after the current step.

    After the first Ctrl-C, SIGINT gets its default action back, so a second Ctrl-C ends the process
    at once, even inside a long native op; the last checkpoint stays valid (it is written atomically)
    and the run then reads `interrupted`, since its lock is gone.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)

    def __init__(self):
        self.requested = False
        self.previous = {}

    def __enter__(self) -> "StopFlag":
        for sig in self.SIGNALS:
            self.previous[sig] = signal.signal(sig, self.handle)
        return self

    def handle(self, signum, frame) -> None:
        self.requested = True
        if signum == signal.SIGINT and not distributed.launched():  # torchrun passes a Ctrl-C on: a second one
            signal.signal(signal.SIGINT, signal.SIG_DFL)

    def check(self) -> None:
        """Raise Interrupted if a stop was asked for: long evaluations call this between batches."""
        if self.requested:
            raise Interrupted(
                "interrupted during the final evaluation; the checkpoint is kept, --resume evaluates again"
            )

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def train(
    config: Config, run_dir: Path, resume: bool, files: dict[str, str], console: Console | None = None
) -> Summary | None:
    """Train one run into run_dir and evaluate it; returns its final Summary (None on ranks other than 0).

    files: the config.yaml and overrides.yaml texts of a new run directory; with resume, the
    config.yaml the overrides extended, written once the checkpoint has been found to fit.
    """
    console = console or Console(stderr=True, quiet=not distributed.is_rank0())
    with StopFlag() as stop:
        threads = run_threads(config, run_dir, resume)
        s = prepare(config)
        if distributed.any_rank(stop.requested):  # every rank stops here, so rank 0 alone says so
            raise Interrupted("interrupted before the run started; nothing was written")
        run, state, resumed = open_on_ranks(s, run_dir, resume, files)
        if run is None:  # a rank other than 0: trains in step with rank 0 and writes nothing
            with TrainProgress(
                console, run_dir.name, config.max_steps, state.step, config.train.log_interval, s.compiled
            ) as p:
                fit(s, None, state, p, stop, fresh=not resumed)
            final_evals(s, state, stop)  # its share of the windows: rank 0 gets the reduced numbers
            return None
        with run:
            if resumed:
                console.print(f"resuming {run_dir.name} from step {state.step}", highlight=False)
            if threads.warning():
                console.print(threads.warning(), highlight=False, markup=False, soft_wrap=True)
            console.print(distributed.batch_line(config.train, config.model.block_size), highlight=False)
            warning = small_batch_warning(s.device, config.train, config.model.block_size)
            if warning:
                console.print(warning, style="yellow", highlight=False)
            summary = run.reader.summary()
            summary.status, summary.error, summary.started = "running", None, now()
            summary.run_id = state.run_id
            summary.max_steps, summary.threads = config.max_steps, threads.n
            run.summary(summary)
            try:
                with TrainProgress(
                    console, run_dir.name, config.max_steps, state.step, config.train.log_interval, s.compiled
                ) as progress:
                    fit(s, run, state, progress, stop, fresh=not resumed)
                    finals = final_evals(s, state, stop)
                for result in finals:
                    run.eval(result)
                peak = peak_memory(s.device)
                return finish(run, summary, state, "completed", final_val=finals[0].brief(), peak_memory=peak)
            except Interrupted as e:
                finish(run, summary, state, "interrupted", error=str(e), peak_memory=peak_memory(s.device))
                raise
            except BaseException as e:
                error = f"{type(e).__name__}: {e}".strip()
                finish(run, summary, state, "failed", error=error, peak_memory=peak_memory(s.device))
                raise


def run_threads(config: Config, run_dir: Path, resume: bool) -> Threads:
    """This process's torch threads (runtime.use_threads); a resumed run keeps the count it trained with,
    since another count sums in another order (the last bits of its losses would differ)."""
    kept = rundir.RunReader(run_dir).summary().threads if resume and (run_dir / rundir.SUMMARY).is_file() else None
    return use_threads(pick_device(config.device), kept)


def fit(
    s: Setup, run: RunWriter | None, state: TrainState, progress: TrainProgress, stop: StopFlag, fresh: bool
) -> None:
    """The training loop: set lr -> micro-steps -> diagnostics -> clip -> step -> log/eval/checkpoint.

    Under DDP every rank runs it in step; rank 0 alone (run is not None) evaluates and writes."""
    c, t, d = s.config, s.config.train, s.config.diag
    max_steps, model, optimizer = c.max_steps, s.model, s.optimizer
    emb0 = checkpoint.load_embeddings(run.path / rundir.INIT_CHECKPOINT, c.model, run.path.name) if run else None
    buckets_t = torch.from_numpy(s.buckets.astype("int64")).to(s.device)
    pair_index = diagnostics.pair_index(s.pairs, s.corpus.counts, d.seed, s.device) if d.every > 0 else None
    loss_acc = torch.tensor(state.loss_sum, device=s.device)  # train loss summed since the last log line
    if fresh and run:  # a checkpoint at step 0 (stopped before the first step) already has these
        log_step_0(s, run, state, progress, emb0)
    interval_start, interval_tokens = time.perf_counter(), 0
    tick = interval_start
    while state.step < max_steps and not distributed.any_rank(stop.requested):  # a signal to any rank stops all
        step_start = time.perf_counter()
        state.wall_time += step_start - tick  # everything between steps too: logging, evaluation, checkpoints
        tick = step_start
        lr = lr_at(state.step, c)
        for group in optimizer.param_groups:
            group["lr"] = lr * group["lr_scale"]
        diag_now = d.every > 0 and (state.step + 1) % d.every == 0
        present = micro_steps(s, loss_acc, diag_now)
        diag = grad_stats(s, present, buckets_t, state.step, pair_index)
        model.emb.clear_split_grads()
        grad_norm = clip_and_step(s)
        state.step += 1
        if state.step < max_steps:
            s.batches.prefetch()  # the host reads the next step's windows while the device runs this one
        state.tokens += c.tokens_per_step
        state.loss_n += 1
        at_eval = c.is_eval_step(state.step)
        log_now = state.step % t.log_interval == 0 or at_eval or bool(diag)
        if log_now:  # the host runs ahead of a GPU: wait for it, so the times measure its work, not the queue
            synchronize(s.device)
        state.train_time += time.perf_counter() - step_start
        interval_tokens += c.tokens_per_step
        progress.advance(state.step)

        if log_now:
            tps = interval_tokens / (time.perf_counter() - interval_start)
            loss = mean_loss(distributed.mean_(loss_acc), state, run)
            if run:  # rank 0 evaluates and writes; the others wait for it in the next step
                row = MetricsRow(state.step, state.tokens, lr, loss, grad_norm.item(), tps, diag=diag)
                log(run, state, row, subset_evals(s) if at_eval else None, progress)
                if at_eval:
                    record_geometry(s, run, emb0, state.step)
            loss_acc.zero_()
            state.loss_n = 0
            interval_start, interval_tokens = time.perf_counter(), 0
        if c.is_checkpoint_step(state.step):
            save_checkpoint(s, run, state, loss_acc, keep=True)
    if state.step < max_steps:
        save_checkpoint(s, run, state, loss_acc)
        raise Interrupted(f"interrupted at step {state.step}/{max_steps}; checkpoint saved")


def log_step_0(s: Setup, run: RunWriter, state: TrainState, progress: TrainProgress, emb0) -> None:
    """The step-0 evaluation and geometry, and the expected final-evaluation time, timed from the former."""
    c, t = s.config, s.config.train
    start = time.perf_counter()
    log(run, state, MetricsRow(step=0, tokens=0, lr=0.0), subset_evals(s), progress)
    pace = 2 * t.eval_batches * t.batch_size * c.model.block_size / (time.perf_counter() - start)
    splits = ["val", "train", *(["test"] if c.eval.test else [])]
    world = distributed.world_size()  # the final evaluation is sharded across the ranks
    progress.plain(expected_line(s.corpus, splits, c.model.block_size, c.eval.max_tokens, pace * world))
    record_geometry(s, run, emb0, 0)


def clip_and_step(s: Setup) -> torch.Tensor:
    """Clip the global gradient norm and step the optimizer; returns the norm before clipping."""
    optimizer = s.optimizer
    if s.scaler:  # fp16: clip the true gradients; a step whose gradients overflowed is skipped
        s.scaler.unscale_(optimizer)
    grad_norm = torch.nn.utils.clip_grad_norm_(s.model.parameters(), s.config.train.grad_clip or float("inf"))
    if s.scaler:
        s.scaler.step(optimizer)
        s.scaler.update()
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


MIN_GPU_BATCH_TOKENS = 16384  # below this a rank's micro-batch leaves a GPU waiting on the host's kernel launches


def small_batch_warning(device: torch.device, t: TrainConfig, block_size: int) -> str | None:
    """One line when a rank's micro-batch on CUDA is under MIN_GPU_BATCH_TOKENS tokens, else None."""
    micro, _ = distributed.rank_shape(t, distributed.world_size())
    if device.type != "cuda" or micro * block_size >= MIN_GPU_BATCH_TOKENS:
        return None
    return (
        f"warning: a micro-batch of {micro} x {block_size} = {micro * block_size:,} tokens a rank keeps a GPU "
        f"waiting (under {MIN_GPU_BATCH_TOKENS:,}); raise train.batch_size (hardware=gpu: 16 x 1024)"
    )


def synchronize(device: torch.device) -> None:
    """Wait until the device has done the work queued so far (only log steps call it: it stalls the queue)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory(device: torch.device) -> dict:
    """summary.json's peak_memory: the most the device held during this session of the run.

    CUDA: torch.cuda.max_memory_allocated (tensors; the caching allocator reserves somewhat more);
    elsewhere the process's peak resident set (ru_maxrss: KiB on Linux, bytes on macOS), which
    counts the model, the data pages read and Python itself."""
    if device.type == "cuda":
        return {"bytes": torch.cuda.max_memory_allocated(device), "of": "cuda max_memory_allocated"}
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"bytes": rss if sys.platform == "darwin" else rss * 1024, "of": "process peak RSS"}


def grad_stats(
    s: Setup, present: torch.Tensor | None, buckets: torch.Tensor, step: int, pairs: diagnostics.PairIndex | None
) -> dict:
    """Gradient interference of the token matrices (present: the input tokens, None off diag steps), and
    at the related-form pairs. Before clipping: the statistics describe the raw gradients that tying would sum."""
    if present is None:
        return {}
    emb = s.model.emb
    g_in, g_out, present = diagnostics.across_ranks(emb, *diagnostics.gradient_paths(emb), present)
    if s.scaler:  # fp16: the gradients are still multiplied by the loss scale
        g_in, g_out = g_in / s.scaler.get_scale(), g_out / s.scaler.get_scale()
    stats = diagnostics.interference(g_in, g_out, present, buckets, seed=s.config.diag.seed, step=step)
    assert pairs is not None  # fit draws them whenever diag.every > 0, which present requires
    return stats | diagnostics.pair_gradients(g_in, g_out, *diagnostics.path_matrices(emb), pairs)


def micro_steps(s: Setup, loss_acc: torch.Tensor, diag_now: bool) -> torch.Tensor | None:
    """Forward and backward over grad_accum micro-batches; returns which tokens were inputs (for diagnostics)."""
    present = torch.zeros(s.config.model.vocab_size, dtype=torch.bool, device=s.device) if diag_now else None
    batches = s.batches.next()  # this rank's share of one process's draws, on the device
    for i, (x, y) in enumerate(batches):
        distributed.sync_grads(s.forward, now=i == len(batches) - 1)
        if present is not None:
            present[x.flatten()] = True
        with s.autocast():
            loss = s.forward(x, y) / len(batches)
        (s.scaler.scale(loss) if s.scaler else loss).backward()
        loss_acc += loss.detach().float()
    return present


def mean_loss(loss_acc: torch.Tensor, state: TrainState, run: RunWriter | None) -> float:
    """The mean train loss since the last log line; a NaN or infinite one stops the run."""
    loss = loss_acc.item() / max(1, state.loss_n)
    if not math.isfinite(loss):
        kept = run.reader.checkpoint()["state"]["step"] if run and (run.path / rundir.CHECKPOINT).is_file() else 0
        raise Diverged(
            f"the training loss became {loss} by step {state.step}; the checkpoint from step {kept} is kept "
            "(try a lower train.lr)"
        )
    return loss


def subset_evals(s: Setup) -> dict[str, dict]:
    """The in-training evaluation: the same eval_batches x batch_size fixed windows of the validation and
    the training split every time, so val_loss - train_eval_loss is the generalisation gap."""
    t = s.config.train
    return {
        split: evaluate(s.model, s.corpus, split, s.buckets, s.device, s.autocast, limit=t.eval_batches * t.batch_size)
        for split in ("val", "train")
    }


def final_evals(s: Setup, state: TrainState, stop: StopFlag) -> list[EvalResult]:
    """The validation split, the training split and, with eval.test, the test split: each whole, or a
    fixed subset past eval.max_tokens (final_windows). Every rank evaluates its share (shard).

    One process stops between batches on Ctrl-C; ranks, whose shares differ by a batch, agree on a
    stop before each split (a rank that left alone would leave the others waiting in the reduction)."""
    block_size, alone = s.config.model.block_size, distributed.world_size() == 1
    results = []
    for split in ["val", "train", *(["test"] if s.config.eval.test else [])]:
        if distributed.any_rank(stop.requested):
            stop.requested = True
            stop.check()
        windows = final_windows(s.corpus, split, block_size, s.config.eval.max_tokens)
        check = stop.check if alone else None
        result = evaluate(
            s.model, s.corpus, split, s.buckets, s.device, s.autocast, check=check, windows=windows, shard=True
        )
        results.append(EvalResult(step=state.step, **result))
    return results


def log(
    run: RunWriter, state: TrainState, row: MetricsRow, evals: dict[str, dict] | None, progress: TrainProgress
) -> None:
    """Append one metrics.jsonl line; with evaluation metrics, also track the best val loss."""
    if evals is not None:
        val = evals["val"]
        row.val_loss, row.val_ppl, row.val_bpb = val["loss"], val["perplexity"], val["bits_per_byte"]
        row.train_eval_loss = evals["train"]["loss"]
        if state.best_val_loss is None or val["loss"] < state.best_val_loss:
            state.best_val_loss, state.best_val_step = val["loss"], row.step
    run.log(row)
    state.logged_step = row.step
    progress.log(row)


def record_geometry(s: Setup, run: RunWriter, emb0: Embeddings | None, step: int) -> None:
    d = s.config.diag
    if not d.geometry or emb0 is None:  # emb0: rank 0's, the only rank that records
        return
    entry = diagnostics.embedding_geometry(s.model.emb, emb0, s.corpus.counts, s.buckets, s.pairs, s.pairs_info, d.seed)
    run.geometry(rundir.parse_record(GeometryEntry, {"step": step, **entry}, "a geometry entry"))
    if d.snapshots and snapshot_due(s.config, step):
        run.save(rundir.SNAPSHOTS / f"step_{step}.pt", checkpoint.to_bytes({"emb": s.model.emb.state_dict()}))
        for kept in run.reader.snapshot_steps():  # a resume that changed the schedule leaves some off the plan
            if not snapshot_due(s.config, kept):
                run.remove_snapshot(kept)


def snapshot_due(c: Config, step: int) -> bool:
    """Whether checkpoints/emb/ keeps step's token matrices: of the geometry steps (0 and each
    evaluation), at most diag.max_snapshots, evenly spread by index, the first and the last among them."""
    if step != 0 and not c.is_eval_step(step):
        return False
    last, most = c.n_evals, c.diag.max_snapshots  # geometry steps are numbered 0..last
    return last < most or c.evals_by(step) in {round(i * last / (most - 1)) for i in range(most)}


def save_checkpoint(
    s: Setup, run: RunWriter | None, state: TrainState, loss_acc: torch.Tensor, keep: bool = False
) -> None:
    """last.pt: weights, optimizer, every RNG and the loop's state. Never one from after a NaN loss.

    Under DDP rank 0 writes it, with each other rank's RNG streams and train loss in `rank_rng`.
    keep: one of the checkpoint_interval's, which train.keep_checkpoints keeps as step_N.pt too."""
    state.loss_sum = loss_acc.item()
    if distributed.any_rank(not math.isfinite(state.loss_sum)):
        mean_loss(distributed.mean_(loss_acc.clone()), state, run)  # raises Diverged, naming the checkpoint kept
    # the sampler's state from before a prefetched draw, so a resume draws it again
    rng = {"torch": torch.get_rng_state(), "sampler": s.batches.state(), **checkpoint.device_rng(s.device)}
    ranks = distributed.gather({**rng, "loss_sum": state.loss_sum})
    if run is None or ranks is None:
        return
    ckpt: dict[str, object] = {
        "model": s.model.state_dict(),
        "optimizer": s.optimizer.state_dict(),
        "rng": rng,
        "state": asdict(state),
    }
    if len(ranks) > 1:
        ckpt["rank_rng"] = ranks[1:]
    if s.scaler:
        ckpt["scaler"] = s.scaler.state_dict()
    run.save(rundir.CHECKPOINT, checkpoint.to_bytes(ckpt))
    if keep:
        run.keep_checkpoint(state.step, s.config.train.keep_checkpoints)


def finish(run: RunWriter, summary: Summary, state: TrainState, status: str, **fields) -> Summary:
    """The final summary.json; when even that cannot be written (a full disk), the original error still wins."""
    summary.wall_time = state.wall_time
    summary.status, summary.step, summary.tokens = status, state.step, state.tokens
    summary.train_time, summary.tokens_per_s = state.train_time, state.tokens / max(state.train_time, 1e-9)
    summary.best_val_loss, summary.best_val_step, summary.ended = state.best_val_loss, state.best_val_step, now()
    for key, value in fields.items():
        setattr(summary, key, value)
    try:
        run.summary(summary)
    except OSError:
        if status == "completed":
            raise
    return summary
